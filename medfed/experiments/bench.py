"""``medfed bench``: every registered method on the synthetic fundus and CT federations over
several seeds, plus speed figures measured side by side, written as results.json, a markdown
table (results.md) and PNG plots.

Seed s synthesizes the federation with seed s and trains every method with seed s, so the
spread over seeds covers both the data draw and the training randomness, and every method of
seed s is tested on the same scans. Each figure is the mean over the seeds with its 95% CI (a
bootstrap of patients within each (seed, site) stratum), and FedDRM is compared with every
other method by paired differences on those same scans (:mod:`medfed.experiments.paired`):
the findings are the verdicts of those intervals, under the protocol each figure names.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import re
import shlex
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from medfed.algorithms import ALGORITHMS, make_algorithm
from medfed.config import TrainConfig
from medfed.data.modality import modality_spec
from medfed.data.synth import synthesize
from medfed.errors import ConfigError
from medfed.experiments.demo import (
    CT_FULL,
    FULL,
    QUICK,
    REFERENCE,
    WARMUP_BASE,
    Budget,
    MethodSpec,
    WarmupBase,
    comparisons_markdown,
    with_normalization,
)
from medfed.experiments.memory import site_memory
from medfed.experiments.paired import (
    ORIGIN_KNOWN,
    ORIGIN_UNKNOWN,
    PROTOCOLS,
    Scans,
    ci_cell,
    compare_methods,
    figure_intervals,
    load_scans,
    verdict_lines,
)
from medfed.experiments.speed import (
    backbone_speed,
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
from medfed.runs.report import markdown_table, update_readme_section, write_results

# results.json's own version (not the run directory's): 2 states findings computed from the
# results instead of fixed acceptance claims; 3 gives every figure its 95% CI, both protocols,
# and findings that are the verdicts of paired differences with FedDRM.
RESULTS_VERSION = 3
MARKER = "bench-table"
MODALITIES = ("fundus", "ct")
BUDGETS = {
    # The CT lesion task is learned after about 100 local steps (see demo.CT_FULL).
    "full": {"fundus": FULL, "ct": CT_FULL},
    # Quick CT only shows the CT path end to end (speed, bytes); its AUCs are noise at 2 rounds.
    "quick": {"fundus": QUICK, "ct": Budget(n_per_site=24, rounds=2, local_steps=3)},
}
SEEDS = {"full": 3, "quick": 2}
SPEED_ROUNDS = {"full": 20, "quick": 10}
# Local steps of the second engine-speed measurement (the first uses the budget's).
LARGER_ROUND_STEPS = 10
# Bootstrap resamples of every interval (per-method figures and paired differences).
N_BOOT = {"full": 2000, "quick": 1000}
# CT seconds per round on the 3-D and the 2.5-D path, GroupNorm then BatchNorm forms (the
# backbones `auto` picks are timed too, whichever they are): timed rounds after one warm-up.
CT_BACKBONES = ("monai3d-gn", "slices-cnn-gn", "monai3d", "slices-cnn")
BACKBONE_ROUNDS = 3
# Peak memory of loading one CT site of this many patients, against the limit it must stay under.
MEMORY_PATIENTS = 500
MEMORY_LIMIT_BYTES = 2 * 10**9


@dataclass(frozen=True)
class SeedRun:
    """One method trained on one seed: its summary.json, its median round time and its test
    scans (predictions.csv)."""

    summary: Summary
    # The median is robust to rounds slowed by other work on a shared machine.
    median_seconds_per_round: float | None
    seed: int = 0
    scans: Scans = field(default_factory=dict)


def _origin_known_accuracy(summary: Summary) -> float | None:
    router = summary.routers_origin_known.get(summary.routing_method)
    return None if router is None else router.system_accuracy


# The figures results.json averages over the seeds, by name.
FIGURES: dict[str, Callable[[SeedRun], float | None]] = {
    "mean_site_auc": lambda r: r.summary.federation.mean_site_auc,
    "worst_site_auc": lambda r: r.summary.federation.worst_site_auc,
    "average_accuracy": lambda r: r.summary.federation.average_accuracy,
    "average_accuracy_by_train": lambda r: r.summary.federation.average_accuracy_by_train,
    "system_accuracy": lambda r: r.summary.system_accuracy,
    "system_accuracy_origin_known": lambda r: _origin_known_accuracy(r.summary),
    "routing_accuracy": lambda r: r.summary.routing_accuracy,
    "bytes_per_round": lambda r: r.summary.bytes_per_round,
    "seconds_per_round": lambda r: r.summary.seconds_per_round,
    "median_seconds_per_round": lambda r: r.median_seconds_per_round,
}
STD_NOTE = "sample standard deviation over seeds (ddof=1); 0 with one seed"
CI_NOTE = (
    "95% CI: percentile bootstrap ({n_boot} resamples) of patients drawn with replacement "
    "within each (seed, site) stratum"
)
PLOT_DIR = Path("docs/bench")


# The paper's FedDRM beside medfed's default (whose backbone norms stay on each site).
PAPER_FEDDRM = "feddrm:private_norms=false,lam=0.9"
# Baselines trained and evaluated with statistics pooled over the federation: a scan of unknown
# origin then meets every site's model under the same normalization, their fair chance there.
FEDERATION_NORM = tuple(with_normalization(m, "federation") for m in ("fedavg", "fedbn"))


# LoRA adapts a trained base: it and FedAvg+FT start from the same FedAvg warm-up base.
LORA_FROM_BASE = f"lora {WARMUP_BASE}"
FT_FROM_BASE = f"fedavgft {WARMUP_BASE}"


def bench_methods() -> tuple[str, ...]:
    """Every algorithm in the registry with its default parameters (LoRA from a FedAvg
    warm-up base, next to FedAvg+FT from the same base), the paper's FedDRM, and FedAvg and
    FedBN with federation-wide normalization."""
    registry = [LORA_FROM_BASE if name == "lora" else name for name in ALGORITHMS]
    return (*registry, FT_FROM_BASE, PAPER_FEDDRM, *FEDERATION_NORM)


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
    backbone_rounds: int = BACKBONE_ROUNDS  # timed CT rounds per backbone
    memory_patients: int = MEMORY_PATIENTS  # of the CT site whose loading memory is measured
    n_boot: int = N_BOOT["full"]
    command: str = "medfed bench"

    def __post_init__(self) -> None:
        if self.seeds < 1:
            raise ConfigError(f"--seeds must be at least 1, got {self.seeds}")
        unknown = set(self.budgets) - set(MODALITIES)
        if unknown or not self.budgets:
            raise ConfigError(f"federations must be among {list(MODALITIES)}, got {unknown}")
        for method in self.methods:
            if MethodSpec.parse(method).algorithm not in ALGORITHMS:
                raise ConfigError(
                    f"--method {method!r}: unknown algorithm; the bench's methods are "
                    f"{list(bench_methods())}"
                )
        if "fedavg" not in self.methods:
            raise ConfigError(
                "--method: the bench needs fedavg among its methods (bytes are compared with "
                "FedAvg in float32); add --method fedavg"
            )
        if self.speed_rounds < 1 or self.speed_repeats < 1:
            raise ConfigError("speed rounds and repeats must be at least 1")
        if self.backbone_rounds < 1:
            raise ConfigError(f"--backbone-rounds must be at least 1, got {self.backbone_rounds}")
        if self.memory_patients < 4:
            raise ConfigError(
                f"--memory-patients must be at least 4 (a training and a test scan of each "
                f"class), got {self.memory_patients}"
            )
        if self.n_boot < 1:
            raise ConfigError(f"bootstrap resamples must be at least 1, got {self.n_boot}")
        if len(set(self.methods)) != len(self.methods):
            raise ConfigError(f"--method: give each method once, got {list(self.methods)}")

    @property
    def marker(self) -> str:
        """The README section this plan's tables go to: both federations share one; a bench of
        one federation has its own (``bench-ct-table``), so that it leaves the other's alone."""
        if tuple(self.budgets) == MODALITIES:
            return MARKER
        return f"bench-{'-'.join(self.budgets)}-table"

    @property
    def plot_dir(self) -> Path:
        """Where ``--update-readme`` copies the plots, beside the README (one per section)."""
        return PLOT_DIR if self.marker == MARKER else PLOT_DIR.with_name(self.marker)

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
        backbone_rounds: int | None = None,
        memory_patients: int | None = None,
        n_boot: int | None = None,
        methods: tuple[str, ...] = (),
    ) -> BenchPlan:
        """The quick or full plan, with any budget overridden (``SCANSxROUNDSxSTEPS``) and
        ``methods`` (names as :func:`bench_methods` gives them) instead of every method."""
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
            backbone_rounds=BACKBONE_ROUNDS if backbone_rounds is None else backbone_rounds,
            memory_patients=MEMORY_PATIENTS if memory_patients is None else memory_patients,
            n_boot=n_boot or N_BOOT[size],
            **({"methods": tuple(methods)} if methods else {}),
            command=_command(
                quick=quick,
                seeds=seeds,
                modalities=modalities,
                fundus_budget=fundus_budget,
                ct_budget=ct_budget,
                image_size=image_size,
                speed_rounds=speed_rounds,
                backbone_rounds=backbone_rounds,
                memory_patients=memory_patients,
                n_boot=n_boot,
                methods=methods,
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
    parts += [f"--method {shlex.quote(m)}" for m in options.pop("methods")]
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


def _per_seed(runs: list[SeedRun], value: Callable[[Any], Any]) -> dict[str, list[Any]]:
    """One value per seed of every site's figures (``value(site_figures)``)."""
    sites = runs[0].summary.sites
    return {s: [value(r.summary.sites[s]) for r in runs] for s in sites}


def method_row(runs: list[SeedRun], n_boot: int = N_BOOT["full"]) -> dict[str, Any]:
    """One method's figures over the seeds (one run directory per seed): mean and std of
    each, 95% CIs of the figures the tables show, and every site's test split per seed."""
    first = runs[0].summary
    row = {
        "algorithm": first.algorithm,
        "routing_method": first.routing_method,
        "normalization": first.normalization,
        "metrics": {
            "site_auc": {s: stat([r.summary.sites[s].auc for r in runs]) for s in first.sites},
            **{name: stat([figure(r) for r in runs]) for name, figure in FIGURES.items()},
        },
        "test_scans": {
            "n": _per_seed(runs, lambda f: f.n_test),
            "positives": _per_seed(runs, lambda f: f.n_pos),
            "unreliable": _per_seed(runs, lambda f: f.unreliable),
        },
    }
    if all(r.scans for r in runs):
        by_seed = {r.seed: r.scans for r in runs}
        row["intervals"] = figure_intervals(by_seed, n_boot=n_boot)
    return row


def comparisons(runs: FederationRuns, n_boot: int) -> dict[str, Any] | None:
    """FedDRM minus every other method, figure by figure, on the same test scans of every
    seed (None when FedDRM is not among the methods)."""
    if REFERENCE not in runs.runs:
        return None
    scans = {m: {r.seed: r.scans for r in seed_runs} for m, seed_runs in runs.runs.items()}
    return compare_methods(scans, REFERENCE, n_boot=n_boot)


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
        base = WarmupBase(_run_dir(out, modality, seed, "warmup_base"), budget, seed)
        for method in plan.methods:
            run_dir = _run_dir(out, modality, seed, method)
            if run_dir.exists():
                shutil.rmtree(run_dir)
            config = base.config(MethodSpec.parse(method), sites, echo)
            summary = train(sites, config, run_dir)
            rounds = recorded_round_seconds(run_dir)
            median = statistics.median(rounds) if rounds else None
            runs.runs[method].append(SeedRun(summary, median, seed, load_scans(run_dir)))
            echo(
                f"[{modality} seed {seed}] {method}: worst-site AUC "
                f"{_fmt(summary.federation.worst_site_auc)}, system accuracy {ORIGIN_UNKNOWN} "
                f"{_fmt(summary.system_accuracy)}, {ORIGIN_KNOWN} "
                f"{_fmt(_origin_known_accuracy(summary))} ({summary.routing_method})"
            )
        if seed == 0:
            runs.first_seed_sites = sites
            runs.first_seed_manifests = list(manifests)
            runs.first_seed_runs = {m: _run_dir(out, modality, 0, m) for m in plan.methods}
    runs.seconds = time.perf_counter() - start
    return runs


def base_comparison(runs: FederationRuns, n_boot: int) -> dict[str, Any] | None:
    """LoRA minus FedAvg+FT, both from the same warm-up base, on the same test scans (None
    unless both ran)."""
    if LORA_FROM_BASE not in runs.runs or FT_FROM_BASE not in runs.runs:
        return None
    scans = {m: {r.seed: r.scans for r in runs.runs[m]} for m in (LORA_FROM_BASE, FT_FROM_BASE)}
    return compare_methods(scans, LORA_FROM_BASE, n_boot=n_boot)


def warmup_base(runs: FederationRuns) -> dict[str, Any] | None:
    """How the warm-up base rows spent their rounds (None when none ran)."""
    methods = [m for m in runs.runs if MethodSpec.parse(m).warmup_base]
    if not methods:
        return None
    base = WarmupBase(Path(), runs.budget, 0).rounds
    return {"fedavg_rounds": base, "method_rounds": runs.budget.rounds - base, "methods": methods}


def federation_results(runs: FederationRuns, n_boot: int = N_BOOT["full"]) -> dict[str, Any]:
    rows = {m: method_row(r, n_boot) for m, r in runs.runs.items()}
    first = next(iter(runs.runs.values()))[0].summary
    return {
        "warmup_base": warmup_base(runs),
        "base_comparison": base_comparison(runs, n_boot),
        "budget": {
            "n_per_site": runs.budget.n_per_site,
            "rounds": runs.budget.rounds,
            "local_steps": runs.budget.local_steps,
        },
        "sites": list(first.sites),
        "backbones": {m: r[0].summary.backbone for m, r in runs.runs.items()},
        "seconds": runs.seconds,
        "methods": rows,
        "comparisons": comparisons(runs, n_boot),
    }


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
    if config.local_steps < LARGER_ROUND_STEPS:
        # Where a site's local work outweighs the round's fixed costs, as in a real pilot's.
        echo(f"[speed] the same at {LARGER_ROUND_STEPS} local steps")
        speed["engine_overhead_larger_rounds"] = {
            "federation": first.modality,
            **engine_overhead(
                first.first_seed_sites,
                dataclasses.replace(config, local_steps=LARGER_ROUND_STEPS),
                out / "speed_larger",
                repeats=plan.speed_repeats,
            ),
        }
    for modality, runs in all_runs.items():
        echo(f"[speed] {modality}: data path, routing latency, bytes")
        speed["data_path"][modality] = data_path(
            runs.first_seed_manifests, out / "cache", repeats=plan.speed_repeats
        )
        # Normalization does not change how long routing takes: the site-normalized runs only.
        site_norm = {
            m: run
            for m, run in runs.first_seed_runs.items()
            if MethodSpec.parse(m).normalization == "site"
        }
        speed["routing_latency"][modality] = routing_latency(site_norm, runs.first_seed_sites)
        speed["bytes"][modality] = bytes_ratios(
            {
                m: float(np.mean([r.summary.bytes_per_round for r in seed_runs]))
                for m, seed_runs in runs.runs.items()
            }
        )
    if "ct" in all_runs:
        speed["ct_backbones"] = ct_backbone_speed(out, all_runs["ct"], plan, echo)
    return speed


def auto_backbones(modality: str) -> dict[str, Any]:
    """What ``backbone = auto`` trains on ``modality`` for algorithms that share every layer,
    and for those that keep normalization layers on each site (named, at their defaults)."""
    spec = modality_spec(modality)
    return {
        "shared_norms": spec.default_backbone(False),
        "private_norms": spec.default_backbone(True),
        "private_norm_algorithms": [
            name for name in ALGORITHMS if make_algorithm(name).prefers_batch_norm()
        ],
    }


def ct_backbone_speed(
    out: Path, runs: FederationRuns, plan: BenchPlan, echo: Callable[[str], Any]
) -> dict[str, Any]:
    """FedAvg's seconds per round, parameters and bytes per round on the 3-D and the 2.5-D CT
    backbones (and whichever `auto` picks), on the first seed's CT sites at the CT budget."""
    auto = auto_backbones(runs.modality)
    picked = (auto["shared_norms"], auto["private_norms"])
    backbones = tuple(dict.fromkeys([*CT_BACKBONES, *picked]))
    echo(
        f"[speed] {runs.modality} backbones: fedavg, 1 warm-up + {plan.backbone_rounds} timed "
        f"round(s) on each of {', '.join(backbones)}"
    )
    config = MethodSpec.parse("fedavg").config(runs.budget, 0)
    return {
        "federation": runs.modality,
        "auto": auto,
        **backbone_speed(
            runs.first_seed_sites,
            config,
            backbones,
            out / "speed" / f"{runs.modality}_backbones",
            rounds=plan.backbone_rounds,
        ),
    }


def measure_memory(plan: BenchPlan, echo: Callable[[str], Any]) -> dict[str, Any]:
    """Peak RSS of loading one synthetic CT site of ``plan.memory_patients``, cold and warm
    cache, each in a fresh process, against :data:`MEMORY_LIMIT_BYTES`."""
    echo(f"[memory] loading a {plan.memory_patients}-patient CT site, cold then warm cache")
    figures = site_memory(plan.memory_patients, seed=0).to_dict()
    peak = max(figures["cold"]["peak_rss_bytes"], figures["warm"]["peak_rss_bytes"])
    return {
        **figures,
        "limit_bytes": MEMORY_LIMIT_BYTES,
        "peak_rss_bytes": peak,
        "under_limit": peak < MEMORY_LIMIT_BYTES,
    }


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
        "n_boot": plan.n_boot,
        "ci": CI_NOTE.format(n_boot=plan.n_boot),
        "protocols": PROTOCOLS,
        "federations": {},
    }
    for modality, runs in all_runs.items():
        echo(f"[{modality}] 95% CIs and paired comparisons ({plan.n_boot} bootstrap resamples)")
        results["federations"][modality] = federation_results(runs, plan.n_boot)
    results["speed"] = measure_speed(out, all_runs, plan, echo)
    results["memory"] = measure_memory(plan, echo) if "ct" in plan.budgets else None
    results["seconds_total"] = time.perf_counter() - start
    # Speed figures depend on what else the machine was doing; 1, 5 and 15 minute averages.
    results["load_average"] = {"start": load_at_start, "end": load_average()}
    results["plots"] = [p.name for p in write_plots(results, out)]
    written = write_results(out, "results", results, results_markdown(results))
    echo(
        f"finished in {results['seconds_total']:.0f} s; wrote {written} and "
        f"{len(results['plots'])} plot(s)"
    )
    if readme is not None:
        update_readme(readme, results, out, plan)
        echo(
            f"updated the {plan.marker} section of {readme} "
            f"(plots in {readme.parent / plan.plot_dir})"
        )
    return results


