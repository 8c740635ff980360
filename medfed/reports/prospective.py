"""The prospective review's figures (``medfed.clinic.review``: sensitivity, specificity and
agreement against the clinicians' reads, kappa between readers) as text and markdown, for
``medfed review`` and the study report."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from medfed.reports.markdown import markdown_table
from medfed.reports.text import NA, UNRELIABLE_MARK, ci_text, count_text

PROSPECTIVE_FIGURES: dict[str, str] = {
    "sensitivity": "sensitivity",
    "specificity": "specificity",
    "agreement": "agreement with reader",
    "kappa": "kappa between readers",
    "ungradable_rate": "ungradable rate",
    "abstain_rate": "abstain rate",
}
"""The prospective review's figures (``medfed.clinic.review``), by key, as tables head them."""


def prospective_cell(row: Mapping[str, Any]) -> str:
    """One prospective figure: ``0.900 (0.700–0.970) 18/20`` for a rate, ``0.620 (0.410–0.830)
    n=30`` for kappa, ``n/a`` when it has no value; :data:`UNRELIABLE_MARK` when its note says
    it rests on too few positives or negatives."""
    value, low, high = row.get("value"), row.get("ci_low"), row.get("ci_high")
    if value is None:
        return NA
    if low is not None and high is not None:
        text = ci_text({"estimate": float(value), "low": float(low), "high": float(high)})
    else:
        text = ci_text(None, float(value))
    k, n = row.get("k"), row.get("n")
    text += f" {count_text(k, n)}" if k is not None else f" n={n}"
    note = row.get("note") or ""
    return f"{text} {UNRELIABLE_MARK}" if note.startswith("fewer than") else text


def prospective_grid(rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The figures as a grid: one row per scope (each site, then the system), one column per
    figure of :data:`PROSPECTIVE_FIGURES`."""
    scopes: dict[str, dict[str, Mapping[str, Any]]] = {}
    for row in rows:
        scopes.setdefault(str(row["scope"]), {})[str(row["figure"])] = row
    header = ["scope", *PROSPECTIVE_FIGURES.values()]
    grid = [
        [scope, *(prospective_cell(cells.get(key, {})) for key in PROSPECTIVE_FIGURES)]
        for scope, cells in scopes.items()
    ]
    return header, grid


def prospective_notes(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Why figures are unreliable (one line per scope) or missing (one line per figure and
    reason, naming the scopes)."""
    flagged: dict[tuple[str, str], list[str]] = {}
    missing: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        note, scope = row.get("note"), str(row.get("scope"))
        name = PROSPECTIVE_FIGURES.get(str(row.get("figure")), str(row.get("figure")))
        if not note:
            continue
        if str(note).startswith("fewer than"):
            flagged.setdefault((scope, str(note)), []).append(name)
        else:
            missing.setdefault((name, str(note)), []).append(scope)
    lines = [
        f"{UNRELIABLE_MARK} unreliable at {scope} ({', '.join(names)}): {note}"
        for (scope, note), names in flagged.items()
    ]
    lines += [f"{name}: {note} ({', '.join(s)})" for (name, note), s in missing.items()]
    return lines


def prospective_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The prospective figures as a markdown table with their notes below."""
    header, grid = prospective_grid(rows)
    return "\n".join([markdown_table(header, grid), *prospective_notes(rows)])


PROSPECTIVE_LEGEND = (
    "Each figure with its 95% CI and k/n (kappa: n scans read by two readers). Sensitivity, "
    "specificity and agreement score the model's answer at its site's operating point against "
    "each scan's first gradable read, on answered scans; kappa compares the latest reads of "
    "the first two readers of a scan; the abstain rate counts the scans routed in the window."
)
