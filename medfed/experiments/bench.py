"""``medfed bench``: every registered method on the synthetic fundus and CT federations over
several seeds, plus speed figures measured side by side, written as results.json, a markdown
table (results.md) and PNG plots.

Seed s synthesizes the federation with seed s and trains every method with seed s, so the
spread over seeds covers both the data draw and the training randomness.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from medfed.algorithms import ALGORITHMS
from medfed.config import TrainConfig
from medfed.data.synth import synthesize
from medfed.errors import ConfigError
from medfed.experiments.demo import FULL, QUICK, Budget, MethodSpec
from medfed.experiments.speed import (
    bytes_ratios,
    data_path,
    device_info,
    engine_overhead,
    load_average,
    recorded_round_seconds,
    routing_latency,
)
from medfed.federation.training import load_sites, train
from medfed.runs import Summary
from medfed.runs.report import markdown_table, replace_marked_section

# results.json's own version (not the run directory's): 2 states findings computed from the
# results instead of fixed acceptance claims.
RESULTS_VERSION = 2
MARKER = "bench-table"
MODALITIES = ("fundus", "ct")
BUDGETS = {
    # CT volumes cost ~10x a fundus photo per step: a smaller budget keeps the bench short.
    "full": {"fundus": FULL, "ct": Budget(n_per_site=48, rounds=20, local_steps=3)},
    # Quick CT only shows the 3D path end to end (speed, bytes); its AUCs are noise at 2 rounds.
    "quick": {"fundus": QUICK, "ct": Budget(n_per_site=24, rounds=2, local_steps=3)},
}
SEEDS = {"full": 3, "quick": 2}
SPEED_ROUNDS = {"full": 20, "quick": 10}


@dataclass(frozen=True)
class SeedRun:
    """One method trained on one seed: its summary.json and its median round time."""

    summary: Summary
    # The median is robust to rounds slowed by other work on a shared machine.
    median_seconds_per_round: float | None


# The figures results.json averages over the seeds, by name.
FIGURES: dict[str, Callable[[SeedRun], float | None]] = {
    "mean_site_auc": lambda r: r.summary.mean_site_auc,
    "worst_site_auc": lambda r: r.summary.worst_site_auc,
    "average_accuracy": lambda r: r.summary.average_accuracy,
    "system_accuracy": lambda r: r.summary.system_accuracy,
    "routing_accuracy": lambda r: r.summary.routing_accuracy,
    "bytes_per_round": lambda r: r.summary.bytes_per_round,
    "seconds_per_round": lambda r: r.summary.seconds_per_round,
    "median_seconds_per_round": lambda r: r.median_seconds_per_round,
}
STD_NOTE = "sample standard deviation over seeds (ddof=1); 0 with one seed"
PLOT_DIR = Path("docs/bench")


# The paper's FedDRM beside medfed's default (whose backbone norms stay on each site).
PAPER_FEDDRM = "feddrm:private_norms=false,lam=0.9"


def bench_methods() -> tuple[str, ...]:
    """Every algorithm in the registry with its default parameters, and the paper's FedDRM."""
    return (*ALGORITHMS, PAPER_FEDDRM)


def parse_budget(text: str) -> Budget:
    """``SCANSxROUNDSxSTEPS``, e.g. ``240x60x3``."""
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ConfigError(
            f"budget {text!r} must be SCANSxROUNDSxSTEPS with positive integers, e.g. 240x60x3"
        )
    n, rounds, steps = map(int, parts)
    return Budget(n_per_site=n, rounds=rounds, local_steps=steps)


