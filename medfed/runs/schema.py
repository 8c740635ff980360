"""What a run directory holds, as types: the one definition every reader and writer shares.

``summary.json`` is a :class:`Summary` (what the run was, an :class:`Evaluation` of the trained
federation, and what it cost), each line of ``metrics.jsonl`` a :class:`RoundRecord`.
Every JSON, JSONL and TOML file of a run carries ``schema_version``; :class:`RunDir` adds it on
write and checks it on read (:func:`check_version`), so a reader meets a newer file with a clear
message instead of a ``KeyError``. A file without ``schema_version`` predates versioning and
reads as version 1.

Each record declares its fields once: their types and, for figures, their kinds
(:mod:`medfed.core.kinds`); one reader and one writer (:mod:`medfed.runs.fields`) follow them.
Version 1 fields: those medfed has written since its first release are required; those added
later (ROC points, router figures, traffic per site, the wire format, skipped rounds, the engine)
have defaults, so every version-1 file still reads. Unknown keys are ignored, except in round
records, where a numeric one is an algorithm's own figure (:attr:`RoundRecord.extra`).

No torch here (and nothing that imports it): the dashboard and the report tables read runs
without loading the training code.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from medfed.core import kinds
from medfed.core.errors import RunDirError
from medfed.core.versions import REDO
from medfed.metrics import (
    Calibration,
    ClassAUC,
    FederationMetrics,
    Interval,
    MulticlassFigure,
    OperatingPoint,
    Pooled,
    Proportion,
    RoutingCalibration,
)
from medfed.runs.fields import Record, keys_of


# ---------------------------------------------------------------------------- summary parts
@dataclass(frozen=True)
class RocPoints(Record):
    """One site's test ROC curve, or the reason it has none (one class, more than two)."""

    WHERE = "roc"

    fpr: list[float] | None = kinds.rate(missing=None)
    tpr: list[float] | None = kinds.rate(missing=None)
    thresholds: list[float | None] | None = kinds.figure(missing=None)
    reason: str | None = None

    @property
    def drawable(self) -> bool:
        return bool(self.fpr) and bool(self.tpr)


@dataclass(frozen=True)
class EndpointFigures(Record):
    """A graded task's binary endpoint on a site's test scans: ``name`` (``referable``: DR of
    grade ``from_class`` or worse), scored by the probability of those grades; its AUC with a
    95% CI, its counts, and sensitivity, specificity, PPV and NPV at the threshold ``rule``
    chose on the site's validation split."""

    WHERE = "endpoint figures"

    name: str
    from_class: int = kinds.count()
    auc: float | None = kinds.auc()
    auc_reason: str | None
    n_pos: int = kinds.count()
    n_neg: int = kinds.count()
    unreliable: str | None = None
    auc_ci: Interval | None = None
    operating_point: OperatingPoint | None = None


@dataclass(frozen=True)
class SiteFigures(Record):
    """One site's model on its own test scans; ``auc`` is None exactly when ``auc_reason`` says
    why (a test split with one class has no AUC).

    For a two-class task: ``n_pos`` / ``n_neg`` count the test split's classes, ``auc_ci`` is the
    AUC's 95% CI (its method named in it), ``unreliable`` says why a figure rests on too few
    positives or negatives (fewer than 10), ``operating_point`` holds sensitivity, specificity,
    PPV and NPV at the threshold chosen on the site's validation split, and ``calibration`` the
    Brier score, ECE, calibration intercept and slope and the reliability-diagram points.
    With more than two classes ``auc`` is the macro one-vs-rest AUC and ``auc_ci`` its
    patient bootstrap CI (the same as ``macro_auc``'s).
    """

    WHERE = "site figures"

    auc: float | None = kinds.auc()
    auc_reason: str | None
    accuracy: float = kinds.rate()
    balanced_accuracy: float = kinds.rate()
    n_test: int = kinds.count()
    n_train: int = kinds.count()
    n_val: int = kinds.count()
    n_pos: int | None = kinds.count(None)
    n_neg: int | None = kinds.count(None)
    unreliable: str | None = None
    roc: RocPoints | None = kinds.part(None, omit_none=True)
    auc_ci: Interval | None = None
    operating_point: OperatingPoint | None = None
    calibration: Calibration | None = None
    # Tasks with more than two classes only (absent otherwise): each class against the rest
    # (AUC with CI), the macro one-vs-rest AUC and the quadratic weighted kappa of the argmax
    # grade, both with patient bootstrap CIs, and the ICDR grading's referable-DR endpoint.
    class_auc: list[ClassAUC] | None = kinds.part(None, omit_none=True)
    macro_auc: MulticlassFigure | None = kinds.part(None, omit_none=True)
    kappa: MulticlassFigure | None = kinds.part(None, omit_none=True)
    referable: EndpointFigures | None = kinds.part(None, omit_none=True)

    @property
    def operating_accuracy(self) -> float:
        """Accuracy at the site's operating point (the threshold chosen on its validation
        split), the rule the routed system answers by; at argmax where the site has none."""
        op = self.operating_point
        if op is None:
            return self.accuracy
        return (op.tp + op.tn) / (op.tp + op.fp + op.tn + op.fn)


