"""Speed figures for ``medfed bench``, each measured side by side with its reference in one run.

- engine overhead: the in-process engine's seconds per round against a plain PyTorch FedAvg loop
  doing the same local steps on the same tensors (same model, batch size, optimizer, sites);
- data path: images per second of the cached pipeline against decoding every epoch;
- routing: per-scan latency of each trained federation's router (FedDRM's density ratio: one
  pass per site model, or one batched pass when only the target heads differ; majority vote:
  one pass per site);
- bytes per round of each method against FedAvg in float32;
- CT backbones: seconds per round, parameters and bytes per round of one algorithm on the 3-D
  and the 2.5-D backbones, on the same sites, budget and device.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from medfed.config import TrainConfig, load_manifests
from medfed.data.cache import TensorCache
from medfed.data.modality import modality_spec
from medfed.data.preprocess import NormalizedView
from medfed.data.records import Split
from medfed.data.sitedata import SiteData, load_site
from medfed.federation.lanes import Lanes
from medfed.federation.plan import SiteInfo, initial_model, plan_run
from medfed.federation.shared import cosine_lr, derive_seed
from medfed.federation.training import train
from medfed.metrics.latency import median_interval
from medfed.models.backbones import SLICE_BACKBONES
from medfed.models.device import DeviceSetup, resolve_device
from medfed.routing.bundle import TrainedFederation
from medfed.routing.evaluation import pooled_views
from medfed.routing.routers import Router, default_router, routers_for
from medfed.runs import RunDir

ENGINE_OVERHEAD_GOAL = 1.05
# Every site of the round at once, the cores divided between them, against the plain loop.
CONCURRENT_GOAL = 0.95
ENGINE_OVERHEAD_DEFINITION = (
    "median seconds of one round's training (every site's local steps, update encoding and "
    "checking, aggregation; per-round validation and checkpoints excluded) of the in-process "
    "engine running FedAvg, one site at a time or every site at once, divided by the same for "
    "a plain PyTorch loop one site at a time (load the global weights, a fresh AdamW, the same "
    "minibatches and flips, forward/backward/step, then a weighted average) on the same "
    "tensors, model, batch size, sites and local steps; best of the repeats, the three "
    "alternating"
)


def _sync(setup: DeviceSetup) -> None:
    if setup.is_cuda:
        torch.cuda.synchronize(setup.device)


# ---------------------------------------------------------------------------- engine overhead
def engine_round_seconds(sites: list[SiteData], config: TrainConfig, run_dir: Path) -> list[float]:
    """Per-round training seconds of the in-process engine (as its metrics.jsonl records them)."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    train(sites, config, run_dir)
    return recorded_round_seconds(run_dir)


def recorded_round_seconds(run_dir: Path) -> list[float]:
    """Each round's training seconds, as the run's metrics.jsonl records them."""
    by_round = {
        r["round"]: r["round_seconds"]
        for r in RunDir(run_dir).read_metrics()
        if r.get("round_seconds") is not None
    }
    return [by_round[k] for k in sorted(by_round)]


def plain_round_seconds(sites: list[SiteData], config: TrainConfig) -> list[float]:
    """Per-round seconds of a plain PyTorch FedAvg loop doing the engine's local steps."""
    setup = resolve_device(config.device)
    modality = sites[0].manifest.modality
    plan = plan_run(config, [SiteInfo.of(s) for s in sites])  # the engine's model and rate
    config = plan.config
    model = initial_model(plan.spec, plan.algorithm, config.seed, setup)  # its first weights
    data = [(setup.put(s.x[Split.TRAIN]), setup.put(s.y[Split.TRAIN])) for s in sites]
    total = sum(int(y.shape[0]) for _, y in data)
    weights = [int(y.shape[0]) / total for _, y in data]
    flip = config.augment == "flip" and modality_spec(modality).horizontal_flip
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    seconds = []
    for round_ in range(1, config.rounds + 1):
        _sync(setup)
        start = time.perf_counter()
        lr = cosine_lr(config.lr, round_, config.rounds)
        states = []
        for index, (x, y) in enumerate(data):
            model.load_state_dict(state)
            generator = torch.Generator().manual_seed(derive_seed(config.seed, round_, index))
            _plain_local_steps(model, x, y, lr, config, generator, flip, setup)
            states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        state = {k: sum(w * s[k] for w, s in zip(weights, states, strict=True)) for k in state}
        _sync(setup)
        seconds.append(time.perf_counter() - start)
    return seconds