@dataclass(frozen=True)
class BenchPlan:
    """What one ``medfed bench`` run trains and measures."""

    quick: bool = False
    seeds: int = SEEDS["full"]
    budgets: dict[str, Budget] = field(default_factory=lambda: dict(BUDGETS["full"]))
    methods: tuple[str, ...] = field(default_factory=bench_methods)
    image_size: int | None = None  # native fundus size; None: the generator's default
    speed_rounds: int = SPEED_ROUNDS["full"]
    speed_repeats: int = 2
    command: str = "medfed bench"

    def __post_init__(self) -> None:
        if self.seeds < 1:
            raise ConfigError(f"--seeds must be at least 1, got {self.seeds}")
        unknown = set(self.budgets) - set(MODALITIES)
        if unknown or not self.budgets:
            raise ConfigError(f"federations must be among {list(MODALITIES)}, got {unknown}")
        for method in self.methods:
            if MethodSpec.parse(method).algorithm not in ALGORITHMS:
                raise ConfigError(f"bench method {method!r}: unknown algorithm")
        if "fedavg" not in self.methods:
            raise ConfigError("the bench needs fedavg: bytes are compared with FedAvg float32")
        if self.speed_rounds < 1 or self.speed_repeats < 1:
            raise ConfigError("speed rounds and repeats must be at least 1")

    @classmethod
    def make(
        cls,
        *,
        quick: bool = False,
        seeds: int | None = None,
        modalities: tuple[str, ...] = MODALITIES,
        fundus_budget: str | None = None,
        ct_budget: str | None = None,
        image_size: int | None = None,
        speed_rounds: int | None = None,
    ) -> BenchPlan:
        """The quick or full plan, with any budget overridden (``SCANSxROUNDSxSTEPS``)."""
        size = "quick" if quick else "full"
        budgets = dict(BUDGETS[size])
        if fundus_budget:
            budgets["fundus"] = parse_budget(fundus_budget)
        if ct_budget:
            budgets["ct"] = parse_budget(ct_budget)
        unknown = set(modalities) - set(MODALITIES)
        if unknown:
            raise ConfigError(f"--modality: unknown {sorted(unknown)}; choose fundus, ct or all")
        return cls(
            quick=quick,
            seeds=seeds if seeds is not None else SEEDS[size],
            budgets={m: budgets[m] for m in MODALITIES if m in modalities},
            image_size=image_size,
            speed_rounds=speed_rounds or SPEED_ROUNDS[size],
            command=_command(
                quick=quick,
                seeds=seeds,
                modalities=modalities,
                fundus_budget=fundus_budget,
                ct_budget=ct_budget,
                image_size=image_size,
                speed_rounds=speed_rounds,
            ),
        )


def _command(**options: Any) -> str:
    """The command line that reproduces a plan (flags left at their defaults are omitted)."""
    parts = ["medfed bench"]
    if options.pop("quick"):
        parts.append("--quick")
    modalities = options.pop("modalities")
    if tuple(modalities) != MODALITIES:
        parts.append(f"--modality {','.join(modalities)}")
    for name, value in options.items():
        if value is not None:
            parts.append(f"--{name.replace('_', '-')} {value}")
    return " ".join(parts)


# ---------------------------------------------------------------------------- statistics
def stat(values: list[float | None]) -> dict[str, Any]:
    """Mean and sample std over the seeds that have a value (an AUC can be undefined)."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    return {
        "mean": float(np.mean(finite)) if finite else None,
        "std": float(np.std(finite, ddof=1)) if len(finite) > 1 else (0.0 if finite else None),
        "n": len(finite),
        "values": [None if v is None else float(v) for v in values],
    }


def method_row(runs: list[SeedRun]) -> dict[str, Any]:
    """One method's figures over the seeds (one run directory per seed)."""
    first = runs[0].summary
    return {
        "algorithm": first.algorithm,
        "routing_method": first.routing_method,
        "metrics": {
            "site_auc": {s: stat([r.summary.sites[s].auc for r in runs]) for s in first.sites},
            **{name: stat([figure(r) for r in runs]) for name, figure in FIGURES.items()},
        },
    }


# Figures where higher is better, in the order the findings state them.
LEADING_FIGURES = {
    "system_accuracy": "system accuracy",
    "worst_site_auc": "worst-site AUC",
    "mean_site_auc": "mean site AUC",
}


