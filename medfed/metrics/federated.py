"""Figures of the pooled test scans computed from what each site may send: sums and counts.

A site keeps its per-scan predictions; it sends, for the quadratic weighted kappa, its
confusion matrix of true against predicted grades (the point estimate) and one confusion
matrix per bootstrap replicate under Poisson(1) weights drawn per patient (the federated
bootstrap: the replicates of all sites summed give a replicate of the pooled scans), and, for
the routing posterior's calibration, per-bin sums over fixed-width confidence bins. Summing
the sites' parts and reading the figures off the sums gives the same figure as the pooled
scans would, exactly for the point figures and the calibration, and for the kappa's interval
a Poisson bootstrap of patients (close to the patient bootstrap on the pooled scans).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from medfed.metrics._common import check_label_range, labels
from medfed.metrics.intervals import Interval
from medfed.metrics.multiclass import N_BOOT, MulticlassFigure, kappa_of_confusions
from medfed.metrics.routing import RoutingCalibration

CALIBRATION_BINS = 10
"""Fixed-width bins of the chosen site's probability, [0, 0.1), ..., [0.9, 1.0]."""
BIN_SUMS = ("n", "confidence", "correct", "brier", "confidence_correct")
"""Per bin: scans, sum of the chosen site's probability, scans routed right, sum of the
multi-class Brier terms, sum of the chosen site's probability over scans routed right."""


def confusion_counts(y_true: ArrayLike, y_pred: ArrayLike, n_classes: int) -> np.ndarray:
    """``(k, k)`` counts of (true grade, predicted grade)."""
    y, pred = labels(y_true, "y_true"), labels(y_pred, "y_pred")
    if y.size != pred.size:
        raise ValueError(f"y_true ({y.size}) and y_pred ({pred.size}) must be equally long")
    check_label_range(y, n_classes)
    check_label_range(pred, n_classes)
    return np.bincount(y * n_classes + pred, minlength=n_classes**2).reshape(n_classes, -1)


def replicate_seed(seed: int, site: str) -> list[int]:
    """The seed of a site's bootstrap weights: the run's seed and the site's id (stable)."""
    return [int(seed) & 0xFFFFFFFF, zlib.crc32(site.encode("utf-8"))]


def poisson_confusions(
    y_true: ArrayLike,
    y_pred: ArrayLike,
    n_classes: int,
    patients: ArrayLike,
    rng: np.random.Generator,
    n_boot: int = N_BOOT,
) -> np.ndarray:
    """``(n_boot, k, k)`` confusion matrices, each scan weighted by its patient's Poisson(1)
    draw of that replicate (a patient's scans share it)."""
    y, pred = labels(y_true, "y_true"), labels(y_pred, "y_pred")
    codes = np.unique(np.asarray(patients), return_inverse=True)[1].ravel()
    if codes.size != y.size:
        raise ValueError(f"patients must give one id per scan ({y.size}); got {codes.size}")
    n_groups = int(codes.max()) + 1 if codes.size else 0
    draws = rng.poisson(1.0, size=(n_boot, n_groups)).astype(np.int64)
    cells = np.eye(n_classes * n_classes, dtype=np.int64)[y * n_classes + pred]
    return (draws[:, codes] @ cells).reshape(n_boot, n_classes, n_classes)


def pooled_kappa(
    confusion: ArrayLike, replicates: ArrayLike | None, *, level: float = 0.95
) -> MulticlassFigure:
    """Quadratic weighted kappa from the summed confusion matrix, with the percentile interval
    of the summed Poisson-bootstrap replicates (None when no replicates are given)."""
    observed = np.asarray(confusion, dtype=np.float64)
    n = int(observed.sum())
    value = float(kappa_of_confusions(observed[None])[0])
    if not np.isfinite(value):
        reason = "true and predicted grades are all one grade: kappa undefined"
        return MulticlassFigure(None, None, reason, n)
    if replicates is None:
        return MulticlassFigure(value, None, "no bootstrap replicates were sent", n)
    boot = kappa_of_confusions(np.asarray(replicates, dtype=np.float64))
    valid = boot[np.isfinite(boot)]
    if valid.size == 0:
        return MulticlassFigure(value, None, "every bootstrap resample held one grade", n)
    low, high = np.quantile(valid, [(1 - level) / 2, (1 + level) / 2])
    skipped = boot.size - valid.size
    note = f"; {skipped} skipped" if skipped else ""
    method = (
        f"quadratic weighted kappa, federated Poisson bootstrap of patients "
        f"({boot.size} resamples{note})"
    )
    return MulticlassFigure(value, Interval(value, float(low), float(high), method, level), None, n)


