"""One figure as text: a value, a figure with its 95% CI, a rate with its counts, a count. Every
table of medfed (the CLI's, the dashboard's, the HTML report's, the experiments') writes its
figures through these, so a figure reads the same wherever it is shown."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from medfed.metrics import Interval, OperatingPoint, Pooled, Proportion

NA = "n/a"

UNRELIABLE_MARK = "\u2020"
"""Marks a figure resting on fewer than 10 positives or negatives; a note below names why."""


def fmt(value: Any, digits: int = 3) -> str:
    """A value as the tables print it: floats to ``digits`` decimals, None as ``n/a``."""
    if value is None:
        return NA
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _bounds(interval: Interval | Pooled | Mapping[str, Any]) -> tuple[float, float, float]:
    if isinstance(interval, Mapping):  # an interval as results.json stores it
        return interval["estimate"], interval["low"], interval["high"]
    return interval.estimate, interval.low, interval.high


def bounds_text(interval: Interval | Pooled | Mapping[str, Any], digits: int = 3) -> str:
    """``0.780–0.900``: an interval's bounds alone."""
    _, low, high = _bounds(interval)
    return f"{low:.{digits}f}\u2013{high:.{digits}f}"


def ci_text(
    interval: Interval | Pooled | Mapping[str, Any] | None,
    fallback: float | None = None,
    digits: int = 3,
    *,
    no_ci: str = "",
) -> str:
    """``0.840 (0.780–0.900)``; without an interval the bare ``fallback`` (followed by
    ``(no_ci)`` when given), or ``n/a`` when there is no value either."""
    if interval is not None:
        estimate = _bounds(interval)[0]
        return f"{estimate:.{digits}f} ({bounds_text(interval, digits)})"
    if fallback is None or (isinstance(fallback, float) and math.isnan(fallback)):
        return NA
    return f"{fmt(fallback, digits)} ({no_ci})" if no_ci else fmt(fallback, digits)


def count_text(k: Any, n: Any) -> str:
    """``18/20``: k of n (positives of negatives, hits of scans)."""
    return f"{k}/{n}"


def rate_text(
    rate: Proportion | None, fallback: float | None = None, digits: int = 3, *, no_ci: str = ""
) -> str:
    """``0.900 (0.700–0.970) 18/20``; ``n/a (0 scans)`` when there was nothing to count; a run
    without counts shows its plain rate (see :func:`ci_text`), or ``n/a``."""
    if rate is None:
        return ci_text(None, fallback, digits, no_ci=no_ci)
    if rate.interval is None:
        return f"{NA} (0 scans)"
    return f"{ci_text(rate.interval, digits=digits)} {count_text(rate.k, rate.n)}"


def pooled_text(pooled: Pooled | None, digits: int = 3, *, sites: bool = False) -> str:
    """``0.840 (0.780–0.900), I² 35%`` (``sites``: then ``over 5 sites``), or ``n/a``."""
    if pooled is None:
        return NA
    text = f"{ci_text(pooled, digits=digits)}, I\u00b2 {100 * pooled.i2:.0f}%"
    return f"{text} over {pooled.n_sites} sites" if sites else text


def operating_cells(op: OperatingPoint, mark: str = "") -> list[Any]:
    """An operating point's cells: rule, threshold, sensitivity, specificity, PPV and NPV
    (each with its Wilson CI and k/n, then ``mark``), TP/FP/TN/FN and its note."""
    rates = (op.sensitivity, op.specificity, op.ppv, op.npv)
    return [
        op.rule,
        op.threshold,
        *(rate_text(r) + mark for r in rates),
        f"{op.tp}/{op.fp}/{op.tn}/{op.fn}",
        op.note or "",
    ]
