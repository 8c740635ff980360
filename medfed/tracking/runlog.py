"""A run folder (or a folder of runs) logged to MLflow from its own files.

The same reading serves ``medfed train --track`` when a run ends and ``medfed track`` later:
parameters from config.toml (the plan's resolved settings, not the command line), tags,
per-round metrics from metrics.jsonl, the final figures with their 95% intervals from
summary.json, and the run's documents as artifacts. Per-scan data never leaves the folder.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import tomllib
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from medfed.core.errors import ConfigError, MedfedError
from medfed.core.fileio import atomic_write
from medfed.runs import RunDir
from medfed.tracking.settings import (
    TRACKING_FILE,
    TrackSettings,
    metric_name,
    require_mlflow,
)

BATCH = 100  # params / tags / metrics per log_batch call (MLflow's smallest limit is 100)
VALUE_CHARS = 6000  # MLflow's longest parameter value
SITE_FIGURES = ("auc", "accuracy", "macro_auc", "balanced_accuracy")


class TrackingUnavailable(MedfedError):
    """The tracking store cannot be reached or refused what was sent."""


def _flat(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            _flat(f"{prefix}.{key}" if prefix else str(key), inner, out)
        return
    text = json.dumps(value) if isinstance(value, list | bool) or value is None else str(value)
    out[prefix] = text[:VALUE_CHARS]


def run_params(config: dict[str, Any]) -> dict[str, str]:
    """The run's resolved settings (config.toml's train, model and init tables) as flat
    parameters: ``train.lr``, ``train.params.lam``, ``model.backbone``, ..."""
    out: dict[str, str] = {}
    for table in ("train", "model", "init"):
        if isinstance(config.get(table), dict):
            _flat(table, config[table], out)
    return out


def plan_hash(config: dict[str, Any]) -> str:
    """A short hash of what the run trained: its settings, model and sites."""
    keep = {k: config.get(k) for k in ("train", "model", "sites")}
    return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_tags(config: dict[str, Any], summary: dict[str, Any], run: Path) -> dict[str, str]:
    """Tags: what the run is (algorithm, backbone, sites, seed, plan hash, medfed version) and
    what a site's policy kept from leaving."""
    train = config.get("train", {})
    sites = [str(s.get("id")) for s in config.get("sites", []) if isinstance(s, dict)]
    tags = {
        "medfed.algorithm": str(summary.get("algorithm") or train.get("algorithm", "")),
        "medfed.backbone": str(summary.get("backbone") or config.get("model", {}).get("backbone")),
        "medfed.sites": ",".join(sites or sorted(summary.get("sites", {}))),
        "medfed.seed": str(train.get("seed", "")),
        "medfed.plan_hash": plan_hash(config),
        "medfed.version": str(config.get("medfed_version", "")),
        "medfed.modality": str(summary.get("modality", "")),
        "medfed.run_folder": str(run.resolve()),
        "mlflow.runName": run.name,
    }
    for cell, why in (summary.get("suppressed") or {}).items():
        tags[f"medfed.suppressed.{metric_name(cell)}"] = str(why)[:VALUE_CHARS]
    if summary.get("predictions") == "sites":
        tags["medfed.predictions"] = "kept at the sites (not logged)"
    return tags


EVENT_KINDS = ("dropout", "site_refused", "site_lost", "round_skipped", "resume")


def event_tags(events: list[dict[str, Any]]) -> dict[str, str]:
    """What went wrong or was refused during the run, logged as such: a count per kind, and
    each refusing site with the rules that refused."""
    tags = {}
    for kind in EVENT_KINDS:
        count = sum(1 for e in events if e.get("event") == kind)
        if count:
            tags[f"medfed.events.{kind}"] = str(count)
    for event in events:
        if event.get("event") == "site_refused":
            site = metric_name(str(event.get("site", "?")))
            tags[f"medfed.refused.{site}"] = json.dumps(event.get("refusals"))[:VALUE_CHARS]
    return tags


