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
import shlex
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from medfed.algorithms import ALGORITHMS, make_algorithm
from medfed.config import TrainConfig
from medfed.core.errors import ConfigError
from medfed.data.modality import modality_spec
from medfed.experiments.bench_tables import fixed, results_markdown

# The bench's table as the GPU check shows it.
from medfed.experiments.bench_tables import methods_markdown as methods_markdown
from medfed.experiments.demo import (
    CT_FULL,
    FULL,
    QUICK,
    REFERENCE,
    WARMUP_BASE,
    Budget,
    MethodSpec,
    WarmupBase,
    with_normalization,
)
from medfed.experiments.harness import (
    N_BOOT,
    Docs,
    Federation,
    Trained,
    synthesize_federation,
    train_run,
    train_seeds,
)
from medfed.experiments.memory import site_memory
from medfed.experiments.paired import (
    ORIGIN_KNOWN,
    ORIGIN_UNKNOWN,
    PROTOCOLS,
    Scans,
    compare_methods,
    figure_intervals,
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
from medfed.runs import Summary

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
    "average_accuracy_operating": lambda r: r.summary.average_accuracy_operating,
    "average_accuracy_operating_by_train": lambda r: r.summary.average_accuracy_operating_by_train,
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
PLOT_DIR = Path("bench")


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

    @property
    def docs(self) -> Docs:
        """OUT/results.json and .md, and the README section with its plots."""
        return Docs("results", self.marker, self.plot_dir)

    @staticmethod
    def make(**options: Any) -> BenchPlan:
        """The plan of ``medfed bench``'s options, named as :class:`BenchOptions` names them."""
        return BenchOptions(**options).plan()


@dataclass(frozen=True)
class BenchOptions:
    """``medfed bench``'s options as given: budgets as ``SCANSxROUNDSxSTEPS``, ``methods`` as
    :func:`bench_methods` names them; None (or empty) leaves the quick or full plan's own."""

    quick: bool = False
    seeds: int | None = None
    modalities: tuple[str, ...] = MODALITIES
    fundus_budget: str | None = None
    ct_budget: str | None = None
    image_size: int | None = None
    speed_rounds: int | None = None
    backbone_rounds: int | None = None
    memory_patients: int | None = None
    n_boot: int | None = None
    methods: tuple[str, ...] = ()

    def plan(self) -> BenchPlan:
        """The quick or full plan, with any budget overridden and ``methods`` instead of every
        method."""
        size = "quick" if self.quick else "full"
        budgets = dict(BUDGETS[size])
        if self.fundus_budget:
            budgets["fundus"] = parse_budget(self.fundus_budget)
        if self.ct_budget:
            budgets["ct"] = parse_budget(self.ct_budget)
        unknown = set(self.modalities) - set(MODALITIES)
        if unknown:
            raise ConfigError(f"--modality: unknown {sorted(unknown)}; choose fundus, ct or all")
        return BenchPlan(
            quick=self.quick,
            seeds=self.seeds if self.seeds is not None else SEEDS[size],
            budgets={m: budgets[m] for m in MODALITIES if m in self.modalities},
            image_size=self.image_size,
            speed_rounds=self.speed_rounds or SPEED_ROUNDS[size],
            backbone_rounds=(
                BACKBONE_ROUNDS if self.backbone_rounds is None else self.backbone_rounds
            ),
            memory_patients=(
                MEMORY_PATIENTS if self.memory_patients is None else self.memory_patients
            ),
            n_boot=self.n_boot or N_BOOT[size],
            **({"methods": tuple(self.methods)} if self.methods else {}),
            command=self.command(),
        )

    def command(self) -> str:
        """The command line that reproduces the plan (options left at their defaults are
        omitted)."""
        parts = ["medfed bench"]
        if self.quick:
            parts.append("--quick")
        if tuple(self.modalities) != MODALITIES:
            parts.append(f"--modality {','.join(self.modalities)}")
        parts += [f"--method {shlex.quote(m)}" for m in self.methods]
        for option in dataclasses.fields(self):
            value = getattr(self, option.name)
            if option.name not in ("quick", "modalities", "methods") and value is not None:
                parts.append(f"--{option.name.replace('_', '-')} {value}")
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

    def federation(seed: int) -> tuple[Federation, WarmupBase]:
        data = out / "data" / f"{modality}_seed{seed}"
        echo(f"[{modality} seed {seed}] synthesizing {budget.n_per_site} per site into {data}")
        image_size = plan.image_size if modality == "fundus" else None
        found = synthesize_federation(out, data, modality, budget, seed, image_size)
        return found, WarmupBase(_run_dir(out, modality, seed, "warmup_base"), budget, seed)

    def train_one(found: tuple[Federation, WarmupBase], seed: int, method: str) -> Trained:
        fed, base = found
        config = base.config(MethodSpec.parse(method), fed.sites, echo)
        run = train_run(fed.sites, config, _run_dir(out, modality, seed, method))
        summary = run.summary
        echo(
            f"[{modality} seed {seed}] {method}: worst-site AUC "
            f"{fixed(summary.federation.worst_site_auc)}, system accuracy {ORIGIN_UNKNOWN} "
            f"{fixed(summary.system_accuracy)}, {ORIGIN_KNOWN} "
            f"{fixed(_origin_known_accuracy(summary))} ({summary.routing_method})"
        )
        return run

    trained = train_seeds(range(plan.seeds), federation, plan.methods, train_one)
    first, _ = trained.first
    return FederationRuns(
        modality,
        budget,
        {
            m: [_seed_run(run, seed) for seed, run in by_seed.items()]
            for m, by_seed in trained.runs.items()
        },
        first.sites,
        {m: by_seed[0].folder for m, by_seed in trained.runs.items()},
        first.manifests,
        trained.seconds,
    )


def _seed_run(run: Trained, seed: int) -> SeedRun:
    rounds = recorded_round_seconds(run.folder)
    return SeedRun(run.summary, statistics.median(rounds) if rounds else None, seed, run.scans)


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
    plan.docs.publish(
        out,
        results,
        results_markdown,
        [out / name for name in results["plots"]],
        echo=echo,
        readme=readme,
        summary=lambda written: [
            f"finished in {results['seconds_total']:.0f} s; wrote {written} and "
            f"{len(results['plots'])} plot(s)"
        ],
        readme_style={"heading_level": 3},
    )
    return results
