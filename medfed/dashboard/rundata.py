"""Run directories as the dashboard's tables: discovery, labels, and one function per view.

No Streamlit here: every function takes what a run directory holds (typed summaries and round
records from :mod:`medfed.runs.schema`, events, audit entries) and returns plain values or pandas
frames.
"""

from __future__ import annotations

import math
import re
import reprlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from medfed.clinic.audit import AuditEntry
from medfed.core.errors import ConfigError
from medfed.core.names import printable
from medfed.core.units import human_bytes
from medfed.dashboard import clinical
from medfed.dashboard.checks import damaged, escape_markdown
from medfed.dashboard.reviewdata import answer_text
from medfed.data.cards import TO_FILL
from medfed.reports import fmt
from medfed.reports.evaluation import AT_ARGMAX, AT_OPERATING, PRIVACY_COLUMNS, privacy_cells
from medfed.runs import RunDir
from medfed.runs.schema import DROPPED, OK, STATISTICS_FILE, RoundRecord, Summary

# Folders medfed writes that never hold runs (a run's own, the preprocessing cache): skipping
# them keeps discovery fast.
_NOT_RUNS = {"checkpoints", "model", "site_overview", "cache", "__pycache__"}
MAX_DEPTH = 4


@dataclass(frozen=True)
class Run:
    """One run directory and the short name the pages show for it."""

    path: Path
    label: str

    @property
    def dir(self) -> RunDir:
        return RunDir(self.path)

    @property
    def has_config(self) -> bool:
        return self.dir.config_path.is_file()

    @property
    def has_summary(self) -> bool:
        return self.dir.summary_path.is_file()

    @property
    def has_model(self) -> bool:
        return (self.dir.model_dir / "model.json").is_file()


def find_runs(roots: Iterable[str | Path]) -> list[Path]:
    """Run directories (folders holding config.toml) at or below each root, sorted per root."""
    found: list[Path] = []
    for root in map(Path, roots):
        if _is_run(root):
            found.append(root)
        elif root.is_dir():
            found += sorted(_runs_below(root, MAX_DEPTH))
    unique: dict[Path, None] = {}
    for path in found:
        unique.setdefault(path.resolve(), None)
    return list(unique)


def _is_run(folder: Path) -> bool:
    """A run directory: a training run's (config.toml) or a statistics-only run's."""
    return (folder / "config.toml").is_file() or (folder / STATISTICS_FILE).is_file()


def _runs_below(folder: Path, depth: int) -> list[Path]:
    if depth == 0:
        return []
    runs = []
    try:
        children = sorted(p for p in folder.iterdir() if p.is_dir())
    except OSError:
        return []
    for child in children:
        if child.name.startswith(".") or child.name in _NOT_RUNS:
            continue
        if _is_run(child):
            runs.append(child)
        else:
            runs += _runs_below(child, depth - 1)
    return runs


def label_runs(paths: Sequence[Path]) -> list[Run]:
    """Name each run by the fewest trailing path parts that tell it from the others."""
    labels = []
    for path in paths:
        parts = path.parts
        for k in range(1, len(parts) + 1):
            label = "/".join(parts[-k:])
            others = [p for p in paths if p != path and "/".join(p.parts[-k:]) == label]
            if not others:
                break
        labels.append(Run(path, label))
    return labels


def run_status(run: Run, config: dict[str, Any] | None, records: list[RoundRecord]) -> str:
    """One sentence on how far the run got, for the top of each page."""
    if not run.has_config:
        if (run.path / STATISTICS_FILE).is_file():
            return "a statistics-only run: no training (its overview is on the Sites page)."
        return f"{run.path}: no config.toml: not a run directory yet."
    planned = (config or {}).get("train", {}).get("rounds")
    done = max((r.round for r in records), default=0)
    of = f" of {planned}" if planned else ""
    if run.has_summary:
        return f"finished: {done}{of} rounds recorded."
    if not records:
        return (
            f"no round recorded yet ({run.dir.metrics_path.name} is missing or empty): the run "
            "is starting, or was stopped before its first round."
        )
    return (
        f"not finished: {done}{of} rounds recorded and no summary.json yet. The run is still "
        "training, or was stopped (continue it with 'medfed train ... --resume')."
    )


