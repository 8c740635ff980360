"""``medfed transfer``: does a pretrained start help? A FedAvg base trained on one synthetic
fundus federation (A, seed 1) is the starting point (``--init``) of LoRA and FedDRM on a second
federation (B, seed 2); the same methods also train on B from seeded random weights.

Two things are measured on B, one seed:

* per round, the worst-site validation AUC (the lowest over B's sites of each site's model on
  its validation split, as ``metrics.jsonl`` records it), plotted for both starts, and the first
  round at which it reaches ``THRESHOLD``: a description of one curve, with no interval;
* after the last round, the worst-site and mean site AUC on B's test scans with 95% CIs, and
  the paired differences pretrained minus random on those same scans
  (:func:`medfed.experiments.paired.compare_methods`): whether the pretrained start helps is
  the verdict of those intervals, nothing else.

LoRA refuses a frozen base of random weights, so its random start trains the base too
(``base = "federated"``); from the pretrained start it keeps LoRA's default, the base frozen.

Where torchvision's ImageNet weights of ResNet-18 are in the local hub cache
(``$TORCH_HOME/hub/checkpoints``; nothing is downloaded), a third pair trains FedAvg on the
torchvision-shaped ResNet-18 at 224 px on the same federations B, from those weights (every
tensor loaded, ImageNet's normalization) and from random weights; where the file is absent the
pair is skipped and the results say why.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
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
from medfed.runs import RunDir

MARKER = "transfer"
PLOT_DIR = Path("transfer")
DOCS = Docs("transfer", MARKER, PLOT_DIR)
SOURCE_SEED = 1  # federation A: the base's data and training seed
TARGET_SEED = 2  # federation B: every compared run's data and training seed
BACKBONE = "cnn-gn"  # one backbone for every run, so the base's weights fit every model
THRESHOLD = 0.75  # the worst-site validation AUC whose first round the table gives
IMAGENET_NET = "resnet18"  # torchvision's network whose ImageNet weights start the third pair
IMAGENET_BACKBONE = "tv-resnet18"
IMAGENET_SIZE = 224  # the resolution those weights were trained at


@dataclass(frozen=True)
class TransferBudget:
    """Scans per site of each federation, rounds of the base (on A) and of each compared run
    (on B), local steps per round, and the native fundus image height (None: the default)."""

    n_per_site: int
    base_rounds: int
    rounds: int
    local_steps: int = 3
    image_size: int | None = None
    # A second, short budget: does the pretrained start lead after this many rounds?
    early_rounds: int = 2
    seeds: int = 3  # federations B, one per seed from TARGET_SEED on: the paired tests pool them

    def __post_init__(self) -> None:
        names = ("n_per_site", "base_rounds", "rounds", "local_steps", "early_rounds", "seeds")
        for name in names:
            if getattr(self, name) < 1:
                raise ConfigError(f"transfer budget: {name} must be at least 1")
        if self.early_rounds > self.rounds:
            raise ConfigError("transfer budget: early_rounds must not exceed rounds")


FULL = TransferBudget(n_per_site=240, base_rounds=30, rounds=20)
QUICK = TransferBudget(n_per_site=120, base_rounds=12, rounds=10, seeds=2)


@dataclass(frozen=True)
class Arm:
    """One run on federation B: a method, its parameters, and its start."""

    label: str
    algorithm: str
    pretrained: bool
    dirname: str
    params: dict[str, str] = field(default_factory=dict)
    init: str = ""  # the starting weights of a pretrained arm ("": the FedAvg base)
    backbone: str = BACKBONE
    image_size: int | None = None  # train at this fundus size (None: the federation's own)
    normalization: str = "site"


@dataclass(frozen=True)
class Pair:
    """A method from the pretrained base and from random weights."""

    name: str
    pretrained: Arm
    random: Arm


PAIRS = (
    Pair(
        "LoRA",
        Arm("lora (pretrained)", "lora", True, "lora_pretrained"),
        # A frozen random base is refused: from random weights LoRA trains its base as well.
        Arm("lora (random)", "lora", False, "lora_random", {"base": "federated"}),
    ),
    Pair(
        "FedDRM",
        Arm("feddrm (pretrained)", "feddrm", True, "feddrm_pretrained"),
        Arm("feddrm (random)", "feddrm", False, "feddrm_random"),
    ),
)
IMAGENET_PAIR = Pair(
    "ImageNet",
    Arm(
        "fedavg (ImageNet, tv-resnet18)",
        "fedavg",
        True,
        "imagenet_pretrained",
        init=f"torchvision:{IMAGENET_NET}",
        backbone=IMAGENET_BACKBONE,
        image_size=IMAGENET_SIZE,
        normalization="imagenet",
    ),
    Arm(
        "fedavg (random, tv-resnet18)",
        "fedavg",
        False,
        "imagenet_random",
        backbone=IMAGENET_BACKBONE,
        image_size=IMAGENET_SIZE,
        normalization="imagenet",
    ),
)
# Every run on federation B, in the order they train.
ARMS = tuple(arm for pair in PAIRS for arm in (pair.pretrained, pair.random))


def imagenet_weights() -> tuple[Path, str | None]:
    """The hub file of ResNet-18's ImageNet weights, and why the ImageNet pair is skipped
    (None: the file is there and the pair trains)."""
    from medfed.federation.pretrained import torchvision_hub_file

    path = torchvision_hub_file(IMAGENET_NET)
    if path.is_file():
        return path, None
    return path, (
        f"{path} is absent (torchvision's hub cache, $TORCH_HOME/hub/checkpoints), and nothing "
        f"is downloaded: copy {path.name} there, or set TORCH_HOME to the folder holding "
        "hub/checkpoints/, to add the ImageNet start"
    )


def chosen_pairs(imagenet: bool) -> tuple[Pair, ...]:
    return (*PAIRS, IMAGENET_PAIR) if imagenet else PAIRS


def arms_of(pairs: tuple[Pair, ...]) -> tuple[Arm, ...]:
    return tuple(arm for pair in pairs for arm in (pair.pretrained, pair.random))


def arm_init(arm: Arm, base: Path) -> str | None:
    """What ``arm`` starts from: None (random weights), the FedAvg base, or ``arm.init``."""
    if not arm.pretrained:
        return None
    return arm.init or str(base)


# The suffix of the folder and the key of each arm's run at the short budget.
EARLY = "_early"


# ---------------------------------------------------------------------------- figures
def worst_site_curve(run: Path) -> list[dict[str, Any]]:
    """One point per round of ``run``'s metrics.jsonl: the lowest validation AUC over the sites
    (a site whose validation split holds one class has no AUC and is left out; None when no
    site has one)."""
    by_round: dict[int, list[float]] = {}
    for record in RunDir(run).read_metrics():
        values = by_round.setdefault(record.round, [])
        if record.validation is not None and record.validation.auc is not None:
            values.append(record.validation.auc)
    return [
        {"round": r, "worst_site_val_auc": min(values) if values else None}
        for r, values in sorted(by_round.items())
    ]


def rounds_to(curve: list[dict[str, Any]], threshold: float) -> int | None:
    """The first round whose worst-site validation AUC reaches ``threshold`` (None: never)."""
    for point in curve:
        value = point["worst_site_val_auc"]
        if value is not None and value >= threshold:
            return int(point["round"])
    return None


def mean_curve(curves: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Round by round, the mean over the seeds' curves of the worst-site validation AUC (over
    the seeds where it is defined; None where it is nowhere)."""
    out = []
    for points in zip(*curves, strict=True):
        values = [p["worst_site_val_auc"] for p in points if p["worst_site_val_auc"] is not None]
        mean = sum(values) / len(values) if values else None
        out.append({"round": points[0]["round"], "worst_site_val_auc": mean})
    return out