@dataclass(frozen=True)
class CrossSiteCell(Record):
    """One site's model on another site's test scans (a cell of the cross-site matrix)."""

    WHERE = "cross-site cell"

    auc: float | None = kinds.auc()
    auc_reason: str | None
    accuracy: float = kinds.rate()
    n: int = kinds.count()


ROUTER_RATES: tuple[str, ...] = (
    "system_accuracy",
    "routing_accuracy",
    "abstain_rate",
    "answered_accuracy",
    "sensitivity",
    "specificity",
)
"""Rates a router reports with their counts and Wilson 95% CIs (:attr:`RouterFigures.rates`)."""


@dataclass(frozen=True)
class RouterFigures(Record):
    """One router on every site's test scans pooled (a new patient's view of the federation).

    ``routing_accuracy`` is None for a majority vote (it sends no scan anywhere);
    ``answered_accuracy`` counts only the scans it did not abstain on. ``rates`` gives each of
    :data:`ROUTER_RATES` with its counts and 95% CI; ``sensitivity`` and ``specificity`` are
    over the answered scans, each decided at the answering site's operating point.
    """

    WHERE = "router figures"

    system_accuracy: float | None = kinds.rate()
    routing_accuracy: float | None = kinds.rate()
    abstain_rate: float | None = kinds.rate()
    answered_accuracy: float | None = kinds.rate()
    forward_passes: int = kinds.count()
    latency_ms_per_scan: float = kinds.amount()
    n_pooled: int = kinds.count()
    # the median's distribution-free 95% interval; None with too few timings or in older runs
    latency_ms_low: float | None = kinds.amount(None, omit_none=True)
    latency_ms_high: float | None = kinds.amount(None, omit_none=True)
    rates: dict[str, Proportion] = field(default_factory=dict)


@dataclass(frozen=True)
class SiteTraffic(Record):
    """Bytes one site sent (``up``) and received (``down``), per round on average."""

    up: float = kinds.amount()
    down: float = kinds.amount()


@dataclass(frozen=True)
class PrivacySpent(Record):
    """One site's differential privacy: the epsilon it spent at its delta over ``steps`` DP-SGD
    steps, and the mechanism (noise multiplier, Poisson sampling rate, clip, accountant)."""

    WHERE = "summary.json"

    epsilon: float = kinds.amount()
    delta: float = kinds.rate()
    budget: float | None = kinds.amount(missing=None)
    noise_multiplier: float = kinds.amount()
    sample_rate: float = kinds.rate()
    clip: float = kinds.amount()
    steps: int = kinds.count()
    planned_steps: int = kinds.count()
    accountant: str
    # The round in which the site stopped training because its budget was spent (rounds + 1:
    # it skipped its fine-tuning); None: it never stopped.
    stopped_round: int | None = kinds.count(None)


@dataclass(frozen=True)
class WireSettings(Record):
    """How updates were encoded on the wire."""

    precision: str
    delta: bool

    @property
    def label(self) -> str:
        return self.precision + (" + delta" if self.delta else "")


@dataclass(frozen=True)
class Dropout(Record):
    """A site that dropped out of one round, and why."""

    round: int = kinds.count()
    site: str
    reason: str = kinds.part(missing="")


