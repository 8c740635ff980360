"""What a run directory holds, as types: the one definition every reader and writer shares.

``summary.json`` is a :class:`Summary` (an :class:`Evaluation` of the trained federation plus
what the run was and what it cost), each line of ``metrics.jsonl`` a :class:`RoundRecord`.
Every JSON, JSONL and TOML file of a run carries ``schema_version``; :class:`RunDir` adds it on
write and checks it on read (:func:`check_version`), so a reader meets a newer file with a clear
message instead of a ``KeyError``. A file without ``schema_version`` predates versioning and
reads as version 1.

Version 1 fields: those medfed has written since its first release are required; those added
later (ROC points, router figures, traffic per site, the wire format, skipped rounds, the engine)
have defaults, so every version-1 file still reads. Unknown keys are ignored, except in round
records, where a numeric one is an algorithm's own figure (:attr:`RoundRecord.extra`).

No torch here (and nothing that imports it): the dashboard and the report tables read runs
without loading the training code.
"""

from __future__ import annotations

import math
from collections.abc import ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from medfed.errors import RunDirError
from medfed.metrics import Calibration, Interval, OperatingPoint, Pooled, Proportion
from medfed.versions import REDO, VERSION_KEY

_REQUIRED: Any = object()


# ---------------------------------------------------------------------------- reading helpers
def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class Kind:
    """What a figure of a run file may hold: every number read from one is checked against its
    kind (a rate between 0 and 1, a count, an amount of bytes or seconds, ...), so a NaN, an
    infinity, a negative count or an AUC of 7.5 is refused by name instead of printed."""

    expected: str
    whole: bool = False
    low: float | None = None
    high: float | None = None
    finite: bool = True

    def accepts(self, value: Any) -> bool:
        if not _is_number(value) or (self.whole and not isinstance(value, int)):
            return False
        if self.finite and not math.isfinite(value):
            return False
        if self.low is not None and not value >= self.low:
            return False
        return self.high is None or value <= self.high


FIGURE = Kind("a finite number")
"""Any finite number (a threshold, a seed-free statistic)."""
RAW = Kind("a number", finite=False)
"""Any number, NaN included (a training loss as recorded)."""
RATE = Kind("a number from 0 to 1", low=0.0, high=1.0)
"""A probability, AUC, accuracy or other rate."""
AMOUNT = Kind("a finite number, 0 or more", low=0.0)
"""Bytes, seconds, milliseconds, a standard deviation."""
WHOLE = Kind("a whole number", whole=True)
"""A round number, a seed."""
COUNT = Kind("a whole number, 0 or more", whole=True, low=0)
"""Scans, sites, rounds, passes."""