def _arm_figures(
    arm: Arm,
    trained: SeedRuns[list[Any], tuple[str, str]],
    init: str | None,
    n_boot: int,
    threshold: float,
) -> dict[str, Any]:
    runs = {seed: run.folder for seed, run in trained.runs[(arm.label, "")].items()}
    curves = {seed: worst_site_curve(run) for seed, run in runs.items()}
    curve = mean_curve(list(curves.values()))
    return {
        "algorithm": arm.algorithm,
        "params": dict(arm.params),
        "start": "pretrained" if arm.pretrained else "random",
        "init": init,
        "runs": {str(seed): str(run) for seed, run in runs.items()},
        "seed_curves": {str(seed): c for seed, c in curves.items()},
        "curve": curve,
        "final_worst_site_val_auc": curve[-1]["worst_site_val_auc"] if curve else None,
        "rounds_to_threshold": rounds_to(curve, threshold),
        "test": auc_intervals(trained.scans((arm.label, "")), n_boot, TARGET_SEED),
        "early_test": auc_intervals(trained.scans((arm.label, EARLY)), n_boot, TARGET_SEED),
    }


# ---------------------------------------------------------------------------- running
def target_seeds(budget: TransferBudget) -> list[int]:
    """The seeds of the federations B (data and training), from TARGET_SEED on."""
    return seed_range(TARGET_SEED, budget.seeds)