def lead(rows: dict[str, Any], key: str) -> dict[str, Any] | None:
    """The method with the highest seed mean of ``key`` (and any tied with it), the next one
    behind, and whether the gap to it is larger than the spread between seeds (None with a
    single seed)."""
    scored = [
        (m, r["metrics"][key]) for m, r in rows.items() if r["metrics"][key]["mean"] is not None
    ]
    if not scored:
        return None
    scored.sort(key=lambda item: -item[1]["mean"])  # stable: ties keep the table's order
    (best, b), *rest = scored
    found: dict[str, Any] = {"best": best, "mean": b["mean"], "std": b["std"], "seeds": b["n"]}
    found["tied"] = [m for m, s in rest if s["mean"] == b["mean"]]
    behind = [(m, s) for m, s in rest if s["mean"] < b["mean"]]
    if behind:
        second, s = behind[0]
        gap = b["mean"] - s["mean"]
        spread = max(b["std"] or 0.0, s["std"] or 0.0)
        found |= {
            "runner_up": second,
            "runner_up_mean": s["mean"],
            "runner_up_std": s["std"],
            "runner_up_seeds": s["n"],
            "gap": gap,
            "seed_spread": spread,
            "gap_exceeds_spread": gap > spread if min(b["n"], s["n"]) > 1 else None,
        }
    return found


def findings(federation: dict[str, Any]) -> dict[str, Any]:
    """What the seed means show, stated from the results themselves: which method leads each
    figure a clinician reads first (and by how much against the seed spread), and the best
    system accuracy of each way of answering a new scan (routing or voting)."""
    rows = federation["methods"]
    by_router: dict[str, dict[str, Any]] = {}
    for method, row in rows.items():
        figure = row["metrics"]["system_accuracy"]
        best = by_router.get(row["routing_method"])
        if figure["mean"] is not None and (best is None or figure["mean"] > best["mean"]):
            by_router[row["routing_method"]] = {"method": method, **figure}
    return {
        "leads": {key: found for key in LEADING_FIGURES if (found := lead(rows, key))},
        "best_by_router": {
            router: {k: best[k] for k in ("method", "mean", "std")} | {"seeds": best["n"]}
            for router, best in by_router.items()
        },
    }


# ---------------------------------------------------------------------------- running
@dataclass
class FederationRuns:
    """What training one federation over the seeds left behind."""

    modality: str
    budget: Budget
    runs: dict[str, list[SeedRun]]
    first_seed_sites: list[Any]
    first_seed_runs: dict[str, Path]
    first_seed_manifests: list[Path]
    seconds: float


def _run_dir(out: Path, modality: str, seed: int, method: str) -> Path:
    return out / "runs" / modality / f"seed{seed}" / MethodSpec.parse(method).dirname


def train_federation(
    out: Path, modality: str, budget: Budget, plan: BenchPlan, echo: Callable[[str], Any]
) -> FederationRuns:
    """Synthesize ``modality``'s federation for every seed and train every method on it."""
    start = time.perf_counter()
    runs = FederationRuns(modality, budget, {m: [] for m in plan.methods}, [], {}, [], 0.0)
    for seed in range(plan.seeds):
        data = out / "data" / f"{modality}_seed{seed}"
        echo(f"[{modality} seed {seed}] synthesizing {budget.n_per_site} per site into {data}")
        manifests = synthesize(
            data,
            modality=modality,
            n_per_site=budget.n_per_site,
            seed=seed,
            image_size=plan.image_size if modality == "fundus" else None,
        )
        sites = load_sites(list(manifests), out / "cache")
        for method in plan.methods:
            run_dir = _run_dir(out, modality, seed, method)
            if run_dir.exists():
                shutil.rmtree(run_dir)
            summary = train(sites, MethodSpec.parse(method).config(budget, seed), run_dir)
            rounds = recorded_round_seconds(run_dir)
            runs.runs[method].append(
                SeedRun(summary, statistics.median(rounds) if rounds else None)
            )
            echo(
                f"[{modality} seed {seed}] {method}: worst-site AUC "
                f"{_fmt(summary.worst_site_auc)}, system accuracy "
                f"{_fmt(summary.system_accuracy)} ({summary.routing_method})"
            )
        if seed == 0:
            runs.first_seed_sites = sites
            runs.first_seed_manifests = list(manifests)
            runs.first_seed_runs = {m: _run_dir(out, modality, 0, m) for m in plan.methods}
    runs.seconds = time.perf_counter() - start
    return runs


