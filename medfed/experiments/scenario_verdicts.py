"""The figures, gate and verdicts of ``medfed scenarios``.

Every figure is the mean over the seeds (each seed its own synthetic federation, trained once
per method) with a two-level bootstrap interval (:func:`medfed.metrics.seeds.seed_bootstrap`:
the seeds with replacement, then patients within each site of each drawn seed), so that the
variation between trained federations is in it. Differences between methods of one level are
paired on the same draws; a trend across levels (different federations) bootstraps each level
on its own and subtracts.

**The informativeness gate.** A level can only tell methods apart when the methods learned
there. Its *majority rate* is what answering every scan with its seed's most common grade
scores (:func:`constant_answer`); a level is *informative* when every baseline's system
accuracy (origin unknown) has its lower bound above the majority rate by at least
:data:`MARGIN` and no baseline answers all of a seed's scans with one grade. The margin is the
smallest difference the sweep is sized to resolve (two points of system accuracy): a baseline
within it of the constant answer cannot be told from one that learned only the grade mix.
An uninformative level gets no verdict and no ranking.

**Verdicts under Holm's adjustment.** Each table's comparisons are one family: the level table's
FedDRM-minus-baseline differences (both FedDRM variants, informative levels only), and the
claims table's rows. A two-sided bootstrap p-value per comparison, Holm's step-down adjustment
at family-wise 0.05 (statsmodels); a comparison is decided only when the adjustment rejects,
and its direction is then its estimate's sign.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from medfed.experiments.paired import Scans
from medfed.metrics import wilson
from medfed.metrics.intervals import Interval
from medfed.metrics.seeds import SeedBootstrap, seed_bootstrap, seed_interval, two_sided_p

# The smallest difference the sweep is sized to resolve; a baseline within it of the
# most-common-grade rate is read as not having learned (see the module's docstring).
MARGIN = 0.02
ALPHA = 0.05
ADJUSTMENT = "Holm"
REFERENCE = "feddrm"  # medfed's FedDRM (private norms, its default client head and lambda)
PAPER = "feddrm-paper"  # the paper's: shared norms, the client head trained, lambda 0.8
VARIANTS = (REFERENCE, PAPER)
VARIANT_NAMES = {REFERENCE: "medfed's FedDRM", PAPER: "the paper's FedDRM"}
REPRODUCED, NOT_REPRODUCED, NO_DIFFERENCE = (
    "reproduced in direction",
    "not reproduced",
    "no difference detected",
)
NOT_MEASURED = "not measured"
UNINFORMATIVE = "no verdict: uninformative level"
AHEAD, BEHIND = "ahead", "behind"

SeedScans = Mapping[int, Scans]  # seed -> site -> scans


# ---------------------------------------------------------------------------- figures
def _pooled(column: str) -> Callable[[Scans], float]:
    def figure(scans: Scans) -> float:
        n = sum(len(s.y) for s in scans.values())
        hits = sum(int(s.column(column).sum()) for s in scans.values())
        return hits / n if n else float("nan")

    return figure


def _site_mean(scans: Scans) -> float:
    means = [float(s.correct_own.mean()) for s in scans.values() if len(s.y)]
    return float(np.mean(means)) if means else float("nan")


# key -> the figure on one seed's federation (the scenario tables' three columns)
FIGURES: dict[str, Callable[[Scans], float]] = {
    "system_accuracy": _pooled("correct"),
    "system_accuracy_origin_known": _pooled("correct_origin_known"),
    "average_accuracy": _site_mean,
}
SYSTEM = "system_accuracy"


def _dict(interval: Interval | None, p: float | None = None) -> dict[str, Any] | None:
    if interval is None:
        return None
    out = interval.to_dict()
    if p is not None and np.isfinite(p):
        out["p"] = p
    return out


def bootstraps(
    by_method: Mapping[str, SeedScans], n_boot: int, seed: int = 0
) -> dict[str, SeedBootstrap]:
    """Every figure of every method at one level, on shared two-level draws."""
    return {
        key: seed_bootstrap(by_method, figure, n_boot=n_boot, seed=seed)
        for key, figure in FIGURES.items()
    }


def baselines(methods: Sequence[str]) -> list[str]:
    """The methods other than FedDRM's variants; all of them where only FedDRM trained."""
    found = [m for m in methods if m not in VARIANTS]
    return found or list(methods)