def run_transfer(
    out: Path,
    *,
    quick: bool = False,
    echo: Callable[[str], Any] = print,
    readme: Path | None = None,
    n_boot: int | None = None,
    budget: TransferBudget | None = None,
    threshold: float = THRESHOLD,
    command: str = "medfed transfer",
) -> dict[str, Any]:
    """Train the base on federation A and the four runs on federation B, then write
    OUT/transfer.json, OUT/transfer.md and OUT/transfer.png (and, with ``readme``, the plot
    under ``readme.parent / transfer`` and the README's ``transfer`` section)."""
    from medfed.experiments.speed import device_info

    budget = budget or (QUICK if quick else FULL)
    n_boot = resamples(n_boot, quick)
    if not 0.0 < threshold <= 1.0:
        raise ConfigError(f"the AUC threshold must be in (0, 1], got {threshold}")
    start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    weights, skipped = imagenet_weights()
    echo(f"ImageNet start: {weights}" if skipped is None else f"ImageNet start skipped: {skipped}")
    pairs_run = chosen_pairs(skipped is None)
    arms = arms_of(pairs_run)
    base = _train_base(out, budget, echo)
    trained = _train_targets(out, budget, base.folder, echo, arms)
    runs: dict[str, dict[str, Any]] = {}
    for arm in arms:
        init = arm_init(arm, base.folder)
        runs[arm.label] = found = _arm_figures(arm, trained, init, n_boot, threshold)
        echo(
            f"  {arm.label}: worst-site test AUC "
            f"{ci_cell(found['test']['worst_site_auc'])}, first round with worst-site "
            f"validation AUC >= {threshold}: {found['rounds_to_threshold'] or 'not reached'}"
        )
    pairs = {pair.name: _pair(pair, trained, runs, n_boot, echo) for pair in pairs_run}
    last = trained.runs[(arms[-1].label, "")][target_seeds(budget)[-1]]
    results: dict[str, Any] = {
        "command": command + (" --quick" if quick else ""),
        "quick": quick,
        "budget": asdict(budget),
        "backbone": BACKBONE,
        "threshold": threshold,
        "n_boot": n_boot,
        "base": {
            "run": str(base.folder),
            "algorithm": "fedavg",
            "federation_seed": SOURCE_SEED,
            "rounds": budget.base_rounds,
            "worst_site_test_auc": base.summary.federation.worst_site_auc,
        },
        "target_seeds": target_seeds(budget),
        "device": {"run": last.summary.device, **device_info()},
        "runs": runs,
        "pairs": pairs,
        "imagenet": {"weights": str(weights), "skipped": skipped},
    }
    DOCS.publish_plot(
        out,
        results,
        transfer_markdown,
        transfer_plot,
        start=start,
        verdicts=[line for p in pairs.values() for line in _verdicts(results, p)],
        echo=echo,
        readme=readme,
        readme_style={"heading_level": 3},
    )
    return results