# ---------------------------------------------------------------------------- Federation page
Summaries = Mapping[str, Summary]  # run label -> its summary.json


def worst_sites(summaries: Summaries) -> dict[str, tuple[str | None, float | None]]:
    """Each run's worst site and its AUC, as summary.json names them."""
    return {
        label: (s.federation.worst_site, s.federation.worst_site_auc)
        for label, s in summaries.items()
    }


def undefined_aucs(summaries: Summaries) -> list[str]:
    """Sentences for every site whose AUC is undefined, with summary.json's reason."""
    notes = []
    for label, summary in summaries.items():
        for site, figures in summary.sites.items():
            if figures.auc is None:
                reason = figures.auc_reason or "undefined"
                notes.append(f"{label}, site {site}: AUC n/a ({reason})")
    return notes


OP, ARGMAX = AT_OPERATING, AT_ARGMAX  # each accuracy row names its decision rule
SYSTEM = "system_accuracy"
FEDERATION_ROWS: tuple[tuple[str, Callable[[Summary], Any]], ...] = (
    ("mean site AUC", lambda s: s.federation.mean_site_auc),
    ("pooled AUC (random effects, 95% CI)", clinical.pooled_text),
    ("worst site AUC", lambda s: s.federation.worst_site_auc),
    (
        "worst site AUC (95% CI)",
        lambda s: clinical.with_ci(s.worst_site_auc_ci, s.federation.worst_site_auc),
    ),
    ("worst site", lambda s: s.federation.worst_site),
    ("best site AUC", lambda s: s.federation.best_site_auc),
    ("AUC spread (std)", lambda s: s.federation.auc_std),
    ("AUC Gini", lambda s: s.federation.auc_gini),
    ("worst 10% AUC", lambda s: s.federation.worst10_auc),
    (f"average accuracy {OP} (by test scans)", lambda s: s.average_accuracy_operating),
    (f"average accuracy {OP} (by training scans)", lambda s: s.average_accuracy_operating_by_train),
    (f"system accuracy {OP}", lambda s: s.system_accuracy),
    (f"system accuracy {OP} (95% CI)", lambda s: clinical.default_router_rate(s, SYSTEM)),
    (f"average accuracy {ARGMAX} (by test scans)", lambda s: s.federation.average_accuracy),
    (
        f"average accuracy {ARGMAX} (by training scans)",
        lambda s: s.federation.average_accuracy_by_train,
    ),
    (f"mean accuracy {ARGMAX}", lambda s: s.federation.mean_accuracy),
    (f"accuracy spread {ARGMAX} (std)", lambda s: s.federation.accuracy_std),
    ("answered by", lambda s: s.routing_method),
    ("routing accuracy", lambda s: s.routing_accuracy),
    ("abstain rate", lambda s: s.abstain_rate),
    ("operating rule", lambda s: s.operating_rule),
    ("normalization", lambda s: s.normalization),
    ("rounds", lambda s: s.rounds),
)


def federation_table(summaries: Summaries) -> pd.DataFrame:
    """The federation figures of every run, formatted (rows: figures, columns: runs)."""
    data = {
        label: [fmt(figure(summary)) for _, figure in FEDERATION_ROWS]
        for label, summary in summaries.items()
    }
    return pd.DataFrame(data, index=pd.Index([name for name, _ in FEDERATION_ROWS], name="figure"))


def privacy_frame(summaries: Summaries) -> pd.DataFrame:
    """What each site of each differentially private run spent (one row per run and site);
    empty when no run trained with differential privacy."""
    rows = [
        {
            "method": label,
            "site": site,
            **dict(zip(PRIVACY_COLUMNS, privacy_cells(p, summary.rounds), strict=True)),
        }
        for label, summary in summaries.items()
        for site, p in (summary.privacy or {}).items()
    ]
    return pd.DataFrame(rows)


def roc_frame(summary: Summary) -> tuple[pd.DataFrame, dict[str, str]]:
    """ROC points of every site (site, curve label, fpr, tpr) and, per site without a curve,
    the reason."""
    rows, missing = [], {}
    for site, figures in summary.sites.items():
        roc = figures.roc
        if roc is None:
            missing[site] = "summary.json holds no ROC points (written before they were stored)"
        elif not roc.drawable:
            missing[site] = roc.reason or "no ROC points"
        else:
            curve = f"{site}: AUC {clinical.site_auc_text(figures)}"
            rows += [
                {"site": site, "curve": curve, "fpr": f, "tpr": t}
                for f, t in zip(roc.fpr or [], roc.tpr or [], strict=True)
            ]
    return pd.DataFrame(rows, columns=["site", "curve", "fpr", "tpr"]), missing