def _plain_local_steps(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    lr: float,
    config: TrainConfig,
    generator: torch.Generator,
    flip: bool,
    setup: DeviceSetup,
) -> None:
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=config.weight_decay)
    n = x.shape[0]
    size = min(config.batch_size, n)
    order, pos = torch.randperm(n, generator=generator), 0
    for _ in range(config.local_steps):
        if pos + size > n:
            order, pos = torch.randperm(n, generator=generator), 0
        index = order[pos : pos + size].to(x.device)
        pos += size
        xb, yb = x[index], y[index]
        if flip:
            mirrored = (torch.rand(size, generator=generator) < 0.5).to(x.device)
            xb = torch.where(mirrored.view(-1, *([1] * (xb.dim() - 1))), xb.flip(-1), xb)
        with setup.autocast()():
            loss = F.cross_entropy(model(xb).target_logits.float(), yb)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def engine_overhead(
    sites: list[SiteData], config: TrainConfig, work_dir: Path, *, repeats: int = 2
) -> dict[str, Any]:
    """The engine one site at a time and every site at once against the plain loop, the three
    alternating ``repeats`` times; each side's best per-run median.

    The plain loop and the one-by-one engine use every thread PyTorch has; the concurrent
    engine trains every site of the round at once, the threads divided between them
    (:class:`~medfed.federation.lanes.Lanes`).
    """
    one_by_one = dataclasses.replace(config, concurrency=1)
    side_by_side = dataclasses.replace(config, concurrency=len(sites))
    lanes = Lanes.plan(side_by_side.concurrency, len(sites), resolve_device(config.device))
    engine_runs, concurrent_runs, plain_runs = [], [], []
    for rep in range(repeats):
        engine = engine_round_seconds(sites, one_by_one, work_dir / f"engine_{rep}")
        engine_runs.append(statistics.median(engine))
        both = engine_round_seconds(sites, side_by_side, work_dir / f"concurrent_{rep}")
        concurrent_runs.append(statistics.median(both))
        plain_runs.append(statistics.median(plain_round_seconds(sites, config)))
    engine_s, concurrent_s, plain_s = min(engine_runs), min(concurrent_runs), min(plain_runs)
    return {
        "definition": ENGINE_OVERHEAD_DEFINITION,
        "algorithm": config.algorithm,
        "sites": len(sites),
        "rounds": config.rounds,
        "local_steps": config.local_steps,
        "batch_size": config.batch_size,
        "optimizer": config.optimizer,
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "engine_seconds_per_round": engine_s,
        "plain_seconds_per_round": plain_s,
        "ratio": engine_s / plain_s,
        "goal": ENGINE_OVERHEAD_GOAL,
        "within_goal": engine_s / plain_s <= ENGINE_OVERHEAD_GOAL,
        "concurrent": {
            "lanes": lanes.describe(),
            "workers": lanes.workers,
            "threads_per_site": lanes.threads,
            "seconds_per_round": concurrent_s,
            "ratio": concurrent_s / plain_s,
            "goal": CONCURRENT_GOAL,
            "within_goal": concurrent_s / plain_s <= CONCURRENT_GOAL,
            "runs": concurrent_runs,
        },
        "engine_runs": engine_runs,
        "plain_runs": plain_runs,
    }


# ---------------------------------------------------------------------------- data path
def _best_seconds(action: Callable[[], Any], repeats: int) -> float:
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - start)
    return best


