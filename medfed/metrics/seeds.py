"""Intervals over trained federations: a two-level bootstrap that resamples the seeds (the
trained federations) and then the patients within each site, the same draws for every method,
so that each method's interval holds the variation between seeds and each paired difference is
paired; and Holm's adjustment over a table's comparisons (statsmodels).

A method's data for one seed is ``{site: SiteScans}``; a figure is a function of that mapping
(one seed's federation, possibly resampled) returning a float, NaN where undefined. A method's
figure over seeds is the mean of its per-seed figures.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from medfed.metrics.intervals import Interval, verdict


@dataclass(frozen=True)
class SiteScans:
    """One site's test scans as one trained federation answered them.

    ``probs``: the site's own model, class probabilities (n, C); ``system``: the federation's
    answer when the scan's origin is unknown (-1: abstained, no answer) and ``known`` when it
    is known; ``routed``: the site index the scan was routed to (-1: none); ``flagged``: the
    scan was flagged as fitting no site."""

    y: np.ndarray
    patients: np.ndarray
    probs: np.ndarray
    system: np.ndarray
    known: np.ndarray
    routed: np.ndarray
    index: int  # this site's index in the federation

    def take(self, idx: np.ndarray) -> SiteScans:
        return SiteScans(
            self.y[idx],
            self.patients[idx],
            self.probs[idx],
            self.system[idx],
            self.known[idx],
            self.routed[idx],
            self.index,
        )


Seeded = Mapping[int, Mapping[str, SiteScans]]  # seed -> site -> scans
Figure = Callable[[Mapping[str, SiteScans]], float]


def _patient_groups(patients: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scan indices ordered by patient, each patient's start and size."""
    _, inverse = np.unique(patients, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    sizes = np.bincount(inverse)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return order, starts, sizes


def _draw(groups: tuple[np.ndarray, np.ndarray, np.ndarray], rng: np.random.Generator):
    order, starts, sizes = groups
    chosen = rng.integers(0, sizes.size, size=sizes.size)
    return np.concatenate([order[starts[c] : starts[c] + sizes[c]] for c in chosen])


@dataclass(frozen=True)
class SeedBootstrap:
    """Every method's figure in every resample, on shared draws."""

    estimates: dict[str, float]  # method -> mean over its seeds, on the data as given
    samples: dict[str, np.ndarray]  # method -> (n_boot,) resampled figure (NaN: undefined)
    n_boot: int
    n_seeds: int

    @property
    def method(self) -> str:
        return (
            f"two-level bootstrap ({self.n_boot} resamples: the {self.n_seeds} seeds with "
            "replacement, then patients within each site)"
        )

    def interval(self, name: str, level: float = 0.95) -> Interval | None:
        return seed_interval(self.estimates[name], self.samples[name], self.method, level)

    def difference(self, a: str, b: str, level: float = 0.95) -> Interval | None:
        """a minus b, paired on the same draws."""
        estimate = self.estimates[a] - self.estimates[b]
        return seed_interval(
            estimate, self.samples[a] - self.samples[b], f"paired {self.method}", level
        )

    def p_value(self, a: str, b: str) -> float:
        """Two-sided bootstrap p-value of a minus b against 0 (for Holm's adjustment)."""
        return two_sided_p(self.samples[a] - self.samples[b])


def two_sided_p(diffs: np.ndarray) -> float:
    """Two-sided bootstrap p-value of resampled differences against 0: twice the smaller
    share on either side, at least 1/(n+1); NaN when no resample is defined."""
    diffs = diffs[np.isfinite(diffs)]
    if diffs.size == 0:
        return float("nan")
    share = min(np.mean(diffs <= 0), np.mean(diffs >= 0))
    return float(min(1.0, 2 * max(share, 1 / (diffs.size + 1))))


def seed_interval(
    estimate: float, values: np.ndarray, method: str, level: float
) -> Interval | None:
    """The percentile interval of ``values`` (bootstrap resamples) around ``estimate``, the
    undefined resamples dropped and counted in ``method``; None when nothing is defined."""
    valid = values[np.isfinite(values)]
    if not np.isfinite(estimate) or valid.size == 0:
        return None
    low, high = np.quantile(valid, [(1 - level) / 2, (1 + level) / 2])
    dropped = values.size - valid.size
    note = f"; {dropped} undefined resamples dropped" if dropped else ""
    return Interval(float(estimate), float(low), float(high), method + note, level)


def seed_bootstrap(
    methods: Mapping[str, Seeded], figure: Figure, *, n_boot: int = 1000, seed: int = 0
) -> SeedBootstrap:
    """``figure`` of every method, mean over its seeds, with the two-level resamples.

    Every method must have the same seeds and, per seed and site, the same test scans in the
    same order (each seed may hold its own federation and split, as a synthetic sweep does, or
    all seeds one split): a resample draws seed positions and then, for each drawn seed, each
    site's patients, and every method is measured on that draw."""
    names = list(methods)
    seeds = sorted(methods[names[0]])
    sites = list(methods[names[0]][seeds[0]])
    for name in names:
        if sorted(methods[name]) != seeds:
            raise ValueError(f"{name}: seeds {sorted(methods[name])}, expected {seeds}")
        for k in seeds:
            for s in sites:
                if len(methods[name][k][s].patients) != len(methods[names[0]][k][s].patients):
                    raise ValueError(f"{name}: seed {k}, site {s} holds other test scans")
    groups = {
        (k, s): _patient_groups(methods[names[0]][k][s].patients) for k in seeds for s in sites
    }
    per_seed = {n: {k: figure(methods[n][k]) for k in seeds} for n in names}
    estimates = {n: float(np.mean([per_seed[n][k] for k in seeds])) for n in names}
    rng = np.random.default_rng(seed)
    samples = {n: np.full(n_boot, np.nan) for n in names}
    for r in range(n_boot):
        drawn = rng.integers(0, len(seeds), size=len(seeds))
        draws = [{s: _draw(groups[seeds[k], s], rng) for s in sites} for k in drawn]
        for name in names:
            values = [
                figure({s: methods[name][seeds[k]][s].take(idx[s]) for s in sites})
                for k, idx in zip(drawn, draws, strict=True)
            ]
            samples[name][r] = np.mean(values)
    return SeedBootstrap(estimates, samples, n_boot, len(seeds))


def holm_verdicts(
    boot: SeedBootstrap, reference: str, others: Sequence[str], alpha: float = 0.05
) -> dict[str, str]:
    """reference minus each other method: ahead / behind / no difference detected, Holm's
    step-down adjustment over these comparisons at family-wise level ``alpha``."""
    from statsmodels.stats.multitest import multipletests

    tested = [m for m in others if np.isfinite(boot.p_value(reference, m))]
    out = {m: "not measured" for m in others if m not in tested}
    if not tested:
        return out
    reject, *_ = multipletests([boot.p_value(reference, m) for m in tested], alpha, "holm")
    for name, significant in zip(tested, reject, strict=True):
        word = verdict(boot.difference(reference, name))
        out[name] = (
            word if significant and word != "no difference detected" else ("no difference detected")
        )
    return out
