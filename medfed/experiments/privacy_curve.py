"""``medfed privacy-curve``: what differential privacy costs. FedAvg and FedDRM train on one
synthetic fundus federation at each privacy budget epsilon in ``EPSILONS`` (DP-SGD at every
site, delta = 0.1 / n per site) and without DP (epsilon = infinity), from the same seeds.

Measured on the sites' test scans: the worst-site and mean site AUC with 95% CIs (percentile
bootstrap over patients, the seeds pooled), the epsilon each site actually spent, and each
budget minus the run without DP, paired on the same test scans: what a budget costs is read
from those intervals only.

Every run uses one GroupNorm backbone (DP-SGD cannot train BatchNorm), so the only difference
between a method's runs is the privacy; FedDRM keeps its GroupNorm layers on each site.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from medfed.core.errors import ConfigError
from medfed.experiments.demo import comparisons_markdown
from medfed.experiments.harness import (
    Docs,
    SeedRuns,
    Trained,
    auc_comparisons,
    auc_intervals,
    budget_config,
    fundus_sites,
    image_size_text,
    resamples,
    run_text,
    seed_range,
    seeds_text,
    train_run,
    train_seeds,
)
from medfed.experiments.paired import ORIGIN_KNOWN
from medfed.reports.comparisons import ci_cell, verdict_lines
from medfed.reports.markdown import markdown_table

MARKER = "privacy"
PLOT_DIR = Path("privacy")
DOCS = Docs("privacy", MARKER, PLOT_DIR)
EPSILONS: tuple[float, ...] = (1.0, 3.0, 8.0, math.inf)
METHODS: tuple[str, ...] = ("fedavg", "feddrm")
BACKBONE = "cnn-gn"
FIRST_SEED = 0


@dataclass(frozen=True)
class PrivacyBudget:
    """Scans per site, rounds, local steps, seeds, and the native fundus image height (None:
    the default) of every run."""

    n_per_site: int
    rounds: int
    local_steps: int = 3
    seeds: int = 2
    image_size: int | None = None

    def __post_init__(self) -> None:
        for name in ("n_per_site", "rounds", "local_steps", "seeds"):
            if getattr(self, name) < 1:
                raise ConfigError(f"privacy-curve budget: {name} must be at least 1")


FULL = PrivacyBudget(n_per_site=240, rounds=20, seeds=2)
QUICK = PrivacyBudget(n_per_site=120, rounds=10, seeds=1)


def epsilon_label(epsilon: float) -> str:
    """``1``, ``3``, ``8``, or ``inf`` (no differential privacy)."""
    return "inf" if math.isinf(epsilon) else f"{epsilon:g}"


def run_label(method: str, epsilon: float) -> str:
    if math.isinf(epsilon):
        return f"{method} (no DP)"
    return f"{method} (epsilon {epsilon_label(epsilon)})"


def run_privacy_curve(
    out: Path,
    *,
    quick: bool = False,
    echo: Callable[[str], Any] = print,
    readme: Path | None = None,
    n_boot: int | None = None,
    budget: PrivacyBudget | None = None,
    epsilons: tuple[float, ...] = EPSILONS,
    command: str = "medfed privacy-curve",
) -> dict[str, Any]:
    """Train every method at every budget on every seed's federation, then write
    OUT/privacy.json, OUT/privacy.md and OUT/privacy.png (and, with ``readme``, the plot under
    ``readme.parent / privacy`` and the README's ``privacy`` section)."""
    from medfed.experiments.speed import device_info

    budget = budget or (QUICK if quick else FULL)
    n_boot = resamples(n_boot, quick)
    if not epsilons or any(not e > 0 for e in epsilons):
        raise ConfigError(f"privacy budgets must be numbers > 0 (inf: no DP), got {epsilons}")
    epsilons = tuple(sorted(set(epsilons)))
    start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    seeds = seed_range(FIRST_SEED, budget.seeds)

    def federation(seed: int) -> list[Any]:
        return fundus_sites(out, f"seed{seed}", budget, seed, echo)

    def train_one(sites: list[Any], seed: int, run: tuple[str, float]) -> Trained:
        method, epsilon = run
        echo(f"training {run_label(method, epsilon)}, seed {seed}, {budget.rounds} rounds")
        epsilon_setting = 0.0 if math.isinf(epsilon) else epsilon
        config = budget_config(
            budget, method, budget.rounds, seed, BACKBONE, dp_epsilon=epsilon_setting
        )
        folder = out / "runs" / f"seed{seed}" / f"{method}_eps{epsilon_label(epsilon)}"
        return train_run(sites, config, folder)

    runs = [(method, epsilon) for method in METHODS for epsilon in epsilons]
    trained = train_seeds(seeds, federation, runs, train_one)
    results: dict[str, Any] = {
        "command": command + (" --quick" if quick else ""),
        "quick": quick,
        "budget": asdict(budget),
        "epsilons": [epsilon_label(e) for e in epsilons],
        "backbone": BACKBONE,
        "seeds": seeds,
        "n_boot": n_boot,
        "device": {"run": trained.runs[runs[-1]][seeds[-1]].summary.device, **device_info()},
        "methods": {m: method_figures(trained, m, epsilons, n_boot, echo) for m in METHODS},
    }
    DOCS.publish_plot(
        out,
        results,
        privacy_markdown,
        privacy_plot,
        start=start,
        verdicts=_verdicts(results),
        echo=echo,
        readme=readme,
    )
    return results


def method_figures(
    trained: SeedRuns[list[Any], tuple[str, float]],
    method: str,
    epsilons: tuple[float, ...],
    n_boot: int,
    echo: Callable[[str], Any],
) -> dict[str, Any]:
    """``method``'s test AUCs at every budget, the largest epsilon a site spent, and each
    budget compared with the run without DP on the same test scans."""
    reference = run_label(method, math.inf)
    scans = {run_label(method, e): trained.scans((method, e)) for e in epsilons}
    runs = {}
    for epsilon in epsilons:
        label = run_label(method, epsilon)
        used = [
            p.epsilon
            for run in trained.runs[(method, epsilon)].values()
            for p in (run.summary.privacy or {}).values()
        ]
        runs[label] = {
            "epsilon": None if math.isinf(epsilon) else epsilon,
            "epsilon_spent_max": max(used) if used else None,
            "test": auc_intervals(scans[label], n_boot, FIRST_SEED),
        }
        echo(f"  {label}: worst-site test AUC {ci_cell(runs[label]['test']['worst_site_auc'])}")
    comparisons = None
    if reference in scans and len(scans) > 1:
        echo(f"comparing each budget with {reference} on the same test scans")
        comparisons = auc_comparisons(scans, reference, n_boot, FIRST_SEED)
    return {"reference": reference, "runs": runs, "comparisons": comparisons}


# ---------------------------------------------------------------------------- the plot
def privacy_plot(results: Mapping[str, Any], path: Path) -> Path:
    """Worst-site test AUC (95% CI as error bars) against the budget, one line per method;
    no DP sits at the right end, marked infinity."""
    from medfed.experiments.plots import pyplot, save_figure

    plt = pyplot()
    labels = results["epsilons"]
    ticks = ["\u221e (no DP)" if e == "inf" else e for e in labels]
    fig, axis = plt.subplots(figsize=(6.4, 4.2))
    for k, (method, found) in enumerate(results["methods"].items()):
        xs, ys, low, high = [], [], [], []
        for i, run in enumerate(found["runs"].values()):
            interval = run["test"]["worst_site_auc"]
            if interval is None:
                continue
            xs.append(i + (k - 0.5) * 0.08)
            ys.append(interval["estimate"])
            low.append(interval["estimate"] - interval["low"])
            high.append(interval["high"] - interval["estimate"])
        axis.errorbar(xs, ys, yerr=[low, high], marker="o", capsize=3, label=method)
    axis.set_xticks(range(len(labels)), ticks)
    axis.set_xlabel("privacy budget epsilon per site (delta = 0.1 / n)")
    axis.set_ylabel("worst-site test AUC (95% CI)")
    axis.set_ylim(0.0, 1.0)
    axis.axhline(0.5, color="grey", linewidth=0.8, linestyle=":", label="chance")
    b = results["budget"]
    axis.set_title(
        f"Synthetic fundus, {b['n_per_site']} scans per site, {b['rounds']} rounds x "
        f"{b['local_steps']} steps, {len(results['seeds'])} seed(s)",
        fontsize=10,
    )
    axis.grid(alpha=0.3)
    axis.legend(loc="lower right")
    return save_figure(fig, path)


# ---------------------------------------------------------------------------- markdown
def _where(results: Mapping[str, Any]) -> str:
    return f"synthetic fundus ({seeds_text(results['seeds'])})"


def _verdicts(results: Mapping[str, Any]) -> list[str]:
    lines = []
    for found in results["methods"].values():
        if found["comparisons"] is not None:
            lines += verdict_lines(found["comparisons"], _where(results))
    return lines


def runs_table(results: Mapping[str, Any]) -> str:
    header = [
        "run",
        "epsilon budget",
        "largest epsilon spent (a site)",
        "worst-site test AUC (95% CI)",
        "mean site test AUC (95% CI)",
    ]
    rows = []
    for found in results["methods"].values():
        for label, run in found["runs"].items():
            used = run["epsilon_spent_max"]
            rows.append(
                [
                    label,
                    "none (no DP)" if run["epsilon"] is None else f"{run['epsilon']:g}",
                    "n/a" if used is None else f"{used:.2f}",
                    ci_cell(run["test"]["worst_site_auc"]),
                    ci_cell(run["test"]["mean_site_auc"]),
                ]
            )
    return markdown_table(header, rows)


def caption(results: Mapping[str, Any]) -> str:
    b = results["budget"]
    return (
        f"`{results['command']}` ({_where(results)}; {b['n_per_site']} scans per site"
        f"{image_size_text(b)}; {b['rounds']} rounds x {b['local_steps']} local steps; "
        f"{run_text(results)})"
    )


def privacy_markdown(results: Mapping[str, Any], *, image_prefix: str = "") -> str:
    """What was trained, the table with 95% CIs, each budget minus no DP (paired), the plot."""
    b = results["budget"]
    parts = [
        f"FedAvg and FedDRM on {_where(results)}, each at privacy budgets epsilon "
        f"{', '.join(e for e in results['epsilons'] if e != 'inf')} per site (DP-SGD through "
        "Opacus at every site: Poisson batches, each scan's gradient clipped to norm 1, "
        "Gaussian noise set so that the planned run spends the budget; delta = 0.1 / n, RDP "
        f"accountant) and without DP; {b['rounds']} rounds x {b['local_steps']} local steps, "
        f"backbone {results['backbone']} for every run. Test AUCs with 95% CIs (percentile "
        f"bootstrap, {results['n_boot']} resamples of patients within each seed and site; "
        f"{ORIGIN_KNOWN}: each site's model on its own test scans).",
        runs_table(results),
    ]
    for method, found in results["methods"].items():
        if found["comparisons"] is None:
            continue
        parts.append(
            f"{method}: no DP minus each budget, paired on the same test scans (a positive "
            "difference is what the budget costs):"
        )
        parts.append(comparisons_markdown(found["comparisons"], _where(results)))
    parts.append(f"![worst-site test AUC against epsilon]({image_prefix}{results['plot']})")
    parts.append(caption(results))
    return "\n\n".join(p for p in parts if p)
