"""How sure a figure is: confidence intervals for AUCs and rates, pooling, paired differences.

* ``delong`` / ``delong_paired``: the AUC and its DeLong variance, by the fast midrank algorithm
  (Sun & Xu 2014), for one score or for the difference of two scores of the same scans.
* ``auc_interval``: DeLong when every patient has one scan, else a bootstrap that resamples
  patients (scans of one patient are not independent evidence); ``bootstrap_auc_interval``.
* ``wilson``: a rate with its counts and its Wilson interval (``Proportion``).
* ``pooled_auc``: random-effects (DerSimonian-Laird) pooling of per-site AUCs on the logit scale.
* ``paired_bootstrap``: the interval of a difference between two methods scored on the same
  scans, for any statistic of the per-stratum data; ``verdict`` words it.

Everything returned is JSON-safe through ``to_dict`` (no NaN, no infinity). statsmodels and
scipy.stats are imported inside the functions that use them: the CLI, and every Flower
ClientApp process, imports this package and starts seconds faster without them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy.special import expit, logit

from medfed.metrics._common import binary_inputs, finite, labels

# pooled_auc: an AUC of exactly 0 or 1 has no logit, and a variance of 0 (DeLong's answer for a
# perfectly separated site) would give that site infinite weight. AUCs are clipped into
# [_AUC_EPS, 1 - _AUC_EPS] and variances floored at _VAR_FLOOR (a standard error of 0.001 on
# the AUC scale) before the transform; the method text says when either happened.
_AUC_EPS = 1e-3
_VAR_FLOOR = 1e-6

# bootstrap_auc_interval works on blocks of resamples of at most this many (resample, scan)
# weights, so memory stays bounded for large splits.
_BLOCK = 4_000_000


@dataclass(frozen=True)
class Interval:
    """An estimate with its confidence interval; ``method`` says how the interval was made."""

    estimate: float
    low: float
    high: float
    method: str
    level: float = 0.95

    def __post_init__(self) -> None:
        for name in ("estimate", "low", "high", "level"):
            object.__setattr__(self, name, finite(getattr(self, name), f"Interval.{name}"))
        if not 0 < self.level < 1:
            raise ValueError(f"Interval.level must be in (0, 1); got {self.level}")
        if self.low > self.high:
            raise ValueError(f"Interval: low {self.low} is above high {self.high}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Interval:
        return cls(
            estimate=data["estimate"],
            low=data["low"],
            high=data["high"],
            method=data["method"],
            level=data.get("level", 0.95),
        )

    def text(self, digits: int = 3) -> str:
        """``0.840 (0.780–0.900)``."""
        return f"{self.estimate:.{digits}f} ({self.low:.{digits}f}\u2013{self.high:.{digits}f})"


@dataclass(frozen=True)
class Proportion:
    """A rate ``k / n`` with its counts and its Wilson interval; ``interval`` is ``None``
    exactly when ``n == 0`` (no scans to form the rate: a PPV with no predicted positives)."""

    k: int
    n: int
    interval: Interval | None

    def __post_init__(self) -> None:
        object.__setattr__(self, "k", _count(self.k, "Proportion.k"))
        object.__setattr__(self, "n", _count(self.n, "Proportion.n"))
        if self.k > self.n:
            raise ValueError(f"Proportion: k={self.k} is more than n={self.n}")
        if (self.interval is None) != (self.n == 0):
            raise ValueError("Proportion: give an interval exactly when n > 0")

    @property
    def value(self) -> float | None:
        return self.k / self.n if self.n else None

    def to_dict(self) -> dict[str, Any]:
        """``{"k", "n", "value", "low", "high", "method", "level"}``; the last four ``None``
        when ``n == 0``."""
        iv = self.interval
        return {
            "k": self.k,
            "n": self.n,
            "value": self.value,
            "low": iv.low if iv else None,
            "high": iv.high if iv else None,
            "method": iv.method if iv else None,
            "level": iv.level if iv else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Proportion:
        k, n = int(data["k"]), int(data["n"])
        if n == 0:
            return cls(k, n, None)
        interval = Interval(
            estimate=data["value"] if data.get("value") is not None else k / n,
            low=data["low"],
            high=data["high"],
            method=data["method"],
            level=data.get("level") or 0.95,
        )
        return cls(k, n, interval)

    def text(self, digits: int = 3) -> str:
        """``0.900 (0.700–0.970) 18/20``, or ``n/a (0 scans)``."""
        if self.interval is None:
            return "n/a (0 scans)"
        return f"{self.interval.text(digits)} {self.k}/{self.n}"


@dataclass(frozen=True)
class Pooled:
    """A random-effects pooled AUC over sites, on the AUC scale, with its heterogeneity.

    ``i2`` is I² as a fraction in [0, 1]; ``tau2`` (between-site variance) and ``q`` (Cochran's
    Q) are on the logit-AUC scale the pooling is done on.
    """

    estimate: float
    low: float
    high: float
    i2: float
    tau2: float
    q: float
    n_sites: int
    method: str
    level: float = 0.95

    def __post_init__(self) -> None:
        for name in ("estimate", "low", "high", "i2", "tau2", "q", "level"):
            object.__setattr__(self, name, finite(getattr(self, name), f"Pooled.{name}"))
        object.__setattr__(self, "n_sites", _count(self.n_sites, "Pooled.n_sites"))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Pooled:
        keys = ("estimate", "low", "high", "i2", "tau2", "q", "n_sites", "method")
        return cls(**{k: data[k] for k in keys}, level=data.get("level", 0.95))

    def text(self, digits: int = 3) -> str:
        """``0.840 (0.780–0.900), I² 35% over 5 sites``."""
        d = digits
        return (
            f"{self.estimate:.{d}f} ({self.low:.{d}f}\u2013{self.high:.{d}f}), "
            f"I\u00b2 {100 * self.i2:.0f}% over {self.n_sites} sites"
        )


# ------------------------------------------------------------------------------ AUC and DeLong
def auc_fast(y: ArrayLike, score: ArrayLike) -> float:
    """ROC AUC of a binary task from midranks (ties count one half); equals sklearn's
    ``roc_auc_score``. ``ValueError`` when ``y`` holds one class."""
    yy, s = _two_class(y, score, "AUC")
    n1 = int(yy.sum())
    n0 = yy.size - n1
    from scipy.stats import rankdata  # here: scipy.stats takes seconds to import

    ranks = rankdata(s)
    return float((ranks[yy == 1].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def delong(y: ArrayLike, score: ArrayLike) -> tuple[float, float]:
    """The AUC and its DeLong variance.

    Fast midrank algorithm (Sun & Xu 2014): the structural components V10 (one per positive)
    and V01 (one per negative) come from three rankings, and the variance is
    ``var(V10) / m + var(V01) / n`` (sample variances) for m positives and n negatives.
    ``ValueError`` with one class, or with fewer than 2 positives or 2 negatives (the variance
    of a single component is undefined).
    """
    yy, s = _two_class(y, score, "DeLong")
    aucs, cov = _delong_cov(yy, s[None, :])
    return float(aucs[0]), float(max(cov[0, 0], 0.0))


def delong_paired(y: ArrayLike, score_a: ArrayLike, score_b: ArrayLike) -> tuple[float, float]:
    """``AUC_a - AUC_b`` on the same scans and the DeLong variance of that difference,
    ``var_a + var_b - 2 cov_ab`` (0 for identical scores)."""
    yy, a = _two_class(y, score_a, "DeLong")
    _, b = binary_inputs(yy, score_b)
    aucs, cov = _delong_cov(yy, np.stack([a, b]))
    var = cov[0, 0] + cov[1, 1] - 2 * cov[0, 1]
    return float(aucs[0] - aucs[1]), float(max(var, 0.0))


def _delong_cov(y: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """AUCs of each row of ``scores`` (k, N) and their DeLong covariance matrix (k, k)."""
    pos, neg = scores[:, y == 1], scores[:, y == 0]
    m, n = pos.shape[1], neg.shape[1]
    if m < 2 or n < 2:
        raise ValueError(
            f"DeLong variance needs at least 2 positives and 2 negatives; got {m} and {n}"
        )
    from scipy.stats import rankdata

    tz = rankdata(np.concatenate([pos, neg], axis=1), axis=1)
    v10 = (tz[:, :m] - rankdata(pos, axis=1)) / n  # per positive: share of negatives below
    v01 = 1.0 - (tz[:, m:] - rankdata(neg, axis=1)) / m  # per negative: share of positives above
    aucs = v10.mean(axis=1)
    cov = np.atleast_2d(np.cov(v10)) / m + np.atleast_2d(np.cov(v01)) / n
    return aucs, cov


def auc_variance(y: ArrayLike, score: ArrayLike) -> tuple[float, float, str]:
    """The AUC, a variance for it, and how that variance was found.

    DeLong's variance, unless the scores separate the classes perfectly (or perfectly wrongly):
    then DeLong's variance is 0, which would claim certainty from a handful of scans. In that
    case the Hanley–McNeil variance at a continuity-corrected AUC, 1 − 1/(2mn) (or 1/(2mn)),
    is used, which shrinks with the counts as it should. ``ValueError`` as for :func:`delong`.
    """
    auc, var = delong(y, score)
    if var > 0:
        return auc, var, "DeLong"
    yy = np.asarray(y)
    m, n = int((yy == 1).sum()), int((yy == 0).sum())
    corrected = 1.0 - 0.5 / (m * n)
    q1, q2 = corrected / (2 - corrected), 2 * corrected**2 / (1 + corrected)
    spread = corrected * (1 - corrected) + (m - 1) * (q1 - corrected**2)
    hanley = (spread + (n - 1) * (q2 - corrected**2)) / (m * n)
    method = "DeLong; no overlap between the classes: Hanley-McNeil variance at AUC 1 - 1/(2mn)"
    return auc, float(hanley), method


def auc_interval(
    y: ArrayLike,
    score: ArrayLike,
    patients: ArrayLike | None = None,
    *,
    level: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
) -> Interval | None:
    """The AUC with its confidence interval; ``None`` when ``y`` holds fewer than 2 positives
    or 2 negatives (one scan of a class bounds nothing: the figure is flagged, not dressed up
    with an interval that has no width).

    :func:`auc_variance` (DeLong, normal on the AUC scale, clipped to [0, 1]) when ``patients``
    is ``None`` or every patient has exactly one scan; otherwise the patient-clustered
    bootstrap. The method chosen is named in ``Interval.method``.
    """
    yy, s = binary_inputs(y, score)
    _check_level(level)
    if min(int((yy == 1).sum()), int((yy == 0).sum())) < 2:
        return None
    if patients is not None:
        groups = _groups(patients, yy.size, "patients")
        if np.bincount(groups).max() > 1:
            return bootstrap_auc_interval(yy, s, groups, level=level, n_boot=n_boot, seed=seed)
    auc, var, method = auc_variance(yy, s)
    half = _z(level) * math.sqrt(var)
    return Interval(auc, max(0.0, auc - half), min(1.0, auc + half), method, level)


def bootstrap_auc_interval(
    y: ArrayLike,
    score: ArrayLike,
    clusters: ArrayLike | None = None,
    *,
    level: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
) -> Interval:
    """Percentile bootstrap interval of the AUC; the estimate is the AUC of the data as given.

    ``clusters=None`` resamples scans; otherwise ``clusters`` gives each scan's cluster
    (patient) and whole clusters are resampled with replacement, keeping all their scans.
    Resamples with one class are skipped and counted in ``method``. Each resample is a vector
    of multiplicities over the scans, and its AUC is computed from one sort of the scores, so
    2000 resamples of 2000 scans take well under a second. ``ValueError`` with one class.
    """
    yy, s = _two_class(y, score, "the bootstrap AUC")
    _check_level(level)
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1; got {n_boot}")
    if clusters is None:
        groups, kind = np.arange(yy.size), f"scan-level bootstrap ({n_boot} resamples"
    else:
        groups = _groups(clusters, yy.size, "clusters")
        n_groups = int(groups.max()) + 1
        kind = f"patient-clustered bootstrap ({n_boot} resamples, {n_groups} patients"
    aucs = _bootstrap_aucs(yy, s, groups, n_boot, np.random.default_rng(seed))
    valid = aucs[np.isfinite(aucs)]
    skipped = n_boot - valid.size
    if valid.size == 0:
        raise ValueError(f"every one of the {n_boot} bootstrap resamples held one class")
    low, high = np.quantile(valid, [(1 - level) / 2, (1 + level) / 2])
    note = f"; {skipped} with one class skipped" if skipped else ""
    return Interval(auc_fast(yy, s), float(low), float(high), f"{kind}{note})", level)


def _bootstrap_aucs(
    y: np.ndarray, s: np.ndarray, groups: np.ndarray, n_boot: int, rng: np.random.Generator
) -> np.ndarray:
    """AUC of each of ``n_boot`` resamples of the groups (NaN where a resample has one class),
    drawn in blocks so the weight matrix stays small."""
    out = np.empty(n_boot)
    block = max(1, _BLOCK // max(y.size, int(groups.max()) + 1))
    for first in range(0, n_boot, block):
        b = min(block, n_boot - first)
        out[first : first + b] = weighted_auc(y, s, cluster_weights(groups, b, rng))
    return out


def cluster_weights(groups: ArrayLike, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """``(n_boot, scans)`` multiplicities of a cluster bootstrap: clusters (patients) drawn
    with replacement, each scan weighted by how often its cluster was drawn. ``groups`` gives
    each scan's cluster (any labels; one label per scan gives the scan-level bootstrap)."""
    codes = np.unique(np.asarray(groups), return_inverse=True)[1].ravel()
    n_groups = int(codes.max()) + 1
    draws = rng.integers(0, n_groups, size=(n_boot, n_groups))
    flat = (draws + (np.arange(n_boot) * n_groups)[:, None]).ravel()
    counts = np.bincount(flat, minlength=n_boot * n_groups).reshape(n_boot, n_groups)
    return counts[:, codes].astype(np.float64)