def update_readme(readme: Path, results: dict[str, Any], out: Path, plan: BenchPlan) -> None:
    """Copy the plots next to the README and write the tables into the plan's marked section."""
    prefix = f"{plan.plot_dir.as_posix()}/"
    body = results_markdown(results, image_prefix=prefix, heading_level=3)
    plots = [out / name for name in results["plots"]]
    update_readme_section(readme, plan.marker, body, plots, plan.plot_dir)


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


UNRELIABLE = " \u2020"


def _unreliable(row: dict[str, Any]) -> dict[str, list[str]]:
    """Site -> why its figures rest on too few scans, per seed (sites without a reason left
    out)."""
    found: dict[str, list[str]] = {}
    for site, reasons in row.get("test_scans", {}).get("unreliable", {}).items():
        if reasons and all(why == reasons[0] for why in reasons) and reasons[0]:
            found[site] = [f"every seed: {reasons[0]}"]
        elif marks := [f"seed {k}: {why}" for k, why in enumerate(reasons) if why]:
            found[site] = marks
    return found


def _interval_cell(row: dict[str, Any], key: str, site: str | None = None, flag: str = "") -> str:
    """The mean over seeds with its 95% CI; mean ± std where the run has no per-scan data."""
    intervals = row.get("intervals")
    if intervals is None:
        stat_ = row["metrics"]["site_auc"][site] if site else row["metrics"][key]
        return _cell(stat_) + ("" if stat_["mean"] is None else flag)
    interval = intervals["site_auc"].get(site) if site else intervals.get(key)
    if interval is None:
        # Defined on the data as given, but undefined in most resamples (a site of a handful
        # of test scans draws one class): the mean without an interval.
        stat_ = row["metrics"]["site_auc"][site] if site else row["metrics"][key]
        return "n/a" if stat_["mean"] is None else f"{stat_['mean']:.2f} (no CI){flag}"
    return ci_cell(interval, flag=flag)


