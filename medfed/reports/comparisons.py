"""Methods compared on the same test scans (``medfed.experiments.paired``) as markdown: each
figure with its bootstrap interval, each paired difference with its verdict, and the verdicts
in words, for the bench, the demo and the other experiments."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from medfed.reports.text import ci_text

VERDICTS = ("ahead", "behind", "no difference detected", "not measured")
"""Every verdict of a paired difference, in the order sentences name them."""


def ci_cell(interval: Mapping[str, Any] | None, digits: int = 2, flag: str = "") -> str:
    """``0.84 (0.78–0.90)``, with ``flag`` appended; ``n/a`` for an undefined figure."""
    if interval is None:
        return "n/a"
    return ci_text(interval, digits=digits) + flag


def difference_cell(found: Mapping[str, Any], digits: int = 3) -> str:
    """``+0.050 (+0.010 to +0.090) ahead``; ``not measured`` when there is no interval."""
    iv = found["interval"]
    if iv is None:
        return found["verdict"]
    d = digits
    return f"{iv['estimate']:+.{d}f} ({iv['low']:+.{d}f} to {iv['high']:+.{d}f}) {found['verdict']}"


def figure_title(comparisons: Mapping[str, Any], key: str) -> str:
    """``worst-site AUC (origin known)``: a compared figure as the comparisons describe it."""
    figure = comparisons["figures"][key]
    return f"{figure['label']} ({figure['protocol']})"


def comparison_rows(comparisons: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The header and rows of the table of differences (one row per method compared)."""
    ref = comparisons["reference"]
    keys = list(comparisons["figures"])
    header = ["method", *(f"{ref} \u2212 method: {figure_title(comparisons, k)}" for k in keys)]
    rows = [
        [name, *(difference_cell(found[k]) for k in keys)]
        for name, found in comparisons["methods"].items()
    ]
    return header, rows


def verdict_lines(comparisons: Mapping[str, Any], where: str) -> list[str]:
    """One sentence per figure, e.g. ``- fundus, worst-site AUC (origin known): feddrm ahead of
    fedavg; behind lora; no difference detected against fedbn.``: the reference's verdict
    against each method, read from the intervals' verdicts only."""
    ref = comparisons["reference"]
    lines = []
    for key in comparisons["figures"]:
        groups: dict[str, list[str]] = {v: [] for v in VERDICTS}
        for name, found in comparisons["methods"].items():
            groups[found[key]["verdict"]].append(name)
        linking = {"ahead": "of", "behind": "", "no difference detected": "against"}
        phrases = [
            " ".join(filter(None, (word, linking.get(word, "for"), ", ".join(names))))
            for word, names in groups.items()
            if names
        ]
        if phrases:
            lines.append(
                f"- {where}, {figure_title(comparisons, key)}: {ref} {'; '.join(phrases)}."
            )
    return lines