# ---------------------------------------------------------------------------- evaluation
@dataclass(frozen=True, kw_only=True)
class Evaluation(Record):
    """The figures of a trained federation on its sites' test scans: per site, across sites
    (``federation``: centred on the worst site), and as a new patient meets it (system
    accuracy, by router).

    ``routing_method`` is the router that answers by default. Two protocols: ``routers`` answer
    a scan whose origin is unknown (each candidate site sees it under its own normalization);
    ``routers_origin_known`` answer it normalized with its own site's statistics, as a member
    hospital's archived scan would be (FedDRM still routes). ``pooled_auc`` is the
    random-effects pool of the sites' AUCs with its heterogeneity, ``cross_site[model][data]``
    every site's model on every site's test scans, and ``system_by_site[protocol][data]`` the
    accuracy of the routed system (the default router) on each site's test scans, under
    ``origin_unknown`` and ``origin_known``. ``routing_calibration``: how well the routing
    posterior's probability of the chosen site matches how often it is right (ECE, Brier score,
    reliability curve, the temperature it was taken at), on the pooled test scans (origin
    unknown); ``routing_calibration_uncalibrated`` the same at temperature 1.
    """

    WHERE = "evaluation"

    sites: dict[str, SiteFigures]
    # Written flat, as summary.json always held these figures: its keys beside the others,
    # average_accuracy_by_train (added later) after the routers.
    federation: FederationMetrics = kinds.part(
        flatten=True, after={"average_accuracy_by_train": "routers"}
    )
    routing_method: str
    system_accuracy: float | None = kinds.rate()
    routing_accuracy: float | None = kinds.rate()
    abstain_rate: float | None = kinds.rate(None)
    routers: dict[str, RouterFigures] = field(default_factory=dict)
    pooled_auc: Pooled | None = None
    worst_site_auc_ci: Interval | None = None
    cross_site: dict[str, dict[str, CrossSiteCell]] = field(default_factory=dict)
    routers_origin_known: dict[str, RouterFigures] = field(default_factory=dict)
    system_by_site: dict[str, dict[str, Proportion]] = field(default_factory=dict)
    # Each site's accuracy at its operating point (SiteFigures.operating_accuracy), weighted by
    # test scans or by training scans: the rule system accuracy is taken at. Added later: a
    # run written before them reads them from its sites' operating points.
    average_accuracy_operating: float | None = kinds.rate(None)
    average_accuracy_operating_by_train: float | None = kinds.rate(None)
    # Added later (absent from older runs): the default router's P(site | scan) on the pooled
    # test scans (origin unknown), as routed and at temperature 1.
    routing_calibration: RoutingCalibration | None = kinds.part(None, omit_none=True)
    routing_calibration_uncalibrated: RoutingCalibration | None = kinds.part(None, omit_none=True)
    # Tasks with more than two classes only: the quadratic weighted kappa of the routed
    # system's grades on the pooled test scans (origin unknown), with a patient bootstrap CI.
    system_kappa: MulticlassFigure | None = kinds.part(None, omit_none=True)
    # Added later: the figures a site's policy kept from leaving (outputs.min_count), as
    # "site: figure" -> why; they are left out of the pooled figures.
    suppressed: dict[str, str] | None = kinds.part(None, omit_none=True)
    # Added later: where the per-scan test predictions are: "run" (the run's predictions.csv)
    # or "sites" (each site's own state folder: a deployed run's default).
    predictions: str | None = kinds.part(None, omit_none=True)

    def __post_init__(self) -> None:
        if self.sites and self.average_accuracy_operating is None:
            object.__setattr__(
                self, "average_accuracy_operating", _operating_average(self, "n_test")
            )
        if self.sites and self.average_accuracy_operating_by_train is None:
            by_train = _operating_average(self, "n_train")
            object.__setattr__(self, "average_accuracy_operating_by_train", by_train)

    def field_values(self) -> dict[str, Any]:
        """The evaluation's fields as they are (typed), to build a :class:`Summary` from."""
        return {f.name: getattr(self, f.name) for f in fields(Evaluation)}


def _operating_average(evaluation: Evaluation, weight: str) -> float | None:
    sites = evaluation.sites.values()
    if not all(isinstance(m, SiteFigures) for m in sites):
        return None
    total = sum(getattr(m, weight) for m in sites)
    if not total:
        return None
    return sum(m.operating_accuracy * getattr(m, weight) for m in sites) / total