def data_path(manifests: list[Path], cache_dir: Path, *, repeats: int = 2) -> dict[str, Any]:
    """Images per second: decoding every epoch, the on-disk cache, and the in-memory tensors.

    Both loading paths are the full ``load_site`` (scan the layout, split, preprocess or read
    the cache, fit the normalization); the cache path hashes every file's bytes to find its
    entries. The in-memory figure is one epoch of minibatches read from the loaded training
    splits (indexed and normalized, as the engine reads them), which is what every epoch
    after loading costs the engine.
    """
    sites = load_manifests(manifests)
    loaded = [load_site(s, TensorCache(cache_dir)) for s in sites]  # fills the cache if cold
    n_images = sum(sum(d.n(split) for split in Split) for d in loaded)

    def decode_all() -> None:
        for site in sites:
            load_site(site, TensorCache(None))

    misses = []

    def cached_all() -> None:
        for site in sites:
            misses.append(load_site(site, TensorCache(cache_dir)).cache_misses)

    decode_s = _best_seconds(decode_all, repeats)
    cached_s = _best_seconds(cached_all, repeats)
    tensors = [d.x[Split.TRAIN] for d in loaded]
    n_train = sum(int(x.shape[0]) for x in tensors)
    memory_s = _best_seconds(lambda: _one_epoch(tensors), repeats)
    return {
        "modality": str(sites[0].modality),
        "n_images": n_images,
        "decode_images_per_s": n_images / decode_s,
        "cached_images_per_s": n_images / cached_s,
        "cache_misses": int(sum(misses)),
        "in_memory_images_per_s": n_train / memory_s,
        "cached_speedup": decode_s / cached_s,
        "repeats": repeats,
    }


def _one_epoch(tensors: list[NormalizedView], batch_size: int = 32) -> None:
    for x in tensors:
        order = torch.randperm(x.shape[0])
        for start in range(0, x.shape[0], batch_size):
            x[order[start : start + batch_size]].sum()


# ---------------------------------------------------------------------------- routing
def routing_latency(
    run_dirs: dict[str, Path], sites: list[SiteData], *, scans: int = 32
) -> dict[str, Any]:
    """Median milliseconds (with its 95% interval) to answer one scan with each run's default
    router; for a run that routes (FedDRM, LoRA), every router it offers, each beside the
    routing and system accuracy its run measured on the pooled test scans (origin unknown)."""
    views = pooled_views(sites, Split.TEST)
    n = min(scans, int(views[0].shape[0]))
    methods = {}
    for method, run in run_dirs.items():
        fed = TrainedFederation.load(run)
        default = default_router(fed)
        routers = {r.name: r for r in (routers_for(fed) if fed.routes else [default])}
        measured = {name: _timed(r, fed, views, n) for name, r in routers.items()}
        summary = RunDir(run).read_summary()
        for name, figures in measured.items():
            found = summary.routers.get(name)
            figures["forward_passes"] = routers[name].forward_passes(fed)
            for rate in ("routing_accuracy", "system_accuracy"):
                value = None if found is None else found.rates.get(rate)
                figures[rate] = None if value is None else value.to_dict()
        methods[method] = {
            "router": default.name,
            "forward_passes": default.forward_passes(fed),
            "ms_per_scan": measured[default.name]["ms_per_scan"],
            "routers": measured,
        }
    return {"m_sites": len(sites), "scans": n, "methods": methods, **_router_summary(methods)}


TIMED_ROUTES = 12  # at least this many timings per router: enough for the median's interval


def _timed(
    router: Router, fed: TrainedFederation, views: list[NormalizedView], n: int
) -> dict[str, Any]:
    """Milliseconds to route each of ``n`` scans alone (cycled to at least
    :data:`TIMED_ROUTES` timings), after two warm-up scans: the median and its
    distribution-free 95% interval."""
    times = []
    for k in range(-2, max(n, TIMED_ROUTES)):
        one = [v[k % n : k % n + 1] for v in views]
        start = time.perf_counter()
        router.route(fed, one)
        if k >= 0:
            times.append(1000 * (time.perf_counter() - start))
    found = median_interval(times)
    median, low, high = found if found else (statistics.median(times), None, None)
    return {"ms_per_scan": median, "ms_low": low, "ms_high": high}


