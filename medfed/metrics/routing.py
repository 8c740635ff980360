"""The routing posterior P(site | scan): its calibration and the figures that judge it.

A router's site probabilities are a probability only if they mean what they say: of the scans
routed with probability 0.9, nine in ten should reach their own site. Three pure functions
serve that: :func:`fit_temperature` (one temperature, fitted on the sites' validation scans by
the negative log-likelihood of the true site), :func:`routing_calibration` (top-label ECE over
equal-mass bins, the multi-class Brier score, the reliability curve and the mean probability of
the chosen site on correctly routed scans) and :func:`margin_threshold` (the top-2 margin below
which routing on validation is less accurate than a target). No torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import minimize_scalar

from medfed.core.kinds import RATE, is_number

LOG_T_BOUNDS = (-9.0, 5.0)
"""The search range of log(temperature): from about 1e-4 (sharpening) to about 150."""
MARGIN_TARGET = 0.9
"""Routing accuracy below which a band of low-margin validation scans is reviewed first."""


def softmax_rows(scores: ArrayLike, temperature: float = 1.0) -> np.ndarray:
    """Row-wise softmax of ``scores / temperature`` in float64: (n, K) -> (n, K)."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0; got {temperature}")
    z = np.asarray(scores, dtype=np.float64) / temperature
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def _checked(scores: ArrayLike, sites: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    z = np.asarray(scores, dtype=np.float64)
    y = np.asarray(sites, dtype=np.int64).reshape(-1)
    if z.ndim != 2 or z.shape[0] != y.size:
        raise ValueError(f"scores have shape {z.shape}; expected ({y.size}, K), one row per scan")
    if y.size and (y.min() < 0 or y.max() >= z.shape[1]):
        raise ValueError(f"true sites must lie in 0..{z.shape[1] - 1}")
    if not np.all(np.isfinite(z)):
        raise ValueError("routing scores must be finite")
    return z, y


def nll(scores: ArrayLike, sites: ArrayLike, temperature: float = 1.0) -> float:
    """Mean negative log-likelihood of the true sites under softmax(scores / temperature)."""
    z, y = _checked(scores, sites)
    z = z / temperature
    z = z - z.max(axis=1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(-log_p[np.arange(y.size), y].mean())


def fit_temperature(scores: ArrayLike, sites: ArrayLike) -> float:
    """The temperature T > 0 minimising the validation NLL of softmax(scores / T).

    1.0 (no change) when there is nothing to fit: no scans, or one site. Scaling keeps the
    argmax, so routing decisions never change; only how sure the posterior says it is.
    """
    z, y = _checked(scores, sites)
    if y.size == 0 or z.shape[1] < 2:
        return 1.0
    found = minimize_scalar(
        lambda log_t: nll(z, y, float(np.exp(log_t))),
        bounds=LOG_T_BOUNDS,
        method="bounded",
        options={"xatol": 1e-4},
    )
    return float(np.exp(found.x))


@dataclass(frozen=True)
class RoutingCalibration:
    """How well a routing posterior's probability of the chosen site matches how often it is
    right, on ``n`` scans of known origin.

    ``ece``: top-label expected calibration error over equal-mass bins. ``brier``: the
    multi-class Brier score (sum over sites of the squared error, averaged over scans).
    ``accuracy``: routing accuracy. ``mean_chosen``: mean probability of the chosen site;
    ``mean_chosen_correct``: the same on correctly routed scans (None when none is).
    ``temperature``: the temperature the posterior was taken at. ``bins``: the reliability
    curve, ``{"mean_predicted", "fraction_correct", "n"}`` per bin, low to high.
    ``low_margin``: the review queue's low-margin line fitted on validation with it (None
    when none was).
    """

    n: int
    ece: float
    brier: float
    accuracy: float
    mean_chosen: float
    mean_chosen_correct: float | None
    temperature: float
    bins: list[dict[str, Any]] = field(hash=False)
    low_margin: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RoutingCalibration:
        rates = {k: data.get(k) for k in _RATES}
        for name, value in rates.items():
            if value is not None and not RATE.accepts(value):
                raise ValueError(f"{name} {value!r} is not {RATE.expected}")
        if not (is_number(data["brier"]) and 0.0 <= data["brier"] <= 2.0):
            raise ValueError(f"brier {data['brier']!r} is not a number from 0 to 2")
        if not (is_number(data["temperature"]) and data["temperature"] > 0):
            raise ValueError(f"temperature {data['temperature']!r} is not a positive number")
        return cls(
            n=int(data["n"]),
            ece=float(data["ece"]),
            brier=float(data["brier"]),
            accuracy=float(data["accuracy"]),
            mean_chosen=float(data["mean_chosen"]),
            mean_chosen_correct=_maybe(rates["mean_chosen_correct"]),
            temperature=float(data["temperature"]),
            bins=[dict(b) for b in data["bins"]],
            low_margin=_maybe(rates["low_margin"]),
        )


_RATES = ("ece", "accuracy", "mean_chosen", "mean_chosen_correct", "low_margin")


def _maybe(value: Any) -> float | None:
    return None if value is None else float(value)


def routing_calibration(
    probs: ArrayLike,
    sites: ArrayLike,
    *,
    temperature: float = 1.0,
    low_margin: float | None = None,
    bins: int = 10,
    binning: str = "mass",
) -> RoutingCalibration:
    """ECE, Brier score and reliability curve of site probabilities ``probs`` (n, K) against
    the scans' true sites; ``temperature`` and ``low_margin`` are recorded with them.
    ``binning``: ``"mass"`` (equal-mass bins) or ``"width"`` (fixed-width bins of [0, 1], empty
    ones left out: the bins sites can sum without pooling their scans)."""
    p, y = _checked(probs, sites)
    if y.size == 0:
        raise ValueError("routing calibration needs at least one scan; got none")
    if bins < 1:
        raise ValueError(f"bins must be >= 1; got {bins}")
    chosen = p.argmax(axis=1)
    confidence = p[np.arange(y.size), chosen]
    correct = (chosen == y).astype(np.float64)
    if binning == "width":
        which = np.minimum((confidence * bins).astype(np.int64), bins - 1)
        groups = [np.flatnonzero(which == b) for b in range(bins)]
        groups = [g for g in groups if g.size]
    elif binning == "mass":
        order = np.argsort(confidence, kind="stable")
        groups = [g for g in np.array_split(order, min(bins, y.size)) if g.size]
    else:
        raise ValueError(f"binning must be 'mass' or 'width'; got {binning!r}")
    table = [
        {
            "mean_predicted": float(confidence[g].mean()),
            "fraction_correct": float(correct[g].mean()),
            "n": int(g.size),
        }
        for g in groups
    ]
    ece = sum(b["n"] * abs(b["fraction_correct"] - b["mean_predicted"]) for b in table) / y.size
    truth = np.zeros_like(p)
    truth[np.arange(y.size), y] = 1.0
    right = correct.astype(bool)
    return RoutingCalibration(
        n=int(y.size),
        ece=float(ece),
        brier=float(((p - truth) ** 2).sum(axis=1).mean()),
        accuracy=float(correct.mean()),
        mean_chosen=float(confidence.mean()),
        mean_chosen_correct=float(confidence[right].mean()) if right.any() else None,
        temperature=float(temperature),
        bins=table,
        low_margin=low_margin,
    )


def top_margin(probs: ArrayLike) -> np.ndarray:
    """The gap between each scan's two highest site probabilities (0 with one site)."""
    p = np.asarray(probs, dtype=np.float64)
    if p.shape[1] < 2:
        return np.zeros(p.shape[0])
    top = -np.sort(-p, axis=1)
    return top[:, 0] - top[:, 1]


MIN_BAND = 20
"""Validation scans below the low-margin line, at least: fewer cannot show their routing to be
worse than the target (the line is where that is shown, not merely observed)."""


def margin_threshold(
    margins: ArrayLike,
    correct: ArrayLike,
    target: float = MARGIN_TARGET,
    min_count: int = MIN_BAND,
) -> float:
    """The top-2 margin below which routing on validation is shown to be less accurate than
    ``target``, and which sets apart the scans routed wrong.

    Among the margins ``t`` with at least ``min_count`` validation scans below them whose
    routing accuracy has its Wilson 95% upper bound below ``target``, the one whose band holds
    the largest share of the routing errors beyond its share of the scans (errors below / all
    errors minus scans below / all scans: Youden's index of "margin below t" as a test for a
    wrong route); 0.0 (no scan is low margin) when no band shows that, e.g. when every
    validation scan was routed right or too few scans were wrong together. A line that merely
    grows the band until its accuracy crosses the target would flag most scans of a run routed
    a little below it. :func:`margin_band` gives the band's count and accuracy to show with it.
    """
    from statsmodels.stats.proportion import proportion_confint

    m = np.asarray(margins, dtype=np.float64).reshape(-1)
    ok = np.asarray(correct, dtype=bool).reshape(-1)
    if m.size != ok.size:
        raise ValueError(f"{m.size} margins but {ok.size} outcomes")
    order = np.argsort(m, kind="stable")
    m, ok = m[order], ok[order]
    below = np.arange(1, m.size + 1)
    right = np.cumsum(ok)
    _, upper = proportion_confint(right, below, alpha=0.05, method="wilson")
    # a threshold just above m[k] puts every scan of that margin below it: ends of tie runs
    last_of_tie = np.append(m[1:] != m[:-1], True)
    shown = np.flatnonzero(last_of_tie & (below >= min_count) & (np.asarray(upper) < target))
    errors = int((~ok).sum())
    if not shown.size or errors == 0:
        return 0.0
    youden = (below[shown] - right[shown]) / errors - below[shown] / m.size
    k = int(shown[int(np.argmax(youden))])  # the first of equals: the smaller band
    upper_margin = m[k + 1] if k + 1 < m.size else 1.0
    return float((m[k] + upper_margin) / 2)


def margin_band(margins: ArrayLike, correct: ArrayLike, line: float) -> tuple[int, int]:
    """(scans with a margin below ``line``, of them routed right): the band the line flags."""
    m = np.asarray(margins, dtype=np.float64).reshape(-1)
    ok = np.asarray(correct, dtype=bool).reshape(-1)
    below = m < line
    return int(below.sum()), int(ok[below].sum())