# ---------------------------------------------------------------------------- per-scan predictions
PREDICTION_COLUMNS: tuple[str, ...] = (
    "site",
    "scan_id",
    "patient_id",
    "label",
    "score",
    "prediction",
    "routed_site",
    "abstained",
    "system_prediction",
    "routed_site_origin_known",
    "system_prediction_origin_known",
)
"""Columns of ``predictions.csv``: one row per test scan. ``score`` is P(positive) from the
scan's own site model (empty for more than two classes), ``prediction`` that model's answer at
its operating point; the routed columns are the default router's, under each protocol:
``routed_site`` is the best site, abstention aside (routing accuracy counts it), and
``abstained`` says whether the router abstained (then the answer is not to be relied on)."""


def prediction_row(raw: Mapping[str, str], where: str) -> dict[str, Any]:
    """One ``predictions.csv`` row with its types back (empty cells are None)."""
    missing = [c for c in PREDICTION_COLUMNS if c not in raw]
    if missing:
        raise RunDirError(f"{where}: missing column(s) {', '.join(missing)}; {REDO}")
    row: dict[str, Any] = {c: (raw[c] if raw[c] != "" else None) for c in PREDICTION_COLUMNS}
    try:
        for key in ("label", "prediction", "system_prediction", "system_prediction_origin_known"):
            row[key] = int(row[key])
        row["score"] = None if row["score"] is None else float(row["score"])
        if row["abstained"] not in ("true", "false"):
            raise ValueError(f"abstained is {row['abstained']!r}, not true or false")
        row["abstained"] = row["abstained"] == "true"
    except (TypeError, ValueError) as exc:
        raise RunDirError(f"{where}: {exc}; {REDO}") from None
    if row["score"] is not None and not 0.0 <= row["score"] <= 1.0:
        raise RunDirError(f"{where}: score {row['score']} is not a probability; {REDO}")
    return row


# ---------------------------------------------------------------------------- round records
RoundStatus = Literal["ok", "dropped", "not_sampled"]
OK: RoundStatus = "ok"
DROPPED: RoundStatus = "dropped"
NOT_SAMPLED: RoundStatus = "not_sampled"


@dataclass(frozen=True, kw_only=True)
class Validation(Record):
    """A site's model on its validation split after a round (``val_*`` in metrics.jsonl)."""

    loss: float = kinds.raw()
    auc: float | None = kinds.raw(None)  # None: undefined on this split (one class)
    accuracy: float = kinds.raw()
    # Site recognition, where the model has a client head.
    client_accuracy: float | None = kinds.raw(None, omit_none=True)


@dataclass(frozen=True, kw_only=True)
class RoundRecord(Record):
    """One site's part of one round: one line of metrics.jsonl.

    Written flat, as ``{"round": 3, "site": "acrima", "train_loss": 0.4, "val_auc": 0.8, ...}``.
    Figures an algorithm adds (FedGMI's ``train_mixture_0``, Ditto's ``train_global_loss``)
    live in ``extra`` and are written beside the others.
    """

    WHERE = "round record"

    round: int = kinds.count()
    site: str
    status: str  # RoundStatus; read as text so a new status never makes old files unreadable
    lr: float | None = kinds.raw(None, omit_none=True)
    reason: str | None = kinds.part(None, omit_none=True)
    train_loss: float | None = kinds.raw(None, omit_none=True)
    bytes_up: int | None = kinds.count(None, omit_none=True)
    bytes_down: int | None = kinds.count(None, omit_none=True)
    bytes_eval: int | None = kinds.count(None, omit_none=True)
    keys_sent: int | None = kinds.count(None, omit_none=True)
    seconds: float | None = kinds.amount(None, omit_none=True)
    round_seconds: float | None = kinds.amount(None, omit_none=True)
    aggregated: bool | None = kinds.part(None, omit_none=True)
    validation: Validation | None = kinds.part(None, flatten=True, prefix="val_")
    extra: dict[str, float] = kinds.raw(
        rest=True, expected="a number (an algorithm's figure)", default_factory=dict
    )

    def __post_init__(self) -> None:
        clash = set(self.extra) & keys_of(RoundRecord)
        if clash:
            raise ValueError(f"RoundRecord.extra repeats the record's own fields {sorted(clash)}")

    @property
    def bytes_exchanged(self) -> int:
        """Update bytes sent and received this round (0 when the site exchanged nothing)."""
        return (self.bytes_up or 0) + (self.bytes_down or 0)

    def extras(self, prefix: str) -> dict[str, float]:
        """The algorithm's figures whose names start with ``prefix``, the prefix cut off."""
        return {k[len(prefix) :]: v for k, v in sorted(self.extra.items()) if k.startswith(prefix)}

    @classmethod
    def of(
        cls, record: RoundRecord | Mapping[str, Any], where: str = "round record"
    ) -> RoundRecord:
        """``record`` itself, or the record a plain dict describes (validated)."""
        return record if isinstance(record, RoundRecord) else cls.from_dict(record, where)


