"""The routing posterior's calibration in words and tables: what ``medfed evaluate``, the
dashboard's Routing page and report.html show of :attr:`Evaluation.routing_calibration`."""

from __future__ import annotations

from medfed.metrics import RoutingCalibration
from medfed.reports.markdown import markdown_table
from medfed.reports.text import fmt
from medfed.runs.schema import Evaluation

CALIBRATION_HEADER = [
    "posterior",
    "n",
    "routing acc.",
    "mean P(chosen)",
    "mean P(chosen), routed right",
    "ECE",
    "Brier",
]


def _row(label: str, c: RoutingCalibration) -> list[object]:
    return [label, c.n, c.accuracy, c.mean_chosen, c.mean_chosen_correct, c.ece, c.brier]


def posterior_rows(summary: Evaluation) -> list[list[object]]:
    """One row per posterior the run records: as routed (fitted temperature), and at
    temperature 1; [] for a run without them (a method that does not route, an older run)."""
    rows = []
    routed, raw = summary.routing_calibration, summary.routing_calibration_uncalibrated
    if routed is not None:
        rows.append(_row(f"as routed (temperature {fmt(routed.temperature, 3)})", routed))
    if raw is not None:
        rows.append(_row("uncalibrated (temperature 1)", raw))
    return rows


def reliability_rows(c: RoutingCalibration) -> list[list[object]]:
    """The reliability curve: per equal-mass bin, mean P(chosen site) and how often it was right."""
    return [[b["n"], b["mean_predicted"], b["fraction_correct"]] for b in c.bins]


def routing_calibration_text(summary: Evaluation) -> list[str]:
    """The evaluate output's section on the routing posterior (``n/a`` when the run has none)."""
    rows = posterior_rows(summary)
    title = f"Routing posterior P(site | scan) ({summary.routing_method}, pooled test scans)"
    if not rows:
        return [f"{title}: n/a (not in this run)"]
    c = summary.routing_calibration
    lines = [title, markdown_table(CALIBRATION_HEADER, rows)]
    if c is not None:
        lines += [
            "",
            "Reliability (as routed; equal-mass bins)",
            markdown_table(["n", "mean P(chosen)", "fraction routed right"], reliability_rows(c)),
        ]
        if c.low_margin is not None:
            lines.append(
                f"review queue: scans whose top two site probabilities are less than "
                f"{fmt(c.low_margin, 2)} apart are low margin (fitted on validation)"
            )
    return lines