def routing_bin_sums(
    probs: ArrayLike, sites: ArrayLike, bins: int = CALIBRATION_BINS
) -> list[dict[str, float]]:
    """Per fixed-width bin of the chosen site's probability: the :data:`BIN_SUMS` (one dict
    per bin, low to high, empty bins included with n 0)."""
    p = np.asarray(probs, dtype=np.float64)
    y = np.asarray(sites, dtype=np.int64).reshape(-1)
    if p.ndim != 2 or p.shape[0] != y.size:
        raise ValueError(f"probabilities have shape {p.shape}; expected ({y.size}, K)")
    chosen = p.argmax(axis=1)
    confidence = p[np.arange(y.size), chosen]
    correct = (chosen == y).astype(np.float64)
    truth = np.zeros_like(p)
    truth[np.arange(y.size), y] = 1.0
    brier = ((p - truth) ** 2).sum(axis=1)
    which = width_bins(confidence, bins)
    values = {
        "n": np.ones(y.size),
        "confidence": confidence,
        "correct": correct,
        "brier": brier,
        "confidence_correct": confidence * correct,
    }
    sums = {k: np.bincount(which, weights=v, minlength=bins) for k, v in values.items()}
    return [
        {k: int(sums[k][b]) if k in ("n", "correct") else float(sums[k][b]) for k in BIN_SUMS}
        for b in range(bins)
    ]


def width_bins(confidence: np.ndarray, bins: int) -> np.ndarray:
    """Each probability's fixed-width bin of [0, 1] (1.0 falls in the last)."""
    return np.minimum((np.asarray(confidence) * bins).astype(np.int64), bins - 1)


def sum_bins(parts: Iterable[list[Mapping[str, Any]] | None]) -> list[dict[str, float]] | None:
    """The sites' bin sums added bin by bin; a bin a site left out (None) adds nothing."""
    total: list[dict[str, float]] | None = None
    for bins in parts:
        if bins is None:
            continue
        if total is None:
            total = [dict.fromkeys(BIN_SUMS, 0) for _ in bins]
        for into, got in zip(total, bins, strict=True):
            if got is None:
                continue
            for key in BIN_SUMS:
                into[key] += got[key]
    return total


def calibration_of_sums(
    bins: list[Mapping[str, float]], *, temperature: float = 1.0, low_margin: float | None = None
) -> RoutingCalibration | None:
    """The routing calibration the bin sums give (None when they hold no scan)."""
    n = sum(int(b["n"]) for b in bins)
    if n == 0:
        return None
    correct = sum(b["correct"] for b in bins)
    table = [
        {
            "mean_predicted": float(b["confidence"] / b["n"]),
            "fraction_correct": float(b["correct"] / b["n"]),
            "n": int(b["n"]),
        }
        for b in bins
        if b["n"]
    ]
    ece = sum(b["n"] * abs(b["fraction_correct"] - b["mean_predicted"]) for b in table) / n
    return RoutingCalibration(
        n=n,
        ece=float(ece),
        brier=float(sum(b["brier"] for b in bins) / n),
        accuracy=float(correct / n),
        mean_chosen=float(sum(b["confidence"] for b in bins) / n),
        mean_chosen_correct=(
            float(sum(b["confidence_correct"] for b in bins) / correct) if correct else None
        ),
        temperature=float(temperature),
        bins=table,
        low_margin=low_margin,
    )
