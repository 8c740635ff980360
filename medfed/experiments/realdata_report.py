"""The real-data study's figures, intervals, verdicts and tables (``medfed real-study``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from medfed.experiments.realdata import CENTRAL, REFERENCE, StudyPlan, StudyRuns
from medfed.metrics.intervals import Interval, auc_fast
from medfed.metrics.seeds import SeedBootstrap, SiteScans, holm_verdicts, seed_bootstrap
from medfed.reports.markdown import markdown_table

Scans = Mapping[str, SiteScans]


# ---------------------------------------------------------------------------- figures
def macro_auc(scans: SiteScans) -> float:
    """One-vs-rest AUC of the site's own model, averaged over the classes its scans hold."""
    present = np.unique(scans.y)
    if present.size < 2:
        return float("nan")
    return float(np.mean([auc_fast(scans.y == c, scans.probs[:, c]) for c in present]))


def own_accuracy(scans: SiteScans) -> float:
    return float(np.mean(scans.probs.argmax(axis=1) == scans.y)) if scans.y.size else np.nan


def site_figure(site: str, multiclass: bool) -> Callable[[Scans], float]:
    if multiclass:
        return lambda s: macro_auc(s[site])
    return lambda s: own_accuracy(s[site])


def worst_multiclass(sites: list[str]) -> Callable[[Scans], float]:
    return lambda s: float(min(macro_auc(s[site]) for site in sites))


def glaucoma_auc(site_id: str, classes: list[str]) -> Callable[[Scans], float]:
    """A site's glaucoma against normal (ODIR's): P(glaucoma) among the two, on those photos
    only."""
    g, n = classes.index("glaucoma"), classes.index("normal")

    def figure(s: Scans) -> float:
        site = s[site_id]
        keep = np.isin(site.y, [g, n])
        y = site.y[keep] == g
        if y.all() or not y.any():
            return float("nan")
        p = site.probs[keep]
        return auc_fast(y, p[:, g] / np.maximum(p[:, g] + p[:, n], 1e-12))

    return figure


def pooled_rate(kind: str) -> Callable[[Scans], float]:
    """System accuracy (origin unknown: abstained scans have no answer; origin known) or
    routing accuracy over every site's test scans."""

    def figure(s: Scans) -> float:
        if kind == "routing":
            routed = np.concatenate([x.routed for x in s.values()])
            if (routed < 0).all():
                return float("nan")
            home = np.concatenate([np.full(x.y.size, x.index) for x in s.values()])
            return float(np.mean(routed == home))
        y = np.concatenate([x.y for x in s.values()])
        answer = np.concatenate([x.system if kind == "unknown" else x.known for x in s.values()])
        return float(np.mean(answer == y))

    return figure


def study_figures(runs: StudyRuns) -> dict[str, Callable[[Scans], float]]:
    """Every figure the study reports, by its column name."""
    first = next(iter(next(iter(runs.scans.values())).values()))
    multi = [s for s in runs.sites if np.unique(first[s].y).size >= 2]
    out: dict[str, Callable[[Scans], float]] = {}
    for site in runs.sites:
        what = "macro AUC" if site in multi else "accuracy"
        out[f"{site} {what}"] = site_figure(site, site in multi)
    if multi:
        out["worst multi-class site macro AUC"] = worst_multiclass(multi)
    if {"glaucoma", "normal"} <= set(runs.classes):
        g, n = runs.classes.index("glaucoma"), runs.classes.index("normal")
        for site in runs.sites:  # every site holding both (ODIR)
            if {g, n} <= set(np.unique(first[site].y).tolist()):
                out[f"{site} glaucoma AUC"] = glaucoma_auc(site, runs.classes)
    out["system accuracy (origin unknown)"] = pooled_rate("unknown")
    out["system accuracy (origin known)"] = pooled_rate("known")
    out["routing accuracy"] = pooled_rate("routing")
    return out


def majority_rate(runs: StudyRuns) -> tuple[float, str]:
    """What answering every pooled test scan with the most common class scores."""
    first = next(iter(next(iter(runs.scans.values())).values()))
    y = np.concatenate([s.y for s in first.values()])
    counts = np.bincount(y, minlength=len(runs.classes))
    return float(counts.max() / y.size), runs.classes[int(counts.argmax())]


