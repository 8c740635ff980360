"""Per-site and federation-level metrics: pure functions of labels and scores.

Everything here takes numpy-compatible arrays and returns plain Python numbers, lists or frozen
dataclasses whose ``to_dict()`` is JSON-serialisable (no NaN, no infinity). Undefined values are
``None`` with a reason, never a made-up number: a test split holding one class has no AUC, and
reporting 0.5 would hide that from the clinician looking at the worst site.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from sklearn.metrics import roc_auc_score, roc_curve

ABSTAIN = -1
"""Value of ``routed_site`` for a scan that no site's model fits (the router abstained)."""

# Softmax in reduced precision drifts from 1 by up to ~1e-2; logits miss by far more.
_PROB_TOL = 1e-2


@dataclass(frozen=True)
class SiteMetrics:
    """Metrics of one site's model on one split of that site's data.

    ``auc`` is ``None`` exactly when it is undefined, and then ``auc_reason`` says why.
    ``n_per_class`` counts every class the model predicts, 0 for classes absent from the split.
    """

    auc: float | None
    auc_reason: str | None
    accuracy: float
    balanced_accuracy: float
    n: int
    n_per_class: dict[int, int] = field(hash=False)

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"SiteMetrics needs n >= 1 scans, got n={self.n}")
        if (self.auc is None) != (self.auc_reason is not None):
            raise ValueError("SiteMetrics: give auc_reason exactly when auc is None")

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON; class keys become strings, as JSON requires."""
        data = asdict(self)
        data["n_per_class"] = {str(c): int(k) for c, k in sorted(self.n_per_class.items())}
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SiteMetrics:
        """Inverse of ``to_dict`` (for example when reading ``summary.json``)."""
        values = _pick_fields(cls, data)
        values["n_per_class"] = {int(c): int(k) for c, k in values["n_per_class"].items()}
        return cls(**values)


@dataclass(frozen=True)
class FederationMetrics:
    """Summary over sites, centred on the worst one.

    AUC fields are computed over the sites with a defined AUC and are ``None`` when no site has
    one; ``sites_without_auc`` names the sites left out. Ties for worst / best site go to the
    smallest site id, so the result does not depend on dict order.
    """

    n_sites: int
    mean_site_auc: float | None
    worst_site_auc: float | None
    worst_site: str | None
    best_site_auc: float | None
    best_site: str | None
    auc_std: float | None
    worst10_auc: float | None
    auc_gini: float | None
    average_accuracy: float
    mean_accuracy: float
    accuracy_std: float
    sites_without_auc: list[str] = field(hash=False)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FederationMetrics:
        """Inverse of ``to_dict``."""
        values = _pick_fields(cls, data)
        values["sites_without_auc"] = list(values["sites_without_auc"])
        return cls(**values)


def site_metrics(y_true: ArrayLike, probs: ArrayLike, *, split: str = "test") -> SiteMetrics:
    """AUC, accuracy and balanced accuracy of one site's predictions.

    ``probs`` is ``(n, K)`` class probabilities, or ``(n,)`` the probability of class 1 for a
    binary task. The prediction is the argmax (ties go to the lower class, so p=0.5 predicts 0).
    AUC is the ROC AUC of class 1's probability for K=2 and the macro one-vs-rest AUC for K>2,
    averaged over the classes present in the split. ``split`` only words the reasons.
    """
    y = _labels(y_true, "y_true")
    if y.size == 0:
        raise ValueError(
            f"{split} split is empty (n=0): metrics need at least one scan; "
            "check the site's split fractions and record count"
        )
    p = _probabilities(probs, y.size)
    k = p.shape[1]
    _check_label_range(y, k)
    pred = p.argmax(axis=1)
    counts = np.bincount(y, minlength=k)
    auc, reason = _auc(y, p, counts, split)
    return SiteMetrics(
        auc=auc,
        auc_reason=reason,
        accuracy=float(np.mean(pred == y)),
        balanced_accuracy=_balanced_accuracy(y, pred),
        n=int(y.size),
        n_per_class={c: int(counts[c]) for c in range(k)},
    )


def federation_metrics(per_site: Mapping[str, SiteMetrics]) -> FederationMetrics:
    """Summarise per-site metrics: mean, worst, spread and inequality of AUC; accuracies.

    ``average_accuracy`` weights each site by its number of scans (the FedDRM paper's figure);
    ``mean_accuracy`` weights sites equally. ``worst10_auc`` is the mean AUC of the worst
    ceil(10%) of the sites with an AUC, at least one site. Spreads are population std (ddof=0).
    """
    if not per_site:
        raise ValueError("federation_metrics needs at least one site; got an empty mapping")
    ids = sorted(per_site)
    acc = np.array([per_site[s].accuracy for s in ids], dtype=np.float64)
    n = np.array([per_site[s].n for s in ids], dtype=np.float64)
    return FederationMetrics(
        n_sites=len(ids),
        **_auc_summary({s: per_site[s].auc for s in ids}),
        average_accuracy=float(np.sum(acc * n) / np.sum(n)),
        mean_accuracy=float(np.mean(acc)),
        accuracy_std=float(np.std(acc)),
        sites_without_auc=[s for s in ids if per_site[s].auc is None],
    )


def gini(values: Iterable[float]) -> float:
    """Gini coefficient, population form: sum_ij |x_i - x_j| / (2 n^2 mean).

    0 when all values are equal (all zeros included); approaches 1 as one value takes all.
    Examples: [1, 1, 1] -> 0; [0, 0, 1] -> 2/3; [1, 2, 3, 4] -> 0.25. Values must be >= 0.
    """
    x = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=np.float64)
    x = x.ravel()
    if x.size == 0:
        raise ValueError("gini needs at least one value; got none")
    if not np.all(np.isfinite(x)):
        raise ValueError("gini got NaN or infinite values; drop undefined entries first")
    if np.any(x < 0):
        raise ValueError(f"gini is defined for values >= 0; got minimum {x.min():g}")
    mean = x.mean()
    if mean == 0:
        return 0.0
    return float(np.abs(x[:, None] - x[None, :]).sum() / (2 * x.size**2 * mean))


def system_accuracy(y_true: ArrayLike, y_pred: ArrayLike) -> float:
    """Fraction of scans the whole federation labels correctly (after routing or voting)."""
    y = _labels(y_true, "y_true")
    pred = _labels(y_pred, "y_pred")
    _check_same_length(y, pred, "y_true", "y_pred")
    return float(np.mean(y == pred))


def routing_accuracy(true_site: ArrayLike, routed_site: ArrayLike) -> float:
    """Fraction of scans sent to the site they came from; abstentions (-1) count as wrong."""
    true = _labels(true_site, "true_site")
    routed = _routed(routed_site)
    _check_same_length(true, routed, "true_site", "routed_site")
    if np.any(true < 0):
        raise ValueError(f"true_site holds site indices >= 0; got minimum {true.min()}")
    return float(np.mean(true == routed))


def abstain_rate(routed_site: ArrayLike) -> float:
    """Fraction of scans for which the router abstained (routed_site == -1)."""
    routed = _routed(routed_site)
    if routed.size == 0:
        raise ValueError("abstain_rate needs at least one routed scan; got none")
    return float(np.mean(routed == ABSTAIN))


def majority_vote(probs: ArrayLike) -> np.ndarray:
    """Class chosen by most of m models for each of n scans, from ``(m, n, K)`` probabilities.

    Each model votes its argmax. A tie between classes with the same number of votes goes to
    the tied class with the highest probability averaged over all m models (classes outside the
    tie are not eligible); an exact tie on that too goes to the lowest class index.
    """
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim != 3 or p.shape[0] < 1 or p.shape[2] < 2:
        raise ValueError(
            f"majority_vote expects probs of shape (m_models >= 1, n_scans, K >= 2); got {p.shape}"
        )
    if not np.all(np.isfinite(p)):
        raise ValueError("majority_vote got NaN or infinite probabilities from a site model")
    votes = p.argmax(axis=2)
    counts = (votes[..., None] == np.arange(p.shape[2])).sum(axis=0)
    tied = counts == counts.max(axis=1, keepdims=True)
    score = np.where(tied, p.mean(axis=0), -np.inf)
    return score.argmax(axis=1).astype(np.int64)


def roc_points(y_true: ArrayLike, scores: ArrayLike, *, split: str = "test") -> dict[str, Any]:
    """ROC curve of a binary task as JSON-ready lists: ``fpr``, ``tpr``, ``thresholds``, ``reason``.

    ``scores`` is the probability of class 1, ``(n,)``, or ``(n, 2)`` probabilities. The first
    threshold (above every score: nothing called positive) is ``None`` rather than infinity.
    With one class in ``y_true`` the three lists are ``None`` and ``reason`` says why.
    """
    y = _labels(y_true, "y_true")
    if y.size == 0:
        raise ValueError(f"{split} split is empty (n=0): no ROC curve to draw")
    s = _binary_scores(scores, y.size)
    _check_label_range(y, 2)
    present = np.unique(y)
    if present.size < 2:
        reason = _single_class_reason(split, int(present[0]), y.size)
        return {"fpr": None, "tpr": None, "thresholds": None, "reason": reason}
    fpr, tpr, thresholds = roc_curve(y, s)
    return {
        "fpr": [float(v) for v in fpr],
        "tpr": [float(v) for v in tpr],
        "thresholds": [float(t) if np.isfinite(t) else None for t in thresholds],
        "reason": None,
    }


def _auc(
    y: np.ndarray, p: np.ndarray, counts: np.ndarray, split: str
) -> tuple[float | None, str | None]:
    present = np.flatnonzero(counts)
    if present.size < 2:
        return None, _single_class_reason(split, int(present[0]), y.size)
    if p.shape[1] == 2:
        return float(roc_auc_score(y == 1, p[:, 1])), None
    # A class absent from the split has no one-vs-rest AUC; averaging over the present classes
    # keeps the rest usable, and n_per_class shows the absent ones.
    per_class = [roc_auc_score(y == c, p[:, c]) for c in present]
    return float(np.mean(per_class)), None


def _auc_summary(aucs: Mapping[str, float | None]) -> dict[str, Any]:
    defined = sorted((a, s) for s, a in aucs.items() if a is not None)
    if not defined:
        keys = ("mean_site_auc", "worst_site_auc", "worst_site", "best_site_auc", "best_site")
        return dict.fromkeys((*keys, "auc_std", "worst10_auc", "auc_gini"))
    values = np.array([a for a, _ in defined], dtype=np.float64)
    n_worst = max(1, -(-values.size // 10))  # ceil(10%) in integers: 0.1 * 30 is 3.0000000000000004
    best_auc = values[-1]
    best_site = min(s for a, s in defined if a == best_auc)
    return {
        "mean_site_auc": float(values.mean()),
        "worst_site_auc": float(values[0]),
        "worst_site": defined[0][1],
        "best_site_auc": float(best_auc),
        "best_site": best_site,
        "auc_std": float(values.std()),
        "worst10_auc": float(values[:n_worst].mean()),
        "auc_gini": gini(values),
    }


def _balanced_accuracy(y: np.ndarray, pred: np.ndarray) -> float:
    recalls = [np.mean(pred[y == c] == c) for c in np.unique(y)]
    return float(np.mean(recalls))


def _single_class_reason(split: str, cls: int, n: int) -> str:
    return f"{split} split has only class {cls} (n={n}): AUC undefined"


def _labels(values: ArrayLike, name: str) -> np.ndarray:
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


def _probabilities(probs: ArrayLike, n: int) -> np.ndarray:
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
    if p.min() < -_PROB_TOL or p.max() > 1 + _PROB_TOL:
        raise ValueError(
            f"probs must lie in [0, 1], got range [{p.min():g}, {p.max():g}]; "
            "pass softmax probabilities, not logits"
        )
    sums = p.sum(axis=1)
    if np.any(np.abs(sums - 1.0) > _PROB_TOL):
        raise ValueError(
            f"probs rows must sum to 1, got sums in [{sums.min():g}, {sums.max():g}]; "
            "pass softmax probabilities, not logits or sigmoid outputs per class"
        )
    return p


def _binary_scores(scores: ArrayLike, n: int) -> np.ndarray:
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim == 2 and s.shape[1] == 2:
        s = s[:, 1]
    elif s.ndim != 1:
        raise ValueError(f"scores must be (n,) or (n, 2) for a binary ROC curve; got {s.shape}")
    if s.size != n:
        raise ValueError(f"scores has {s.size} entries but y_true has {n} labels")
    if not np.all(np.isfinite(s)):
        raise ValueError("scores contain NaN or infinite values; the model output is unusable")
    return s


def _check_label_range(y: np.ndarray, k: int) -> None:
    if y.size and (y.min() < 0 or y.max() >= k):
        raise ValueError(
            f"y_true holds labels in [{y.min()}, {y.max()}] but the model scores {k} classes "
            f"(0..{k - 1}); check the site manifest's label map"
        )


def _check_same_length(a: np.ndarray, b: np.ndarray, name_a: str, name_b: str) -> None:
    if a.size != b.size:
        raise ValueError(f"{name_a} has {a.size} entries but {name_b} has {b.size}")
    if a.size == 0:
        raise ValueError(f"{name_a} and {name_b} are empty: nothing to score")


def _routed(routed_site: ArrayLike) -> np.ndarray:
    routed = _labels(routed_site, "routed_site")
    if routed.size and routed.min() < ABSTAIN:
        raise ValueError(
            f"routed_site holds site indices >= 0 or {ABSTAIN} (abstain); got {routed.min()}"
        )
    return routed


def _pick_fields(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    names = [f.name for f in fields(cls)]
    missing = [name for name in names if name not in data]
    if missing:
        raise ValueError(f"{cls.__name__}: missing key(s) {', '.join(missing)}")
    return {name: data[name] for name in names}