def _finite_tree(value: Any) -> str | None:
    """The path (``.a.b``) to the first NaN or infinity inside a JSON value, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return ""
    if isinstance(value, Mapping):
        items: Iterable[tuple[Any, Any]] = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        inner = _finite_tree(item)
        if inner is not None:
            return f".{key}{inner}"
    return None


class _Fields:
    """Typed reads from one JSON object; every error names the file and the field."""

    def __init__(self, data: Any, where: str, path: str = "") -> None:
        if not isinstance(data, Mapping):
            what = f"field {path.rstrip('.')!r}" if path else "the record"
            got = _kind(data)
            raise RunDirError(f"{where}: {what} should be a JSON object, got {got}; {REDO}")
        self.data, self.where, self.path = data, where, path

    def _raw(self, key: str, default: Any) -> Any:
        if key in self.data:
            return self.data[key]
        if default is _REQUIRED:
            raise RunDirError(f"{self.where}: missing required field {self.path + key!r}; {REDO}")
        return default

    def bad(self, key: str, expected: str, value: Any) -> RunDirError:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return RunDirError(
            f"{self.where}: field {self.path + key!r} should be {expected}, got {shown}; {REDO}"
        )

    def text(self, key: str, default: Any = _REQUIRED) -> str:
        value = self._raw(key, default)
        if not isinstance(value, str):
            raise self.bad(key, "text", value)
        return value

    def opt_text(self, key: str, default: Any = None) -> str | None:
        value = self._raw(key, default)
        if value is not None and not isinstance(value, str):
            raise self.bad(key, "text or null", value)
        return value

    def integer(self, key: str, default: Any = _REQUIRED, kind: Kind = WHOLE) -> int:
        value = self._raw(key, default)
        if not kind.accepts(value):
            raise self.bad(key, kind.expected, value)
        return int(value)

    def opt_integer(self, key: str, default: Any = None, kind: Kind = WHOLE) -> int | None:
        value = self._raw(key, default)
        if value is not None and not kind.accepts(value):
            raise self.bad(key, f"{kind.expected}, or null", value)
        return None if value is None else int(value)

    def number(self, key: str, default: Any = _REQUIRED, kind: Kind = FIGURE) -> float:
        value = self._raw(key, default)
        if not kind.accepts(value):
            raise self.bad(key, kind.expected, value)
        return float(value)

    def opt_number(self, key: str, default: Any = None, kind: Kind = FIGURE) -> float | None:
        value = self._raw(key, default)
        if value is not None and not kind.accepts(value):
            raise self.bad(key, f"{kind.expected}, or null", value)
        return None if value is None else float(value)

    def flag(self, key: str, default: Any = _REQUIRED) -> bool:
        value = self._raw(key, default)
        if not isinstance(value, bool):
            raise self.bad(key, "true or false", value)
        return value

    def opt_flag(self, key: str, default: Any = None) -> bool | None:
        value = self._raw(key, default)
        if value is not None and not isinstance(value, bool):
            raise self.bad(key, "true, false or null", value)
        return value

    def obj(self, key: str, default: Any = _REQUIRED) -> dict[str, Any]:
        value = self._raw(key, default)
        if not isinstance(value, Mapping):
            raise self.bad(key, "a JSON object", value)
        return dict(value)

    def numbers(self, key: str, default: Any = _REQUIRED, kind: Kind = FIGURE) -> dict[str, float]:
        """A JSON object of numbers (site id -> share, ...)."""
        values = self.obj(key, default)
        for name, value in values.items():
            if not kind.accepts(value):
                raise self.bad(f"{key}.{name}", kind.expected, value)
        return {name: float(value) for name, value in values.items()}

    def texts(self, key: str, default: Any = _REQUIRED) -> dict[str, str]:
        values = self.obj(key, default)
        for name, value in values.items():
            if not isinstance(value, str):
                raise self.bad(f"{key}.{name}", "text", value)
        return values

    def array(self, key: str, default: Any = _REQUIRED) -> list[Any]:
        value = self._raw(key, default)
        if not isinstance(value, list):
            raise self.bad(key, "a list", value)
        return value

    def typed(self, key: str, cls: Any) -> Any:
        """An optional nested figure (an Interval, an OperatingPoint, ...) read by its own
        ``from_dict``; a malformed one is named by its key."""
        value = self.data.get(key)
        if value is None:
            return None
        inner = _finite_tree(value)
        if inner is not None:
            raise self.bad(key + inner, "a finite number", _at(value, inner))
        try:
            return cls.from_dict(value)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise self.bad(key, f"{cls.__name__} figures ({exc})", value) from None

    def number_list(
        self, key: str, *, nulls: bool = False, kind: Kind = FIGURE
    ) -> list[Any] | None:
        """A list of numbers (``nulls``: null entries allowed), or null."""
        value = self._raw(key, None)
        if value is None:
            return None
        if not isinstance(value, list):
            raise self.bad(key, "a list of numbers or null", value)
        for k, item in enumerate(value):
            if not (kind.accepts(item) or (nulls and item is None)):
                raise self.bad(f"{key}.{k}", kind.expected, item)
        return [None if v is None else float(v) for v in value]


def _at(value: Any, path: str) -> Any:
    """The item of ``value`` at ``path`` as :func:`_finite_tree` gives it (``.a.0``)."""
    for part in path.split(".")[1:]:
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


class _JsonView:
    """Read-only access as the JSON file reads (``summary["sites"]["a"]["auc"]``, ``.items()``),
    for scripts and tests that compare against summary.json; library code reads attributes.
    Nothing written through it reaches the object (each read is a copy).
    """

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def __contains__(self, key: object) -> bool:
        return key in self.to_dict()

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())

    def get(self, key: str, default: Any = None) -> Any:
        return self.to_dict().get(key, default)

    def keys(self) -> KeysView[str]:
        return self.to_dict().keys()

    def items(self) -> ItemsView[str, Any]:
        return self.to_dict().items()

    def values(self) -> ValuesView[Any]:
        return self.to_dict().values()


# ---------------------------------------------------------------------------- summary parts
@dataclass(frozen=True)
class RocPoints(_JsonView):
    """One site's test ROC curve, or the reason it has none (one class, more than two)."""

    fpr: list[float] | None
    tpr: list[float] | None
    thresholds: list[float | None] | None
    reason: str | None = None

    @property
    def drawable(self) -> bool:
        return bool(self.fpr) and bool(self.tpr)

    def to_dict(self) -> dict[str, Any]:
        return {
            "fpr": self.fpr,
            "tpr": self.tpr,
            "thresholds": self.thresholds,
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "roc", path: str = "") -> RocPoints:
        f = _Fields(data, where, path)
        return cls(
            fpr=f.number_list("fpr", kind=RATE),
            tpr=f.number_list("tpr", kind=RATE),
            thresholds=f.number_list("thresholds", nulls=True),
            reason=f.opt_text("reason"),
        )


