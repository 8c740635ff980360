"""Where a model is used: operating points (threshold, sensitivity, specificity, PPV, NPV) and
calibration (Brier score, ECE, calibration intercept and slope).

A threshold applies to P(positive): a scan is called positive iff its score >= the threshold.
The threshold is chosen on the validation split (``choose_threshold``) and then applied to the
test split (``operating_point``), never chosen on the split it is reported on.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy.special import logit

from medfed.core.operating_rule import OperatingRule
from medfed.metrics._common import binary_inputs, finite, pick_fields, probability_scores
from medfed.metrics.intervals import Proportion, wilson

_FALLBACK_THRESHOLD = 0.5
_P_CLIP = 1e-6  # calibration: probabilities are clipped into [1e-6, 1 - 1e-6] before the logit


@dataclass(frozen=True)
class OperatingPoint:
    """Counts and rates of one threshold on one split; ``note`` says why the threshold is not
    the rule's own choice (for example a validation split with one class)."""

    rule: str
    threshold: float
    tp: int
    fp: int
    tn: int
    fn: int
    sensitivity: Proportion
    specificity: Proportion
    ppv: Proportion
    npv: Proportion
    note: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "threshold", finite(self.threshold, "OperatingPoint.threshold"))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {name: getattr(self, name).to_dict() for name in _RATES}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OperatingPoint:
        values = pick_fields(cls, data, optional=("note",))
        for name in _RATES:
            values[name] = Proportion.from_dict(values[name])
        for name in ("tp", "fp", "tn", "fn"):
            values[name] = int(values[name])
        return cls(**values)


_RATES = ("sensitivity", "specificity", "ppv", "npv")


