"""Figures of methods on the same test scans, with 95% confidence intervals, and the paired
differences between methods that the bench's and the demo's verdicts are read from.

Everything here is computed from the runs' ``predictions.csv`` (one row per test scan). Scans
fall into strata keyed ``(seed, site)``: seed s draws the federation with seed s, so every method
trained on seed s was tested on the same scans, and that is checked scan id by scan id before
two methods are compared. A bootstrap resample draws patients with replacement within each
stratum (every site keeps its size, every seed its own data) and a figure over several seeds is
the mean over the seeds of the figure of each seed.

* :func:`figure_intervals`: one method's figures (each site's AUC, the mean and the worst site's
  AUC, system accuracy under each protocol) with percentile bootstrap intervals.
* :func:`compare_methods`: a reference method minus every other method, figure by figure, with
  the interval of :func:`medfed.metrics.paired_bootstrap` (both methods get the same resample)
  and its :func:`medfed.metrics.verdict`: the verdicts come from these intervals and nothing
  else. An AUC difference over sites so small that most resamples would draw one class at some
  site (:func:`defined_share` under ``MIN_DEFINED``) gets no interval: "not measured".

The two protocols:

* ``origin known``: a scan is normalized with its own site's statistics and, for the site AUCs,
  scored by its own site's model (a member hospital's archived scan);
* ``origin unknown``: each candidate site normalizes the scan with its own statistics (a new
  patient's scan whose hospital is not known); with ``normalization = "federation"`` every site
  uses the statistics pooled over the federation, so that protocol costs such a run nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from medfed.core.errors import RunDirError
from medfed.metrics import Interval, cluster_weights, paired_bootstrap, verdict, weighted_auc
from medfed.reports.evaluation import AT_OPERATING
from medfed.runs import RunDir

N_BOOT = 2000
LEVEL = 0.95
ORIGIN_KNOWN = "origin known"
ORIGIN_UNKNOWN = "origin unknown"
PROTOCOLS = {
    ORIGIN_KNOWN: "each scan normalized with its own site's statistics (site AUCs: each site's "
    "model on its own test scans; system accuracy: the federation still routes or votes)",
    ORIGIN_UNKNOWN: "each candidate site normalizes the scan with its own statistics, as it "
    "would a new patient's scan from an unknown hospital (with federation normalization every "
    "site uses the statistics pooled over the federation)",
}
# An AUC interval is given only when at least this share of the resamples has both classes at
# every site: below it, the few resamples left are not a fair picture of the spread (a site of
# a handful of test scans), and the figure is "not measured" rather than given a narrow CI.
MIN_DEFINED = 0.5

Strata = Mapping[Hashable, tuple[np.ndarray, np.ndarray]]


# ---------------------------------------------------------------------------- per-scan data
@dataclass(frozen=True)
class SiteScans:
    """One site's test scans in one run, in ``predictions.csv`` order.

    ``score`` is P(positive) of the site's own model (None for more than two classes);
    ``correct`` and ``correct_origin_known`` say whether the federation's answer (the default
    router's) was right under each protocol; ``correct_own`` whether the site's own model's
    answer was.
    """

    scan_ids: tuple[str, ...]
    patients: np.ndarray
    y: np.ndarray
    score: np.ndarray | None
    correct: np.ndarray
    correct_origin_known: np.ndarray
    correct_own: np.ndarray
    answer: np.ndarray | None = None  # the federation's answer, origin unknown (-1: abstained)

    def column(self, name: str) -> np.ndarray | None:
        return {
            "score": self.score,
            "correct": self.correct,
            "correct_origin_known": self.correct_origin_known,
            "correct_own": self.correct_own,
        }[name]

    def take(self, index: np.ndarray) -> SiteScans:
        return SiteScans(
            scan_ids=tuple(self.scan_ids[i] for i in index),
            patients=self.patients[index],
            y=self.y[index],
            score=None if self.score is None else self.score[index],
            correct=self.correct[index],
            correct_origin_known=self.correct_origin_known[index],
            correct_own=self.correct_own[index],
            answer=None if self.answer is None else self.answer[index],
        )


Scans = dict[str, SiteScans]
"""Every site's test scans of one run, by site id."""