def methods_markdown(federation: dict[str, Any]) -> str:
    """Rows = methods: each figure's mean over the seeds with its 95% CI (accuracy averaged
    over sites and timing: mean ± std)."""
    sites = federation["sites"]
    header = ["method", "norm.", "answered by", *(f"AUC {s}" for s in sites)]
    header += ["mean AUC", "worst AUC", "avg acc. (by test scans)", "avg acc. (by training scans)"]
    header += [f"system acc. ({ORIGIN_UNKNOWN})", f"system acc. ({ORIGIN_KNOWN})"]
    header += [f"routing acc. ({ORIGIN_UNKNOWN})", "s/round (median)"]
    rows = []
    for name, row in federation["methods"].items():
        m = row["metrics"]
        weak = _unreliable(row)
        any_weak = UNRELIABLE if weak else ""
        rows.append(
            [
                name,
                row.get("normalization", "site"),
                row["routing_method"],
                *(
                    _interval_cell(row, "site_auc", s, UNRELIABLE if s in weak else "")
                    for s in sites
                ),
                _interval_cell(row, "mean_site_auc", flag=any_weak),
                _interval_cell(row, "worst_site_auc", flag=any_weak),
                _cell(m["average_accuracy"]),
                _cell(m["average_accuracy_by_train"]),
                _interval_cell(row, "system_accuracy"),
                _interval_cell(row, "system_accuracy_origin_known"),
                _cell(m["routing_accuracy"]),
                _cell(m["median_seconds_per_round"], 2),
            ]
        )
    return markdown_table(header, rows)


