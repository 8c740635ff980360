"""A deployed statistics-only run (RUN/statistics.json, written by the coordinator) logged to
MLflow: only what the sites' policies released, each refusal and each suppressed cell as such.

The coordinator's statistics.json holds no per-scan data: per site, its status (released,
refused by its policy with the rules that refused, or failed with a reason), the counts it
released (a cell on fewer scans than the policy's ``min_count`` is suppressed: its count is
absent) and how many cells of each table it suppressed. That file is the artifact; the tags and
metrics say per site what was released and what was kept back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from medfed.runs.statistics import read_statistics, statistics_path
from medfed.tracking.settings import metric_name

if TYPE_CHECKING:
    from medfed.runs.schema import FederationStatistics
    from medfed.tracking.runlog import Tracker

VALUE_CHARS = 6000  # MLflow's longest tag value


def is_statistics_run(folder: Path) -> bool:
    return statistics_path(folder).is_file()


def statistics_tags(stats: FederationStatistics, folder: Path) -> dict[str, str]:
    """What the run is, and per site what its policy let leave (status, refusals, reason)."""
    tags = {
        "medfed.kind": "statistics",
        "medfed.engine": stats.engine,
        "medfed.plan_sha256": stats.plan_sha256,
        "medfed.sites": ",".join(sorted(stats.sites)),
        "medfed.run_folder": str(folder.resolve()),
        "medfed.predictions": "none (statistics only: no per-scan data leaves a site)",
        "mlflow.runName": stats.run_name or folder.name,
    }
    for site, entry in sorted(stats.sites.items()):
        name = metric_name(site)
        tags[f"medfed.site_status.{name}"] = entry.status
        if entry.refusals:
            tags[f"medfed.refused.{name}"] = json.dumps(entry.refusals)[:VALUE_CHARS]
        if entry.reason:
            tags[f"medfed.reason.{name}"] = entry.reason[:VALUE_CHARS]
    return tags


def statistics_metrics(stats: FederationStatistics) -> list[tuple[str, float, int]]:
    """Sites released / refused / failed, and each site's suppressed cells per table."""
    out = []
    for status in ("released", "refused", "failed"):
        count = sum(1 for e in stats.sites.values() if e.status == status)
        out.append((f"sites_{status}", float(count), 0))
    for site, entry in sorted(stats.sites.items()):
        for table, cells in sorted(entry.suppressed.items()):
            out.append((metric_name(f"suppressed_cells.{site}.{table}"), float(cells), 0))
        if entry.status == "released":
            out.append((metric_name(f"min_count.{site}"), float(entry.min_count), 0))
    return out


def log_statistics_run(tracker: Tracker, folder: Path, parent: str | None = None) -> str:
    """Log the statistics-only run ``folder``; returns the MLflow run id (RUN/tracking.json
    records it, as for a trained run)."""
    stats = read_statistics(folder)
    assert stats is not None  # is_statistics_run(folder)
    run_id = tracker.start(folder.name, statistics_tags(stats, folder), parent)
    params = {
        "min_count": str(stats.min_count),
        "noise": stats.noise,
        "epsilon": str(stats.epsilon),
        "delta": str(stats.delta),
    }
    tracker.log(run_id, params, statistics_metrics(stats))
    for path in (statistics_path(folder), folder / "events.jsonl"):
        if path.is_file():
            tracker.client.log_artifact(run_id, str(path))
    tracker.finish(run_id)
    tracker.record(folder, run_id, parent)
    return run_id