def scans_from_rows(rows: Sequence[Mapping[str, Any]]) -> Scans:
    """``predictions.csv`` rows (as ``RunDir.read_predictions`` types them), grouped by site."""
    by_site: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_site.setdefault(str(row["site"]), []).append(row)
    scans = {}
    for site, part in by_site.items():
        y = np.array([int(r["label"]) for r in part], dtype=np.int64)
        scores = [r["score"] for r in part]
        answer = np.array([int(r["system_prediction"]) for r in part], dtype=np.int64)
        abstained = np.array([r.get("abstained") in (True, "true") for r in part], dtype=bool)
        scans[site] = SiteScans(
            scan_ids=tuple(str(r["scan_id"]) for r in part),
            patients=np.array([str(r["patient_id"]) for r in part], dtype=object),
            y=y,
            score=None if any(s is None for s in scores) else np.array(scores, dtype=np.float64),
            correct=answer == y,
            correct_origin_known=(
                np.array([int(r["system_prediction_origin_known"]) for r in part]) == y
            ),
            correct_own=np.array([int(r["prediction"]) for r in part]) == y,
            answer=np.where(abstained, -1, answer),
        )
    return scans


def load_scans(run: Path) -> Scans:
    """A run directory's test scans, from its ``predictions.csv``."""
    return scans_from_rows(RunDir(run).read_predictions())


# ---------------------------------------------------------------------------- the figures
@dataclass(frozen=True)
class Figure:
    """A figure compared between methods: which column of the scans it reads, under which
    protocol, and how it combines the ``(seed, site)`` strata."""

    key: str
    label: str
    protocol: str
    column: str
    definition: str
    statistic: Callable[[Strata], float]

    @property
    def is_auc(self) -> bool:
        return self.column == "score"

    def describe(self) -> dict[str, str]:
        return {"label": self.label, "protocol": self.protocol, "definition": self.definition}


def site_auc(y: np.ndarray, score: np.ndarray) -> float:
    """The AUC (midranks: ties count one half), NaN when ``y`` holds one class (a resample can
    draw a single class). Called for every site of every resample: no input checks."""
    return float(weighted_auc(y, score, np.ones((1, y.size)))[0])


def _by_seed(strata: Strata) -> dict[Any, list[tuple[np.ndarray, np.ndarray]]]:
    seeds: dict[Any, list[tuple[np.ndarray, np.ndarray]]] = {}
    for (seed, _site), part in strata.items():
        seeds.setdefault(seed, []).append(part)
    return seeds


def worst_site_auc(strata: Strata) -> float:
    """Mean over the seeds of the lowest site AUC of each seed (NaN if one is undefined)."""
    seeds = _by_seed(strata)
    return float(np.mean([np.min([site_auc(y, s) for y, s in parts]) for parts in seeds.values()]))


def mean_site_auc(strata: Strata) -> float:
    """Mean over the seeds of the mean site AUC of each seed (NaN if one is undefined)."""
    seeds = _by_seed(strata)
    return float(np.mean([np.mean([site_auc(y, s) for y, s in parts]) for parts in seeds.values()]))


def pooled_accuracy(strata: Strata) -> float:
    """Mean over the seeds of the share of every site's scans (pooled) answered correctly."""
    seeds = _by_seed(strata)
    return float(
        np.mean(
            [
                sum(float(np.sum(c)) for _, c in parts) / sum(c.size for _, c in parts)
                for parts in seeds.values()
            ]
        )
    )


FIGURES: tuple[Figure, ...] = (
    Figure(
        "worst_site_auc",
        "worst-site AUC",
        ORIGIN_KNOWN,
        "score",
        "mean over seeds of the lowest AUC among the sites (each site's model on its own test "
        "scans)",
        worst_site_auc,
    ),
    Figure(
        "mean_site_auc",
        "mean site AUC",
        ORIGIN_KNOWN,
        "score",
        "mean over seeds of the sites' mean AUC (each site's model on its own test scans)",
        mean_site_auc,
    ),
    Figure(
        "system_accuracy",
        f"system accuracy {AT_OPERATING}",
        ORIGIN_UNKNOWN,
        "correct",
        "mean over seeds of the share of all sites' test scans, pooled, that the federation "
        "answers correctly (weighted by test scans)",
        pooled_accuracy,
    ),
    Figure(
        "system_accuracy_origin_known",
        f"system accuracy {AT_OPERATING}",
        ORIGIN_KNOWN,
        "correct_origin_known",
        "mean over seeds of the share of all sites' test scans, pooled, that the federation "
        "answers correctly (weighted by test scans)",
        pooled_accuracy,
    ),
)
FIGURES_BY_KEY = {f.key: f for f in FIGURES}