@dataclass(frozen=True)
class SiteFigures(_JsonView):
    """One site's model on its own test scans; ``auc`` is None exactly when ``auc_reason`` says
    why (a test split with one class has no AUC).

    For a two-class task: ``n_pos`` / ``n_neg`` count the test split's classes, ``auc_ci`` is the
    AUC's 95% CI (its method named in it), ``unreliable`` says why a figure rests on too few
    positives or negatives (fewer than 10), ``operating_point`` holds sensitivity, specificity,
    PPV and NPV at the threshold chosen on the site's validation split, and ``calibration`` the
    Brier score, ECE, calibration intercept and slope and the reliability-diagram points.
    """

    auc: float | None
    auc_reason: str | None
    accuracy: float
    balanced_accuracy: float
    n_test: int
    n_train: int
    n_val: int
    roc: RocPoints | None = None
    n_pos: int | None = None
    n_neg: int | None = None
    auc_ci: Interval | None = None
    unreliable: str | None = None
    operating_point: OperatingPoint | None = None
    calibration: Calibration | None = None

    def to_dict(self) -> dict[str, Any]:
        data = {
            "auc": self.auc,
            "auc_reason": self.auc_reason,
            "accuracy": self.accuracy,
            "balanced_accuracy": self.balanced_accuracy,
            "n_test": self.n_test,
            "n_train": self.n_train,
            "n_val": self.n_val,
            "n_pos": self.n_pos,
            "n_neg": self.n_neg,
            "unreliable": self.unreliable,
            **({} if self.roc is None else {"roc": self.roc.to_dict()}),
        }
        for key in ("auc_ci", "operating_point", "calibration"):
            value = getattr(self, key)
            data[key] = None if value is None else value.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Any, where: str = "site figures", path: str = "") -> SiteFigures:
        f = _Fields(data, where, path)
        roc = f.data.get("roc")
        return cls(
            auc=f.opt_number("auc", _REQUIRED, RATE),
            auc_reason=f.opt_text("auc_reason", _REQUIRED),
            accuracy=f.number("accuracy", kind=RATE),
            balanced_accuracy=f.number("balanced_accuracy", kind=RATE),
            n_test=f.integer("n_test", kind=COUNT),
            n_train=f.integer("n_train", kind=COUNT),
            n_val=f.integer("n_val", kind=COUNT),
            roc=None if roc is None else RocPoints.from_dict(roc, where, f"{path}roc."),
            n_pos=f.opt_integer("n_pos", kind=COUNT),
            n_neg=f.opt_integer("n_neg", kind=COUNT),
            auc_ci=f.typed("auc_ci", Interval),
            unreliable=f.opt_text("unreliable"),
            operating_point=f.typed("operating_point", OperatingPoint),
            calibration=f.typed("calibration", Calibration),
        )