# ------------------------------------------------------------------------------ Training page
CURVES = {
    "train_loss": "training loss",
    "val_loss": "validation loss",
    "val_auc": "validation AUC",
    "val_accuracy": "validation accuracy",
    "val_client_accuracy": "validation site-recognition accuracy",
    "train_dp_epsilon": "privacy spent (epsilon, differential privacy)",
}


def metrics_frame(records: Sequence[RoundRecord], order: Sequence[str] = ()) -> pd.DataFrame:
    """metrics.jsonl as a frame with one row per round per site (a column per figure), the
    sites of each round in ``order`` (the manifests' order; others after them)."""
    columns = ["round", "site", "status", "reason", *CURVES]
    frame = pd.DataFrame([r.to_dict() for r in records])
    for column in columns:
        if column not in frame:
            frame[column] = None
    frame = frame[columns + [c for c in frame.columns if c not in columns]]
    rank = site_rank(frame["site"], order)
    frame = frame.assign(_rank=frame["site"].map(rank))
    frame = frame.sort_values(["round", "_rank"], kind="stable").drop(columns="_rank")
    return frame.reset_index(drop=True)


def site_rank(sites: Iterable[str], order: Sequence[str] = ()) -> dict[str, int]:
    """Each site's place: ``order`` first, then the others sorted by name."""
    rest = sorted({s for s in sites if s not in order})
    return {s: i for i, s in enumerate([*order, *rest])}


def settings_table(
    configs: Mapping[str, Mapping[str, Any] | None], summaries: Summaries
) -> pd.DataFrame:
    """The runs' settings side by side (rows: settings, columns: runs), from config.toml and,
    where it is silent, summary.json."""
    data = {}
    for label in dict.fromkeys([*configs, *summaries]):
        train = dict((configs.get(label) or {}).get("train") or {})
        model = dict((configs.get(label) or {}).get("model") or {})
        summary = summaries.get(label)
        data[label] = [_setting(train, model, summary, key) for key, _ in SETTINGS]
    index = pd.Index([name for _, name in SETTINGS], name="setting")
    return pd.DataFrame(data, index=index)


SETTINGS: tuple[tuple[str, str], ...] = (
    ("algorithm", "algorithm"),
    ("params", "algorithm parameters"),
    ("rounds", "rounds"),
    ("local_steps", "local steps"),
    ("batch_size", "batch size"),
    ("optimizer", "optimizer"),
    ("lr", "learning rate"),
    ("backbone", "backbone"),
    ("normalization", "normalization"),
    ("augment", "augmentation"),
    ("operating_point", "operating rule"),
    ("wire_precision", "wire precision"),
    ("client_fraction", "sites per round (fraction)"),
    ("seed", "seed"),
)


def _setting(train: dict, model: dict, summary: Summary | None, key: str) -> str:
    value = train.get(key)
    if key == "backbone" and model.get("backbone"):
        value = model["backbone"]  # "auto" resolved to the one trained
    if value is None and summary is not None:
        value = {
            "operating_point": summary.operating_rule,
            "wire_precision": summary.wire.label if summary.wire is not None else None,
        }.get(key, getattr(summary, key, None))
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "none"
    if isinstance(value, list | tuple):
        return ", ".join(map(str, value)) or "none"
    return fmt(value) if isinstance(value, float) else ("n/a" if value is None else str(value))


def runs_frame(frames: Mapping[str, pd.DataFrame], curve: str) -> pd.DataFrame:
    """Each run's mean of ``curve`` over its sites that trained in each round (run, round,
    curve), for the chart that overlays runs."""
    parts = []
    for label, frame in frames.items():
        if curve not in frame:
            continue
        trained = frame[frame["status"] == OK]
        values = pd.to_numeric(trained[curve], errors="coerce")
        mean = values.groupby(trained["round"]).mean().dropna()
        parts.append(pd.DataFrame({"run": label, "round": mean.index, curve: mean.to_numpy()}))
    if not parts:
        return pd.DataFrame(columns=["run", "round", curve])
    return pd.concat(parts, ignore_index=True)