def mean_site_accuracy(strata: Strata) -> float:
    """Mean over the seeds of the mean over sites of each site's share answered correctly."""
    seeds = _by_seed(strata)
    return float(np.mean([np.mean([np.mean(c) for _, c in parts]) for parts in seeds.values()]))


AVERAGE_ACCURACY = Figure(
    "average_accuracy",
    "average accuracy",
    ORIGIN_KNOWN,
    "correct_own",
    "mean over seeds of the sites' mean accuracy, each site's own model on its own test scans "
    "(FedDRM's A-Acc)",
    mean_site_accuracy,
)
"""Each site's own model on its own scans: the personalized figure of the heterogeneity
scenarios (``medfed scenarios``); not one of the bench's :data:`FIGURES`."""


# ---------------------------------------------------------------------------- pairing
def _pair_error(names: tuple[str, str], where: str, why: str) -> RunDirError:
    a, b = names
    return RunDirError(
        f"cannot compare {a} with {b} on {where}: {why}. A paired comparison needs both "
        "methods tested on the same scans: train them on the same seed's data, and compare "
        "runs of one bench or demo only"
    )


def _align(a: SiteScans, b: SiteScans, names: tuple[str, str], where: str) -> np.ndarray:
    """The order of ``b``'s scans that matches ``a``'s, refusing scans that differ."""
    for name, scans in zip(names, (a, b), strict=True):
        if len(set(scans.scan_ids)) != len(scans.scan_ids):
            seen: set[str] = set()
            twice = next(s for s in scans.scan_ids if s in seen or seen.add(s))
            raise _pair_error(names, where, f"{name}'s predictions.csv lists scan {twice!r} twice")
    position = {scan: k for k, scan in enumerate(b.scan_ids)}
    only_a = [s for s in a.scan_ids if s not in position]
    only_b = sorted(set(b.scan_ids) - set(a.scan_ids))
    if only_a or only_b:
        parts = [
            f"{len(only)} scan(s) only in {name}'s predictions.csv (e.g. {only[0]!r})"
            for name, only in zip(names, (only_a, only_b), strict=True)
            if only
        ]
        raise _pair_error(names, where, "they were tested on different scans: " + "; ".join(parts))
    index = np.array([position[s] for s in a.scan_ids], dtype=np.int64)
    differ = np.flatnonzero(b.y[index] != a.y)
    if differ.size:
        k = int(differ[0])
        raise _pair_error(
            names,
            where,
            f"scan {a.scan_ids[k]!r} is labelled {int(a.y[k])} in {names[0]}'s predictions but "
            f"{int(b.y[index][k])} in {names[1]}'s",
        )
    return index


def paired_scans(
    a: Mapping[int, Scans], b: Mapping[int, Scans], names: tuple[str, str]
) -> dict[tuple[int, str], tuple[SiteScans, SiteScans]]:
    """Both methods' scans of every ``(seed, site)`` stratum, ``b``'s put in ``a``'s order.

    ``RunDirError`` when the two were not tested on the same seeds, sites and scans (each scan
    id once, with the same label): a difference over different scans would not be paired.
    """
    if set(a) != set(b):
        raise _pair_error(names, "their seeds", f"seeds {sorted(a)} against {sorted(b)}")
    pairs = {}
    for seed in sorted(a):
        if set(a[seed]) != set(b[seed]):
            why = f"sites {sorted(a[seed])} against {sorted(b[seed])}"
            raise _pair_error(names, f"seed {seed}", why)
        for site, scans in a[seed].items():
            index = _align(scans, b[seed][site], names, f"seed {seed}, site {site}")
            pairs[(seed, site)] = (scans, b[seed][site].take(index))
    return pairs