def level_table(by_method: Mapping[str, SeedScans], n_boot: int) -> tuple[dict, dict]:
    """One level: each method's figures with two-level intervals, each FedDRM variant minus
    each baseline (paired, with its unadjusted p-value), the constant answer and the gate.
    Returns the JSON-ready table and the bootstraps (for the claims)."""
    boots = bootstraps(by_method, n_boot)
    methods = {m: {k: _dict(b.interval(m)) for k, b in boots.items()} for m in by_method}
    differences: dict[str, dict[str, Any]] = {}
    for variant in (v for v in VARIANTS if v in by_method):
        differences[variant] = {
            m: {k: _dict(b.difference(variant, m), b.p_value(variant, m)) for k, b in boots.items()}
            for m in by_method
            if m not in VARIANTS
        }
    constant = constant_answer(by_method[next(iter(by_method))])
    table = {
        "methods": methods,
        "differences": differences,
        "constant": constant,
        "gate": gate(by_method, methods, constant),
        "method": boots[SYSTEM].method,
    }
    return table, boots


# ---------------------------------------------------------------------------- the gate
def constant_answer(by_seed: SeedScans) -> dict[str, Any]:
    """What answering without a model scores on these test scans: each seed's federation's most
    common grade for every one of its scans (system accuracy, origin unknown: the majority
    rate), each site's most common grade for its scans (origin known), and the mean over sites
    and seeds of the latter (average accuracy). A method at these figures has learned nothing
    beyond the grade mix. Wilson 95% CIs on the scans of every seed pooled."""
    grades: dict[int, int] = {}
    hits = own_hits = total = 0
    shares = []
    for seed, scans in by_seed.items():
        pooled: dict[int, int] = {}
        for site in scans.values():
            if not len(site.y):
                continue
            found, counts = np.unique(site.y, return_counts=True)
            for g, n in zip(found, counts, strict=True):
                pooled[int(g)] = pooled.get(int(g), 0) + int(n)
            own_hits += int(counts.max())
            total += len(site.y)
            shares.append(counts.max() / len(site.y))
        if pooled:
            grades[seed] = max(pooled, key=lambda g: (pooled[g], -g))
            hits += pooled[grades[seed]]
    if not total:
        return {"grades": {}, "system": None, "system_origin_known": None, "average": None}
    return {
        "grades": {str(seed): g for seed, g in grades.items()},
        "system": wilson(hits, total).interval.to_dict(),
        "system_origin_known": wilson(own_hits, total).interval.to_dict(),
        "average": float(np.mean(shares)),
        "n_test": total,
    }


def one_grade(by_seed: SeedScans) -> tuple[int, int] | None:
    """(seed, grade) of the first seed whose every answered scan got one grade, else None."""
    for seed, scans in sorted(by_seed.items()):
        answers = [s.answer for s in scans.values() if s.answer is not None and len(s.y)]
        if not answers:
            continue
        given = np.unique(np.concatenate(answers))
        given = given[given >= 0]
        if given.size == 1:
            return seed, int(given[0])
    return None


def gate(
    by_method: Mapping[str, SeedScans],
    methods: Mapping[str, Mapping[str, Any]],
    constant: Mapping[str, Any],
) -> dict[str, Any]:
    """Whether this level can tell methods apart (see the module's docstring), with each
    reason it cannot."""
    if constant.get("system") is None:
        return {"informative": False, "majority_rate": None, "margin": MARGIN, "why": ["no scans"]}
    majority = float(constant["system"]["estimate"])
    why = []
    for name in baselines(list(by_method)):
        figure = methods[name][SYSTEM]
        if figure is None:
            why.append(f"{name}: no system accuracy")
        elif figure["low"] <= majority + MARGIN:
            why.append(
                f"{name}: lower bound {figure['low']:.3f} not above the majority rate "
                f"{majority:.3f} + {MARGIN:g}"
            )
        constant_seed = one_grade(by_method[name])
        if constant_seed is not None:
            why.append(
                f"{name} answers every scan of seed {constant_seed[0]} with grade "
                f"{constant_seed[1]}"
            )
    return {"informative": not why, "majority_rate": majority, "margin": MARGIN, "why": why}