def test_scans_lines(federation: dict[str, Any]) -> list[str]:
    """How many test scans (and positives) every site had on each seed, and which figures rest
    on too few of a class."""
    rows = federation["methods"]
    row = rows.get(REFERENCE) or next(iter(rows.values()))
    scans = row.get("test_scans")
    if not scans:
        return []
    per_site = []
    for site, counts in scans["n"].items():
        positives = scans["positives"][site]
        seeds = ", ".join(
            f"{n}" + ("" if p is None else f" ({p} positive)")
            for n, p in zip(counts, positives, strict=True)
        )
        per_site.append(f"{site} {seeds}")
    lines = [f"Test scans per site on each seed: {'; '.join(per_site)}."]
    weak = _unreliable(row)
    if weak:
        reasons = "; ".join(f"{site} ({', '.join(marks)})" for site, marks in weak.items())
        lines.append(
            f"\u2020 unreliable: the figure rests on fewer than 10 positives or negatives in "
            f"some seed's test split: {reasons}."
        )
    return lines


def reading_note(results: dict[str, Any]) -> str:
    """How to read the tables: what each cell is, its CI, the protocols, the weighting."""
    seeds = len(results["seeds"])
    return (
        f"Each cell: the mean over {seeds} seed(s) with its {results['ci']}. AUC columns: each "
        f"site's model on its own test scans ({ORIGIN_KNOWN}). System accuracy: every site's "
        "test scans pooled and answered as the federation answers a new scan (routing or "
        f"voting, as 'answered by' says), under two protocols. {ORIGIN_UNKNOWN}: "
        f"{PROTOCOLS[ORIGIN_UNKNOWN]}; {ORIGIN_KNOWN}: {PROTOCOLS[ORIGIN_KNOWN]}. Rows marked "
        "[federation norm] (norm. federation) train and evaluate with that pooled "
        "normalization. Average accuracy weights the sites by their test scans, or by their "
        "training scans; it, routing accuracy and seconds per round are mean \u00b1 std over "
        "seeds. \u2020: the figure rests on fewer than 10 positives or negatives in some seed's "
        "test split (unreliable)."
    )