def round_metrics(rows: list[dict[str, Any]]) -> list[tuple[str, float, int]]:
    """Per round (the step): the sites' mean training loss, each site's validation AUC, the
    worst site's, and the bytes sent both ways."""
    by_round: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if isinstance(row.get("round"), int) and "site" in row:
            by_round[row["round"]].append(row)
    out: list[tuple[str, float, int]] = []
    for step, records in sorted(by_round.items()):
        ok = [r for r in records if r.get("status") == "ok"]
        losses = [float(r["train_loss"]) for r in ok if _finite(r.get("train_loss"))]
        if losses:
            out.append(("train_loss", sum(losses) / len(losses), step))
        aucs = {}
        for r in ok:
            if _finite(r.get("val_auc")):
                aucs[r["site"]] = float(r["val_auc"])
                out.append((metric_name(f"val_auc.{r['site']}"), aucs[r["site"]], step))
        if aucs:
            out.append(("val_auc_worst_site", min(aucs.values()), step))
        sent = [r.get("bytes_up", 0) or 0 for r in ok] + [r.get("bytes_down", 0) or 0 for r in ok]
        out.append(("bytes", float(sum(sent)), step))
        out.append(("sites_dropped", float(len(records) - len(ok)), step))
    return out


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _interval(name: str, value: Any, out: dict[str, float]) -> None:
    """A figure with its interval ({estimate|value, low, high}) as name, name_low, name_high."""
    if not isinstance(value, dict):
        return
    point = value.get("estimate", value.get("value"))
    if _finite(point):
        out[name] = float(point)
    for end in ("low", "high"):
        if _finite(value.get(end)):
            out[f"{name}_{end}"] = float(value[end])


def final_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The run's final figures: every number summary.json holds at its top level, each site's
    test figures, and each interval as ``_low`` / ``_high``."""
    out: dict[str, float] = {}
    for key, value in summary.items():
        if _finite(value):
            out[metric_name(key)] = float(value)
        elif isinstance(value, dict) and ("low" in value or "estimate" in value):
            _interval(metric_name(key), value, out)
    worst = summary.get("worst_site_auc_ci")
    if isinstance(worst, dict):
        for end in ("low", "high"):
            if _finite(worst.get(end)):
                out[f"worst_site_auc_{end}"] = float(worst[end])
    for site, figures in (summary.get("sites") or {}).items():
        if not isinstance(figures, dict):
            continue
        for figure in SITE_FIGURES:
            if _finite(figures.get(figure)):
                out[metric_name(f"test_{figure}.{site}")] = float(figures[figure])
        ci = figures.get("auc_ci")
        if isinstance(ci, dict):
            for end in ("low", "high"):
                if _finite(ci.get(end)):
                    out[metric_name(f"test_auc.{site}_{end}")] = float(ci[end])
    return out


def _json_lines(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file; a torn or foreign line is skipped (a killed run's last
    line: the lines before it still count)."""
    rows = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows


def read_run(run: Path) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """A finished run's config.toml, summary.json and metrics.jsonl rows (checked)."""
    folder = RunDir(run).require()
    if not folder.summary_path.is_file():
        raise ConfigError(
            f"{run}: the run has no summary.json (not finished); finish it (medfed train "
            "--resume) before tracking it"
        )
    try:
        config = tomllib.loads(folder.config_path.read_text(encoding="utf-8"))
        summary = json.loads(folder.summary_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(
            f"{run}: its config.toml or summary.json cannot be read ({exc})"
        ) from None
    return config, summary, _json_lines(run / "metrics.jsonl")


def run_artifacts(run: Path) -> list[tuple[Path, str]]:
    """The run's documents (file, folder in the MLflow run): settings, figures, model card,
    data cards, events; never per-scan data."""
    found = [
        (run / "config.toml", ""),
        (run / "summary.json", ""),
        (run / "events.jsonl", ""),
        (run / "model" / "MODEL_CARD.md", ""),
        (run / "report.html", ""),
    ]
    cards = sorted((run / "site_overview" / "cards").glob("*.md"))
    return [(p, where) for p, where in found if p.is_file()] + [(c, "data_cards") for c in cards]


def check_reachable(settings: TrackSettings) -> None:
    """Refuse (TrackingUnavailable) a tracking server that does not answer its health check."""
    if not settings.is_server:
        return
    import httpx

    verify: bool | str = os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH") or True
    if os.environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() == "true":
        verify = False
    try:
        answer = httpx.get(f"{settings.uri.rstrip('/')}/health", timeout=5.0, verify=verify)
    except httpx.HTTPError as exc:
        raise TrackingUnavailable(f"{settings.uri} cannot be reached ({exc})") from None
    if answer.status_code >= 500:  # up but failing; a 401 of a server that signs in is up
        raise TrackingUnavailable(f"{settings.uri}/health answered {answer.status_code}")


class Tracker:
    """One tracking store: creates the experiment, logs runs into it."""

    def __init__(self, settings: TrackSettings) -> None:
        mlflow = require_mlflow()
        # fail in seconds, not minutes of retries, when the server is down mid-way
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
        check_reachable(settings)
        from mlflow.tracking import MlflowClient

        self.settings, self.mlflow = settings, mlflow
        self.client = MlflowClient(tracking_uri=settings.uri, registry_uri=settings.uri)
        found = self.client.get_experiment_by_name(settings.experiment)
        if found is not None:
            self.experiment_id = found.experiment_id
        else:
            self.experiment_id = self.client.create_experiment(
                settings.experiment, artifact_location=_local_artifacts(settings.uri)
            )

    def start(self, name: str, tags: dict[str, str], parent: str | None = None) -> str:
        if parent is not None:
            tags = {**tags, "mlflow.parentRunId": parent}
        run = self.client.create_run(self.experiment_id, tags=tags, run_name=name)
        return run.info.run_id

    def log(
        self,
        run_id: str,
        params: dict[str, str],
        metrics: list[tuple[str, float, int]],
        tags: dict[str, str] | None = None,
    ) -> None:
        from mlflow.entities import Metric, Param, RunTag

        stamp = _now_ms()
        param_list = [Param(k, v) for k, v in params.items()]
        metric_list = [Metric(k, v, stamp, step) for k, v, step in metrics]
        tag_list = [RunTag(k, v) for k, v in (tags or {}).items()]
        for chunk in _chunks(param_list):
            self.client.log_batch(run_id, params=chunk)
        for chunk in _chunks(metric_list):
            self.client.log_batch(run_id, metrics=chunk)
        for chunk in _chunks(tag_list):
            self.client.log_batch(run_id, tags=chunk)

    def finish(self, run_id: str) -> None:
        self.client.set_terminated(run_id, "FINISHED")

    def url(self, run_id: str) -> str | None:
        if not self.settings.is_server:
            return None
        base = self.settings.uri.rstrip("/")
        return f"{base}/#/experiments/{self.experiment_id}/runs/{run_id}"

    def log_run(self, run: Path, parent: str | None = None) -> str:
        """Log the finished run folder ``run`` (a child of ``parent`` when given); records the
        MLflow run in RUN/tracking.json and returns its id."""
        config, summary, rows = read_run(run)
        tags = run_tags(config, summary, run) | event_tags(_json_lines(run / "events.jsonl"))
        run_id = self.start(run.name, tags, parent)
        last = int(summary.get("rounds") or 0)
        finals = [(k, v, last) for k, v in final_metrics(summary).items()]
        self.log(run_id, run_params(config), round_metrics(rows) + finals)
        with _report_beside(run) as extra:
            for path, where in [*run_artifacts(run), *extra]:
                self.client.log_artifact(run_id, str(path), where or None)
        from medfed.tracking.pyfunc import log_router

        log_router(self, run_id, run)
        self.finish(run_id)
        self.record(run, run_id, parent)
        return run_id

    def record(self, run: Path, run_id: str, parent: str | None = None) -> None:
        """Write RUN/tracking.json: the MLflow run ``run`` was logged as."""
        record = {
            "tracking_uri": self.settings.uri,
            "experiment": self.settings.experiment,
            "experiment_id": self.experiment_id,
            "run_id": run_id,
            "url": self.url(run_id),
        }
        if parent is not None:
            record["parent_run_id"] = parent
        atomic_write(run / TRACKING_FILE, json.dumps(record, indent=2) + "\n")

    def log_any(self, run: Path, parent: str | None = None) -> str:
        """A trained run, or a deployed statistics-only run (statistics.json)."""
        from medfed.tracking.statistics import is_statistics_run, log_statistics_run

        if is_statistics_run(run) and not (run / "summary.json").is_file():
            return log_statistics_run(self, run, parent)
        return self.log_run(run, parent)


@contextmanager
def _report_beside(run: Path) -> Iterator[list[tuple[Path, str]]]:
    """The run's HTML report (written for it when the run folder holds none)."""
    if (run / "report.html").is_file():
        yield []
        return
    from medfed.reports.study import write_study_report

    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "report.html"
        try:
            write_study_report([run], target)
        except MedfedError:
            yield []  # a run the report cannot show is still tracked
            return
        yield [(target, "")]


def _local_artifacts(uri: str) -> str | None:
    """Artifacts of a SQLite store beside its database file (a server keeps its own)."""
    parsed = urlparse(uri)
    if parsed.scheme != "sqlite":
        return None
    database = Path(uri[len("sqlite:///") :])
    return (database.parent / "mlartifacts").resolve().as_uri()


def _chunks(items: list) -> Iterator[list]:
    for start in range(0, len(items), BATCH):
        yield items[start : start + BATCH]


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)