def weighted_auc(y: np.ndarray, score: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The AUC under each row of scan weights ``w`` (k, n):
    sum_{pos i, neg j} w_i w_j ([s_i > s_j] + [s_i = s_j] / 2) / (W_pos W_neg),
    which sorting the scores once turns into cumulative sums over tie groups; NaN where a row
    weighs one class only. Rows of ones give the plain (midrank) AUC. No input checks: callers
    pass validated 0/1 labels and finite scores."""
    order = np.argsort(score, kind="stable")
    s, yy, ww = score[order], y[order], np.atleast_2d(w)[:, order]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    pos = np.add.reduceat(ww * (yy == 1), starts, axis=1)
    neg = np.add.reduceat(ww * (yy == 0), starts, axis=1)
    wins = (pos * (np.cumsum(neg, axis=1) - neg + 0.5 * neg)).sum(axis=1)
    w_pos, w_neg = pos.sum(axis=1), neg.sum(axis=1)
    ok = (w_pos > 0) & (w_neg > 0)
    return np.where(ok, wins / np.where(ok, w_pos * w_neg, 1.0), np.nan)


# ------------------------------------------------------------------------------ rates
def wilson(k: int, n: int, level: float = 0.95) -> Proportion:
    """``k / n`` with its Wilson score interval (statsmodels ``proportion_confint``);
    ``n == 0`` gives a Proportion without an interval."""
    k, n = _count(k, "k"), _count(n, "n")
    if k > n:
        raise ValueError(f"wilson: k={k} is more than n={n}")
    _check_level(level)
    if n == 0:
        return Proportion(0, 0, None)
    from statsmodels.stats.proportion import proportion_confint

    low, high = proportion_confint(k, n, alpha=1 - level, method="wilson")
    value = k / n
    low = min(max(0.0, float(low)), value)
    high = max(min(1.0, float(high)), value)
    return Proportion(k, n, Interval(value, low, high, "Wilson", level))


# ------------------------------------------------------------------------------ pooling
def pooled_auc(
    aucs: Sequence[float], variances: Sequence[float], *, level: float = 0.95
) -> Pooled | None:
    """Random-effects pooled AUC over sites: DerSimonian-Laird on the logit scale.

    Each site contributes logit(AUC) with variance ``var / (AUC (1 - AUC))^2`` (delta method);
    statsmodels' ``combine_effects(method_re="dl")`` pools them, and the estimate and its normal
    interval are taken back with expit. tau² is truncated at 0 as DerSimonian-Laird define it
    (statsmodels leaves it negative when Q < df; the pooled figure is then the fixed-effect
    one). I² is ``max(0, (Q - df) / Q)`` (0 when Q = 0). ``None`` with fewer than 2 sites.

    Extreme inputs: an AUC of 0 or 1 is clipped into [0.001, 0.999] and a variance below 1e-6
    (a standard error of 0.001) is raised to 1e-6, so a perfectly separated site (DeLong
    variance 0) gets a large but finite weight instead of an infinite one; ``method`` says how
    many sites were adjusted.
    """
    a = np.asarray(aucs, dtype=np.float64).ravel()
    v = np.asarray(variances, dtype=np.float64).ravel()
    _check_level(level)
    if a.size != v.size:
        raise ValueError(f"pooled_auc: {a.size} AUCs but {v.size} variances")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(v))):
        raise ValueError("pooled_auc: AUCs and variances must be finite; drop undefined sites")
    if np.any((a < 0) | (a > 1)) or np.any(v < 0):
        raise ValueError("pooled_auc: AUCs must lie in [0, 1] and variances be >= 0")
    if a.size < 2:
        return None
    from statsmodels.stats.meta_analysis import combine_effects

    clipped = np.clip(a, _AUC_EPS, 1 - _AUC_EPS)
    floored = np.maximum(v, _VAR_FLOOR)
    effect = logit(clipped)
    variance = floored / (clipped * (1 - clipped)) ** 2
    with np.errstate(invalid="ignore", divide="ignore"):
        res = combine_effects(effect, variance, method_re="dl")
    q, df = float(res.q), a.size - 1
    if res.tau2 > 0:
        mean, se, tau2 = float(res.mean_effect_re), float(res.sd_eff_w_re), float(res.tau2)
    else:
        # DerSimonian-Laird truncates tau² = (Q - df) / c at 0. statsmodels (0.15) does not,
        # and with Q < df weights its random-effects mean by 1 / (v - |tau²|), or gives NaN;
        # with tau² = 0 the random-effects model is the fixed-effect one.
        mean, se, tau2 = float(res.mean_effect_fe), float(res.sd_eff_w_fe), 0.0
    half = _z(level) * se
    notes = []
    if n_clip := int(np.sum(clipped != a)):
        notes.append(f"{n_clip} AUC(s) clipped into [{_AUC_EPS:g}, {1 - _AUC_EPS:g}]")
    if n_floor := int(np.sum(floored != v)):
        notes.append(f"{n_floor} variance(s) raised to {_VAR_FLOOR:g}")
    method = "DerSimonian-Laird on logit AUC" + (f" ({'; '.join(notes)})" if notes else "")
    return Pooled(
        estimate=float(expit(mean)),
        low=float(expit(mean - half)),
        high=float(expit(mean + half)),
        i2=max(0.0, (q - df) / q) if q > 0 else 0.0,
        tau2=tau2,
        q=q,
        n_sites=int(a.size),
        method=method,
        level=level,
    )


# ------------------------------------------------------------------------------ paired differences
Stratum = tuple[np.ndarray, np.ndarray]


def paired_bootstrap(
    strata: Mapping[Hashable, tuple[ArrayLike, ArrayLike, ArrayLike]],
    statistic: Callable[[Mapping[Hashable, Stratum]], float],
    *,
    clusters: Mapping[Hashable, ArrayLike] | None = None,
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> Interval | None:
    """Percentile interval of ``statistic(a) - statistic(b)``: two methods on the same scans.

    ``strata[key] = (y, values_a, values_b)``: the same scans scored by methods a and b
    (scores, or 0/1 correctness). ``statistic`` gets ``{key: (y, values)}`` for every stratum of
    one sample and returns a float (NaN or None when undefined), so it can be, for example, the
    mean over seeds of the worst site's AUC with keys ``(seed, site)``.

    Each resample draws, within each stratum, scans with replacement, or whole patients when
    ``clusters[key]`` gives each scan's patient (strata missing from ``clusters`` resample
    scans); a and b get the same draw (paired). The estimate is the difference on the data as
    given. Resamples where the difference is undefined are dropped and counted in ``method``.
    ``None`` when the difference on the data as given is undefined, or in every resample.
    """
    _check_level(level)
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1; got {n_boot}")
    if not strata:
        raise ValueError("paired_bootstrap needs at least one stratum; got none")
    prepared = {key: _stratum(key, parts, clusters) for key, parts in strata.items()}

    def difference(pick: Callable[[Hashable, int], np.ndarray | slice]) -> float:
        part_a, part_b = {}, {}
        for key, (y, a, b, _) in prepared.items():
            idx = pick(key, y.size)
            part_a[key], part_b[key] = (y[idx], a[idx]), (y[idx], b[idx])
        return _as_float(statistic(part_a)) - _as_float(statistic(part_b))

    estimate = difference(lambda key, n: slice(None))
    if not math.isfinite(estimate):
        return None
    rng = np.random.default_rng(seed)

    def draw(key: Hashable, n: int) -> np.ndarray:
        members = prepared[key][3]
        if members is None:
            return rng.integers(0, n, size=n)
        order, starts, sizes = members
        chosen = rng.integers(0, sizes.size, size=sizes.size)
        lengths = sizes[chosen]
        shift = np.repeat(starts[chosen] - (np.cumsum(lengths) - lengths), lengths)
        return order[shift + np.arange(lengths.sum())]

    diffs = np.array([difference(draw) for _ in range(n_boot)])
    valid = diffs[np.isfinite(diffs)]
    if valid.size == 0:
        return None
    low, high = np.quantile(valid, [(1 - level) / 2, (1 + level) / 2])
    clustered = sum(members is not None for *_, members in prepared.values())
    unit = (
        "scans"
        if clustered == 0
        else "patients"
        if clustered == len(prepared)
        else "patients (scans where no patients are given)"
    )
    dropped = n_boot - valid.size
    method = f"paired bootstrap ({n_boot} resamples of {unit} within {len(prepared)} strata"
    method += f"; {dropped} undefined resamples dropped)" if dropped else ")"
    return Interval(estimate, float(low), float(high), method, level)


def verdict(interval: Interval | None, *, higher_is_better: bool = True) -> str:
    """Word a difference interval (method a minus method b): ``ahead`` when the whole interval
    favours a, ``behind`` when it favours b, else ``no difference detected``; ``not measured``
    for ``None``. With ``higher_is_better=False`` (an error rate) the sides swap."""
    if interval is None:
        return "not measured"
    if interval.low > 0:
        return "ahead" if higher_is_better else "behind"
    if interval.high < 0:
        return "behind" if higher_is_better else "ahead"
    return "no difference detected"


# ------------------------------------------------------------------------------ helpers
def _two_class(y: ArrayLike, score: ArrayLike, what: str) -> tuple[np.ndarray, np.ndarray]:
    yy, s = binary_inputs(y, score)
    present = np.unique(yy)
    if present.size < 2:
        only = f"only class {int(present[0])}" if present.size else "no scans"
        raise ValueError(f"{what} needs both classes; y has {only} (n={yy.size})")
    return yy, s


def _groups(ids: ArrayLike, n: int, name: str) -> np.ndarray:
    """Each scan's group as an index 0..G-1, from any ids (strings, integers)."""
    arr = np.asarray(ids)
    if arr.ndim != 1 or arr.size != n:
        raise ValueError(f"{name} must give one id per scan ({n}); got shape {arr.shape}")
    return np.unique(arr, return_inverse=True)[1].ravel()