# ---------------------------------------------------------------------------- what a run cost
@dataclass(frozen=True, kw_only=True)
class RunCosts:
    """What the rounds cost, from metrics.jsonl: bytes, seconds, dropouts, skipped rounds."""

    bytes_per_round: float
    bytes_per_round_by_site: dict[str, SiteTraffic]
    seconds_per_round: float | None
    seconds_total: float | None
    dropouts: int
    dropped: list[Dropout]
    skipped_rounds: list[int]

    @classmethod
    def of(cls, records: Iterable[RoundRecord], sites: Iterable[str]) -> RunCosts:
        """Per round: bytes summed over sites, seconds as recorded; per site: mean per round."""
        records = list(records)
        rounds: dict[int, list[RoundRecord]] = {}
        for r in records:
            rounds.setdefault(r.round, []).append(r)
        per_round = [sum(r.bytes_exchanged for r in rs) for rs in rounds.values()]
        seconds = [rs[0].round_seconds for rs in rounds.values() if rs[0].round_seconds is not None]
        n = max(1, len(rounds))
        dropped = [Dropout(r.round, r.site, r.reason or "") for r in records if r.status == DROPPED]
        return cls(
            bytes_per_round=sum(per_round) / len(per_round) if per_round else 0.0,
            bytes_per_round_by_site={
                site: SiteTraffic(
                    up=sum(r.bytes_up or 0 for r in records if r.site == site) / n,
                    down=sum(r.bytes_down or 0 for r in records if r.site == site) / n,
                )
                for site in sites
            },
            seconds_per_round=sum(seconds) / len(seconds) if seconds else None,
            seconds_total=math.fsum(seconds) if seconds else None,
            dropouts=len(dropped),
            dropped=dropped,
            skipped_rounds=sorted({r.round for r in records if r.aggregated is False}),
        )

    def field_values(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(RunCosts)}


# ---------------------------------------------------------------------------- summary.json
@dataclass(frozen=True, kw_only=True)
class RunSettings(Record):
    """What was trained: the head of summary.json."""

    algorithm: str
    params: dict[str, Any]
    rounds: int = kinds.count()
    local_steps: int = kinds.count()
    seed: int = kinds.whole()
    backbone: str
    modality: str
    device: str