def federation_results(runs: FederationRuns) -> dict[str, Any]:
    rows = {m: method_row(r) for m, r in runs.runs.items()}
    first = next(iter(runs.runs.values()))[0].summary
    result = {
        "budget": {
            "n_per_site": runs.budget.n_per_site,
            "rounds": runs.budget.rounds,
            "local_steps": runs.budget.local_steps,
        },
        "sites": list(first.sites),
        "backbones": {m: r[0].summary.backbone for m, r in runs.runs.items()},
        "seconds": runs.seconds,
        "methods": rows,
    }
    result["findings"] = findings(result)
    return result


def measure_speed(
    out: Path, all_runs: dict[str, FederationRuns], plan: BenchPlan, echo: Callable[[str], Any]
) -> dict[str, Any]:
    """Engine overhead on the first federation's seed-0 sites; the rest for every federation."""
    first = next(iter(all_runs.values()))
    echo(f"[speed] engine vs plain PyTorch loop ({first.modality}, {plan.speed_rounds} rounds)")
    config = TrainConfig(
        algorithm="fedavg",
        rounds=plan.speed_rounds,
        local_steps=first.budget.local_steps,
        seed=0,
        device="auto",
    )
    speed: dict[str, Any] = {
        "engine_overhead": {
            "federation": first.modality,
            **engine_overhead(
                first.first_seed_sites, config, out / "speed", repeats=plan.speed_repeats
            ),
        },
        "data_path": {},
        "routing_latency": {},
        "bytes": {},
    }
    for modality, runs in all_runs.items():
        echo(f"[speed] {modality}: data path, routing latency, bytes")
        speed["data_path"][modality] = data_path(
            runs.first_seed_manifests, out / "cache", repeats=plan.speed_repeats
        )
        speed["routing_latency"][modality] = routing_latency(
            runs.first_seed_runs, runs.first_seed_sites
        )
        speed["bytes"][modality] = bytes_ratios(
            {
                m: float(np.mean([r.summary.bytes_per_round for r in seed_runs]))
                for m, seed_runs in runs.runs.items()
            }
        )
    return speed


def run_bench(
    out: Path,
    plan: BenchPlan,
    *,
    echo: Callable[[str], Any] = print,
    readme: Path | None = None,
) -> dict[str, Any]:
    """Train, measure, and write results.json, results.md and the plots under ``out``."""
    from medfed.experiments.plots import write_plots

    start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    load_at_start = load_average()
    all_runs = {m: train_federation(out, m, b, plan, echo) for m, b in plan.budgets.items()}
    results: dict[str, Any] = {
        "schema_version": RESULTS_VERSION,
        "command": plan.command,
        "quick": plan.quick,
        "seeds": list(range(plan.seeds)),
        "std": STD_NOTE,
        "methods": list(plan.methods),
        "device": device_info(),
        "started_at": started,
        "federations": {m: federation_results(r) for m, r in all_runs.items()},
    }
    results["speed"] = measure_speed(out, all_runs, plan, echo)
    results["seconds_total"] = time.perf_counter() - start
    # Speed figures depend on what else the machine was doing; 1, 5 and 15 minute averages.
    results["load_average"] = {"start": load_at_start, "end": load_average()}
    results["plots"] = [p.name for p in write_plots(results, out)]
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    (out / "results.md").write_text(results_markdown(results) + "\n", encoding="utf-8")
    echo(
        f"finished in {results['seconds_total']:.0f} s; wrote {out / 'results.json'}, "
        f"{out / 'results.md'} and {len(results['plots'])} plot(s)"
    )
    if readme is not None:
        update_readme(readme, results, out)
        echo(f"updated the {MARKER} section of {readme} (plots in {readme.parent / PLOT_DIR})")
    return results