MIXTURE_PREFIX = "train_mixture_"  # FedGMI: a site's share of scans per intrinsic distribution


def mixture_frame(records: Sequence[RoundRecord], order: Sequence[str] = ()) -> pd.DataFrame:
    """Each site's latest mixture coefficients: one row per site and distribution (sites in
    ``order``, the manifests' order)."""
    latest: dict[str, RoundRecord] = {}
    for record in records:
        if record.status == OK and record.extras(MIXTURE_PREFIX):
            latest[record.site] = record
    rank = site_rank(latest, order)
    rows = [
        {
            "site": site,
            "distribution": f"distribution {component}",
            "share": share,
            "round": record.round,
        }
        for site, record in sorted(latest.items(), key=lambda kv: rank[kv[0]])
        for component, share in record.extras(MIXTURE_PREFIX).items()
    ]
    return pd.DataFrame(rows, columns=["site", "distribution", "share", "round"])


def available_curves(frame: pd.DataFrame) -> list[str]:
    return [c for c in CURVES if c in frame and frame[c].notna().any()]


def dropouts(frame: pd.DataFrame, curve: str) -> pd.DataFrame:
    """Dropped sites, placed on ``curve`` at their value (or their last value before)."""
    rows = []
    for _, record in frame[frame["status"] == DROPPED].iterrows():
        mine = frame[(frame["site"] == record["site"]) & (frame["round"] <= record["round"])]
        known = pd.to_numeric(mine[curve], errors="coerce").dropna()
        if known.empty:
            known = pd.to_numeric(frame[curve], errors="coerce").dropna()
        if known.empty:
            continue
        rows.append(
            {
                "round": record["round"],
                "site": record["site"],
                "value": float(known.iloc[-1]),
                "reason": _text(record.get("reason")) or "dropped",
            }
        )
    return pd.DataFrame(rows, columns=["round", "site", "value", "reason"])


def events_frame(events: list[dict[str, Any]]) -> pd.DataFrame:
    """events.jsonl for reading: time, event, round, site, details."""
    rows = []
    for event in events:
        time = event.get("time")
        when = (
            pd.to_datetime(time, unit="s", utc=True)
            if _number(time, None) is not None and math.isfinite(time) and 0 <= time < 1e11
            else None
        )
        round_ = event.get("round", event.get("from_round"))
        details = {
            k: v for k, v in event.items() if k not in ("event", "time", "round", "site", "reason")
        }
        rows.append(
            {
                "time (UTC)": when.strftime("%Y-%m-%d %H:%M:%S") if when is not None else "",
                "event": str(event.get("event", "?")),
                "round": "" if round_ is None else str(round_),
                "site": str(event.get("site") or ""),
                "reason": str(event.get("reason") or ""),
                "details": ", ".join(f"{k}={v}" for k, v in details.items()),
            }
        )
    return pd.DataFrame(rows, columns=["time (UTC)", "event", "round", "site", "reason", "details"])


def resumes(events: list[dict[str, Any]]) -> list[int]:
    """The last round done before each resume (events without a round number are skipped)."""
    return [
        int(e.get("from_round", 0))
        for e in events
        if e.get("event") == "resume" and _whole(e.get("from_round", 0))
    ]


def skipped_rounds(events: list[dict[str, Any]]) -> list[int]:
    return [
        int(e["round"])
        for e in events
        if e.get("event") == "round_skipped" and _whole(e.get("round"))
    ]


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


RANDOM_INIT = "random (seeded) initialization"


@dataclass(frozen=True)
class StartingWeights:
    """The pretrained weights a run started from, as config.toml's ``[init]`` records them.

    Text fields the table leaves out are empty strings; ``strict`` and ``adapters`` are None."""

    source: str
    loaded: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...]  # (model key, why it was not loaded)
    random: tuple[str, ...]
    kind: str = ""
    format: str = ""
    file: str = ""
    sha256: str = ""
    strict: bool | None = None
    normalization: str = ""
    weights_normalization: str = ""
    adapters: int | None = None

    @property
    def short_sha256(self) -> str:
        return self.sha256[:12]

    def normalization_note(self) -> str | None:
        """Why the inputs may not be what the weights expect, or None when they match."""
        given, used = self.weights_normalization, self.normalization
        if not given or not used or given == used:
            return None
        came = "ImageNet" if given == "imagenet" else given
        how = "each site's own statistics" if used == "site" else f"{used} statistics"
        return (
            f"The weights came with {came} normalization, but this run normalized its inputs "
            f"with {how} ({used}): the pretrained layers see inputs scaled differently from "
            "those they learned from."
        )


