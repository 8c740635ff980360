"""Input checks shared by the metrics modules (private to ``medfed.metrics``).

The names carry no underscore so the package's modules can import them; the module itself is
private, and nothing outside ``medfed.metrics`` should use it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

# Softmax in reduced precision drifts from 1 by up to ~1e-2; logits miss by far more.
PROB_TOL = 1e-2


def labels(values: ArrayLike, name: str) -> np.ndarray:
    """1-D integer labels (booleans become 0/1); floats must hold whole numbers."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one entry per scan); got shape {arr.shape}")
    if arr.dtype == np.bool_:
        return arr.astype(np.int64)
    if not np.issubdtype(arr.dtype, np.number):
        raise ValueError(f"{name} must hold integer indices; got dtype {arr.dtype}")
    if not np.issubdtype(arr.dtype, np.integer):
        bad = arr[~np.isfinite(arr) | (arr != np.round(arr))]
        if bad.size:
            raise ValueError(f"{name} must hold integer indices; got {bad[0]!r}")
    return arr.astype(np.int64)


def probabilities(probs: ArrayLike, n: int) -> np.ndarray:
    """``(n, K)`` class probabilities from ``(n, K)`` or ``(n,)`` P(class 1), checked."""
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim == 1:
        p = np.stack([1.0 - p, p], axis=1)
    elif p.ndim != 2 or p.shape[1] < 2:
        raise ValueError(
            f"probs must be (n, K >= 2) class probabilities or (n,) P(class 1); got {p.shape}"
        )
    if p.shape[0] != n:
        raise ValueError(f"probs has {p.shape[0]} rows but y_true has {n} labels")
    if not np.all(np.isfinite(p)):
        raise ValueError("probs contain NaN or infinite values; the model output is unusable")
    if p.min() < -PROB_TOL or p.max() > 1 + PROB_TOL:
        raise ValueError(
            f"probs must lie in [0, 1], got range [{p.min():g}, {p.max():g}]; "
            "pass softmax probabilities, not logits"
        )
    sums = p.sum(axis=1)
    if np.any(np.abs(sums - 1.0) > PROB_TOL):
        raise ValueError(
            f"probs rows must sum to 1, got sums in [{sums.min():g}, {sums.max():g}]; "
            "pass softmax probabilities, not logits or sigmoid outputs per class"
        )
    return p


def binary_scores(scores: ArrayLike, n: int) -> np.ndarray:
    """``(n,)`` scores of class 1 from ``(n,)`` or ``(n, 2)``, finite, matching ``n`` labels."""
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim == 2 and s.shape[1] == 2:
        s = s[:, 1]
    elif s.ndim != 1:
        raise ValueError(f"scores must be (n,) or (n, 2) for a binary task; got {s.shape}")
    if s.size != n:
        raise ValueError(f"scores has {s.size} entries but y_true has {n} labels")
    if not np.all(np.isfinite(s)):
        raise ValueError("scores contain NaN or infinite values; the model output is unusable")
    return s


def binary_inputs(y_true: ArrayLike, scores: ArrayLike, name: str = "y") -> tuple:
    """Checked ``(y, s)`` of a binary task: labels in {0, 1}, one finite score per label."""
    y = labels(y_true, name)
    check_label_range(y, 2)
    return y, binary_scores(scores, y.size)


def probability_scores(y_true: ArrayLike, probs: ArrayLike, name: str = "y") -> tuple:
    """Checked ``(y, p)``: binary labels and P(positive) in [0, 1] (a drift within
    ``PROB_TOL``, from reduced-precision softmax, is clipped)."""
    y, p = binary_inputs(y_true, probs, name)
    if p.size and (p.min() < -PROB_TOL or p.max() > 1 + PROB_TOL):
        raise ValueError(
            f"probabilities must lie in [0, 1], got range [{p.min():g}, {p.max():g}]; "
            "pass P(positive), not logits"
        )
    return y, np.clip(p, 0.0, 1.0)


def check_label_range(y: np.ndarray, k: int) -> None:
    if y.size and (y.min() < 0 or y.max() >= k):
        raise ValueError(
            f"y_true holds labels in [{y.min()}, {y.max()}] but the model scores {k} classes "
            f"(0..{k - 1}); check the site manifest's label map"
        )


def check_same_length(a: np.ndarray, b: np.ndarray, name_a: str, name_b: str) -> None:
    if a.size != b.size:
        raise ValueError(f"{name_a} has {a.size} entries but {name_b} has {b.size}")
    if a.size == 0:
        raise ValueError(f"{name_a} and {name_b} are empty: nothing to score")


def pick_fields(cls: type, data: Mapping[str, Any], optional: tuple[str, ...] = ()) -> dict:
    """The dataclass ``cls``'s fields from ``data``; keys in ``optional`` may be missing."""
    names = [f.name for f in fields(cls)]
    missing = [name for name in names if name not in data and name not in optional]
    if missing:
        raise ValueError(f"{cls.__name__}: missing key(s) {', '.join(missing)}")
    return {name: data[name] for name in names if name in data}


def finite(value: float, name: str) -> float:
    """``value`` as a float, refusing NaN and infinity (they are not JSON)."""
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"{name} must be finite; got {out}")
    return out
