"""The runs of a study report as the report reads them: each run directory's summary, its
sites' declared facts (``config.toml``), its site overview and when training finished, under a
label that tells the methods apart."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from medfed.core.errors import ConfigError, RunDirError
from medfed.runs.rundir import RunDir, read_json
from medfed.runs.schema import Summary

OVERVIEW_FILE = Path("site_overview", "overview.json")
"""Where a run keeps its site overview (written by the data layer once training has finished)."""


@dataclass(frozen=True)
class StudyRun:
    """One method of the study: a run directory and what the report reads from it."""

    path: Path
    label: str
    summary: Summary
    site_facts: dict[str, dict[str, Any]]
    overview: dict[str, Any] | None
    finished: str | None


def read_overview(run_dir: str | Path) -> dict[str, Any] | None:
    """``site_overview/overview.json`` of a run, or None when the run has none."""
    path = Path(run_dir) / OVERVIEW_FILE
    if not path.exists():
        return None
    data = read_json(path)
    if not isinstance(data.get("sites"), Mapping):
        raise RunDirError(f"{path}: no 'sites' table; the file is damaged")
    return data


def _finished(run: RunDir) -> str | None:
    """When training finished (UTC), from events.jsonl; None when it says nothing."""
    try:
        events = run.read_events()
    except RunDirError:
        return None
    times = [e.get("time") for e in events if e.get("event") == "finish"]
    times = [t for t in times if isinstance(t, int | float) and math.isfinite(t)]
    if not times:
        return None
    return datetime.fromtimestamp(times[-1], UTC).strftime("%Y-%m-%d %H:%M UTC")


def _site_facts(config: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    sites = config.get("sites")
    if not isinstance(sites, list):
        return {}
    return {str(s["id"]): dict(s) for s in sites if isinstance(s, Mapping) and "id" in s}


def method_label(summary: Summary) -> str:
    """The algorithm, with its wire encoding when it is not plain float32 (``fedavg@int8``)."""
    wire = summary.wire
    if wire is None or (wire.precision == "float32" and not wire.delta):
        return summary.algorithm
    return f"{summary.algorithm}@{wire.precision}" + ("+delta" if wire.delta else "")


def _unique_labels(summaries: Sequence[Summary], paths: Sequence[Path]) -> list[str]:
    """Each run's method label; runs that share one are told apart by their folder."""
    base = [method_label(s) for s in summaries]
    labels = [
        f"{b} ({p.name})" if base.count(b) > 1 else b for b, p in zip(base, paths, strict=True)
    ]
    return [f"{lab} #{i + 1}" if labels.count(lab) > 1 else lab for i, lab in enumerate(labels)]


def _require_one_federation(runs: Sequence[tuple[Path, Summary]]) -> None:
    """A study compares methods on one federation: runs of another modality or other sites
    would put unrelated figures side by side under one site's name or one table."""
    first_path, first = runs[0]
    for path, summary in runs[1:]:
        if summary.modality != first.modality:
            raise ConfigError(
                f"{path} is a {summary.modality} run but {first_path} a {first.modality} one: "
                "a study report compares methods on the same sites; write one report per "
                "federation"
            )
        if set(summary.sites) != set(first.sites):
            raise ConfigError(
                f"{path} was trained on sites {', '.join(summary.sites)} but {first_path} on "
                f"{', '.join(first.sites)}: a study report compares methods on the same "
                "sites; write one report per federation"
            )


def load_study(paths: Sequence[str | Path], *, models: bool = False) -> list[StudyRun]:
    """Read every run of the study (RunDirError names the first unusable one; a run given
    twice is refused). ``models``: check each run's model/ too (a damaged one makes the run
    unusable, whatever it measured)."""
    if not paths:
        raise ConfigError("the study report needs at least one run directory")
    seen: dict[Path, Path] = {}
    for path in map(Path, paths):
        first = seen.setdefault(path.resolve(), path)
        if first is not path:
            same = "is given twice" if str(first) == str(path) else f"is the same run as {first}"
            raise ConfigError(f"{path}: {same}; give each run directory once")
    read = []
    for path in paths:
        run = RunDir(path).require()
        summary = run.read_summary()
        if models:
            run.verify_model()
        facts = _site_facts(run.read_config())
        read.append((run, summary, facts, read_overview(run.path), _finished(run)))
    _require_one_federation([(r[0].path, r[1]) for r in read])
    labels = _unique_labels([r[1] for r in read], [r[0].path for r in read])
    return [
        StudyRun(run.path, label, summary, facts, overview, finished)
        for (run, summary, facts, overview, finished), label in zip(read, labels, strict=True)
    ]