def speed_markdown(speed: dict[str, Any]) -> str:
    e = speed["engine_overhead"]
    measured = [
        speed[k] for k in ("engine_overhead", "engine_overhead_larger_rounds") if k in speed
    ]
    engine = markdown_table(
        [
            "local steps",
            "engine, one site at a time (s/round)",
            "engine, every site at once (s/round)",
            "plain loop (s/round)",
            "one at a time / plain",
            "every site at once / plain",
        ],
        [
            [
                m["local_steps"],
                f"{m['engine_seconds_per_round']:.4f}",
                f"{m['concurrent']['seconds_per_round']:.4f}",
                f"{m['plain_seconds_per_round']:.4f}",
                f"{m['ratio']:.3f} (goal ≤ {m['goal']:.2f})",
                f"{m['concurrent']['ratio']:.3f} (goal ≤ {m['concurrent']['goal']:.2f})",
            ]
            for m in measured
        ],
    )
    engine += (
        f"\n\nEngine speed ({e['federation']}, {e['algorithm']}, {e['sites']} sites, batch "
        f"{e['batch_size']}, {e['rounds']} rounds, best of {e['repeats']}): {e['definition']}. "
        f"One site at a time and the plain loop use {e['threads']} thread(s); every site at "
        f"once: {e['concurrent']['lanes']} (`--concurrency`)."
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
    parts = [engine, data, routing, bytes_markdown(speed["bytes"])]
    if speed.get("ct_backbones"):
        parts.append(backbones_markdown(speed["ct_backbones"]))
    return "\n\n".join(parts)


def _norm_family(norm: str) -> str:
    """BatchNorm2d and BatchNorm3d are one kind of norm layer for comparing paths."""
    return re.sub(r"[123]d$", "", norm)


def backbones_markdown(found: dict[str, Any]) -> str:
    """Seconds per round, parameters and bytes per round of each CT backbone, each against the
    3-D backbone with the same kind of norm layers, and what `auto` picks."""
    rows = found["backbones"]
    three_d = {
        _norm_family(r["norm"]): r["seconds_per_round"] for r in rows.values() if r["path"] == "3-D"
    }
    auto = found["auto"]
    picks = {auto["shared_norms"]: "shared norms", auto["private_norms"]: "private norms"}
    if auto["shared_norms"] == auto["private_norms"]:
        picks = {auto["shared_norms"]: "always"}
    table = markdown_table(
        [
            "backbone",
            "path",
            "norm",
            "parameters",
            "MB/round",
            "s/round (median)",
            "vs 3-D, same norm",
            "`auto` picks it",
        ],
        [
            [
                name,
                r["path"],
                r["norm"],
                f"{r['parameters']:,}",
                f"{r['bytes_per_round'] / 1e6:.3f}",
                _fmt(r["seconds_per_round"], 3),
                _ratio(r["seconds_per_round"], three_d.get(_norm_family(r["norm"]))),
                picks.get(name, ""),
            ]
            for name, r in rows.items()
        ],
    )
    private = ", ".join(auto.get("private_norm_algorithms", [])) or "none"
    return (
        f"{table}\n\n{found['federation']} backbones ({found['algorithm']}, {found['sites']} "
        f"sites, input {'x'.join(map(str, found['input_shape']))}, {found['local_steps']} local "
        f"steps of batch {found['batch_size']}, {found['device']}): "
        f"{found['definition']}, over {found['rounds']} timed round(s). With `backbone = auto`, "
        f"{found['federation']} trains **{auto['shared_norms']}** where every layer is shared "
        f"and **{auto['private_norms']}** where normalization layers stay on each site "
        f"(so, at their default parameters: {private})."
    )


def _ratio(value: float | None, reference: float | None) -> str:
    if value is None or not reference:
        return "n/a"
    return f"{value / reference:.2f}x"


def memory_markdown(memory: dict[str, Any]) -> str:
    """Peak RSS of loading one CT site with a cold and a warm cache, against the limit."""
    mb = 1e6
    table = markdown_table(
        [
            "cache",
            "peak RSS (MB)",
            "after imports (MB)",
            "site tensors (MB)",
            "memory-mapped",
            "cache hits / misses",
            "seconds",
        ],
        [
            [
                name,
                f"{load['peak_rss_bytes'] / mb:.0f}",
                f"{load['import_rss_bytes'] / mb:.0f}",
                f"{load['site_bytes'] / mb:.1f}",
                "yes" if load["mapped"] else "no",
                f"{load['cache_hits']} / {load['cache_misses']}",
                f"{load['seconds']:.1f}",
            ]
            for name, load in (("cold", memory["cold"]), ("warm", memory["warm"]))
        ],
    )
    limit = f"{memory['limit_bytes'] / 1e9:g} GB"
    verdict_ = "under" if memory["under_limit"] else "OVER"
    return (
        f"Loading one CT site of {memory['patients']} patients (each "
        f"{'x'.join(map(str, memory['input_shape']))}, stored as {memory['storage_dtype']}; one "
        f"float32 copy would be {memory['float32_bytes'] / mb:.1f} MB), each load in a fresh "
        f"process that then reads every scan once:\n\n{table}\n\nPeak RSS "
        f"{memory['peak_rss_bytes'] / mb:.0f} MB: {verdict_} the {limit} limit."
    )


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


def warmup_markdown(fed: dict[str, Any], modality: str, h: str) -> str:
    """What the warm-up base rows cost in rounds, and LoRA against FedAvg+FT from that base."""
    base = fed.get("warmup_base")
    if not base:
        return ""
    parts = [
        f"{h}# {modality}: from a FedAvg warm-up base",
        f"Rows marked {WARMUP_BASE} start from one FedAvg run of {base['fedavg_rounds']} "
        f"round(s) on the same federation and seed, then train {base['method_rounds']} "
        f"round(s) of their own: {base['fedavg_rounds'] + base['method_rounds']} rounds in "
        "all, as every other row. Their bytes per round count their own rounds; each warm-up "
        "round cost what a FedAvg round costs. LoRA freezes the base and keeps its adapters "
        "and target head on each site: only its client head travels, and once, each site's "
        "feature statistics (count, sum, scatter) from which the server sets that head.",
    ]
    found = fed.get("base_comparison")
    if found:
        parts.append(comparisons_markdown(found, f"{modality}, same base"))
    return "\n\n".join(parts)


def findings_lines(results: dict[str, Any]) -> list[str]:
    """The findings of every federation: the verdicts of the paired differences with FedDRM,
    each naming its figure and protocol (nothing else is claimed)."""
    lines = []
    for modality, fed in results["federations"].items():
        if fed.get("comparisons"):
            lines += verdict_lines(fed["comparisons"], modality)
        if fed.get("base_comparison"):
            lines += verdict_lines(fed["base_comparison"], f"{modality}, same base")
    return lines


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
    """The whole report: one table per federation with its paired comparisons and their
    verdicts, the speed tables, the plots, the caption."""
    h = "#" * heading_level
    parts = [reading_note(results)]
    for modality, fed in results["federations"].items():
        parts.append(
            f"{h} {modality} federation ({len(fed['sites'])} sites), mean over "
            f"{len(results['seeds'])} seed(s) with 95% CIs"
        )
        parts.append(methods_markdown(fed))
        parts.append("\n".join(test_scans_lines(fed)))
        found = fed.get("comparisons")
        if found:
            parts.append(
                f"{h}# {modality}: {found['reference']} against each method, paired on the "
                "same test scans"
            )
            parts.append(comparisons_markdown(found, modality))
        parts.append(warmup_markdown(fed, modality, h))
    parts.append(f"{h} Speed")
    parts.append(speed_markdown(results["speed"]))
    if results.get("memory"):
        parts.append(f"{h} Memory")
        parts.append(memory_markdown(results["memory"]))
    parts.append("\n".join(f"![{name[:-4]}]({image_prefix}{name})" for name in results["plots"]))
    parts.append(caption(results))
    return "\n\n".join(p for p in parts if p)