def at_size(sites: list[Any], size: int | None, cache: Path) -> list[Any]:
    """The same sites' photos preprocessed at ``size`` px (the sites themselves for None)."""
    if size is None:
        return sites
    import dataclasses

    from medfed.data.cache import TensorCache
    from medfed.data.sitedata import load_site

    tensors = TensorCache(cache)
    return [
        load_site(
            dataclasses.replace(
                s.manifest, preprocess=dataclasses.replace(s.manifest.preprocess, image_size=size)
            ),
            tensors,
        )
        for s in sites
    ]


def _train_base(out: Path, budget: TransferBudget, echo: Callable[[str], Any]) -> Trained:
    """FedAvg on federation A: the start of every pretrained arm."""
    source = fundus_sites(out, "source", budget, SOURCE_SEED, echo, "source")
    folder = (out / "runs" / "base").resolve()
    echo(f"training the base: fedavg on federation A, {budget.base_rounds} rounds, into {folder}")
    config = budget_config(budget, "fedavg", budget.base_rounds, SOURCE_SEED, BACKBONE)
    return train_run(source, config, folder)


def _train_targets(
    out: Path,
    budget: TransferBudget,
    base: Path,
    echo: Callable[[str], Any],
    chosen: tuple[Arm, ...] = ARMS,
) -> SeedRuns[list[Any], tuple[str, str]]:
    """Every arm on every federation B, at the short and at the full budget."""
    arms = {arm.label: arm for arm in chosen}
    stages = {EARLY: budget.early_rounds, "": budget.rounds}

    def train_one(target: list[Any], seed: int, run: tuple[str, str]) -> Trained:
        arm, rounds = arms[run[0]], stages[run[1]]
        init = arm_init(arm, base)
        extra = {"init": init} if init else {}
        folder = out / "runs" / f"seed{seed}" / f"{arm.dirname}{run[1]}"
        echo(f"training {arm.label} on federation B seed {seed}, {rounds} rounds")
        config = budget_config(
            budget,
            arm.algorithm,
            rounds,
            seed,
            arm.backbone,
            params=dict(arm.params),
            normalization=arm.normalization,
            **extra,
        )
        return train_run(at_size(target, arm.image_size, out / "cache"), config, folder)

    return train_seeds(
        target_seeds(budget),
        lambda seed: fundus_sites(
            out, f"target_seed{seed}", budget, seed, echo, f"target_seed{seed}"
        ),
        [(label, stage) for label in arms for stage in stages],
        train_one,
    )


def _pair(
    pair: Pair,
    trained: SeedRuns[list[Any], tuple[str, str]],
    runs: Mapping[str, Any],
    n_boot: int,
    echo: Callable[[str], Any],
) -> dict[str, Any]:
    """Pretrained minus random on the same test scans, after the full and the short budget."""
    a, b = pair.pretrained.label, pair.random.label
    echo(f"comparing {a} with {b} on the same test scans ({n_boot} resamples)")
    found = {
        stage: auc_comparisons(
            {a: trained.scans((a, suffix)), b: trained.scans((b, suffix))}, a, n_boot, TARGET_SEED
        )
        for stage, suffix in (("comparisons", ""), ("early_comparisons", EARLY))
    }
    return {
        "pretrained": a,
        "random": b,
        "curves": {label: runs[label]["curve"] for label in (a, b)},
        **found,
    }