def update_readme(readme: Path, results: dict[str, Any], out: Path) -> None:
    """Copy the plots next to the README and write the tables into its marked section."""
    plot_dir = readme.parent / PLOT_DIR
    plot_dir.mkdir(parents=True, exist_ok=True)
    for name in results["plots"]:
        shutil.copyfile(out / name, plot_dir / name)
    body = results_markdown(results, image_prefix=f"{PLOT_DIR.as_posix()}/", heading_level=3)
    text = readme.read_text(encoding="utf-8")
    readme.write_text(replace_marked_section(text, MARKER, body), encoding="utf-8")


# ---------------------------------------------------------------------------- markdown
def _fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _cell(s: dict[str, Any], digits: int = 3, scale: float = 1.0) -> str:
    if s["mean"] is None:
        return "n/a"
    text = f"{s['mean'] * scale:.{digits}f}"
    if s["n"] > 1:
        text += f" ± {s['std'] * scale:.{digits}f}"
    return text


def methods_markdown(federation: dict[str, Any]) -> str:
    """Rows = methods; mean ± std over the seeds."""
    sites = federation["sites"]
    header = ["method", "answered by", *(f"AUC {s}" for s in sites), "mean AUC", "worst AUC"]
    header += ["avg acc.", "system acc.", "routing acc.", "MB/round", "s/round (median)"]
    rows = []
    for name, row in federation["methods"].items():
        m = row["metrics"]
        rows.append(
            [
                name,
                row["routing_method"],
                *(_cell(m["site_auc"][s]) for s in sites),
                _cell(m["mean_site_auc"]),
                _cell(m["worst_site_auc"]),
                _cell(m["average_accuracy"]),
                _cell(m["system_accuracy"]),
                _cell(m["routing_accuracy"]),
                _cell(m["bytes_per_round"], 3, 1e-6),
                _cell(m["median_seconds_per_round"], 2),
            ]
        )
    return markdown_table(header, rows)


def speed_markdown(speed: dict[str, Any]) -> str:
    e = speed["engine_overhead"]
    engine = markdown_table(
        ["engine s/round", "plain loop s/round", "overhead (engine / plain)", "goal"],
        [
            [
                f"{e['engine_seconds_per_round']:.4f}",
                f"{e['plain_seconds_per_round']:.4f}",
                f"{e['ratio']:.3f}",
                f"≤ {e['goal']:.2f}",
            ]
        ],
    )
    engine += (
        f"\n\nEngine overhead ({e['federation']}, {e['algorithm']}, {e['sites']} sites, "
        f"{e['local_steps']} local steps of batch {e['batch_size']}, {e['rounds']} rounds, best "
        f"of {e['repeats']}): {e['definition']}."
    )
    data = markdown_table(
        [
            "federation",
            "scans",
            "decode every epoch (img/s)",
            "cached (img/s)",
            "speed-up",
            "in memory (img/s)",
        ],
        [
            [
                m,
                d["n_images"],
                f"{d['decode_images_per_s']:.0f}",
                f"{d['cached_images_per_s']:.0f}",
                f"{d['cached_speedup']:.1f}x",
                f"{d['in_memory_images_per_s']:.0f}",
            ]
            for m, d in speed["data_path"].items()
        ],
    )
    routing = markdown_table(
        [
            "federation",
            "m sites",
            "FedDRM density ratio (ms/scan)",
            "majority vote (ms/scan)",
            "vote / density ratio",
        ],
        [
            [
                m,
                r["m_sites"],
                _fmt(r["feddrm_density_ratio_ms_per_scan"], 2),
                _fmt(r["majority_vote_ms_per_scan"], 2),
                _fmt(r["majority_vote_over_density_ratio"], 1),
            ]
            for m, r in speed["routing_latency"].items()
        ],
    )
    return "\n\n".join([engine, data, routing, bytes_markdown(speed["bytes"])])