def _stratum(
    key: Hashable, parts: tuple, clusters: Mapping[Hashable, ArrayLike] | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple | None]:
    if len(parts) != 3:
        raise ValueError(f"stratum {key!r}: expected (y, values_a, values_b); got {len(parts)}")
    y = labels(parts[0], f"stratum {key!r} y")
    a, b = np.asarray(parts[1]), np.asarray(parts[2])
    if y.size == 0:
        raise ValueError(f"stratum {key!r} is empty: nothing to resample")
    for name, values in (("values_a", a), ("values_b", b)):
        if values.shape != y.shape:
            raise ValueError(
                f"stratum {key!r}: {name} has shape {values.shape} but y has {y.shape}"
            )
    members = None
    if clusters is not None and clusters.get(key) is not None:
        groups = _groups(clusters[key], y.size, f"clusters[{key!r}]")
        order = np.argsort(groups, kind="stable")
        sizes = np.bincount(groups)
        members = (order, np.cumsum(sizes) - sizes, sizes)
    return y, a, b, members


def _as_float(value: Any) -> float:
    return math.nan if value is None else float(value)


def _count(value: Any, name: str) -> int:
    if isinstance(value, bool) or int(value) != value or value < 0:
        raise ValueError(f"{name} must be a whole number >= 0; got {value!r}")
    return int(value)


def _check_level(level: float) -> None:
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), e.g. 0.95; got {level}")


def _z(level: float) -> float:
    return NormalDist().inv_cdf(0.5 + level / 2)
