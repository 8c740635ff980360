"""Sections of the study report that check the figures against something else: the paired
comparisons ``medfed demo`` and ``medfed compare`` wrote beside the runs (each method against the
reference on the same test scans), the scans whose clinicians disagree (figures the caller
passes in; the audit log belongs to serving), and how far the routing posterior can be trusted
(its calibration on the pooled test scans)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from medfed.reports.comparisons import comparison_rows, verdict_lines
from medfed.reports.html import Html, join, table, tag
from medfed.reports.routing import CALIBRATION_HEADER, posterior_rows, reliability_rows
from medfed.reports.study_runs import StudyRun
from medfed.reports.text import fmt
from medfed.runs.schema import Evaluation

COMPARISON_FILES = ("demo-table.json", "demo-ct-table.json", "compare-table.json")
"""What ``medfed demo`` and ``medfed compare`` write into OUT, beside OUT/runs/METHOD."""


def read_comparisons(runs: Sequence[StudyRun]) -> dict[Path, dict[str, Any]]:
    """The paired comparisons written beside the runs (OUT/MARKER.json for runs in OUT/runs/),
    by file, each file once; files without comparisons, or unreadable, are left out."""
    found: dict[Path, dict[str, Any]] = {}
    for run in runs:
        if run.path.parent.name != "runs":
            continue
        for name in COMPARISON_FILES:
            path = run.path.parent.parent / name
            if path in found or not path.is_file():
                continue
            try:
                record = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError):
                continue
            if isinstance(record, Mapping) and isinstance(record.get("comparisons"), Mapping):
                found[path] = dict(record)
    return found


def comparisons_section(records: Mapping[Path, Mapping[str, Any]]) -> list[Html]:
    """Each file's table of paired differences with how they were formed and the verdicts."""
    parts: list[Html] = []
    for path, record in records.items():
        comparisons = record["comparisons"]
        try:
            header, rows = comparison_rows(comparisons)
            where = f"seed {record.get('seed', 'n/a')}"
            verdicts = [line.removeprefix("- ") for line in verdict_lines(comparisons, where)]
            how = f"{comparisons['ci']}; {comparisons['verdict_rule']}."
        except (KeyError, TypeError, AttributeError):
            parts.append(tag("p", f"{path}: n/a (not a comparison medfed can read)."))
            continue
        caption = f"{record.get('command', 'medfed')} ({path})"
        parts += [table(header, rows, caption=caption), tag("p", how)]
        if verdicts:
            parts.append(tag("ul", join(tag("li", v) for v in verdicts)))
    return parts


DISAGREEMENT_HEADER = ("scan", "file", "routed to", "model's answer", "reads")


def disagreements_section(
    runs: Sequence[StudyRun], disagreements: Mapping[Path, Sequence[Mapping[str, Any]]]
) -> list[Html]:
    """Each run's scans whose readers' latest reads differ (the rows of
    ``medfed.clinic.review.Review.disagreements`` as dicts), when it has any."""
    by_path = {Path(path).resolve(): rows for path, rows in disagreements.items()}
    parts: list[Html] = []
    for run in runs:
        found = by_path.get(run.path.resolve())
        if not found:
            continue
        rows = [
            [
                d["scan_id"],
                d["file"],
                d.get("chosen_site") or "abstained",
                d.get("prediction") or "n/a",
                "; ".join(f"{reader}: {read}" for reader, read in sorted(d["reads"].items())),
            ]
            for d in found
        ]
        caption = f"{run.label}: {len(rows)} scan(s) read differently"
        parts.append(table(list(DISAGREEMENT_HEADER), rows, caption=caption))
    return parts


def posterior_tables(label: str, summary: Evaluation) -> list[Html]:
    """How far a run's site probabilities can be trusted, as report.html's tables (none for a
    run without them)."""
    rows = [[c if isinstance(c, str) else fmt(c) for c in r] for r in posterior_rows(summary)]
    if not rows:
        return []
    caption = f"{label}: routing posterior P(site | scan) on the pooled test scans"
    out = [table(CALIBRATION_HEADER, rows, caption=caption)]
    if summary.routing_calibration is not None:
        bins = [[fmt(c) for c in r] for r in reliability_rows(summary.routing_calibration)]
        header = ["n", "mean P(chosen)", "fraction routed right"]
        out.append(table(header, bins, caption=f"{label}: reliability, as routed"))
    return out