# ---------------------------------------------------------------------------- measuring
def measure(runs: StudyRuns, plan: StudyPlan) -> dict[str, Any]:
    """Every figure of every method with its interval, and FedDRM's paired verdicts."""
    results: dict[str, Any] = {"figures": {}, "verdicts": {}}
    others = [m for m in runs.scans if m != REFERENCE]
    for name, figure in study_figures(runs).items():
        boot = seed_bootstrap(runs.scans, figure, n_boot=plan.n_boot)
        results["figures"][name] = {m: _interval_dict(boot.interval(m)) for m in runs.scans}
        compared = [m for m in others if np.isfinite(boot.estimates[m])]
        verdicts = holm_verdicts(boot, REFERENCE, compared)
        results["verdicts"][name] = {
            m: {"difference": _interval_dict(boot.difference(REFERENCE, m)), "verdict": v}
            for m, v in verdicts.items()
        }
        results.setdefault("method", _method(boot))
    rate, label = majority_rate(runs)
    results["majority"] = {"rate": rate, "class": label}
    results["routing_ece"] = {m: v for m, v in runs.routing_ece.items() if v}
    results["seconds"] = dict(runs.seconds)
    results["encode_seconds"] = runs.encode_seconds
    results["n_test"] = dict(runs.n_test)
    return results


def _method(boot: SeedBootstrap) -> str:
    return boot.method


def _interval_dict(interval: Interval | None) -> dict[str, float] | None:
    if interval is None:
        return None
    return {"estimate": interval.estimate, "low": interval.low, "high": interval.high}


# ---------------------------------------------------------------------------- tables
def _cell(entry: dict[str, float] | None) -> str:
    if entry is None:
        return "n/a"
    return f"{entry['estimate']:.3f} ({entry['low']:.3f}–{entry['high']:.3f})"


def _signed(entry: dict[str, float] | None) -> str:
    if entry is None:
        return "n/a"
    return f"{entry['estimate']:+.3f} ({entry['low']:+.3f} to {entry['high']:+.3f})"


def figures_table(results: dict[str, Any]) -> str:
    """One row per method (and the majority-class row), one column per figure."""
    names = list(results["figures"])
    methods = list(next(iter(results["figures"].values())))
    rows = []
    for method in methods:
        row = [method, *(_cell(results["figures"][n][method]) for n in names)]
        ece = results["routing_ece"].get(method)
        row.append(f"{np.mean(ece):.3f} ({min(ece):.3f}–{max(ece):.3f})" if ece else "n/a")
        row.append(f"{results['seconds'].get(method, 0) / 60:.1f}")
        rows.append(row)
    majority = results["majority"]
    rows.append(
        [
            f"majority class ({majority['class']})",
            *("" for _ in names[:-3]),
            f"{majority['rate']:.3f}",
            f"{majority['rate']:.3f}",
            "",
            "",
            "",
        ]
    )
    header = ["method", *names, "routing ECE (mean, min–max over seeds)", "minutes"]
    return markdown_table(header, rows)


def verdicts_table(results: dict[str, Any]) -> str:
    """FedDRM minus each method, per figure: the paired interval and Holm's verdict."""
    names = [n for n in results["verdicts"] if n != "routing accuracy"]
    methods = list(next(iter(results["verdicts"].values())))
    rows = []
    for method in methods:
        cells = []
        for name in names:
            entry = results["verdicts"][name].get(method)
            cells.append(
                "n/a" if entry is None else f"{_signed(entry['difference'])} {entry['verdict']}"
            )
        rows.append([method, *cells])
    return markdown_table(["method", *(f"{REFERENCE} − method: {n}" for n in names)], rows)


def study_markdown(results: dict[str, Any], plan: StudyPlan, runs: StudyRuns) -> str:
    """The section docs/real-data.md shows (between its real-study markers)."""
    sizes = ", ".join(f"{s} {n}" for s, n in results["n_test"].items())
    budget = (
        f"frozen {plan.init} encoder, {plan.rounds} rounds x {plan.local_steps} local steps, "
        f"batch {plan.batch_size}, lr {plan.lr}, seeds {', '.join(map(str, plan.seeds))}"
    )
    total = sum(results["seconds"].values()) + results["encode_seconds"]
    return "\n\n".join(
        [
            f"Test scans per site: {sizes}. Budget: {budget}. Intervals: 95% {results['method']}; "
            f"the centralized reference ({CENTRAL}) trains one model on the pooled training "
            "scans. Accuracy for a site that holds one class; macro AUC over the classes a "
            "site holds otherwise. System accuracy origin unknown counts an abstained scan as "
            "unanswered.",
            figures_table(results),
            f"{REFERENCE} minus each method, paired on the same seeds and patients; verdicts "
            "after Holm's adjustment over each column's comparisons (family-wise 5%): ahead or "
            "behind only where the adjusted test rejects no difference and the interval "
            "excludes 0.",
            verdicts_table(results),
            f"`medfed real-study`: {total / 60:.1f} minutes of training and evaluation on this "
            f"machine, every run included; {_encoding(results['encode_seconds'])}.",
        ]
    )


def _encoding(seconds: float) -> str:
    if seconds < 60:  # the features came from the cache of an earlier invocation
        return "the photos' features were read from the cache an earlier invocation wrote"
    return f"encoding every photo once took {seconds / 60:.1f} min"