@dataclass(frozen=True)
class Calibration:
    """How well predicted probabilities match observed frequencies.

    ``brier``: mean squared error of the probabilities. ``ece``: expected calibration error over
    equal-mass bins, weighted by bin size. ``slope``: coefficient of logit(p) in a logistic
    regression of y on logit(p) (1 is ideal; < 1 means over-confident). ``intercept``:
    calibration-in-the-large, the intercept of a logistic model with logit(p) as offset
    (0 is ideal; > 0 means risks are under-estimated). ``reason`` says why intercept or slope is
    ``None``. ``bins``: ``{"mean_predicted", "fraction_positive", "n"}`` per bin, low to high.
    ``slope_ci``: the slope's Wald 95% interval from the same fit (None without a slope, and in
    a summary written before it was recorded).
    """

    n: int
    brier: float
    ece: float
    intercept: float | None
    slope: float | None
    reason: str | None
    bins: list[dict[str, Any]] = field(hash=False)
    slope_ci: tuple[float, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "brier": self.brier,
            "ece": self.ece,
            "intercept": self.intercept,
            "slope": self.slope,
            "slope_ci": None if self.slope_ci is None else list(self.slope_ci),
            "reason": self.reason,
            "bins": [dict(b) for b in self.bins],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Calibration:
        values = pick_fields(cls, data, optional=("slope_ci",))
        values["bins"] = [dict(b) for b in values["bins"]]
        ci = values.get("slope_ci")
        if ci is not None:
            low, high = (finite(v, "Calibration.slope_ci") for v in ci)
            if low > high:
                raise ValueError(f"Calibration.slope_ci: low {low} is above high {high}")
            values["slope_ci"] = (low, high)
        return cls(**values)


# ------------------------------------------------------------------------------ thresholds
def choose_threshold(
    y_val: ArrayLike, score_val: ArrayLike, rule: OperatingRule | str
) -> tuple[float, str | None]:
    """The threshold ``rule`` picks on the validation split, and a note when it could not.

    Candidate thresholds are the lowest score (everything positive), the midpoints between
    adjacent distinct scores, and the midpoint between the highest score and 1 (nothing
    positive): all finite, in [0, 1], and each as far as possible from the validation scores it
    separates. ``specificity:s`` picks the lowest candidate whose validation specificity is
    >= s (the most sensitive one); ``youden`` the candidate maximising tpr - fpr (ties: the
    higher threshold); ``threshold:t`` returns t. With one class (or no scans) in the
    validation split a data-driven rule falls back to 0.5 and the note says so.
    """
    if isinstance(rule, str):
        rule = OperatingRule.parse(rule)
    if rule.kind == "threshold":
        return float(rule.value), None  # type: ignore[arg-type]
    y, p = probability_scores(y_val, score_val, "y_val")
    present = np.unique(y)
    if present.size < 2:
        what = f"only class {int(present[0])}" if present.size else "no scans"
        return (
            _FALLBACK_THRESHOLD,
            f"validation split has {what} (n={y.size}): fixed threshold {_FALLBACK_THRESHOLD} used",
        )
    candidates = _candidates(p)
    pos, neg = np.sort(p[y == 1]), np.sort(p[y == 0])
    tpr = 1.0 - np.searchsorted(pos, candidates, side="left") / pos.size
    tnr = np.searchsorted(neg, candidates, side="left") / neg.size
    if rule.kind == "youden":
        j = tpr + tnr - 1.0
        best = np.flatnonzero(j >= j.max() - 1e-12)[-1]
        return float(candidates[best]), None
    target = float(rule.value)  # type: ignore[arg-type]
    feasible = np.flatnonzero(tnr >= target - 1e-12)
    if feasible.size:
        return float(candidates[feasible[0]]), None
    # Only when negatives score exactly 1: no threshold in [0, 1] separates them.
    return float(candidates[-1]), (
        f"no threshold in [0, 1] reaches validation specificity {target:g} (best "
        f"{tnr[-1]:.3f}): threshold {candidates[-1]:g} used"
    )


def _candidates(p: np.ndarray) -> np.ndarray:
    """Ascending thresholds, one per distinct way of splitting the scores ``p``."""
    u = np.unique(p)
    mids = (u[:-1] + u[1:]) / 2
    mids = np.where(mids > u[:-1], mids, u[1:])  # adjacent floats: no midpoint in between
    top = (u[-1] + 1.0) / 2
    tail = [top] if top > u[-1] else []
    return np.concatenate([u[:1], mids, tail])


def operating_point(
    y: ArrayLike, score: ArrayLike, threshold: float, rule: str, note: str | None = None
) -> OperatingPoint:
    """Confusion counts of ``score >= threshold`` against ``y``, and sensitivity, specificity,
    PPV and NPV as Wilson proportions (a rate over 0 scans has no interval)."""
    yy, s = binary_inputs(y, score)
    t = finite(threshold, "threshold")
    called = s >= t
    positive = yy == 1
    tp = int(np.sum(called & positive))
    fp = int(np.sum(called & ~positive))
    tn = int(np.sum(~called & ~positive))
    fn = int(np.sum(~called & positive))
    return OperatingPoint(
        rule=str(rule),
        threshold=t,
        tp=tp,
        fp=fp,
        tn=tn,
        fn=fn,
        sensitivity=wilson(tp, tp + fn),
        specificity=wilson(tn, tn + fp),
        ppv=wilson(tp, tp + fp),
        npv=wilson(tn, tn + fn),
        note=note,
    )


# ------------------------------------------------------------------------------ calibration
def calibration(y: ArrayLike, prob: ArrayLike, *, bins: int = 10) -> Calibration:
    """Brier score, ECE over ``bins`` equal-mass bins, calibration intercept and slope.

    Bins: the scans sorted by probability and cut into ``min(bins, n)`` groups whose sizes
    differ by at most one (tied probabilities may straddle a cut). Intercept and slope come
    from statsmodels' binomial GLM on logit(p), p clipped into [1e-6, 1 - 1e-6]; they are
    ``None``, with ``reason``, when the split holds one class. When the positives and negatives
    are perfectly separated by p (or all p are equal) the slope is ``None`` (its maximum
    likelihood estimate does not exist) but the intercept is still given.
    """
    yy, p = probability_scores(y, prob)
    if yy.size == 0:
        raise ValueError("calibration needs at least one scan; got none")
    if bins < 1:
        raise ValueError(f"bins must be >= 1; got {bins}")
    n = int(yy.size)
    order = np.argsort(p, kind="stable")
    groups = [g for g in np.array_split(order, min(bins, n)) if g.size]
    table = [
        {
            "mean_predicted": float(p[g].mean()),
            "fraction_positive": float(yy[g].mean()),
            "n": int(g.size),
        }
        for g in groups
    ]
    ece = sum(b["n"] * abs(b["fraction_positive"] - b["mean_predicted"]) for b in table) / n
    intercept, slope, slope_ci, reason = _intercept_and_slope(yy, p)
    return Calibration(
        n=n,
        brier=float(np.mean((p - yy) ** 2)),
        ece=float(ece),
        intercept=intercept,
        slope=slope,
        reason=reason,
        bins=table,
        slope_ci=slope_ci,
    )


def _intercept_and_slope(
    y: np.ndarray, p: np.ndarray
) -> tuple[float | None, float | None, tuple[float, float] | None, str | None]:
    present = np.unique(y)
    if present.size < 2:
        return (
            None,
            None,
            None,
            f"only class {int(present[0])} (n={y.size}): calibration intercept and slope undefined",
        )
    x = logit(np.clip(p, _P_CLIP, 1 - _P_CLIP))
    ones = np.ones((y.size, 1))
    intercept, _, why = _glm_coefficient(y, ones, x, 0)
    reasons = [f"calibration intercept not estimable: {why}"] if why else []
    slope: float | None = None
    slope_ci: tuple[float, float] | None = None
    if np.ptp(x) == 0:
        reasons.append("calibration slope undefined: every predicted probability is the same")
    elif x[y == 0].max() <= x[y == 1].min() or x[y == 1].max() <= x[y == 0].min():
        reasons.append(
            "calibration slope undefined: the probabilities separate positives from negatives "
            "perfectly, so the logistic fit has no finite slope"
        )
    else:
        slope, slope_ci, why = _glm_coefficient(y, np.column_stack([ones, x]), None, 1)
        if why:
            reasons.append(f"calibration slope not estimable: {why}")
    return intercept, slope, slope_ci, "; ".join(reasons) or None


def _glm_coefficient(
    y: np.ndarray, design: np.ndarray, offset: np.ndarray | None, index: int
) -> tuple[float | None, tuple[float, float] | None, str | None]:
    """One coefficient of a binomial GLM with its Wald 95% interval, or ``None`` and why the
    fit failed."""
    from statsmodels.genmod.families import Binomial
    from statsmodels.genmod.generalized_linear_model import GLM

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = GLM(y, design, family=Binomial(), offset=offset).fit()
        except Exception as exc:  # statsmodels raises several types on a degenerate fit
            return None, None, f"logistic fit failed ({type(exc).__name__}: {exc})"
    value = float(result.params[index])
    separation = [w for w in caught if "separation" in str(w.message).lower()]
    if separation:
        return None, None, "perfect separation detected by the logistic fit"
    if not getattr(result, "converged", True):
        return None, None, "the logistic fit did not converge"
    if not math.isfinite(value):
        return None, None, "the logistic fit gave a non-finite coefficient"
    low, high = (float(v) for v in np.asarray(result.conf_int(alpha=0.05))[index])
    interval = (low, high) if math.isfinite(low) and math.isfinite(high) else None
    return value, interval, None