def run_folders(folder: Path) -> list[Path]:
    """The finished run folders at or under ``folder`` (a run's own warm-up base included), and
    deployed statistics-only runs (statistics.json)."""
    if _finished(folder):
        return [folder]
    found = {p.parent for p in folder.rglob("summary.json") if _finished(p.parent)}
    found |= {p.parent for p in folder.rglob("statistics.json") if _finished(p.parent)}
    return sorted(found)


def _finished(folder: Path) -> bool:
    from medfed.runs.statistics import statistics_path

    trained = (folder / "summary.json").is_file() and (folder / "config.toml").is_file()
    return trained or statistics_path(folder).is_file()


def log_folder(
    folder: Path, settings: TrackSettings, name: str | None = None
) -> tuple[str, list[str]]:
    """Log ``folder``: one run, or a parent run with one child per run under it (a sweep,
    compare, bench, scenarios or real-study folder); the parent holds the folder's own
    results files. Returns the top run id and the children's."""
    runs = run_folders(folder)
    if not runs and (folder / "config.toml").is_file():
        read_run(folder)  # a run folder that has not finished: said as such
    if not runs:
        raise ConfigError(
            f"{folder}: holds no finished run (a folder with config.toml and summary.json, "
            "or a deployed run's statistics.json); give a run folder or the --out folder of a "
            "sweep"
        )
    tracker = Tracker(settings)
    if runs == [folder]:
        return tracker.log_any(folder), []
    parent = tracker.start(name or folder.name, {"medfed.sweep_folder": str(folder.resolve())})
    tracker.log(parent, {"runs": str(len(runs))}, [])
    for path in sorted(folder.glob("*.json")) + sorted(folder.glob("*.md")):
        tracker.client.log_artifact(parent, str(path))
    children = [tracker.log_any(run, parent) for run in runs]
    tracker.finish(parent)
    return parent, children


def track_safely(
    folder: Path, settings: TrackSettings | None, warn: Callable[[str], Any]
) -> str | None:
    """:func:`log_folder`, where a failure never loses the run: reported once (one line to
    ``warn``), with the command that uploads the folder later."""
    if settings is None:
        return None
    try:
        top, _ = log_folder(folder, settings)
    except ConfigError:
        raise
    except Exception as exc:  # a tracking store that is down or refuses: the run is kept
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
        warn(
            f"tracking: {folder} was not logged to {settings.uri} ({reason}); the run folder "
            f"is complete; log it later with: medfed track {folder} --track {settings.uri}"
        )
        return None
    return top