# ---------------------------------------------------------------------------- the plot
def transfer_plot(results: Mapping[str, Any], path: Path) -> Path:
    """One panel per method: the worst-site validation AUC per round from the pretrained base
    and from random weights, with the threshold line."""
    from medfed.experiments.plots import pyplot, save_figure

    plt = pyplot()
    budget = results["budget"]
    pairs = results["pairs"]
    fig, axes = plt.subplots(1, len(pairs), figsize=(6.2 * len(pairs), 4.2), squeeze=False)
    for axis, (name, pair) in zip(axes[0], pairs.items(), strict=True):
        for key, style in (("pretrained", "-"), ("random", "--")):
            label = pair[key]
            curve = pair["curves"][label]
            xs = [p["round"] for p in curve]
            values = [p["worst_site_val_auc"] for p in curve]
            ys = [float("nan") if v is None else v for v in values]
            axis.plot(xs, ys, style, marker="o", markersize=3, label=label)
        axis.axhline(
            results["threshold"],
            color="grey",
            linewidth=0.8,
            linestyle=":",
            label=f"threshold {results['threshold']}",
        )
        axis.set_title(
            f"{name} on federation B ({_seeds(results)}; mean curve), "
            f"{budget['rounds']} rounds x {budget['local_steps']} steps\n"
            f"pretrained: FedAvg base, federation A (seed {results['base']['federation_seed']}), "
            f"{budget['base_rounds']} rounds",
            fontsize=10,
        )
        axis.set_xlabel("round")
        axis.set_ylabel("worst-site validation AUC")
        axis.set_ylim(0.0, 1.0)
        axis.grid(alpha=0.3)
        axis.legend(loc="lower right")
    return save_figure(fig, path)


# ---------------------------------------------------------------------------- markdown
def _round_cell(found: Mapping[str, Any], rounds: int) -> str:
    first = found["rounds_to_threshold"]
    return f"not reached in {rounds}" if first is None else str(first)