def _router_summary(methods: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """FedDRM's density ratio against majority votes that need one pass per site model."""
    vote = [
        f["ms_per_scan"]
        for f in methods.values()
        if f["router"] == "majority_vote" and f["forward_passes"] > 1
    ]
    density = methods.get("feddrm", {}).get("ms_per_scan")
    vote_ms = statistics.median(vote) if vote else None
    return {
        "feddrm_density_ratio_ms_per_scan": density,
        "majority_vote_ms_per_scan": vote_ms,
        "majority_vote_over_density_ratio": vote_ms / density if density and vote_ms else None,
    }


# ---------------------------------------------------------------------------- CT backbones
BACKBONE_SPEED_DEFINITION = (
    "median seconds of one round's training (as the engine overhead counts it) over the timed "
    "rounds, after one warm-up round that is left out (first allocations and kernel choices); "
    "the same algorithm, budget, sites and device for every backbone"
)


def backbone_speed(
    sites: list[SiteData],
    config: TrainConfig,
    backbones: Sequence[str],
    work_dir: Path,
    *,
    rounds: int = 3,
) -> dict[str, Any]:
    """Seconds per round, parameters and bytes per round of ``config`` on each backbone.

    Each backbone trains one warm-up round and ``rounds`` timed rounds of ``config`` (its
    algorithm, local steps, batch size and device) into ``work_dir/<backbone>``.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    rows: dict[str, Any] = {}
    device = None
    for name in dict.fromkeys(backbones):  # each once, in the order given
        run_dir = work_dir / name
        if run_dir.exists():
            shutil.rmtree(run_dir)
        summary = train(
            sites, dataclasses.replace(config, backbone=name, rounds=rounds + 1), run_dir
        )
        timed = recorded_round_seconds(run_dir)[1:]
        device = summary.device
        rows[name] = {
            "path": "2.5-D" if name in SLICE_BACKBONES else "3-D",
            **_model_size(run_dir),
            "bytes_per_round": summary.bytes_per_round,
            "seconds_per_round": statistics.median(timed) if timed else None,
            "round_seconds": timed,
        }
    return {
        "definition": BACKBONE_SPEED_DEFINITION,
        "algorithm": config.algorithm,
        "sites": len(sites),
        "scans_per_site": [s.n(Split.TRAIN) for s in sites],
        "input_shape": [int(d) for d in sites[0].x[Split.TRAIN].shape[1:]],
        "local_steps": config.local_steps,
        "batch_size": config.batch_size,
        "warmup_rounds": 1,
        "rounds": rounds,
        "device": device,
        "backbones": rows,
    }


def _model_size(run_dir: Path) -> dict[str, Any]:
    """Parameters of a run's final model (all of it, and its backbone) and its norm layers."""
    model = TrainedFederation.load(run_dir, "cpu").models[0]
    norms = {type(m).__name__ for m in model.backbone.modules() if _is_norm(m)}
    return {
        "norm": ", ".join(sorted(norms)) or "none",
        "parameters": sum(p.numel() for p in model.parameters()),
        "backbone_parameters": sum(p.numel() for p in model.backbone.parameters()),
    }


def _is_norm(module: torch.nn.Module) -> bool:
    batch_norm = torch.nn.modules.batchnorm._BatchNorm
    return isinstance(module, batch_norm | torch.nn.GroupNorm | torch.nn.LayerNorm)


# ---------------------------------------------------------------------------- bytes
def bytes_ratios(bytes_per_round: dict[str, float], baseline: str = "fedavg") -> dict[str, Any]:
    """Each method's bytes per round and its share of the baseline's (FedAvg, float32)."""
    base = bytes_per_round.get(baseline)
    return {
        "baseline": baseline,
        "baseline_bytes_per_round": base,
        "methods": {
            name: {
                "bytes_per_round": value,
                "ratio_to_baseline": value / base if base else None,
            }
            for name, value in bytes_per_round.items()
        },
    }


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages: how busy the machine was (None where unknown)."""
    import os

    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def device_info(setup: DeviceSetup | None = None) -> dict[str, Any]:
    """The machine the figures were measured on (CPU model, GPU name), for results.json."""
    import platform

    setup = setup or resolve_device("auto")
    return {
        "device": setup.describe(),
        "kind": setup.device.type,
        "cpu": _cpu_model(),
        "cpu_count": _cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(setup.device) if setup.is_cuda else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
    }


def _cpu_model() -> str:
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_count() -> int:
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
