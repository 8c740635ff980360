"""Per-site and federation-level point metrics: pure functions of labels and scores.

Everything here takes numpy-compatible arrays and returns plain Python numbers, lists or frozen
dataclasses whose ``to_dict()`` is JSON-serialisable (no NaN, no infinity). Undefined values are
``None`` with a reason, never a made-up number: a test split holding one class has no AUC, and
reporting 0.5 would hide that from the clinician looking at the worst site.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from medfed.core import kinds
from medfed.metrics._common import (
    binary_scores,
    check_label_range,
    check_same_length,
    labels,
    pick_fields,
    probabilities,
)

ABSTAIN = -1
"""Value of ``routed_site`` for a scan that no site's model fits (the router abstained)."""


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
        values = pick_fields(cls, data)
        values["n_per_class"] = {int(c): int(k) for c, k in values["n_per_class"].items()}
        return cls(**values)


@dataclass(frozen=True)
class FederationMetrics:
    """Summary over sites, centred on the worst one.

    AUC fields are computed over the sites with a defined AUC and are ``None`` when no site has
    one; ``sites_without_auc`` names the sites left out. Ties for worst / best site go to the
    smallest site id, so the result does not depend on dict order.

    ``average_accuracy`` weights each site's accuracy by its number of test scans;
    ``average_accuracy_by_train`` weights it by its number of training scans (the weighting of
    the FedDRM reference code), and is ``None`` when the training counts were not given.
    """

    n_sites: int = kinds.count()
    mean_site_auc: float | None = kinds.auc()
    worst_site_auc: float | None = kinds.auc()
    worst_site: str | None
    best_site_auc: float | None = kinds.auc()
    best_site: str | None
    auc_std: float | None = kinds.amount()
    worst10_auc: float | None = kinds.auc()
    auc_gini: float | None = kinds.rate()
    average_accuracy: float = kinds.rate()
    mean_accuracy: float = kinds.rate()
    accuracy_std: float = kinds.amount()
    sites_without_auc: list[str] = kinds.part(hash=False, expected="a list of site ids")
    average_accuracy_by_train: float | None = kinds.rate(None)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FederationMetrics:
        """Inverse of ``to_dict``; a dict written before ``average_accuracy_by_train`` existed
        reads it as ``None``."""
        values = pick_fields(cls, data, optional=("average_accuracy_by_train",))
        values["sites_without_auc"] = list(values["sites_without_auc"])
        return cls(**values)


def site_metrics(y_true: ArrayLike, probs: ArrayLike, *, split: str = "test") -> SiteMetrics:
    """AUC, accuracy and balanced accuracy of one site's predictions.

    ``probs`` is ``(n, K)`` class probabilities, or ``(n,)`` the probability of class 1 for a
    binary task. The prediction is the argmax (ties go to the lower class, so p=0.5 predicts 0).
    AUC is the ROC AUC of class 1's probability for K=2 and the macro one-vs-rest AUC for K>2,
    averaged over the classes present in the split. ``split`` only words the reasons.
    """
    y = labels(y_true, "y_true")
    if y.size == 0:
        raise ValueError(
            f"{split} split is empty (n=0): metrics need at least one scan; "
            "check the site's split fractions and record count"
        )
    p = probabilities(probs, y.size)
    k = p.shape[1]
    check_label_range(y, k)
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


def federation_metrics(
    per_site: Mapping[str, SiteMetrics], n_train: Mapping[str, int] | None = None
) -> FederationMetrics:
    """Summarise per-site metrics: mean, worst, spread and inequality of AUC; accuracies.

    ``average_accuracy`` weights each site by its number of test scans (``SiteMetrics.n``, the
    FedDRM paper's figure); ``average_accuracy_by_train`` weights it by ``n_train[site]``, the
    site's number of training scans (the FedDRM reference code's weighting), and is ``None``
    when ``n_train`` is not given (extra sites in ``n_train`` are ignored). ``mean_accuracy``
    weights sites equally. ``worst10_auc`` is the mean AUC of the worst ceil(10%) of the sites
    with an AUC, at least one site. Spreads are population std (ddof=0).
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
        average_accuracy_by_train=None if n_train is None else _by_train(ids, acc, n_train),
    )


def _by_train(ids: list[str], acc: np.ndarray, n_train: Mapping[str, int]) -> float:
    missing = [s for s in ids if s not in n_train]
    if missing:
        raise ValueError(f"n_train has no training count for site(s) {', '.join(missing)}")
    weights = np.array([n_train[s] for s in ids], dtype=np.float64)
    if np.any(weights < 0) or not np.all(np.isfinite(weights)):
        got = {s: n_train[s] for s in ids}
        raise ValueError(f"n_train counts must be finite and >= 0; got {got}")
    if weights.sum() == 0:
        raise ValueError("n_train counts are all 0: no training scans to weight by")
    return float(np.sum(acc * weights) / np.sum(weights))


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
    y = labels(y_true, "y_true")
    pred = labels(y_pred, "y_pred")
    check_same_length(y, pred, "y_true", "y_pred")
    return float(np.mean(y == pred))


def routing_accuracy(true_site: ArrayLike, routed_site: ArrayLike) -> float:
    """Fraction of scans sent to the site they came from; abstentions (-1) count as wrong."""
    true = labels(true_site, "true_site")
    routed = _routed(routed_site)
    check_same_length(true, routed, "true_site", "routed_site")
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
    y = labels(y_true, "y_true")
    if y.size == 0:
        raise ValueError(f"{split} split is empty (n=0): no ROC curve to draw")
    s = binary_scores(scores, y.size)
    check_label_range(y, 2)
    present = np.unique(y)
    if present.size < 2:
        reason = _single_class_reason(split, int(present[0]), y.size)
        return {"fpr": None, "tpr": None, "thresholds": None, "reason": reason}
    from sklearn.metrics import roc_curve  # here: scikit-learn takes seconds to import

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
    from sklearn.metrics import roc_auc_score  # here: scikit-learn takes seconds to import

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


def _routed(routed_site: ArrayLike) -> np.ndarray:
    routed = labels(routed_site, "routed_site")
    if routed.size and routed.min() < ABSTAIN:
        raise ValueError(
            f"routed_site holds site indices >= 0 or {ABSTAIN} (abstain); got {routed.min()}"
        )
    return routed
