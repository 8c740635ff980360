"""Figures of a task with more than two classes (diabetic-retinopathy grades 0-4): per-class
and macro one-vs-rest AUC with their intervals, quadratic weighted kappa with a patient
bootstrap interval, and a graded task's binary endpoint ("referable": grade >= a cut-off).

Point figures come from scikit-learn (``roc_auc_score``, ``cohen_kappa_score`` with
``weights="quadratic"``); intervals resample patients, so that two eyes of one patient are
never counted as independent evidence. Undefined figures are ``None`` with a reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from medfed.metrics._common import check_label_range, labels, probabilities
from medfed.metrics.intervals import (
    Interval,
    auc_interval,
    cluster_weights,
    weighted_auc,
)

N_BOOT = 2000


@dataclass(frozen=True)
class ClassAUC:
    """One class against the rest: its AUC with a 95% CI (None with a reason when the split
    holds fewer than 2 of the class or of the rest), and its counts."""

    cls: int
    name: str
    auc: float | None
    interval: Interval | None
    n_pos: int
    n_neg: int
    reason: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ClassAUC:
        interval = data.get("interval")
        return cls(
            cls=int(data["cls"]),
            name=str(data["name"]),
            auc=data["auc"],
            interval=None if interval is None else Interval.from_dict(interval),
            n_pos=int(data["n_pos"]),
            n_neg=int(data["n_neg"]),
            reason=data.get("reason"),
        )


@dataclass(frozen=True)
class MulticlassFigure:
    """A multi-class figure (macro AUC, kappa) with its interval; ``None`` with a reason when
    undefined, and the interval ``None`` (with the reason) when only the point is defined."""

    value: float | None
    interval: Interval | None
    reason: str | None
    n: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MulticlassFigure:
        interval = data.get("interval")
        return cls(
            value=data["value"],
            interval=None if interval is None else Interval.from_dict(interval),
            reason=data.get("reason"),
            n=int(data["n"]),
        )


def _inputs(y_true: ArrayLike, probs: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    y = labels(y_true, "y_true")
    if y.size == 0:
        raise ValueError("y_true is empty: multi-class figures need at least one scan")
    p = probabilities(probs, y.size)
    check_label_range(y, p.shape[1])
    return y, p


def _groups(patients: ArrayLike | None, n: int) -> np.ndarray:
    if patients is None:
        return np.arange(n)
    values = np.asarray(patients)
    if values.shape != (n,):
        raise ValueError(f"patients must give one id per scan ({n}); got shape {values.shape}")
    return np.unique(values, return_inverse=True)[1].ravel()


def per_class_auc(
    y_true: ArrayLike,
    probs: ArrayLike,
    patients: ArrayLike | None = None,
    names: Mapping[int, str] | None = None,
    *,
    n_boot: int = N_BOOT,
    seed: int = 0,
) -> list[ClassAUC]:
    """Each class's one-vs-rest AUC with its CI (DeLong, or the patient-clustered bootstrap
    when a patient has several scans), by class index."""
    y, p = _inputs(y_true, probs)
    out = []
    for c in range(p.shape[1]):
        name = (names or {}).get(c, str(c))
        is_c = (y == c).astype(np.int64)
        n_pos, n_neg = int(is_c.sum()), int(y.size - is_c.sum())
        interval = auc_interval(is_c, p[:, c], patients, n_boot=n_boot, seed=seed)
        if interval is None:
            reason = f"{n_pos} scan(s) of class {name} and {n_neg} of the rest: too few for an AUC"
            out.append(ClassAUC(c, name, None, None, n_pos, n_neg, reason))
        else:
            out.append(ClassAUC(c, name, interval.estimate, interval, n_pos, n_neg, None))
    return out


def macro_auc(
    y_true: ArrayLike,
    probs: ArrayLike,
    patients: ArrayLike | None = None,
    *,
    n_boot: int = N_BOOT,
    seed: int = 0,
    level: float = 0.95,
) -> MulticlassFigure:
    """Macro one-vs-rest AUC over the classes present in ``y_true`` (scikit-learn's
    ``roc_auc_score(multi_class="ovr", average="macro")`` when every class is present), with
    a percentile interval from resampling patients; resamples that lose a class are skipped."""
    from sklearn.metrics import roc_auc_score  # here: scikit-learn takes seconds to import

    y, p = _inputs(y_true, probs)
    present = np.flatnonzero(np.bincount(y, minlength=p.shape[1]))
    if present.size < 2:
        reason = f"only class {int(present[0])} in the split (n={y.size}): macro AUC undefined"
        return MulticlassFigure(None, None, reason, int(y.size))
    value = float(np.mean([roc_auc_score(y == c, p[:, c]) for c in present]))
    groups = _groups(patients, y.size)
    weights = cluster_weights(groups, n_boot, np.random.default_rng(seed))
    per_class = np.stack(
        [weighted_auc((y == c).astype(np.int64), p[:, c], weights) for c in present]
    )
    valid = np.all(np.isfinite(per_class), axis=0)
    if not valid.any():
        reason = "every bootstrap resample lost a class: no interval"
        return MulticlassFigure(value, None, reason, int(y.size))
    boot = per_class[:, valid].mean(axis=0)
    low, high = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    method = _method("macro one-vs-rest AUC", groups, patients, n_boot, int(n_boot - valid.sum()))
    return MulticlassFigure(
        value, Interval(value, float(low), float(high), method, level), None, int(y.size)
    )


def quadratic_kappa(
    y_true: ArrayLike,
    y_pred: ArrayLike,
    n_classes: int,
    patients: ArrayLike | None = None,
    *,
    n_boot: int = N_BOOT,
    seed: int = 0,
    level: float = 0.95,
) -> MulticlassFigure:
    """Quadratic weighted kappa (scikit-learn's ``cohen_kappa_score(weights="quadratic")``)
    between the true and the predicted grades, with a percentile interval from resampling
    patients. ``None`` with a reason when agreement by chance is total (one grade only)."""
    from sklearn.metrics import cohen_kappa_score

    y = labels(y_true, "y_true")
    pred = labels(y_pred, "y_pred")
    if y.size == 0 or y.size != pred.size:
        raise ValueError(f"y_true ({y.size}) and y_pred ({pred.size}) must be equally long, > 0")
    check_label_range(y, n_classes)
    check_label_range(pred, n_classes)
    kappas = _weighted_kappas(y, pred, n_classes, np.ones((1, y.size)))
    if not np.isfinite(kappas[0]):
        reason = "true and predicted grades are all one grade: kappa undefined"
        return MulticlassFigure(None, None, reason, int(y.size))
    value = float(cohen_kappa_score(y, pred, weights="quadratic", labels=list(range(n_classes))))
    groups = _groups(patients, y.size)
    weights = cluster_weights(groups, n_boot, np.random.default_rng(seed))
    boot = _weighted_kappas(y, pred, n_classes, weights)
    valid = boot[np.isfinite(boot)]
    if valid.size == 0:
        return MulticlassFigure(
            value, None, "every bootstrap resample held one grade: no interval", y.size
        )
    low, high = np.quantile(valid, [(1 - level) / 2, (1 + level) / 2])
    method = _method("quadratic weighted kappa", groups, patients, n_boot, n_boot - valid.size)
    return MulticlassFigure(
        value, Interval(value, float(low), float(high), method, level), None, y.size
    )


def _weighted_kappas(y: np.ndarray, pred: np.ndarray, k: int, w: np.ndarray) -> np.ndarray:
    """Quadratic weighted kappa under each row of scan weights ``w`` (b, n); NaN where the
    expected disagreement is 0."""
    cells = np.eye(k * k)[y * k + pred]  # (n, k*k): each scan's (true, predicted) cell
    return kappa_of_confusions((np.atleast_2d(w) @ cells).reshape(-1, k, k))


def kappa_of_confusions(observed: np.ndarray) -> np.ndarray:
    """Quadratic weighted kappa of each ``(b, k, k)`` (weighted) confusion matrix of true
    against predicted grades; NaN where the expected disagreement is 0."""
    k = observed.shape[-1]
    total = observed.sum(axis=(1, 2))[:, None, None]
    grid = np.arange(k)
    penalty = (grid[:, None] - grid[None, :]) ** 2 / (k - 1) ** 2
    with np.errstate(divide="ignore", invalid="ignore"):
        expected = observed.sum(axis=2)[:, :, None] * observed.sum(axis=1)[:, None, :] / total
        disagreement = np.nan_to_num((penalty * expected).sum(axis=(1, 2)))
        return np.where(
            disagreement > 0, 1.0 - (penalty * observed).sum(axis=(1, 2)) / disagreement, np.nan
        )


def _method(what: str, groups: np.ndarray, patients: object, n_boot: int, skipped: int) -> str:
    kind = "scan-level" if patients is None else "patient-clustered"
    units = "scans" if patients is None else "patients"
    note = f"; {skipped} skipped" if skipped else ""
    count = int(groups.max()) + 1
    return f"{kind} bootstrap of the {what} ({n_boot} resamples, {count} {units}{note})"


def referable(
    y_true: ArrayLike, probs: ArrayLike, from_class: int
) -> tuple[np.ndarray, np.ndarray]:
    """A graded task's binary endpoint: ``y >= from_class`` and its score, the probability of
    a class at or above ``from_class`` (for ICDR grades, referable DR from grade 2)."""
    y, p = _inputs(y_true, probs)
    if not 1 <= from_class < p.shape[1]:
        raise ValueError(f"from_class must be between 1 and {p.shape[1] - 1}; got {from_class}")
    return (y >= from_class).astype(np.int64), np.clip(p[:, from_class:].sum(axis=1), 0.0, 1.0)