# ---------------------------------------------------------------------------- Holm
def holm(p_values: Sequence[float], alpha: float = ALPHA) -> list[bool]:
    """Holm's step-down rejections (statsmodels) for ``p_values``; NaN never rejects."""
    from statsmodels.stats.multitest import multipletests

    finite = [k for k, p in enumerate(p_values) if np.isfinite(p)]
    out = [False] * len(p_values)
    if finite:
        reject, *_ = multipletests([p_values[k] for k in finite], alpha, "holm")
        for k, r in zip(finite, reject, strict=True):
            out[k] = bool(r)
    return out


def adjust_table(levels: Mapping[str, dict[str, Any]]) -> int:
    """The level table's family: every FedDRM-variant-minus-baseline difference on system
    accuracy at informative levels, Holm-adjusted; each gets its ``verdict`` (ahead, behind,
    no difference detected, or no verdict at an uninformative level). Returns the family's
    size."""
    family = []
    for table in levels.values():
        for against in table["differences"].values():
            for figures in against.values():
                figure = figures[SYSTEM]
                if not table["gate"]["informative"]:
                    figures["verdict"] = UNINFORMATIVE
                elif figure is None:
                    figures["verdict"] = NOT_MEASURED
                else:
                    family.append((figures, figure))
    for (figures, figure), reject in zip(
        family, holm([f.get("p", float("nan")) for _, f in family]), strict=True
    ):
        figures["verdict"] = (
            NO_DIFFERENCE if not reject else (AHEAD if figure["estimate"] > 0 else BEHIND)
        )
    return len(family)


# ---------------------------------------------------------------------------- claims
def unpaired(
    end: SeedScans, start: SeedScans, figure: str, n_boot: int
) -> tuple[Interval | None, float]:
    """``end`` minus ``start`` (two federations): each bootstrapped on its own draws."""
    key = "run"
    b_end = seed_bootstrap({key: end}, FIGURES[figure], n_boot=n_boot, seed=1)
    b_start = seed_bootstrap({key: start}, FIGURES[figure], n_boot=n_boot, seed=2)
    diffs = b_end.samples[key] - b_start.samples[key]
    estimate = b_end.estimates[key] - b_start.estimates[key]
    method = f"unpaired {b_end.method}, each level on its own draws"
    return seed_interval(estimate, diffs, method, 0.95), two_sided_p(diffs)


def decide(rows: list[dict[str, Any]]) -> None:
    """The claims table's family: Holm over every row that has a p-value; each row gets
    ``supports`` (True / False: decided for / against the paper's direction) or None."""
    open_rows = [r for r in rows if r.get("p") is not None]
    for row, reject in zip(open_rows, holm([r["p"] for r in open_rows]), strict=True):
        estimate = row["interval"]["estimate"]
        row["decided"] = bool(reject)
        row["supports"] = (estimate > 0) == row["sign"] if reject else None


def claim_verdict(rows: Sequence[Mapping[str, Any]]) -> str:
    """One claim for one FedDRM variant, from its Holm-decided rows."""
    if not rows:
        return NOT_MEASURED
    if any(r.get("uninformative") for r in rows):
        return UNINFORMATIVE
    if any(r.get("p") is None for r in rows):
        return NOT_MEASURED
    if any(r["supports"] is False for r in rows):
        return NOT_REPRODUCED
    if any(r["supports"] is None for r in rows):
        return NO_DIFFERENCE
    return REPRODUCED


# ---------------------------------------------------------------------------- curves
def curve(folder: Path, rounds: int) -> list[float | None]:
    """A run's validation accuracy (mean over its sites) after rounds R/3, 2R/3 and R."""
    per_round: dict[int, list[float]] = {}
    try:
        lines = (folder / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    except OSError:
        return [None, None, None]
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("val_accuracy"), int | float):
            per_round.setdefault(int(row.get("round", 0)), []).append(float(row["val_accuracy"]))
    marks = [max(1, rounds // 3), max(1, 2 * rounds // 3), rounds]
    return [float(np.mean(per_round[r])) if r in per_round else None for r in marks]


def mean_curve(curves: Sequence[Sequence[float | None]]) -> list[float | None]:
    """Each mark's mean over the runs that have it."""
    out: list[float | None] = []
    for k in range(3):
        found = [c[k] for c in curves if c[k] is not None]
        out.append(float(np.mean(found)) if found else None)
    return out
