"""``medfed gpu-check``: the GPU path (bf16 autocast, channels-last, pinned uploads; fp16 with a
gradient scaler, as on a GPU without bf16), checked end to end, ready for the first machine
that has a GPU.

On a CUDA machine every algorithm trains a few rounds on small synthetic fundus and CT
federations on the GPU and, with the same seed, on the CPU in float32; each figure of the two
runs is compared within a stated tolerance (bf16 rounds differently, so the figures differ a
little, never by much). Then the images per second of every backbone (forward, backward and an
optimizer step on a training batch) and the peak GPU memory, and, unless left out, the bench's
quick table on the GPU. Without CUDA the same code runs on the CPU with bf16 autocast and
channels-last (``--device cpu-bf16``) where the CPU supports them, so the check itself is
tested on every machine. Everything lands in OUT/gpu_check.json and OUT/gpu_check.md.

It needs only what training needs: run it as ``python3 -m medfed gpu-check`` from the source
tree with any torch from 2.6 on.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from medfed.algorithms import ALGORITHMS
from medfed.config import TrainConfig
from medfed.core.errors import ConfigError
from medfed.core.fileio import fresh_folder
from medfed.data.modality import modality_spec
from medfed.data.records import Split
from medfed.data.sitedata import SiteData
from medfed.data.synth import synthesize
from medfed.federation.site import failure_reason
from medfed.federation.training import load_sites, train
from medfed.models.backbones import BACKBONES, spatial_dims
from medfed.models.device import DeviceSetup, cpu_bf16_supported, resolve_device
from medfed.models.fedmodel import ModelSpec, build_model
from medfed.reports.markdown import markdown_table, write_results
from medfed.runs import RunDir
from medfed.runs.schema import Summary

STEM = "gpu_check"
MODALITIES: tuple[str, ...] = ("fundus", "ct")
# What an algorithm needs besides its defaults to train from scratch here (LoRA: a base).
NEEDS: dict[str, dict[str, Any]] = {"lora": {"warmup_rounds": 1}}
# How far the accelerated run's figures may lie from the float32 CPU run's. bf16 keeps 8 bits of
# mantissa, so one forward pass differs by about 0.4% per operation; a few rounds of training
# compound that, and on a few dozen test scans one flipped ranking moves an AUC by 0.05 or more.
TOLERANCES: dict[str, tuple[str, float]] = {
    "first_round_loss": ("relative", 0.05),  # mean training loss of round 1 over the sites
    "last_val_loss": ("relative", 0.15),  # mean validation loss after the last round
    "worst_site_auc": ("absolute", 0.15),  # lowest test AUC over the sites
}
# The clinical-resolution path: a round's mean training loss (the first steps of one site,
# from the same weights and batches), relative difference. Wider than first_round_loss's: a
# 50-layer ResNet or EfficientNet-B0 rounds to bf16 at every one of its layers, and the short
# form's batch of 2 gives its BatchNorm statistics of two photos (EfficientNet-B0 there: 0.064).
CLINICAL_TOLERANCE = 0.10


@dataclass(frozen=True)
class CheckBudget:
    """Patients (scans) per site, rounds and local steps of every run, the native fundus image
    height (None: the generator's default), timed steps per backbone, and whether the bench's
    quick table runs too."""

    fundus_per_site: int = 48
    ct_per_site: int = 12
    rounds: int = 2
    local_steps: int = 2
    batch_size: int = 16
    image_size: int | None = 96
    throughput_steps: int = 8
    bench: bool = True
    # The backbones timed (None: every one of the modality); batch size of the timed steps.
    throughput_backbones: tuple[str, ...] | None = None
    throughput_batch: int = 32
    # The clinical-resolution path: one fundus site at this size, each backbone trained by the
    # site worker (a round of clinical_steps local steps) on the device and on the CPU.
    clinical_size: int = 224
    clinical_scans: int = 32
    clinical_steps: int = 4
    clinical_batch: int = 16
    clinical_backbones: tuple[str, ...] = ("tv-resnet50", "tv-efficientnet-b0")

    def __post_init__(self) -> None:
        for name in ("fundus_per_site", "ct_per_site", "rounds", "local_steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"gpu-check budget: {name} must be at least 1")
        if self.throughput_steps < 1:
            raise ConfigError("gpu-check budget: throughput_steps must be at least 1")


FULL = CheckBudget()
SHORT = CheckBudget(
    fundus_per_site=12,
    ct_per_site=8,
    rounds=2,
    local_steps=1,
    batch_size=8,
    image_size=48,
    throughput_steps=2,
    bench=False,
    throughput_backbones=("cnn-gn", "slices-cnn-gn"),
    throughput_batch=2,
    clinical_scans=12,
    clinical_steps=1,
    clinical_batch=2,
)


def accelerated_device() -> tuple[str, str | None]:
    """The device to check and, where it is not a GPU, why: cuda, else cpu-bf16, else cpu."""
    if torch.cuda.is_available():
        return "cuda", None
    if cpu_bf16_supported():
        return "cpu-bf16", "no CUDA device: the CPU runs the GPU path's bf16 autocast instead"
    return "cpu", "no CUDA device and no CPU bf16 autocast: both runs are float32 on the CPU"


def _require_two_devices(chosen: str, note: str | None) -> None:
    """Refuse a check of the float32 CPU against itself: every figure would agree, and the
    check would pass having compared nothing."""
    setup = resolve_device(chosen)
    if setup.device.type != "cpu" or setup.autocast_dtype is not None or setup.channels_last:
        return
    why = note or f"--device {chosen} is the float32 CPU"
    raise ConfigError(
        f"gpu-check compares a device with the CPU in float32, and {why}: the check would "
        "compare the CPU with itself and prove nothing. Run it where a CUDA device is (or "
        "give --device cuda / cpu-bf16)"
    )


# ---------------------------------------------------------------------------- figures
def run_figures(summary: Summary, run: Path) -> dict[str, float | None]:
    """The figures compared between the two devices, from one finished run."""
    records = RunDir(run).read_metrics()
    first = [r.train_loss for r in records if r.round == 1 and r.train_loss is not None]
    last_round = max((r.round for r in records), default=0)
    val = [
        r.validation.loss
        for r in records
        if r.round == last_round and r.validation is not None and r.validation.loss is not None
    ]
    return {
        "first_round_loss": statistics.fmean(first) if first else None,
        "last_val_loss": statistics.fmean(val) if val else None,
        "worst_site_auc": summary.federation.worst_site_auc,
    }


def compare_figures(
    got: dict[str, float | None], reference: dict[str, float | None]
) -> dict[str, Any]:
    """Each figure's difference from the reference, and whether it lies within tolerance; a
    figure either run lacks (a one-class split) is reported, not judged."""
    out = {}
    for name, (kind, limit) in TOLERANCES.items():
        a, b = got.get(name), reference.get(name)
        if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
            out[name] = {"value": a, "reference": b, "difference": None, "within": None}
            continue
        diff = abs(a - b) if kind == "absolute" else abs(a - b) / max(abs(b), 1e-12)
        out[name] = {"value": a, "reference": b, "difference": diff, "within": diff <= limit}
    return out


# ---------------------------------------------------------------------------- training runs
def _peak_reset(setup: DeviceSetup) -> None:
    if setup.is_cuda:
        torch.cuda.synchronize(setup.device)
        torch.cuda.reset_peak_memory_stats(setup.device)


def _peak_bytes(setup: DeviceSetup) -> int | None:
    if not setup.is_cuda:
        return None
    torch.cuda.synchronize(setup.device)
    return int(torch.cuda.max_memory_allocated(setup.device))


def _train_once(
    sites: list[SiteData], config: TrainConfig, run: Path, setup: DeviceSetup
) -> dict[str, Any]:
    fresh_folder(run)
    _peak_reset(setup)
    start = time.perf_counter()
    try:
        summary = train(sites, config, run)
    except Exception as exc:  # the check reports every failure and goes on
        return {"ok": False, "error": failure_reason(exc), "seconds": time.perf_counter() - start}
    return {
        "ok": True,
        "seconds": time.perf_counter() - start,
        "seconds_per_round": summary.seconds_per_round,
        "peak_gpu_bytes": _peak_bytes(setup),
        "backbone": summary.backbone,
        "device": summary.device,
        "figures": run_figures(summary, run),
    }


def check_config(algorithm: str, budget: CheckBudget, device: str, **more: Any) -> TrainConfig:
    """The settings of one of the check's runs: the budget's, seed 0, the modality's rate (the
    run's plan sets it)."""
    return TrainConfig(
        algorithm=algorithm,
        params=dict(NEEDS.get(algorithm, {})),
        rounds=budget.rounds,
        local_steps=budget.local_steps,
        batch_size=budget.batch_size,
        seed=0,
        device=device,
        **more,
    )


def check_algorithms(
    sites: list[SiteData],
    modality: str,
    algorithms: Sequence[str],
    budget: CheckBudget,
    device: str,
    work: Path,
    echo: Callable[[str], Any],
) -> dict[str, Any]:
    """Every algorithm on ``device`` and on the CPU in float32, same seed; figures compared."""
    setup = resolve_device(device)
    rows = {}
    for name in algorithms:
        config = check_config(name, budget, device)
        echo(f"[{modality}] {name}: {budget.rounds} rounds on {device}, then on cpu (float32)")
        got = _train_once(sites, config, work / modality / f"{name}_{device}", setup)
        reference = _train_once(
            sites,
            dataclasses.replace(config, device="cpu"),
            work / modality / f"{name}_cpu",
            resolve_device("cpu"),
        )
        row: dict[str, Any] = {device: got, "cpu": reference}
        if got["ok"] and reference["ok"]:
            row["comparison"] = compare_figures(got["figures"], reference["figures"])
        rows[name] = row
    return rows


def check_sites_at_once(
    sites: list[SiteData],
    modality: str,
    budget: CheckBudget,
    device: str,
    work: Path,
    echo: Callable[[str], Any],
) -> dict[str, Any]:
    """FedAvg on ``device`` one site at a time and every site at once (CUDA: a stream per
    site; CPU: the cores divided), same seed: the figures compared, the round times side by
    side."""
    setup = resolve_device(device)
    config = check_config("fedavg", budget, device, concurrency=1)
    echo(f"[{modality}] fedavg on {device}: one site at a time, then every site at once")
    one = _train_once(sites, config, work / modality / "fedavg_one_by_one", setup)
    at_once = dataclasses.replace(config, concurrency=len(sites))
    both = _train_once(sites, at_once, work / modality / "fedavg_at_once", setup)
    found: dict[str, Any] = {"one_by_one": one, "at_once": both}
    if one["ok"] and both["ok"]:
        found["comparison"] = compare_figures(both["figures"], one["figures"])
    return found


# ---------------------------------------------------------------------------- fp16
def fp16_device(device: str) -> tuple[str | None, str | None]:
    """Where the fp16 + gradient-scaler path runs: the CUDA device, else the CPU where its
    autocast runs float16 (this torch's does from 2.x); None and why where neither can."""
    if resolve_device(device).is_cuda:
        return device, None
    try:
        with torch.autocast("cpu", dtype=torch.float16):
            out = torch.nn.functional.conv2d(torch.ones(1, 1, 4, 4), torch.ones(1, 1, 3, 3))
    except (RuntimeError, TypeError) as exc:
        return None, f"no CUDA device and no CPU fp16 autocast here ({exc})"
    if out.dtype != torch.float16:
        return None, "no CUDA device, and CPU autocast here leaves float16 convolutions out"
    return "cpu", "no CUDA device: fp16 autocast and the gradient scaler run on the CPU"


def check_fp16(
    sites: list[SiteData],
    modality: str,
    budget: CheckBudget,
    device: str,
    reference: dict[str, Any] | None,
    work: Path,
    echo: Callable[[str], Any],
) -> dict[str, Any]:
    """FedAvg in fp16 with a gradient scaler (what a GPU without bf16 trains in), against the
    float32 CPU run of the same seed (``reference``, trained here where not given): the
    figures compared, and each site's loss scale after the last round (a scale below the
    scaler's starting 65536 means steps were skipped for overflowing gradients)."""
    where, note = fp16_device(device)
    if where is None:
        return {"ran": False, "note": note}
    config = check_config("fedavg", budget, where, precision="fp16")
    echo(f"[{modality}] fedavg in fp16 with a gradient scaler on {where}")
    got = _train_once(sites, config, work / modality / "fedavg_fp16", resolve_device(where))
    if reference is None:
        cpu = dataclasses.replace(config, device="cpu", precision="fp32")
        reference = _train_once(sites, cpu, work / modality / "fedavg_fp32", resolve_device("cpu"))
    found: dict[str, Any] = {"ran": True, "note": note, "device": where, "fp16": got}
    found["cpu"] = reference
    if got["ok"]:
        records = RunDir(work / modality / "fedavg_fp16").read_metrics()
        last = max(r.round for r in records)
        found["loss_scale"] = {
            r.site: r.extra.get("train_loss_scale") for r in records if r.round == last
        }
        found["precision"] = got["device"]
    if got["ok"] and reference["ok"]:
        found["comparison"] = compare_figures(got["figures"], reference["figures"])
    return found


def _fp16_passed(found: dict[str, Any]) -> bool:
    if not found["ran"]:
        return True  # reported, not judged: the device cannot run fp16
    if not (found["fp16"]["ok"] and found["cpu"]["ok"]):
        return False
    scales = found["loss_scale"].values()
    if not scales or any(s is None or not s > 0 for s in scales):
        return False  # the scaler did not run, or its scale collapsed
    return all(c["within"] is not False for c in found["comparison"].values())


def _fp16_markdown(found: dict[str, Any], modality: str) -> str:
    if not found["ran"]:
        return f"{modality}, fp16 with a gradient scaler: not run ({found['note']})."
    failed = [f"failed: {r['error']}" for r in (found["fp16"], found["cpu"]) if not r["ok"]]
    if failed:
        return f"{modality}, fp16 with a gradient scaler: " + "; ".join(failed)
    c = found["comparison"]
    scales = ", ".join(f"{k} {v:g}" for k, v in found["loss_scale"].items())
    table = markdown_table(
        ["device", "loss scale after the last round", *(f"{k} (fp16 vs fp32)" for k in c)],
        [[found["device"], scales, *(_comparison_cell(c[k]) for k in c)]],
    )
    note = f" {found['note']}." if found["note"] else ""
    return f"{modality}, fedavg in fp16 with a gradient scaler against float32:{note}\n\n{table}"


# ---------------------------------------------------------------------------- throughput
def backbone_throughput(
    sites: list[SiteData], modality: str, budget: CheckBudget, setup: DeviceSetup
) -> dict[str, Any]:
    """Training images (volumes) per second of every backbone of the modality on ``setup``:
    forward, backward and an AdamW step on one batch of a site's training scans, after two
    warm-up steps; and the peak GPU memory of those steps."""
    site = sites[0]
    batch = budget.throughput_batch
    x = site.x[Split.TRAIN][:batch].float().to(setup.device)  # normalized
    y = site.y[Split.TRAIN][:batch].to(setup.device)
    dims = modality_spec(modality).spatial_dims
    classes = len(site.manifest.class_names())
    rows = {}
    chosen = budget.throughput_backbones or BACKBONES
    for name in (b for b in chosen if spatial_dims(b) == dims):
        spec = ModelSpec(name, int(x.shape[1]), classes, len(sites), client_branch=True)
        try:
            rate = _images_per_second(spec, x, y, setup, budget.throughput_steps)
        except Exception as exc:  # reported per backbone
            rows[name] = {"ok": False, "error": failure_reason(exc)}
            continue
        rows[name] = {
            "ok": True,
            "images_per_second": rate,
            "batch": int(x.shape[0]),
            "input_shape": [int(d) for d in x.shape[1:]],
            "peak_gpu_bytes": _peak_bytes(setup),
        }
    return rows


def _images_per_second(
    spec: ModelSpec, x: torch.Tensor, y: torch.Tensor, setup: DeviceSetup, steps: int
) -> float:
    torch.manual_seed(0)
    model = build_model(spec).to(setup.device)
    if setup.channels_last and x.dim() == 4:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    autocast = setup.autocast()

    def step() -> None:
        with autocast():
            loss = torch.nn.functional.cross_entropy(model(x).target_logits.float(), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for _ in range(2):  # warm-up: kernels chosen, memory allocated
        step()
    _peak_reset(setup)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if setup.is_cuda:
        torch.cuda.synchronize(setup.device)
    return steps * int(x.shape[0]) / (time.perf_counter() - start)


# ---------------------------------------------------------------------------- clinical resolution
def clinical_check(
    out: Path, budget: CheckBudget, device: str, echo: Callable[[str], Any]
) -> dict[str, Any]:
    """The clinical-resolution path: one synthetic fundus site at ``clinical_size`` px, each of
    ``clinical_backbones`` trained by medfed's site worker on ``device`` and on the CPU in
    float32 from the same weights and batches: the first round's loss compared, then a second
    round on the device timed (images per second) with its peak GPU memory."""
    from medfed.config import load_manifest
    from medfed.data.cache import TensorCache
    from medfed.data.sitedata import load_site
    from medfed.experiments.memory import write_fundus_site

    size = budget.clinical_size
    echo(f"[clinical] one fundus site of {budget.clinical_scans} photos at {size} px")
    manifest = write_fundus_site(out / "data" / "clinical", budget.clinical_scans, size)
    site = load_site(load_manifest(manifest), TensorCache(out / "cache"))
    rows = {}
    for name in budget.clinical_backbones:
        echo(f"[clinical] {name}: {budget.clinical_steps} steps on {device}, then on cpu (float32)")
        try:
            rows[name] = _clinical_backbone(site, name, budget, device)
        except Exception as exc:  # reported per backbone
            rows[name] = {"ok": False, "error": failure_reason(exc)}
    return {"image_size": size, "n_train": site.n(Split.TRAIN), "backbones": rows}


def _clinical_backbone(
    site: SiteData, backbone: str, budget: CheckBudget, device: str
) -> dict[str, Any]:
    from medfed.experiments.throughput import MedfedSide, ThroughputPlan

    steps, batch = budget.clinical_steps, budget.clinical_batch
    losses, rate, peak = {}, None, None
    for name in (device, "cpu"):
        setup = resolve_device(name)
        plan = ThroughputPlan(backbone=backbone, image_size=budget.clinical_size, device=name)
        config = dataclasses.replace(plan.config(), batch_size=batch, augment="none")
        side = MedfedSide(site, config, setup)
        losses[name] = side.train(steps)
        if name == device:  # the second round, timed: kernels chosen, memory allocated
            _peak_reset(setup)
            start = time.perf_counter()
            side.train(steps)
            if setup.is_cuda:
                torch.cuda.synchronize(setup.device)
            rate = steps * min(batch, site.n(Split.TRAIN)) / (time.perf_counter() - start)
            peak = _peak_bytes(setup)
    diff = abs(losses[device] - losses["cpu"]) / max(abs(losses["cpu"]), 1e-12)
    return {
        "ok": True,
        "images_per_second": rate,
        "batch": batch,
        "peak_gpu_bytes": peak,
        "loss": losses,
        "difference": diff,
        "within": diff <= CLINICAL_TOLERANCE,
    }


def _clinical_markdown(found: dict[str, Any], device: str) -> str:
    rows = []
    for name, r in found["backbones"].items():
        if not r["ok"]:
            rows.append([name, f"failed: {r['error']}", "", "", ""])
            continue
        mark = "ok" if r["within"] else "OUTSIDE"
        rows.append(
            [
                name,
                _num(r["images_per_second"], 1),
                _mib(r["peak_gpu_bytes"]),
                f"{r['loss'][device]:.4f} vs {r['loss']['cpu']:.4f}",
                f"{r['difference']:.4f} {mark}",
            ]
        )
    header = ["backbone", "images/s", "peak GPU MiB", f"round loss ({device} vs cpu)", "rel. diff"]
    return (
        f"Clinical resolution ({found['image_size']} px, one fundus site, {found['n_train']} "
        f"training photos), medfed's site worker on {device} against the CPU in float32 "
        f"(tolerance {CLINICAL_TOLERANCE:g}):\n\n{markdown_table(header, rows)}"
    )


# ---------------------------------------------------------------------------- the whole check
def run_gpu_check(
    out: Path,
    *,
    budget: CheckBudget = FULL,
    algorithms: Sequence[str] | None = None,
    modalities: Sequence[str] = MODALITIES,
    device: str | None = None,
    echo: Callable[[str], Any] = print,
) -> dict[str, Any]:
    """Run the check into ``out`` and write gpu_check.json and gpu_check.md; ``ok`` in the
    result says whether every run finished and every figure lay within its tolerance."""
    from medfed.experiments.speed import device_info

    chosen, note = (device, None) if device else accelerated_device()
    algorithms = list(algorithms or ALGORITHMS)
    unknown = sorted(set(algorithms) - set(ALGORITHMS))
    if unknown:
        raise ConfigError(f"gpu-check: unknown algorithm(s) {unknown}; known: {sorted(ALGORITHMS)}")
    unknown = sorted(set(modalities) - set(MODALITIES))
    if unknown or not modalities:
        raise ConfigError(f"gpu-check: modalities must be among {list(MODALITIES)}, got {unknown}")
    _require_two_devices(chosen, note)
    setup = resolve_device(chosen)
    start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "command": "medfed gpu-check",
        "device": chosen,
        "note": note,
        "machine": device_info(setup),
        "budget": asdict(budget),
        "tolerances": {k: {"kind": kind, "limit": v} for k, (kind, v) in TOLERANCES.items()},
        "modalities": {},
    }
    for modality in modalities:
        per_site = budget.fundus_per_site if modality == "fundus" else budget.ct_per_site
        echo(f"[{modality}] synthesizing {per_site} per site")
        manifests = synthesize(
            out / "data" / modality,
            modality=modality,
            n_per_site=per_site,
            seed=0,
            image_size=budget.image_size if modality == "fundus" else None,
        )
        sites = load_sites(list(manifests), out / "cache")
        runs = check_algorithms(sites, modality, algorithms, budget, chosen, out / "runs", echo)
        echo(f"[{modality}] images per second of every backbone on {chosen}")
        results["modalities"][modality] = {
            "algorithms": runs,
            "sites_at_once": check_sites_at_once(
                sites, modality, budget, chosen, out / "runs", echo
            ),
            "throughput": backbone_throughput(sites, modality, budget, setup),
        }
        if modality == "fundus":  # fp16 + gradient scaler: the path of a GPU without bf16
            fedavg = runs.get("fedavg", {}).get("cpu")
            results["modalities"][modality]["fp16"] = check_fp16(
                sites, modality, budget, chosen, fedavg, out / "runs", echo
            )
    if "fundus" in modalities and budget.clinical_backbones:
        results["clinical"] = clinical_check(out, budget, chosen, echo)
    if budget.bench:
        results["bench"] = _quick_bench(out / "bench", echo)
    results["ok"] = check_passed(results)
    results["seconds_total"] = time.perf_counter() - start
    written = write_results(out, STEM, results, gpu_check_markdown(results))
    verdict = "passed" if results["ok"] else "FAILED (see the table)"
    echo(f"gpu-check {verdict} in {results['seconds_total']:.0f} s; wrote {written}")
    return results


def _quick_bench(out: Path, echo: Callable[[str], Any]) -> dict[str, Any]:
    from medfed.experiments.bench import (
        BUDGETS,
        N_BOOT,
        SEEDS,
        SPEED_ROUNDS,
        BenchPlan,
        run_bench,
    )

    plan = BenchPlan(
        quick=True,
        seeds=SEEDS["quick"],
        budgets=dict(BUDGETS["quick"]),
        speed_rounds=SPEED_ROUNDS["quick"],
        n_boot=N_BOOT["quick"],
        command="medfed bench --quick (from medfed gpu-check)",
    )
    return run_bench(out, plan, echo=echo)


def check_passed(results: dict[str, Any]) -> bool:
    """Every run finished, every backbone stepped, every judged figure within tolerance."""
    for found in results["modalities"].values():
        for row in [*found["algorithms"].values(), found["sites_at_once"]]:
            runs = [v for k, v in row.items() if k != "comparison"]
            if not all(r["ok"] for r in runs):
                return False
            if any(c["within"] is False for c in row.get("comparison", {}).values()):
                return False
        if not all(r["ok"] for r in found["throughput"].values()):
            return False
        if "fp16" in found and not _fp16_passed(found["fp16"]):
            return False
    clinical = results.get("clinical", {}).get("backbones", {})
    return all(r["ok"] and r["within"] is not False for r in clinical.values())


# ---------------------------------------------------------------------------- markdown
def _num(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _comparison_cell(found: dict[str, Any]) -> str:
    if found["difference"] is None:
        return f"{_num(found['value'])} vs {_num(found['reference'])} (not judged)"
    mark = "ok" if found["within"] else "OUTSIDE"
    return f"{_num(found['value'])} vs {_num(found['reference'])}: {found['difference']:.3f} {mark}"


def _mib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / 2**20:.0f}"


def _sites_at_once_table(found: dict[str, Any]) -> str:
    one, both = found["one_by_one"], found["at_once"]
    failed = [f"failed: {r['error']}" for r in (one, both) if not r["ok"]]
    if failed:
        return "; ".join(failed)
    c = found["comparison"]
    return markdown_table(
        ["s/round one at a time", "s/round every site at once", *TOLERANCES],
        [
            [
                _num(one["seconds_per_round"], 2),
                _num(both["seconds_per_round"], 2),
                *(_comparison_cell(c[k]) for k in TOLERANCES),
            ]
        ],
    )


def gpu_check_markdown(results: dict[str, Any]) -> str:
    device = results["device"]
    m = results["machine"]
    where = m.get("gpu") or m.get("cpu") or ""
    tol = ", ".join(
        f"{name} {t['kind']} {t['limit']:g}" for name, t in results["tolerances"].items()
    )
    parts = [
        f"`medfed gpu-check` on {device} ({where}; torch {m['torch']}, Python {m['python']}): "
        f"{'passed' if results['ok'] else 'FAILED'}.",
    ]
    if results["note"]:
        parts.append(results["note"] + ".")
    b = results["budget"]
    parts.append(
        f"Each algorithm: {b['rounds']} rounds x {b['local_steps']} local steps, batch "
        f"{b['batch_size']}, seed 0, on {device} and on the CPU in float32; tolerances: {tol}."
    )
    for modality, found in results["modalities"].items():
        rows = []
        for name, row in found["algorithms"].items():
            got, ref = row[device], row["cpu"]
            if not (got["ok"] and ref["ok"]):
                failed = got if not got["ok"] else ref
                which = device if not got["ok"] else "cpu"
                rows.append([name, f"failed on {which}: {failed['error']}", "", "", "", "", ""])
                continue
            c = row["comparison"]
            rows.append(
                [
                    name,
                    got["backbone"],
                    _num(got["seconds_per_round"], 2),
                    _num(ref["seconds_per_round"], 2),
                    _mib(got["peak_gpu_bytes"]),
                    *(_comparison_cell(c[k]) for k in TOLERANCES),
                ]
            )
        header = [
            "algorithm",
            "backbone",
            f"s/round {device}",
            "s/round cpu",
            "peak GPU MiB",
            *(f"{k} ({device} vs cpu)" for k in TOLERANCES),
        ]
        parts.append(f"{modality}, every algorithm:")
        parts.append(markdown_table(header, rows))
        parts.append(f"{modality}, fedavg on {device}, every site at once against one at a time:")
        parts.append(_sites_at_once_table(found["sites_at_once"]))
        speed_rows = [
            [
                name,
                "x".join(map(str, r["input_shape"])) if r["ok"] else "",
                _num(r.get("images_per_second"), 1) if r["ok"] else f"failed: {r['error']}",
                _mib(r.get("peak_gpu_bytes")) if r["ok"] else "",
            ]
            for name, r in found["throughput"].items()
        ]
        if "fp16" in found:
            parts.append(_fp16_markdown(found["fp16"], modality))
        parts.append(f"{modality}, training throughput on {device}:")
        parts.append(markdown_table(["backbone", "input", "images/s", "peak GPU MiB"], speed_rows))
    if results.get("clinical"):
        parts.append(_clinical_markdown(results["clinical"], device))
    bench = results.get("bench")
    if bench:
        from medfed.experiments.bench import methods_markdown

        for modality, fed in bench["federations"].items():
            parts.append(f"The bench's quick table on {device}, {modality}:")
            parts.append(methods_markdown(fed))
    parts.append(f"{results['seconds_total']:.0f} s in all.")
    return "\n\n".join(parts)