@dataclass(frozen=True)
class CrossSiteCell(_JsonView):
    """One site's model on another site's test scans (a cell of the cross-site matrix)."""

    auc: float | None
    auc_reason: str | None
    accuracy: float
    n: int

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Any, where: str = "cross-site cell", path: str = "") -> CrossSiteCell:
        f = _Fields(data, where, path)
        return cls(
            auc=f.opt_number("auc", _REQUIRED, RATE),
            auc_reason=f.opt_text("auc_reason", _REQUIRED),
            accuracy=f.number("accuracy", kind=RATE),
            n=f.integer("n", kind=COUNT),
        )


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
class RouterFigures(_JsonView):
    """One router on every site's test scans pooled (a new patient's view of the federation).

    ``routing_accuracy`` is None for a majority vote (it sends no scan anywhere);
    ``answered_accuracy`` counts only the scans it did not abstain on. ``rates`` gives each of
    :data:`ROUTER_RATES` with its counts and 95% CI; ``sensitivity`` and ``specificity`` are
    over the answered scans, each decided at the answering site's operating point.
    """

    system_accuracy: float | None
    routing_accuracy: float | None
    abstain_rate: float | None
    answered_accuracy: float | None
    forward_passes: int
    latency_ms_per_scan: float
    n_pooled: int
    rates: dict[str, Proportion] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "rates"}
        data["rates"] = {k: p.to_dict() for k, p in self.rates.items()}
        return data

    @classmethod
    def from_dict(cls, data: Any, where: str = "router figures", path: str = "") -> RouterFigures:
        f = _Fields(data, where, path)
        rates = _Fields(f.obj("rates", {}), where, f"{path}rates.")
        return cls(
            system_accuracy=f.opt_number("system_accuracy", _REQUIRED, RATE),
            routing_accuracy=f.opt_number("routing_accuracy", _REQUIRED, RATE),
            abstain_rate=f.opt_number("abstain_rate", _REQUIRED, RATE),
            answered_accuracy=f.opt_number("answered_accuracy", _REQUIRED, RATE),
            forward_passes=f.integer("forward_passes", kind=COUNT),
            latency_ms_per_scan=f.number("latency_ms_per_scan", kind=AMOUNT),
            n_pooled=f.integer("n_pooled", kind=COUNT),
            rates={k: rates.typed(k, Proportion) for k in rates.data if rates.data[k] is not None},
        )


@dataclass(frozen=True)
class SiteTraffic(_JsonView):
    """Bytes one site sent (``up``) and received (``down``), per round on average."""

    up: float
    down: float

    def to_dict(self) -> dict[str, Any]:
        return {"up": self.up, "down": self.down}


@dataclass(frozen=True)
class PrivacySpent(_JsonView):
    """One site's differential privacy: the epsilon it spent at its delta over ``steps`` DP-SGD
    steps, and the mechanism (noise multiplier, Poisson sampling rate, clip, accountant)."""

    epsilon: float
    delta: float
    budget: float | None
    noise_multiplier: float
    sample_rate: float
    clip: float
    steps: int
    planned_steps: int
    accountant: str
    # The round in which the site stopped training because its budget was spent (rounds + 1:
    # it skipped its fine-tuning); None: it never stopped.
    stopped_round: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "budget": self.budget,
            "noise_multiplier": self.noise_multiplier,
            "sample_rate": self.sample_rate,
            "clip": self.clip,
            "steps": self.steps,
            "planned_steps": self.planned_steps,
            "accountant": self.accountant,
            "stopped_round": self.stopped_round,
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "summary.json", prefix: str = "") -> PrivacySpent:
        f = _Fields(data, where, prefix)
        return cls(
            epsilon=f.number("epsilon", kind=AMOUNT),
            delta=f.number("delta", kind=RATE),
            budget=f.opt_number("budget", None, AMOUNT),
            noise_multiplier=f.number("noise_multiplier", kind=AMOUNT),
            sample_rate=f.number("sample_rate", kind=RATE),
            clip=f.number("clip", kind=AMOUNT),
            steps=f.integer("steps", kind=COUNT),
            planned_steps=f.integer("planned_steps", kind=COUNT),
            accountant=f.text("accountant"),
            stopped_round=f.opt_integer("stopped_round", None, COUNT),
        )


@dataclass(frozen=True)
class WireSettings(_JsonView):
    """How updates were encoded on the wire."""

    precision: str
    delta: bool

    @property
    def label(self) -> str:
        return self.precision + (" + delta" if self.delta else "")

    def to_dict(self) -> dict[str, Any]:
        return {"precision": self.precision, "delta": self.delta}


@dataclass(frozen=True)
class Dropout(_JsonView):
    """A site that dropped out of one round, and why."""

    round: int
    site: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"round": self.round, "site": self.site, "reason": self.reason}