def starting_weights(config: Mapping[str, Any] | None, where: Path) -> StartingWeights | None:
    """The run's ``[init]`` table read defensively; None for a run started from seeded random
    weights (no ``[init]``). A damaged table is a RunDirError naming ``where`` (config.toml)."""
    if config is None or "init" not in config:
        return None
    init = config["init"]
    if not isinstance(init, Mapping):
        raise damaged(where, f"init = {_shown(init)} is not a table ([init])")

    def fail(what: str) -> Exception:
        return damaged(where, f"[init] {what}")

    source = _init_text(init, "source", fail)
    if not source:
        raise fail("has no source (the weights given to 'medfed train --init')")
    strict = init.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise fail(f"strict = {_shown(strict)} is not true or false")
    adapters = init.get("adapters")
    if adapters is not None and not (_whole(adapters) and adapters >= 0):
        raise fail(f"adapters = {_shown(adapters)} is not a count")
    return StartingWeights(
        source=source,
        loaded=_init_keys(init, "loaded", fail),
        skipped=_init_skipped(init, fail),
        random=_init_keys(init, "random", fail),
        kind=_init_text(init, "kind", fail),
        format=_init_text(init, "format", fail),
        file=_init_text(init, "file", fail),
        sha256=_init_text(init, "sha256", fail),
        strict=strict,
        normalization=_init_text(init, "normalization", fail),
        weights_normalization=_init_text(init, "weights_normalization", fail),
        adapters=adapters,
    )


def _shown(value: Any) -> str:
    """A value of a damaged table, cut short when long."""
    return reprlib.repr(value)


def _init_text(init: Mapping[str, Any], name: str, fail: Callable[[str], Exception]) -> str:
    value = init.get(name, "")
    if not isinstance(value, str):
        raise fail(f"{name} = {_shown(value)} is not a string")
    return value


def _init_keys(
    init: Mapping[str, Any], name: str, fail: Callable[[str], Exception]
) -> tuple[str, ...]:
    if name not in init:
        raise fail(f"has no {name!r} list of model keys")
    keys = init[name]
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise fail(f"{name} = {_shown(keys)} is not a list of model key names")
    return tuple(keys)


def _init_skipped(
    init: Mapping[str, Any], fail: Callable[[str], Exception]
) -> tuple[tuple[str, str], ...]:
    if "skipped" not in init:
        raise fail("has no 'skipped' list of model keys")
    skipped = init["skipped"]
    if not isinstance(skipped, list) or not all(
        isinstance(s, Mapping)
        and isinstance(s.get("key"), str)
        and isinstance(s.get("reason"), str)
        for s in skipped
    ):
        raise fail(f"skipped = {_shown(skipped)} is not a list of {{key, reason}} tables")
    return tuple((s["key"], s["reason"]) for s in skipped)


def skipped_frame(weights: StartingWeights) -> pd.DataFrame:
    """The keys of the weights that were not loaded, and why (key, reason)."""
    return pd.DataFrame(list(weights.skipped), columns=["key", "reason"])


def starting_weights_table(
    weights: Mapping[str, StartingWeights | None | Exception],
) -> pd.DataFrame:
    """One row per run (source and key counts, as text); a run whose ``[init]`` could not be
    read (an exception) says so instead of showing counts."""
    rows = []
    for label, w in weights.items():
        if isinstance(w, Exception):
            row = ("damaged [init] in config.toml", "n/a", "n/a", "n/a")
        elif w is None:
            row = (RANDOM_INIT, "0", "0", "all")
        else:
            counts = (len(w.loaded), len(w.skipped), len(w.random))
            row = (w.source, *map(str, counts))
        rows.append((label, *row))
    columns = ["run", "source", "loaded", "skipped", "random"]
    return pd.DataFrame(rows, columns=columns).set_index("run")