def paired_strata(
    a: Mapping[int, Scans], b: Mapping[int, Scans], column: str, names: tuple[str, str]
) -> tuple[dict[tuple[int, str], tuple[np.ndarray, np.ndarray, np.ndarray]], dict, list[str]]:
    """``paired_bootstrap``'s strata ``{(seed, site): (y, values_a, values_b)}`` for one column
    of the scans, each stratum's patients (resampled whole), and the strata left out.

    For the AUC (``column="score"``) a stratum whose test split holds one class has no AUC and
    is left out, as the run's own worst-site figure leaves that site out.
    """
    strata, clusters, left_out = {}, {}, []
    for key, (sa, sb) in paired_scans(a, b, names).items():
        va, vb = sa.column(column), sb.column(column)
        if va is None or vb is None:
            raise ValueError(f"no {column} column: the task has more than two classes")
        if column == "score" and np.unique(sa.y).size < 2:
            left_out.append(f"seed {key[0]} {key[1]} (one class)")
            continue
        strata[key] = (sa.y, va, vb)
        clusters[key] = sa.patients
    return strata, clusters, left_out


def defined_share(labels: Mapping[Hashable, np.ndarray], patients: Mapping[Hashable, Any]) -> float:
    """The chance that a resample of patients within each stratum holds both classes in every
    stratum (each stratum's AUC defined): for G patients of which a share p have no negative
    scan and a share q no positive one, a stratum draws one class with chance p^G + q^G."""
    share = 1.0
    for key, y in labels.items():
        groups = np.unique(patients[key], return_inverse=True)[1].ravel()
        n_groups = int(groups.max()) + 1
        has_pos = np.bincount(groups, weights=(y == 1), minlength=n_groups) > 0
        has_neg = np.bincount(groups, weights=(y == 0), minlength=n_groups) > 0
        p, q = float(np.mean(~has_neg)), float(np.mean(~has_pos))
        share *= max(0.0, 1.0 - p**n_groups - q**n_groups)
    return share


def _too_few(share: float) -> str:
    return (
        f"not measured: a resample holds both classes at every site only {100 * share:.0f}% "
        f"of the time (under {100 * MIN_DEFINED:.0f}%): too few positives or negatives"
    )


# ---------------------------------------------------------------------------- comparisons
@dataclass(frozen=True)
class Comparison:
    """Reference minus one other method on one figure: the interval and its verdict."""

    figure: str
    interval: Interval | None
    verdict: str
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare(
    a: Mapping[int, Scans],
    b: Mapping[int, Scans],
    names: tuple[str, str],
    figure: Figure,
    *,
    n_boot: int = N_BOOT,
    seed: int = 0,
    level: float = LEVEL,
) -> Comparison:
    """``figure(a) - figure(b)`` on the same scans, with its paired bootstrap interval."""
    try:
        strata, clusters, left_out = paired_strata(a, b, figure.column, names)
    except ValueError as exc:
        return Comparison(figure.key, None, verdict(None), str(exc))
    note = f"left out: {', '.join(left_out)}" if left_out else None
    if not strata:
        return Comparison(figure.key, None, verdict(None), note or "no strata")
    if figure.is_auc:
        share = defined_share({k: y for k, (y, _, _) in strata.items()}, clusters)
        if share < MIN_DEFINED:
            why = _too_few(share)
            return Comparison(figure.key, None, verdict(None), f"{note}; {why}" if note else why)
    interval = paired_bootstrap(
        strata, figure.statistic, clusters=clusters, n_boot=n_boot, seed=seed, level=level
    )
    return Comparison(figure.key, interval, verdict(interval), note)


