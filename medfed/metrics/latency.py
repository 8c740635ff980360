"""A median with its distribution-free 95% interval, for timings (milliseconds per scan)."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike
from scipy.stats import quantile_test

MIN_TIMINGS = 6  # below this no pair of order statistics covers the median at 95%


def median_interval(values: ArrayLike, level: float = 0.95) -> tuple[float, float, float] | None:
    """(median, low, high) of the finite ``values``: the order statistics that cover the
    population median with at least ``level`` probability (scipy's quantile test, no
    assumption on the distribution's shape). None for fewer than :data:`MIN_TIMINGS`."""
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    x = x[np.isfinite(x)]
    if x.size < MIN_TIMINGS:
        return None
    median = float(np.median(x))
    ci = quantile_test(x, q=median, p=0.5).confidence_interval(level)
    return median, float(ci.low), float(ci.high)