# ------------------------------------------------------------------------- Communication page
def traffic_frame(
    records_by_run: Mapping[str, Sequence[RoundRecord]],
    orders: Mapping[str, Sequence[str]] | None = None,
) -> pd.DataFrame:
    """Bytes each site sent and received in each round, for every run (each run's sites in
    its manifests' order, ``orders``)."""
    rows = []
    for label, records in records_by_run.items():
        rank = site_rank((r.site for r in records), (orders or {}).get(label, ()))
        for r in sorted(records, key=lambda r: (r.round, rank[r.site])):
            up, down = r.bytes_up or 0, r.bytes_down or 0
            rows.append(
                {
                    "method": label,
                    "round": r.round,
                    "site": r.site,
                    "status": r.status,
                    "bytes sent": float(up),
                    "bytes received": float(down),
                    "bytes total": float(up + down),
                }
            )
    columns = ["method", "round", "site", "status", "bytes sent", "bytes received", "bytes total"]
    return pd.DataFrame(rows, columns=columns)


def traffic_table(summaries: Summaries) -> pd.DataFrame:
    """Per run: wire format, bytes per round in all, and each site's share per round."""
    rows = []
    for label, summary in summaries.items():
        row: dict[str, Any] = {
            "method": label,
            # Runs from before the wire format was recorded sent float32.
            "wire": summary.wire.label if summary.wire is not None else "float32",
            "per round (all sites)": human_bytes(summary.bytes_per_round),
        }
        for site, t in summary.bytes_per_round_by_site.items():
            row[f"{site} sent"] = human_bytes(t.up)
            row[f"{site} received"] = human_bytes(t.down)
        rows.append(row)
    return pd.DataFrame(rows).set_index("method") if rows else pd.DataFrame()


# ------------------------------------------------------------------------------- Routing page
AUDIT_COLUMNS = [
    "time",
    "file",
    "status",
    "chosen_site",
    "prediction",
    "prediction_prob",
    "ood_score",
    "router",
    "reason",
    "sha256",
]


def audit_frame(entries: list[AuditEntry]) -> pd.DataFrame:
    """Audit log entries, newest first, one row each (site probabilities as text)."""
    rows = []
    for e in entries:
        row = {c: getattr(e, c) for c in AUDIT_COLUMNS}
        row["chosen_site"] = e.chosen_site or ("abstain" if e.status == "abstained" else "")
        row["prediction"] = answer_text(e.status, e.prediction)
        row["sha256"] = e.sha256[:12]
        row["site_probs"] = ", ".join(f"{s} {p:.2f}" for s, p in e.site_probs.items())
        rows.append(row)
    return pd.DataFrame(rows, columns=[*AUDIT_COLUMNS, "site_probs"])


AUDIT_LABELS = {
    "time": "time (UTC)",
    "file": "file",
    "status": "status",
    "chosen_site": "chosen site",
    "prediction": "prediction",
    "prediction_prob": "probability",
    "ood_score": "distance to closest site",
    "router": "router",
    "reason": "reason",
    "sha256": "file hash (SHA-256, start)",
    "site_probs": "site probabilities",
}
"""Audit log columns as the page heads them."""