def _auc(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _seeds(results: Mapping[str, Any]) -> str:
    return seeds_text(results["target_seeds"])


def _where(results: Mapping[str, Any], rounds: int) -> str:
    return f"federation B ({_seeds(results)}), {rounds} rounds"


def _verdicts(results: Mapping[str, Any], pair: Mapping[str, Any]) -> list[str]:
    b = results["budget"]
    return verdict_lines(pair["comparisons"], _where(results, b["rounds"])) + verdict_lines(
        pair["early_comparisons"], _where(results, b["early_rounds"])
    )


def runs_table(results: Mapping[str, Any]) -> str:
    """One row per run on federation B: its start, the test AUCs with their 95% CIs, and its
    worst-site validation curve in brief."""
    threshold = results["threshold"]
    rounds = results["budget"]["rounds"]
    header = [
        "run",
        "start",
        "worst-site test AUC (95% CI)",
        "mean site test AUC (95% CI)",
        "worst-site val AUC, last round",
        "best worst-site val AUC",
        f"first round with worst-site val AUC \u2265 {threshold}",
        f"worst-site test AUC after {results['budget']['early_rounds']} rounds (95% CI)",
    ]
    rows = []
    for pair in results["pairs"].values():
        for key in ("pretrained", "random"):
            label = pair[key]
            found = results["runs"][label]
            values = [p["worst_site_val_auc"] for p in found["curve"]]
            defined = [v for v in values if v is not None]
            start = _start_text(found)
            if found["params"]:
                start += " + " + ", ".join(f"{k}={v}" for k, v in found["params"].items())
            rows.append(
                [
                    label,
                    start,
                    ci_cell(found["test"]["worst_site_auc"]),
                    ci_cell(found["test"]["mean_site_auc"]),
                    _auc(found["final_worst_site_val_auc"]),
                    _auc(max(defined) if defined else None),
                    _round_cell(found, rounds),
                    ci_cell(found["early_test"]["worst_site_auc"]),
                ]
            )
    return markdown_table(header, rows)


def _start_text(found: Mapping[str, Any]) -> str:
    init = found["init"]
    if not init:
        return "random weights"
    return (
        f"ImageNet (--init {init})" if init.startswith("torchvision:") else "FedAvg base (--init)"
    )


def imagenet_text(results: Mapping[str, Any]) -> str:
    """A line on the ImageNet start: what it is, or why it was skipped."""
    found = results.get("imagenet") or {}
    if found.get("skipped"):
        return f"ImageNet start: skipped; {found['skipped']}."
    if not found:
        return ""
    return (
        f"ImageNet start: FedAvg on {IMAGENET_BACKBONE} at {IMAGENET_SIZE} px from "
        f"torchvision's ImageNet weights ({found['weights']}; every tensor loaded, ImageNet's "
        "normalization) against the same model from random weights, on the same federations B."
    )


def _rounds_sentence(results: Mapping[str, Any], pair: Mapping[str, Any]) -> str:
    rounds = results["budget"]["rounds"]
    parts = []
    for key in ("pretrained", "random"):
        first = results["runs"][pair[key]]["rounds_to_threshold"]
        when = f"round {first}" if first is not None else f"not within {rounds} rounds"
        parts.append(f"{pair[key]} {when}")
    return (
        f"Worst-site validation AUC \u2265 {results['threshold']} first reached: "
        + "; ".join(parts)
        + " (the seeds' mean validation curve, no interval)."
    )


def caption(results: Mapping[str, Any]) -> str:
    b = results["budget"]
    return (
        f"`{results['command']}` (federation A: seed {results['base']['federation_seed']}, "
        f"federation B: {_seeds(results)}; {b['n_per_site']} scans per site"
        f"{image_size_text(b)}; base {b['base_rounds']} rounds, each run {b['rounds']} rounds, "
        f"x {b['local_steps']} local steps; {run_text(results)})"
    )


def transfer_markdown(
    results: Mapping[str, Any], *, image_prefix: str = "", heading_level: int = 2
) -> str:
    """What was trained and measured, the table of runs with 95% CIs, the paired comparisons
    with their verdicts, the plot and the caption."""
    h = "#" * heading_level
    b = results["budget"]
    base = results["base"]
    parts = [
        f"A FedAvg base trained {b['base_rounds']} rounds on synthetic fundus federation A "
        f"(seed {base['federation_seed']}; its worst-site test AUC there "
        f"{_auc(base['worst_site_test_auc'])}) is the starting point (`--init`) of LoRA and FedDRM "
        f"on federations B ({_seeds(results)}, each seed its own data and training: other "
        "patients and scans from the same generator); each also trains on B from seeded "
        f"random weights. Every run: {b['rounds']} rounds x {b['local_steps']} local steps "
        f"(and separately {b['early_rounds']}), backbone {results['backbone']}. LoRA from the base "
        "keeps it frozen and trains its adapters; LoRA refuses a frozen random base, so from "
        "random weights it trains the base too (base=federated).",
        "Measured on B: each round, the worst-site validation AUC (the lowest over the sites "
        "of each site's model on its validation split); after the last round, the worst-site "
        f"and mean site AUC on the test scans ({ORIGIN_KNOWN}: each site's model on its own "
        f"test scans) with 95% CIs (percentile bootstrap, {results['n_boot']} resamples of "
        "patients within each seed and site, each seed's figure averaged over the seeds), and "
        "pretrained minus random on the same test scans; "
        f"the same for separate runs of {b['early_rounds']} rounds (does the pretrained start "
        "get there in fewer rounds?). "
        "Whether the pretrained start helps is read from those paired intervals' verdicts "
        "only; the round at which a curve (the mean over the seeds) crosses the threshold "
        "carries no interval.",
        runs_table(results),
        imagenet_text(results),
    ]
    for name, pair in results["pairs"].items():
        parts.append(
            f"{h} {name}: {pair['pretrained']} \u2212 {pair['random']}, paired on the same "
            "test scans"
        )
        parts.append(_rounds_sentence(results, pair))
        parts.append(f"After {b['rounds']} rounds:")
        parts.append(comparisons_markdown(pair["comparisons"], _where(results, b["rounds"])))
        parts.append(f"After {b['early_rounds']} rounds (separate runs of that budget):")
        early = _where(results, b["early_rounds"])
        parts.append(comparisons_markdown(pair["early_comparisons"], early))
    parts.append(f"![worst-site validation AUC per round]({image_prefix}{results['plot']})")
    parts.append(caption(results))
    return "\n\n".join(p for p in parts if p)
