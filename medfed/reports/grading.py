"""What ``medfed evaluate`` prints of a task with more than two classes (ICDR grades 0-4):
each site's macro one-vs-rest AUC and quadratic weighted kappa with their 95% CIs, each class
against the rest, the referable-DR endpoint at its operating point, and the routed system's
kappa."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from medfed.metrics import MulticlassFigure
from medfed.reports.markdown import markdown_table
from medfed.reports.text import (
    NA,
    UNRELIABLE_MARK,
    ci_text,
    count_text,
    fmt,
    operating_cells,
)
from medfed.runs.schema import Evaluation


def is_graded(summary: Evaluation) -> bool:
    """Whether the run holds multi-class figures (a task with more than two classes)."""
    return any(m.macro_auc is not None for m in summary.sites.values())


def figure_text(figure: MulticlassFigure | None) -> str:
    """``0.840 (0.780–0.900)``, the bare value with why it has no CI, or ``n/a (reason)``."""
    if figure is None:
        return NA
    if figure.value is None:
        return f"{NA} ({figure.reason})"
    if figure.interval is None:
        return f"{fmt(figure.value)} (no CI: {figure.reason})"
    return ci_text(figure.interval)


Table = tuple[list[str], list[list[Any]]]
"""A table's header and rows, for the markdown of ``medfed evaluate`` and the HTML report."""


def grading_rows(summary: Evaluation) -> Table:
    """Per site: macro one-vs-rest AUC and quadratic weighted kappa (argmax grade), each with
    its 95% CI, the test split's size and its scans per class."""
    header = ["site", "macro AUC (95% CI)", "quadratic weighted kappa (95% CI)", "n test"]
    header.append("scans per class")
    rows = []
    for site, m in summary.sites.items():
        counts = "/".join(str(c.n_pos) for c in m.class_auc or [])
        rows.append([site, figure_text(m.macro_auc), figure_text(m.kappa), m.n_test, counts])
    return header, rows


def class_auc_rows(summary: Evaluation) -> Table:
    """Each class against the rest, per site: AUC with its 95% CI (n/a: too few of a class)."""
    names = next((c.name for c in m.class_auc) for m in summary.sites.values() if m.class_auc)
    names = list(names)
    rows = []
    for site, m in summary.sites.items():
        cells = []
        for c in m.class_auc or []:
            text = (
                ci_text(c.interval)
                if c.interval is not None
                else f"{NA} ({c.n_pos} of {c.n_pos + c.n_neg})"
            )
            cells.append(text)
        rows.append([site, *cells])
    return ["site", *names], rows


def referable_rows(summary: Evaluation) -> tuple[list[str], list[list[Any]], list[str]]:
    """Referable DR per site: AUC with CI, counts, and the operating point chosen on the
    site's validation split (sensitivity, specificity, PPV, NPV with Wilson CIs); and a note
    for each site whose figures rest on too few scans."""
    header = ["site", "AUC (95% CI)", "referable/not", "rule", "threshold"]
    header += ["sensitivity", "specificity", "PPV", "NPV", "TP/FP/TN/FN", "note"]
    rows = []
    for site, m in summary.sites.items():
        r = m.referable
        if r is None:
            rows.append([site, *[NA] * 9, "no referable figures in this run"])
            continue
        mark = f" {UNRELIABLE_MARK}" if r.unreliable else ""
        auc = ci_text(r.auc_ci) if r.auc_ci is not None else f"{NA} ({r.auc_reason})"
        op = r.operating_point
        cells = [NA] * 8 if op is None else operating_cells(op, mark)
        rows.append([site, auc + mark, count_text(r.n_pos, r.n_neg), *cells])
    notes = [
        f"{UNRELIABLE_MARK} unreliable at {site}: {m.referable.unreliable}"
        for site, m in summary.sites.items()
        if m.referable is not None and m.referable.unreliable
    ]
    return header, rows, notes


def referable_heading(summary: Evaluation) -> str | None:
    """What the referable endpoint is, in words; None when the run has none."""
    referables = [m.referable for m in summary.sites.values() if m.referable is not None]
    if not referables:
        return None
    return (
        f"Referable DR (grade {referables[0].from_class} or worse against the rest; operating "
        "point chosen on each site's validation split)"
    )


def system_kappa_text(summary: Evaluation) -> str | None:
    """The routed system's kappa line; None for a two-class run."""
    if summary.system_kappa is None:
        return None
    return (
        "routed system, quadratic weighted kappa (pooled test scans, origin unknown): "
        f"{figure_text(summary.system_kappa)} n={summary.system_kappa.n}"
    )


@dataclass(frozen=True)
class Referable:
    """The referable endpoint's heading (:func:`referable_heading`), table and notes
    (:func:`referable_rows`)."""

    heading: str
    table: Table
    notes: list[str]


@dataclass(frozen=True)
class Grading:
    """What every view of a multi-class run shows, in this order: the per-site table
    (:func:`grading_rows`), each class against the rest (:func:`class_auc_rows`), the
    referable endpoint (None when the run has none) and the routed system's kappa line."""

    sites: Table
    classes: Table
    referable: Referable | None
    system_kappa: str | None


def grading_tables(summary: Evaluation) -> Grading | None:
    """The run's grading tables; None for a two-class run."""
    if not is_graded(summary):
        return None
    heading = referable_heading(summary)
    referable = None
    if heading is not None:
        header, rows, notes = referable_rows(summary)
        referable = Referable(heading, (header, rows), notes)
    return Grading(
        grading_rows(summary), class_auc_rows(summary), referable, system_kappa_text(summary)
    )


def grading_text(summary: Evaluation) -> list[str]:
    """The lines ``medfed evaluate`` adds for a multi-class run (none for a two-class one)."""
    graded = grading_tables(summary)
    if graded is None:
        return []
    parts = [
        "",
        "Grading (each site's model on its own test split; 95% CIs resample patients)",
        markdown_table(*graded.sites),
        "",
        "Each class against the rest (AUC with 95% CI)",
        markdown_table(*graded.classes),
    ]
    if graded.referable is not None:
        table = markdown_table(*graded.referable.table)
        parts += ["", graded.referable.heading, "\n".join([table, *graded.referable.notes])]
    if graded.system_kappa is not None:
        parts += ["", graded.system_kappa]
    return parts