def compare_methods(
    scans: Mapping[str, Mapping[int, Scans]],
    reference: str,
    *,
    figures: Sequence[Figure] = FIGURES,
    n_boot: int = N_BOOT,
    seed: int = 0,
    level: float = LEVEL,
) -> dict[str, Any]:
    """``reference`` minus every other method of ``scans`` (method -> seed -> site -> scans),
    figure by figure; JSON-safe, as results.json stores it."""
    methods = {}
    for other, other_scans in scans.items():
        if other == reference:
            continue
        names = (reference, other)
        methods[other] = {
            f.key: compare(
                scans[reference], other_scans, names, f, n_boot=n_boot, seed=seed, level=level
            ).to_dict()
            for f in figures
        }
    seeds = sorted(next(iter(scans.values())))
    return {
        "reference": reference,
        "seeds": seeds,
        "n_boot": n_boot,
        "level": level,
        "ci": (
            f"{reference} minus each method; {round(100 * level)}% percentile interval of a "
            f"paired bootstrap ({n_boot} resamples): patients drawn with replacement within "
            "each (seed, site) stratum, the same draw for both methods, each seed's figure "
            "averaged over the seeds"
        ),
        "verdict_rule": (
            "ahead: the whole interval above 0; behind: the whole interval below 0; "
            "no difference detected: the interval holds 0"
        ),
        "figures": {f.key: f.describe() for f in figures},
        "methods": methods,
    }


# ---------------------------------------------------------------------------- one method's CIs
def _figures_under(
    strata: Mapping[tuple[int, str], SiteScans], weights: Mapping[tuple[int, str], np.ndarray]
) -> dict[str, Any]:
    """Every figure of one method under each row of the weights: ``{name: (k,) array}``, and
    ``site_auc: {site: (k,) array}``; None where the data as given leave it undefined."""
    seeds = sorted({seed for seed, _ in strata})
    sites = list(dict.fromkeys(site for _, site in strata))
    aucs: dict[tuple[int, str], np.ndarray] = {}
    for key, scans in strata.items():
        if scans.score is not None and np.unique(scans.y).size == 2:
            aucs[key] = weighted_auc(scans.y, scans.score, weights[key])
    out: dict[str, Any] = {"site_auc": {}}
    for site in sites:
        per_seed = [aucs[(seed, site)] for seed in seeds if (seed, site) in aucs]
        out["site_auc"][site] = np.mean(per_seed, axis=0) if per_seed else None
    worst, mean = [], []
    for seed in seeds:
        per_site = [aucs[(seed, site)] for site in sites if (seed, site) in aucs]
        if per_site:
            worst.append(np.min(per_site, axis=0))
            mean.append(np.mean(per_site, axis=0))
    out["worst_site_auc"] = np.mean(worst, axis=0) if worst else None
    out["mean_site_auc"] = np.mean(mean, axis=0) if mean else None
    for name in ("correct", "correct_origin_known"):
        per_seed = []
        for seed in seeds:
            keys = [(seed, site) for site in sites if (seed, site) in strata]
            hits = sum(weights[k] @ strata[k].column(name).astype(np.float64) for k in keys)
            total = sum(weights[k].sum(axis=1) for k in keys)
            per_seed.append(hits / total)
        key = "system_accuracy" if name == "correct" else "system_accuracy_origin_known"
        out[key] = np.mean(per_seed, axis=0)
    return out


def figure_intervals(
    by_seed: Mapping[int, Scans], *, n_boot: int = N_BOOT, seed: int = 0, level: float = LEVEL
) -> dict[str, Any]:
    """One method's figures, each the mean over the seeds, with a percentile bootstrap interval
    (patients drawn with replacement within each ``(seed, site)`` stratum): ``site_auc`` (by
    site), ``mean_site_auc``, ``worst_site_auc``, ``system_accuracy`` (origin unknown) and
    ``system_accuracy_origin_known``, each an ``Interval.to_dict()`` or None (undefined).

    A resample in which a site's AUC is undefined (one class drawn) is dropped, and counted in
    the interval's method; when fewer than ``MIN_DEFINED`` of the resamples are left the figure
    gets no interval (None)."""
    strata = {
        (s, site): scans for s, per_site in by_seed.items() for site, scans in per_site.items()
    }
    rng = np.random.default_rng(seed)
    weights = {key: cluster_weights(scans.patients, n_boot, rng) for key, scans in strata.items()}
    ones = {key: np.ones((1, scans.y.size)) for key, scans in strata.items()}
    given, drawn = _figures_under(strata, ones), _figures_under(strata, weights)
    clustered = any(np.unique(s.patients).size < s.patients.size for s in strata.values())
    unit = "patients" if clustered else "scans"
    text = (
        f"bootstrap ({n_boot} resamples of {unit} within {len(strata)} (seed, site) strata; "
        f"mean over {len(by_seed)} seed(s)"
    )

    def interval(estimate: np.ndarray | None, values: np.ndarray | None) -> dict | None:
        if estimate is None or values is None or not math.isfinite(float(estimate[0])):
            return None
        valid = values[np.isfinite(values)]
        if valid.size == 0 or valid.size < MIN_DEFINED * values.size:
            return None
        low, high = np.quantile(valid, [(1 - level) / 2, (1 + level) / 2])
        dropped = values.size - valid.size
        method = text + (f"; {dropped} undefined resamples dropped)" if dropped else ")")
        return Interval(float(estimate[0]), float(low), float(high), method, level).to_dict()

    out: dict[str, Any] = {
        "site_auc": {
            site: interval(given["site_auc"][site], drawn["site_auc"][site])
            for site in given["site_auc"]
        }
    }
    for key in ("mean_site_auc", "worst_site_auc", "system_accuracy"):
        out[key] = interval(given[key], drawn[key])
    out["system_accuracy_origin_known"] = interval(
        given["system_accuracy_origin_known"], drawn["system_accuracy_origin_known"]
    )
    return out