@dataclass(frozen=True, kw_only=True)
class Summary(Evaluation, RunSettings):
    """summary.json: what was trained (:class:`RunSettings`), how it did (:class:`Evaluation`),
    and what it cost.

    ``engine`` and ``lost_sites`` are written by a Flower deployment only (sites that left
    before publishing their final model, with the reason).
    """

    WHERE = "summary.json"

    priors: dict[str, float] = kinds.rate()
    bytes_per_round: float = kinds.amount()
    bytes_per_round_by_site: dict[str, SiteTraffic] = field(default_factory=dict)
    seconds_per_round: float | None = kinds.amount()
    seconds_total: float | None = kinds.amount()
    dropouts: int = kinds.count()
    dropped: list[Dropout]
    skipped_rounds: list[int] = kinds.count(
        default_factory=list, expected="a list of round numbers"
    )
    resumes: int = kinds.count()
    normalization: str = "site"
    augment: str = "flip"
    operating_rule: str | None = None
    wire: WireSettings | None = kinds.part(None, omit_none=True)
    engine: str | None = kinds.part(None, omit_none=True)
    lost_sites: dict[str, str] | None = kinds.part(None, omit_none=True)
    # Per site, for a differentially private run.
    privacy: dict[str, PrivacySpent] | None = kinds.part(
        None, omit_none=True, expected="an object of sites"
    )

    @property
    def protocol(self) -> str:
        """How a scan of unknown origin is normalized for this run's models, in words."""
        if self.normalization == "federation":
            return "federation-wide normalization"
        return "each site's own normalization"

    @classmethod
    def build(cls, evaluation: Evaluation, costs: RunCosts, **run: Any) -> Summary:
        """The summary of a finished run: its evaluation, its costs and the run's settings."""
        return cls(**evaluation.field_values(), **costs.field_values(), **run)

    @property
    def evaluation(self) -> Evaluation:
        return Evaluation(**self.field_values())

    def __or__(self, other: Mapping[str, Any]) -> Summary:
        """``summary | {"engine": "flower"}``: a copy with those fields changed (as for a dict).

        Prefer ``dataclasses.replace``; this keeps code written for dict summaries working.
        """
        names = {f.name for f in fields(self)}
        unknown = set(other) - names
        if unknown:
            raise TypeError(f"Summary has no field(s) {sorted(unknown)}")
        return replace(self, **other)


# ---------------------------------------------------------------------------- statistics.json
STATISTICS_FILE = "statistics.json"
"""A statistics-only run's file in its run directory (:class:`FederationStatistics`)."""


@dataclass(frozen=True, kw_only=True)
class ClassShare(Record):
    """A class's share of a site's scans from the released counts, with its Wilson 95% CI."""

    WHERE = "statistics.json prevalence"

    k: int = kinds.count()
    n: int = kinds.count()
    estimate: float | None = kinds.rate(None)
    low: float | None = kinds.rate(None)
    high: float | None = kinds.rate(None)


@dataclass(frozen=True, kw_only=True)
class Histogram(Record):
    """Intensity histogram per channel on fixed bins: scans' worth of pixels per bin (None:
    suppressed)."""

    WHERE = "statistics.json histogram"

    unit: str
    edges: list[float] = kinds.figure()
    counts: list[list[float | None]] = kinds.amount()


@dataclass(frozen=True, kw_only=True)
class CountNoise(Record):
    """The differential-privacy noise a site added to every count it released."""

    WHERE = "statistics.json noise"

    mechanism: Literal["laplace", "gaussian"]
    epsilon: float = kinds.amount()
    delta: float = kinds.rate()
    scale: float = kinds.amount()
    tables: int = kinds.count()
    clipped: int = kinds.count()


@dataclass(frozen=True, kw_only=True)
class SiteStatistics(Record):
    """One site in a statistics run: what it released, or why it did not (``status``:
    ``released``, ``refused`` by its policy with the broken rules, or ``failed`` with a reason).

    Counts are None where suppressed (fewer than ``min_count`` scans); an image size or device
    on too few scans is left out, and ``suppressed`` counts the cells of each table."""

    WHERE = "statistics.json site"

    status: Literal["released", "refused", "failed"]
    reason: str | None = None
    refusals: list[dict[str, str]] = field(default_factory=list)
    modality: str = ""
    min_count: int = kinds.count(0)
    counts: dict[str, dict[str, float | None]] = kinds.amount(default_factory=dict)
    prevalence: dict[str, ClassShare | None] = field(default_factory=dict)
    sizes: dict[str, float] = kinds.amount(default_factory=dict)
    histogram: Histogram | None = None
    acquisition: dict[str, dict[str, float]] = kinds.amount(default_factory=dict)
    suppressed: dict[str, int] = kinds.count(default_factory=dict)
    noise: CountNoise | None = None


@dataclass(frozen=True, kw_only=True)
class FederationStatistics(Record):
    """statistics.json: a statistics-only run's overview of the federation (no training)."""

    WHERE = STATISTICS_FILE

    run_name: str
    plan_sha256: str
    engine: str
    time: float = kinds.amount()
    min_count: int = kinds.count()
    noise: str
    epsilon: float = kinds.amount()
    delta: float = kinds.rate()
    sites: dict[str, SiteStatistics]