def _cell(value: Any, digits: int | None = None) -> str:
    """A cell as a reader sees it: a missing value (an abstained or failed scan has no
    probability, a routed one no reason) is ``n/a`` or blank, never ``None`` or ``nan``."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a" if digits is not None else ""
    return f"{float(value):.{digits}f}" if digits is not None else str(value)


def audit_table(frame: pd.DataFrame) -> pd.DataFrame:
    """An audit frame with readable column names and cells, for the page."""
    shown = frame.copy()
    for column, digits in (("prediction_prob", 3), ("ood_score", 3)):
        shown[column] = [_cell(v, digits) for v in shown[column].astype(object)]
    for column in ("reason", "chosen_site", "router", "prediction"):
        shown[column] = [_cell(v) for v in shown[column].astype(object)]
    return shown.rename(columns=AUDIT_LABELS)


def filter_audit(
    frame: pd.DataFrame,
    *,
    statuses: Sequence[str] = (),
    sites: Sequence[str] = (),
    routers: Sequence[str] = (),
    text: str = "",
) -> pd.DataFrame:
    """Rows matching every given filter; an empty filter keeps everything."""
    keep = pd.Series(True, index=frame.index)
    if statuses:
        keep &= frame["status"].isin(statuses)
    if sites:
        keep &= frame["chosen_site"].isin(sites)
    if routers:
        keep &= frame["router"].isin(routers)
    if text.strip():
        keep &= frame["file"].str.contains(text.strip(), case=False, regex=False)
    return frame[keep]


def probabilities_frame(site_probs: dict[str, float], chosen: str | None) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "site": list(site_probs),
            "probability": [float(p) for p in site_probs.values()],
            "chosen": [s == chosen for s in site_probs],
        }
    )


# ------------------------------------------------------------------------------- Review page
# (the page's tables: medfed.dashboard.reviewdata)
REVIEWER_HEADER_ENV = "MEDFED_REVIEWER_HEADER"
"""The request header holding the signed-in reader's name (set by an authenticating reverse
proxy in front of the dashboard); empty turns the header off (the page asks for the name)."""
DEFAULT_REVIEWER_HEADER = "X-Forwarded-User"
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP header name (RFC 9110)


def reviewer_header(environ: Mapping[str, str]) -> str | None:
    """The header the reader's name is taken from (None when turned off); ConfigError naming
    the variable when it holds no valid header name."""
    header = environ.get(REVIEWER_HEADER_ENV, DEFAULT_REVIEWER_HEADER).strip()
    if not header:
        return None
    if not _HEADER_NAME.match(header):
        raise ConfigError(
            f"{REVIEWER_HEADER_ENV}={header!r} is not an HTTP header name; set it to the header "
            f"your sign-in proxy sends (such as {DEFAULT_REVIEWER_HEADER}), or to nothing to type "
            "the reader's name on the page"
        )
    return header


def reviewer_from_headers(headers: Mapping[str, str], header: str | None) -> str | None:
    """The reader's name from the request ``headers`` (None when ``header`` is absent or blank).

    ``headers`` is Streamlit's ``st.context.headers`` (or any mapping; names match in any case).
    A header that came more than once with different names is refused (ConfigError): the proxy
    must replace a header the browser sent, never add its own beside it."""
    if not header:
        return None
    if hasattr(headers, "get_all"):
        values = list(headers.get_all(header))
    else:
        values = [v for k, v in headers.items() if k.lower() == header.lower()]
    names = list(dict.fromkeys(printable(str(v)).strip() for v in values))
    names = [n for n in names if n]
    if len(names) > 1:
        raise ConfigError(
            f"the {header} header names {len(names)} readers ({', '.join(names)}), so who is "
            "reading is unknown; configure the sign-in proxy to set this header once, replacing "
            "any header of that name the browser sends"
        )
    return names[0] if names else None


def _text(value: Any) -> str:
    """A string field of a record; missing values (None, NaN in a frame) become ''."""
    return value if isinstance(value, str) else ""


def _number(value: Any, default: float | None = math.nan) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return default


# --------------------------------------------------------------------------------- Sites page
_TABLE_RULE = re.compile(r"^\|(\s*:?-{3,}:?\s*\|)+$")
_HEADING = re.compile(r"^(#{1,6})\s+(.*)$")
_CODE = re.compile(r"^`[^`]*`$")


def card_markdown(card: str) -> str:
    """A data card as the Sites page shows it: headings two levels down, the card's own layout
    (headings, tables, lists) kept, and every value in it escaped, so a description holding
    ``_g_`` reads as written (the card file itself is as 'medfed sites card' writes it)."""
    return "\n".join(_card_line(line) for line in card.split("\n"))


def _card_line(line: str) -> str:
    text = line.strip()
    if not text:
        return line
    if heading := _HEADING.match(text):
        return f"##{heading.group(1)} {_card_value(heading.group(2))}"
    if text.startswith("|") and text.endswith("|") and len(text) > 1:
        if _TABLE_RULE.match(text):
            return text
        cells = text[1:-1].split("|")
        return "| " + " | ".join(_card_value(c.strip()) for c in cells) + " |"
    if text.startswith("- "):
        return "- " + _card_value(text[2:])
    return _card_value(text)


def _card_value(text: str) -> str:
    if text == TO_FILL or _CODE.match(text):
        return text  # the card's own emphasis, and code spans (shown literally anyway)
    return escape_markdown(text)