# ---------------------------------------------------------------------------- unpaired
def _accuracy_draws(
    by_seed: Mapping[int, Scans], figure: Figure, n_boot: int, rng: np.random.Generator
) -> tuple[float, np.ndarray]:
    """An accuracy figure (``figure.statistic`` over 0/1 answers) on the scans as given, and
    under ``n_boot`` resamples of patients within each ``(seed, site)`` stratum."""
    if figure.is_auc:
        raise ValueError(f"{figure.key}: only accuracy figures are resampled this way")
    strata = {
        (seed, site): scans
        for seed, per_site in by_seed.items()
        for site, scans in per_site.items()
    }
    if not strata:
        raise ValueError(f"{figure.key}: no scans")
    given = figure.statistic(
        {key: (s.y, s.column(figure.column).astype(np.float64)) for key, s in strata.items()}
    )
    hits, totals = {}, {}
    for key, scans in strata.items():
        w = cluster_weights(scans.patients, n_boot, rng)
        hits[key] = w @ scans.column(figure.column).astype(np.float64)
        totals[key] = w.sum(axis=1)
    seeds = sorted({seed for seed, _ in strata})
    per_seed = []
    for seed in seeds:
        keys = [k for k in strata if k[0] == seed]
        if figure.statistic is pooled_accuracy:
            per_seed.append(sum(hits[k] for k in keys) / sum(totals[k] for k in keys))
        else:
            per_seed.append(np.mean([hits[k] / totals[k] for k in keys], axis=0))
    return given, np.mean(per_seed, axis=0)


def level_difference(
    a: Mapping[int, Scans],
    b: Mapping[int, Scans],
    figure: Figure,
    *,
    n_boot: int = N_BOOT,
    seed: int = 0,
    level: float = LEVEL,
) -> Interval:
    """``figure(a) - figure(b)`` for scans of *different* federations (one method at two
    levels of a scenario): an unpaired bootstrap, each side's patients resampled on their own
    within its ``(seed, site)`` strata; a percentile interval. Accuracy figures only."""
    rng = np.random.default_rng(seed)
    given_a, draws_a = _accuracy_draws(a, figure, n_boot, rng)
    given_b, draws_b = _accuracy_draws(b, figure, n_boot, rng)
    low, high = np.quantile(draws_a - draws_b, [(1 - level) / 2, (1 + level) / 2])
    method = (
        f"unpaired bootstrap ({n_boot} resamples of patients within each side's (seed, site) "
        "strata, drawn independently)"
    )
    return Interval(given_a - given_b, float(low), float(high), method, level)


def accuracy_interval(
    by_seed: Mapping[int, Scans],
    figure: Figure,
    *,
    n_boot: int = N_BOOT,
    seed: int = 0,
    level: float = LEVEL,
) -> Interval:
    """One method's accuracy figure with its percentile bootstrap interval (patients drawn
    with replacement within each ``(seed, site)`` stratum), for any number of classes."""
    given, draws = _accuracy_draws(by_seed, figure, n_boot, np.random.default_rng(seed))
    low, high = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
    method = f"bootstrap ({n_boot} resamples of patients within each (seed, site) stratum)"
    return Interval(given, float(low), float(high), method, level)