# ---------------------------------------------------------------------------- evaluation
@dataclass(frozen=True, kw_only=True)
class Evaluation(_JsonView):
    """The figures of a trained federation on its sites' test scans: per site, across sites
    (centred on the worst site), and as a new patient meets it (system accuracy, by router).

    The AUC figures over sites leave out sites without an AUC (``sites_without_auc``) and are
    None when no site has one. ``routing_method`` is the router that answers by default.
    ``average_accuracy`` weights sites by their test scans, ``average_accuracy_by_train`` by
    their training scans (the FedDRM reference code's weighting).

    Two protocols: ``routers`` answer a scan whose origin is unknown (each candidate site sees
    it under its own normalization); ``routers_origin_known`` answer it normalized with its own
    site's statistics, as a member hospital's archived scan would be (FedDRM still routes).
    ``pooled_auc`` is the random-effects pool of the sites' AUCs with its heterogeneity,
    ``cross_site[model][data]`` every site's model on every site's test scans, and
    ``system_by_site[protocol][data]`` the accuracy of the routed system (the default router)
    on each site's test scans, under ``origin_unknown`` and ``origin_known``.
    """

    sites: dict[str, SiteFigures]
    n_sites: int
    mean_site_auc: float | None
    worst_site_auc: float | None
    worst_site: str | None
    best_site_auc: float | None
    best_site: str | None
    auc_std: float | None
    worst10_auc: float | None
    auc_gini: float | None
    average_accuracy: float
    mean_accuracy: float
    accuracy_std: float
    sites_without_auc: list[str]
    routing_method: str
    system_accuracy: float | None
    routing_accuracy: float | None
    abstain_rate: float | None = None
    routers: dict[str, RouterFigures] = field(default_factory=dict)
    average_accuracy_by_train: float | None = None
    pooled_auc: Pooled | None = None
    worst_site_auc_ci: Interval | None = None
    cross_site: dict[str, dict[str, CrossSiteCell]] = field(default_factory=dict)
    routers_origin_known: dict[str, RouterFigures] = field(default_factory=dict)
    system_by_site: dict[str, dict[str, Proportion]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return _evaluation_dict(self)

    @classmethod
    def from_dict(cls, data: Any, where: str = "evaluation") -> Evaluation:
        return cls(**_evaluation_fields(_Fields(data, where)))

    def field_values(self) -> dict[str, Any]:
        """The evaluation's fields as they are (typed), to build a :class:`Summary` from."""
        return {f.name: getattr(self, f.name) for f in fields(Evaluation)}


def _evaluation_dict(e: Evaluation) -> dict[str, Any]:
    return {
        "sites": {s: figures.to_dict() for s, figures in e.sites.items()},
        "n_sites": e.n_sites,
        "mean_site_auc": e.mean_site_auc,
        "worst_site_auc": e.worst_site_auc,
        "worst_site": e.worst_site,
        "best_site_auc": e.best_site_auc,
        "best_site": e.best_site,
        "auc_std": e.auc_std,
        "worst10_auc": e.worst10_auc,
        "auc_gini": e.auc_gini,
        "average_accuracy": e.average_accuracy,
        "mean_accuracy": e.mean_accuracy,
        "accuracy_std": e.accuracy_std,
        "sites_without_auc": list(e.sites_without_auc),
        "routing_method": e.routing_method,
        "system_accuracy": e.system_accuracy,
        "routing_accuracy": e.routing_accuracy,
        "abstain_rate": e.abstain_rate,
        "routers": {name: r.to_dict() for name, r in e.routers.items()},
        "average_accuracy_by_train": e.average_accuracy_by_train,
        "pooled_auc": None if e.pooled_auc is None else e.pooled_auc.to_dict(),
        "worst_site_auc_ci": None if e.worst_site_auc_ci is None else e.worst_site_auc_ci.to_dict(),
        "cross_site": {
            m: {d: cell.to_dict() for d, cell in row.items()} for m, row in e.cross_site.items()
        },
        "routers_origin_known": {name: r.to_dict() for name, r in e.routers_origin_known.items()},
        "system_by_site": {
            protocol: {site: rate.to_dict() for site, rate in by_site.items()}
            for protocol, by_site in e.system_by_site.items()
        },
    }


def _evaluation_fields(f: _Fields) -> dict[str, Any]:
    sites = f.obj("sites")
    routers = f.obj("routers", {})
    known = f.obj("routers_origin_known", {})
    cross = f.obj("cross_site", {})
    by_site = f.obj("system_by_site", {})
    without = f.array("sites_without_auc")
    if not all(isinstance(s, str) for s in without):
        raise f.bad("sites_without_auc", "a list of site ids", without)
    return {
        "sites": {
            s: SiteFigures.from_dict(sites[s], f.where, f"{f.path}sites.{s}.") for s in sites
        },
        "n_sites": f.integer("n_sites", kind=COUNT),
        "mean_site_auc": f.opt_number("mean_site_auc", _REQUIRED, RATE),
        "worst_site_auc": f.opt_number("worst_site_auc", _REQUIRED, RATE),
        "worst_site": f.opt_text("worst_site", _REQUIRED),
        "best_site_auc": f.opt_number("best_site_auc", _REQUIRED, RATE),
        "best_site": f.opt_text("best_site", _REQUIRED),
        "auc_std": f.opt_number("auc_std", _REQUIRED, AMOUNT),
        "worst10_auc": f.opt_number("worst10_auc", _REQUIRED, RATE),
        "auc_gini": f.opt_number("auc_gini", _REQUIRED, RATE),
        "average_accuracy": f.number("average_accuracy", kind=RATE),
        "mean_accuracy": f.number("mean_accuracy", kind=RATE),
        "accuracy_std": f.number("accuracy_std", kind=AMOUNT),
        "sites_without_auc": list(without),
        "routing_method": f.text("routing_method"),
        "system_accuracy": f.opt_number("system_accuracy", _REQUIRED, RATE),
        "routing_accuracy": f.opt_number("routing_accuracy", _REQUIRED, RATE),
        "abstain_rate": f.opt_number("abstain_rate", kind=RATE),
        "routers": {
            name: RouterFigures.from_dict(routers[name], f.where, f"{f.path}routers.{name}.")
            for name in routers
        },
        "average_accuracy_by_train": f.opt_number("average_accuracy_by_train", kind=RATE),
        "pooled_auc": f.typed("pooled_auc", Pooled),
        "worst_site_auc_ci": f.typed("worst_site_auc_ci", Interval),
        "cross_site": {
            m: {
                d: CrossSiteCell.from_dict(cell, f.where, f"{f.path}cross_site.{m}.{d}.")
                for d, cell in _Fields(row, f.where, f"{f.path}cross_site.{m}.").data.items()
            }
            for m, row in cross.items()
        },
        "routers_origin_known": {
            name: RouterFigures.from_dict(
                known[name], f.where, f"{f.path}routers_origin_known.{name}."
            )
            for name in known
        },
        "system_by_site": {
            protocol: _site_rates(_Fields(rates, f.where, f"{f.path}system_by_site.{protocol}."))
            for protocol, rates in by_site.items()
        },
    }


def _site_rates(f: _Fields) -> dict[str, Proportion]:
    return {site: f.typed(site, Proportion) for site in f.data if f.data[site] is not None}


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


@dataclass(frozen=True)
class Validation(_JsonView):
    """A site's model on its validation split after a round (``val_*`` in metrics.jsonl)."""

    loss: float
    accuracy: float
    auc: float | None = None  # None: undefined on this split (one class)
    client_accuracy: float | None = None  # site recognition, where the model has a client head

    def to_dict(self) -> dict[str, Any]:
        flat: dict[str, Any] = {"val_loss": self.loss, "val_auc": self.auc}
        flat["val_accuracy"] = self.accuracy
        if self.client_accuracy is not None:
            flat["val_client_accuracy"] = self.client_accuracy
        return flat


_VALIDATION_KEYS = ("val_loss", "val_auc", "val_accuracy", "val_client_accuracy")


@dataclass(frozen=True, kw_only=True)
class RoundRecord(_JsonView):
    """One site's part of one round: one line of metrics.jsonl.

    Written flat, as ``{"round": 3, "site": "acrima", "train_loss": 0.4, "val_auc": 0.8, ...}``.
    Figures an algorithm adds (FedGMI's ``train_mixture_0``, Ditto's ``train_global_loss``)
    live in ``extra`` and are written beside the others.
    """

    round: int
    site: str
    status: str  # RoundStatus; read as text so a new status never makes old files unreadable
    lr: float | None = None
    reason: str | None = None
    train_loss: float | None = None
    bytes_up: int | None = None
    bytes_down: int | None = None
    bytes_eval: int | None = None
    keys_sent: int | None = None
    seconds: float | None = None
    round_seconds: float | None = None
    aggregated: bool | None = None
    validation: Validation | None = None
    extra: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        clash = set(self.extra) & _RECORD_KEYS
        if clash:
            raise ValueError(f"RoundRecord.extra repeats the record's own fields {sorted(clash)}")

    @property
    def bytes_exchanged(self) -> int:
        """Update bytes sent and received this round (0 when the site exchanged nothing)."""
        return (self.bytes_up or 0) + (self.bytes_down or 0)

    def extras(self, prefix: str) -> dict[str, float]:
        """The algorithm's figures whose names start with ``prefix``, the prefix cut off."""
        return {k[len(prefix) :]: v for k, v in sorted(self.extra.items()) if k.startswith(prefix)}

    def to_dict(self) -> dict[str, Any]:
        flat: dict[str, Any] = {"round": self.round, "site": self.site, "status": self.status}
        for name in _OPTIONAL_RECORD_FIELDS:
            value = getattr(self, name)
            if value is not None:
                flat[name] = value
        if self.validation is not None:
            flat |= self.validation.to_dict()
        return flat | self.extra

    @classmethod
    def from_dict(cls, data: Any, where: str = "round record") -> RoundRecord:
        f = _Fields(data, where)
        validation = None
        if any(key in f.data for key in _VALIDATION_KEYS):
            validation = Validation(
                loss=f.number("val_loss", kind=RAW),
                accuracy=f.number("val_accuracy", kind=RAW),
                auc=f.opt_number("val_auc", kind=RAW),
                client_accuracy=f.opt_number("val_client_accuracy", kind=RAW),
            )
        extra = {}
        for key, value in f.data.items():
            if key in _RECORD_KEYS or key == VERSION_KEY:
                continue
            if not _is_number(value):
                raise f.bad(key, "a number (an algorithm's figure)", value)
            extra[key] = float(value)
        return cls(
            round=f.integer("round", kind=COUNT),
            site=f.text("site"),
            status=f.text("status"),
            lr=f.opt_number("lr", kind=RAW),
            reason=f.opt_text("reason"),
            train_loss=f.opt_number("train_loss", kind=RAW),
            bytes_up=f.opt_integer("bytes_up", kind=COUNT),
            bytes_down=f.opt_integer("bytes_down", kind=COUNT),
            bytes_eval=f.opt_integer("bytes_eval", kind=COUNT),
            keys_sent=f.opt_integer("keys_sent", kind=COUNT),
            seconds=f.opt_number("seconds", kind=AMOUNT),
            round_seconds=f.opt_number("round_seconds", kind=AMOUNT),
            aggregated=f.opt_flag("aggregated"),
            validation=validation,
            extra=extra,
        )

    @classmethod
    def of(
        cls, record: RoundRecord | Mapping[str, Any], where: str = "round record"
    ) -> RoundRecord:
        """``record`` itself, or the record a plain dict describes (validated)."""
        return record if isinstance(record, RoundRecord) else cls.from_dict(record, where)


_OPTIONAL_RECORD_FIELDS = (
    "lr",
    "reason",
    "train_loss",
    "bytes_up",
    "bytes_down",
    "bytes_eval",
    "keys_sent",
    "seconds",
    "round_seconds",
    "aggregated",
)
_RECORD_KEYS = {"round", "site", "status", *_OPTIONAL_RECORD_FIELDS, *_VALIDATION_KEYS}


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
class Summary(Evaluation):
    """summary.json: what was trained, how it did (:class:`Evaluation`), and what it cost.

    ``engine`` and ``lost_sites`` are written by a Flower deployment only (sites that left
    before publishing their final model, with the reason).
    """

    algorithm: str
    params: dict[str, Any]
    rounds: int
    local_steps: int
    seed: int
    backbone: str
    modality: str
    device: str
    priors: dict[str, float]
    bytes_per_round: float
    seconds_per_round: float | None
    seconds_total: float | None
    dropouts: int
    dropped: list[Dropout]
    resumes: int
    bytes_per_round_by_site: dict[str, SiteTraffic] = field(default_factory=dict)
    wire: WireSettings | None = None
    skipped_rounds: list[int] = field(default_factory=list)
    engine: str | None = None
    lost_sites: dict[str, str] | None = None
    normalization: str = "site"
    augment: str = "flip"
    operating_rule: str | None = None
    privacy: dict[str, PrivacySpent] | None = None  # per site, for a differentially private run

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

    def to_dict(self) -> dict[str, Any]:
        """summary.json's content (without ``schema_version``, which RunDir writes)."""
        data = {
            "algorithm": self.algorithm,
            "params": dict(self.params),
            "rounds": self.rounds,
            "local_steps": self.local_steps,
            "seed": self.seed,
            "backbone": self.backbone,
            "modality": self.modality,
            "device": self.device,
            **_evaluation_dict(self),
            "priors": dict(self.priors),
            "bytes_per_round": self.bytes_per_round,
            "bytes_per_round_by_site": {
                s: t.to_dict() for s, t in self.bytes_per_round_by_site.items()
            },
            "seconds_per_round": self.seconds_per_round,
            "seconds_total": self.seconds_total,
            "dropouts": self.dropouts,
            "dropped": [d.to_dict() for d in self.dropped],
            "skipped_rounds": list(self.skipped_rounds),
            "resumes": self.resumes,
            "normalization": self.normalization,
            "augment": self.augment,
            "operating_rule": self.operating_rule,
        }
        if self.wire is not None:
            data["wire"] = self.wire.to_dict()
        if self.engine is not None:
            data["engine"] = self.engine
        if self.lost_sites is not None:
            data["lost_sites"] = dict(self.lost_sites)
        if self.privacy is not None:
            data["privacy"] = {site: p.to_dict() for site, p in self.privacy.items()}
        return data

    @classmethod
    def from_dict(cls, data: Any, where: str = "summary.json") -> Summary:
        f = _Fields(data, where)
        traffic = f.obj("bytes_per_round_by_site", {})
        wire = f.data.get("wire")
        dropped = f.array("dropped")
        skipped = f.array("skipped_rounds", [])
        if not all(COUNT.accepts(r) for r in skipped):
            raise f.bad("skipped_rounds", "a list of round numbers", skipped)
        lost = f.data.get("lost_sites")
        privacy = f.data.get("privacy")
        if privacy is not None and not isinstance(privacy, dict):
            raise f.bad("privacy", "an object of sites", privacy)
        return cls(
            **_evaluation_fields(f),
            algorithm=f.text("algorithm"),
            params=f.obj("params"),
            rounds=f.integer("rounds", kind=COUNT),
            local_steps=f.integer("local_steps", kind=COUNT),
            seed=f.integer("seed"),
            backbone=f.text("backbone"),
            modality=f.text("modality"),
            device=f.text("device"),
            priors=f.numbers("priors", kind=RATE),
            bytes_per_round=f.number("bytes_per_round", kind=AMOUNT),
            seconds_per_round=f.opt_number("seconds_per_round", _REQUIRED, AMOUNT),
            seconds_total=f.opt_number("seconds_total", _REQUIRED, AMOUNT),
            dropouts=f.integer("dropouts", kind=COUNT),
            dropped=[_dropout(f, k) for k in range(len(dropped))],
            resumes=f.integer("resumes", kind=COUNT),
            bytes_per_round_by_site={s: _traffic(f, s) for s in traffic},
            wire=None if wire is None else _wire(f),
            skipped_rounds=list(skipped),
            engine=f.opt_text("engine"),
            lost_sites=None if lost is None else f.texts("lost_sites"),
            normalization=f.text("normalization", "site"),
            augment=f.text("augment", "flip"),
            operating_rule=f.opt_text("operating_rule"),
            privacy=None
            if privacy is None
            else {
                site: PrivacySpent.from_dict(item, where, f"privacy.{site}.")
                for site, item in privacy.items()
            },
        )

    def __or__(self, other: Mapping[str, Any]) -> Summary:
        """``summary | {"engine": "flower"}``: a copy with those fields changed (as for a dict).

        Prefer ``dataclasses.replace``; this keeps code written for dict summaries working.
        """
        names = {f.name for f in fields(self)}
        unknown = set(other) - names
        if unknown:
            raise TypeError(f"Summary has no field(s) {sorted(unknown)}")
        return replace(self, **other)


def _dropout(f: _Fields, k: int) -> Dropout:
    item = _Fields(f.data["dropped"][k], f.where, f"dropped.{k}.")
    return Dropout(item.integer("round", kind=COUNT), item.text("site"), item.text("reason", ""))


_TRAFFIC = "bytes_per_round_by_site"


def _traffic(f: _Fields, site: str) -> SiteTraffic:
    item = _Fields(f.data["bytes_per_round_by_site"][site], f.where, f"{_TRAFFIC}.{site}.")
    return SiteTraffic(up=item.number("up", kind=AMOUNT), down=item.number("down", kind=AMOUNT))


def _wire(f: _Fields) -> WireSettings:
    item = _Fields(f.data["wire"], f.where, "wire.")
    return WireSettings(precision=item.text("precision"), delta=item.flag("delta"))