def bytes_markdown(by_federation: dict[str, Any]) -> str:
    feds = list(by_federation)
    header = ["method"]
    for m in feds:
        header += [f"{m} MB/round", f"{m} vs FedAvg fp32"]
    methods = list(next(iter(by_federation.values()))["methods"])
    rows = []
    for name in methods:
        row: list[Any] = [name]
        for m in feds:
            figures = by_federation[m]["methods"][name]
            ratio = figures["ratio_to_baseline"]
            row += [
                f"{figures['bytes_per_round'] / 1e6:.3f}",
                "n/a" if ratio is None else f"{ratio:.3f}",
            ]
        rows.append(row)
    return markdown_table(header, rows)


def findings_lines(results: dict[str, Any]) -> list[str]:
    """The findings of every federation as sentences (the figures as measured, nothing assumed)."""
    lines = []
    for modality, fed in results["federations"].items():
        found = fed.get("findings") or {}
        for key, lead_ in found.get("leads", {}).items():
            text = f"- {modality}, highest {LEADING_FIGURES[key]}: {_lead_text(lead_)}"
            lines.append(text)
        routers = found.get("best_by_router", {})
        if len(routers) > 1:
            best = "; ".join(
                f"{router} {b['method']} {_pm(b['mean'], b['std'], b['seeds'])}"
                for router, b in sorted(routers.items(), key=lambda item: -item[1]["mean"])
            )
            lines.append(f"- {modality}, best system accuracy of each way to answer: {best}.")
    return lines


def _pm(mean: float, std: float | None, seeds: int) -> str:
    """``mean ± std``; the mean alone for one seed (no spread to show)."""
    return _fmt(mean) + (f" ± {std:.3f}" if seeds > 1 and std is not None else "")


def _lead_text(lead_: dict[str, Any]) -> str:
    text = f"{lead_['best']} {_pm(lead_['mean'], lead_['std'], lead_['seeds'])}"
    if lead_["tied"]:
        text += f" (tied with {', '.join(lead_['tied'])})"
    if "runner_up" not in lead_:
        return text + "."
    behind = _pm(lead_["runner_up_mean"], lead_["runner_up_std"], lead_["runner_up_seeds"])
    text += f", ahead of {lead_['runner_up']} ({behind}) by {lead_['gap']:.3f}"
    exceeds = lead_["gap_exceeds_spread"]
    if exceeds is None:
        return text + " (one seed: no spread to compare the gap with)."
    if exceeds:
        return text + f", more than the spread between seeds ({lead_['seed_spread']:.3f})."
    return text + f", within the spread between seeds ({lead_['seed_spread']:.3f})."


def caption(results: dict[str, Any]) -> str:
    budgets = ", ".join(
        f"{m}: {f['budget']['n_per_site']} per site, {f['budget']['rounds']} rounds x "
        f"{f['budget']['local_steps']} local steps"
        for m, f in results["federations"].items()
    )
    d = results["device"]
    where = d["gpu"] or d["cpu"]
    return (
        f"`{results['command']}` (seeds {results['seeds'][0]}..{results['seeds'][-1]}; "
        f"{budgets}; {d['device']}, {where}; {results['seconds_total']:.0f} s in all, "
        f"{results['started_at']}{_load_text(results.get('load_average'))})"
    )


def _load_text(load: dict[str, Any] | None) -> str:
    if not load or not load.get("start") or not load.get("end"):
        return ""
    return (
        f"; load average {load['start'][0]:.1f} at the start, {load['end'][1]:.1f} over the "
        "last 5 minutes"
    )


def results_markdown(
    results: dict[str, Any], *, image_prefix: str = "", heading_level: int = 2
) -> str:
    """The whole report: one table per federation, the speed tables, the plots, the caption."""
    h = "#" * heading_level
    parts = []
    for modality, fed in results["federations"].items():
        parts.append(
            f"{h} {modality} federation ({len(fed['sites'])} sites), mean ± std over "
            f"{len(results['seeds'])} seed(s)"
        )
        parts.append(methods_markdown(fed))
    lines = findings_lines(results)
    if lines:
        parts.append("\n".join(lines))
    parts.append(f"{h} Speed")
    parts.append(speed_markdown(results["speed"]))
    parts.append("\n".join(f"![{name[:-4]}]({image_prefix}{name})" for name in results["plots"]))
    parts.append(caption(results))
    return "\n\n".join(parts)
