"""Local training throughput: medfed's site worker against a plain torchvision loop.

``medfed bench-throughput`` measures, side by side in one run, on the same model architecture,
resolution, batch size, optimizer and scans:

- **warm**: both read the site's cached tensors (medfed: its :class:`SiteWorker` running a whole
  FedAvg round, payload decoding and update encoding included; the plain loop: random batches
  of the same stored tensor, normalized as it reads them, into ``torchvision.models``' own
  network); the two alternate, each repeat's images per second kept, the median reported;
- **cold**: nothing cached (medfed: load the site into an empty cache, which decodes every photo
  once, then train one epoch; the plain loop: a ``DataLoader`` whose workers decode and resize
  every photo as the epoch reads it), with where the time goes.
"""

from __future__ import annotations

import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from medfed.config import TrainConfig, load_manifest
from medfed.core.errors import ConfigError
from medfed.data.cache import TensorCache
from medfed.data.records import Split
from medfed.data.sitedata import SiteData, load_site
from medfed.experiments.memory import write_fundus_site
from medfed.experiments.speed import device_info, load_average
from medfed.experiments.throughput_features import (
    PhotoFiles,
    feature_figures,
    feature_row,
    feature_words,
)
from medfed.federation import wire
from medfed.federation.plan import SiteInfo, initial_model, plan_run
from medfed.federation.shared import clone_state
from medfed.federation.site import SiteWorker
from medfed.models.device import DeviceSetup, resolve_device
from medfed.models.torchvision_nets import TV_NETS
from medfed.reports.markdown import markdown_table

MARKER = "throughput"
WARM_GOAL = 0.95  # medfed's warm images/s at least this share of the plain loop's
LR, WEIGHT_DECAY = 1e-3, 5e-4  # AdamW on both sides


@dataclass(frozen=True)
class ThroughputPlan:
    """What both loops train, on how many scans, and how often they are measured."""

    backbone: str = "tv-resnet18"
    image_size: int = 224
    batch_size: int = 16
    steps: int = 6  # steps of each warm measurement
    scans: int = 80  # photos written for the site (its training split is about 60% of them)
    repeats: int = 5
    workers: int = 2  # the plain loop's DataLoader workers when cold
    device: str = "cpu"
    seed: int = 0
    # Also medfed's site worker with torch.compile (compile = true), timed in turn with the
    # eager one on the same model, resolution and batch; the compile time is reported apart.
    compiled: bool = False

    def __post_init__(self) -> None:
        if self.backbone not in TV_NETS:
            raise ConfigError(
                f"--backbone {self.backbone!r}: the plain loop needs a torchvision network; "
                f"choose one of {', '.join(sorted(TV_NETS))}"
            )
        if not 32 <= self.image_size <= 512:
            raise ConfigError(f"--image-size must be 32..512 pixels, got {self.image_size}")
        for name, value, low in (
            ("--batch-size", self.batch_size, 1),
            ("--steps", self.steps, 1),
            ("--scans", self.scans, 16),
            ("--repeats", self.repeats, 1),
            ("--workers", self.workers, 0),
        ):
            if value < low:
                raise ConfigError(f"{name} must be at least {low}, got {value}")

    def config(self) -> TrainConfig:
        return TrainConfig(
            algorithm="fedavg",
            backbone=self.backbone,
            rounds=1,
            local_steps=self.steps,
            batch_size=self.batch_size,
            optimizer="adam",
            lr=LR,
            weight_decay=WEIGHT_DECAY,
            device=self.device,
            seed=self.seed,
            augment="flip",
        )


def _sync(setup: DeviceSetup) -> None:
    if setup.is_cuda:
        torch.cuda.synchronize(setup.device)


# ---------------------------------------------------------------------------- medfed's side
class MedfedSide:
    """One site's worker, trained one FedAvg round at a time as the engine trains it."""

    def __init__(self, site: SiteData, config: TrainConfig, setup: DeviceSetup) -> None:
        plan = plan_run(config, [SiteInfo.of(site)])
        model = initial_model(plan.spec, plan.algorithm, config.seed, setup)
        self.worker = SiteWorker(
            data=site,
            index=0,
            n_sites=1,
            algorithm=plan.algorithm,
            config=plan.config,
            model=model,
            setup=setup,
            state=clone_state(model.state_dict()),
            extra=plan.algorithm.init_extra(model),
        )
        self.keys = plan.algorithm.round_keys(model, 1, 1)
        self.state = {k: v.cpu() for k, v in model.state_dict().items() if k in self.keys}
        self.payload = wire.encode(self.state, self.worker.wire)
        self.setup, self.round = setup, 0

    def train(self, steps: int) -> float:
        """One round of ``steps`` local steps; its mean training loss."""
        worker = self.worker
        worker.config = _with_steps(worker.config, steps)
        self.round += 1
        done = worker.train_round(self.round, LR, self.payload, self.keys, self.state)
        worker.keep(done)
        return done.result.loss


def _with_steps(config: TrainConfig, steps: int) -> TrainConfig:
    import dataclasses

    return config if config.local_steps == steps else dataclasses.replace(config, local_steps=steps)


# ---------------------------------------------------------------------------- the plain loop
class PlainSide:
    """``torchvision.models``' network trained by the loop its tutorials write."""

    def __init__(self, plan: ThroughputPlan, n_classes: int, setup: DeviceSetup) -> None:
        import torchvision

        torch.manual_seed(plan.seed)
        net = getattr(torchvision.models, TV_NETS[plan.backbone].constructor)(num_classes=n_classes)
        self.model = net.to(setup.device)
        if setup.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY
        )
        self.setup, self.batch = setup, plan.batch_size
        self.generator = torch.Generator().manual_seed(plan.seed)
        self._held: tuple[torch.Tensor, ...] | None = None

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.model.train()
        with self.setup.autocast()():
            loss = F.cross_entropy(self.model(x).float(), y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def train_cached(self, site: SiteData, steps: int) -> None:
        """``steps`` random batches of the site's stored training tensor, normalized here (the
        tensor moved to the device once, as the site worker moves it)."""
        if self._held is None:
            norm = site.normalization
            stored = self.setup.put(site.raw[Split.TRAIN])
            self._held = (
                stored,
                self.setup.put(site.y[Split.TRAIN]),
                torch.tensor(norm.mean, device=stored.device).view(1, -1, 1, 1),
                torch.tensor(norm.std, device=stored.device).view(1, -1, 1, 1),
            )
        stored, y, mean, std = self._held
        n = int(stored.shape[0])
        for _ in range(steps):
            index = torch.randperm(n, generator=self.generator)[: min(self.batch, n)]
            index = index.to(stored.device)
            xb = (stored[index].float() - mean) / std
            flip = torch.rand(xb.shape[0], generator=self.generator) < 0.5
            xb = torch.where(flip.view(-1, 1, 1, 1).to(xb.device), xb.flip(-1), xb)
            self.step(xb, y[index])

    def train_files(self, site: SiteData, image_size: int, workers: int) -> tuple[int, float]:
        """One epoch through a DataLoader that decodes every photo; (images, seconds waiting
        for batches)."""
        loader = _file_loader(site, image_size, self.batch, workers, self.setup.is_cuda)
        images, waiting, start = 0, 0.0, time.perf_counter()
        for xb, yb in loader:
            waiting += time.perf_counter() - start
            xb = xb.to(self.setup.device, non_blocking=True)
            yb = yb.to(self.setup.device, non_blocking=True)
            self.step(xb, yb)
            images += int(xb.shape[0])
            start = time.perf_counter()
        return images, waiting


def _file_loader(site: SiteData, size: int, batch: int, workers: int, pin: bool):
    from torch.utils.data import DataLoader

    norm = site.normalization
    dataset = PhotoFiles(
        [r.path for r in site.records[Split.TRAIN]],
        [int(v) for v in site.y[Split.TRAIN]],
        size,
        list(norm.mean),
        list(norm.std),
    )
    return DataLoader(
        dataset,
        batch_size=batch,
        shuffle=True,
        num_workers=workers,
        pin_memory=pin,
        generator=torch.Generator().manual_seed(0),
        drop_last=len(dataset) >= batch,  # whole batches, as medfed's epoch counts them
    )


# ---------------------------------------------------------------------------- measuring
def _timed(setup: DeviceSetup, action: Callable[[], Any]) -> float:
    _sync(setup)
    start = time.perf_counter()
    action()
    _sync(setup)
    return time.perf_counter() - start


def warm_figures(
    site: SiteData,
    plan: ThroughputPlan,
    setup: DeviceSetup,
    compiled: MedfedSide | None = None,
) -> dict[str, list[float]]:
    """Images per second of each side on the cached site (and of ``compiled``, medfed's worker
    compiled, where given), in turn, one warm-up each."""
    medfed = MedfedSide(site, plan.config(), setup)
    plain = PlainSide(plan, site.manifest.n_classes, setup)
    images = plan.steps * min(plan.batch_size, site.n(Split.TRAIN))
    medfed.train(1)  # first calls allocate, pick kernels, fault pages in: not measured
    plain.train_cached(site, 1)
    rates: dict[str, list[float]] = {"medfed": [], "plain": []}
    runs = {
        "medfed": lambda: medfed.train(plan.steps),
        "plain": lambda: plain.train_cached(site, plan.steps),
    }
    if compiled is not None:
        rates["medfed_compiled"] = []
        runs["medfed_compiled"] = lambda: compiled.train(plan.steps)
    for repeat in range(plan.repeats):
        # medfed first, then plain first: a machine getting busier or quieter favours neither
        order = list(runs) if repeat % 2 == 0 else list(reversed(runs))
        for side in order:
            rates[side].append(images / _timed(setup, runs[side]))
    return rates


def compiled_side(
    site: SiteData, plan: ThroughputPlan, setup: DeviceSetup
) -> tuple[MedfedSide, dict[str, Any]]:
    """medfed's site worker with ``compile = true``, after its first round (where compiling
    happens: timed apart, with whether it compiled or fell back to eager, and why)."""
    import dataclasses

    side = MedfedSide(site, dataclasses.replace(plan.config(), compile=True), setup)
    seconds = _timed(setup, lambda: side.train(1))
    note = side.worker.compile_note or ""
    return side, {"compiled": not note, "fallback": note, "first_round_s": seconds}


def cold_figures(
    manifest: Path, cache_dir: Path, plan: ThroughputPlan, setup: DeviceSetup
) -> dict[str, dict[str, float]]:
    """One epoch from nothing cached on each side, with where its time went."""
    start = time.perf_counter()
    site = load_site(load_manifest(manifest), TensorCache(cache_dir))
    decode = time.perf_counter() - start
    n_train = site.n(Split.TRAIN)
    epoch = max(1, n_train // min(plan.batch_size, n_train))
    start = time.perf_counter()
    medfed = MedfedSide(site, plan.config(), setup)
    build = time.perf_counter() - start
    train = _timed(setup, lambda: medfed.train(epoch))
    images = epoch * min(plan.batch_size, n_train)
    medfed_total = decode + build + train
    start = time.perf_counter()
    plain = PlainSide(plan, site.manifest.n_classes, setup)
    plain_build = time.perf_counter() - start
    _sync(setup)
    start = time.perf_counter()
    plain_images, waiting = plain.train_files(site, plan.image_size, plan.workers)
    _sync(setup)
    plain_epoch = time.perf_counter() - start
    plain_total = plain_build + plain_epoch
    return {
        "medfed": {
            "images": images,
            "images_per_s": images / medfed_total,
            "decode_s": decode,
            "model_s": build,
            "train_s": train,
            "total_s": medfed_total,
        },
        "plain": {
            "images": plain_images,
            "images_per_s": plain_images / plain_total,
            "decode_s": waiting,  # waiting on the DataLoader's workers for decoded batches
            "model_s": plain_build,
            "train_s": plain_epoch - waiting,
            "total_s": plain_total,
        },
    }


def run_throughput(
    out: Path, plan: ThroughputPlan, *, echo: Callable[[str], Any] = lambda _: None
) -> dict[str, Any]:
    """Write the site, measure both sides cold and warm, and return the results."""
    setup = resolve_device(plan.device)
    out.mkdir(parents=True, exist_ok=True)
    echo(f"writing {plan.scans} synthetic fundus photos of {plan.image_size} px")
    manifest = write_fundus_site(out / "data", plan.scans, plan.image_size, plan.seed)
    cache_dir = out / "cache"
    if cache_dir.exists():
        shutil.rmtree(cache_dir)
    import torchvision  # noqa: F401  both sides' (their networks, the plain loop's transforms)

    echo("cold: one epoch from an empty cache, then from the photos through a DataLoader")
    cold = cold_figures(manifest, cache_dir, plan, setup)
    echo("features: the frozen encoder's pass from an empty cache, then a plain forward loop")
    features = feature_figures(
        manifest, cache_dir, plan.image_size, plan.workers, setup, plan.repeats
    )
    site = load_site(load_manifest(manifest), TensorCache(cache_dir))
    compiled, compile_info = None, None
    if plan.compiled:
        echo("compiled: medfed's site worker with torch.compile, its first round (compiling)")
        compiled, compile_info = compiled_side(site, plan, setup)
    echo(f"warm: {plan.repeats} alternating repeats of {plan.steps} steps on each side")
    warm = warm_figures(site, plan, setup, compiled)
    medians = {side: statistics.median(v) for side, v in warm.items()}
    # each repeat's two sides ran back to back: their ratio is the least disturbed by the load
    # of a shared machine, which moves over minutes
    pairs = [a / b for a, b in zip(warm["medfed"], warm["plain"], strict=True)]
    ratio = statistics.median(pairs)
    if compile_info is not None:
        gains = [a / b for a, b in zip(warm["medfed_compiled"], warm["medfed"], strict=True)]
        compile_info |= {"ratios": gains, "ratio": statistics.median(gains)}
    return {
        "compile": compile_info,
        "plan": asdict(plan),
        "n_train": site.n(Split.TRAIN),
        "input_shape": list(site.raw[Split.TRAIN].shape[1:]),
        "device": device_info(setup),
        "load_average": load_average(),
        "warm": {
            "runs": warm,
            "median": medians,
            "ratios": pairs,
            "ratio": ratio,
            "goal": WARM_GOAL,
        },
        "within_goal": ratio >= WARM_GOAL,
        "cold": cold,
        "cold_ratio": cold["medfed"]["images_per_s"] / cold["plain"]["images_per_s"],
        "features": features,
    }


def markdown(results: dict[str, Any]) -> str:
    """The throughput table and the settings it was measured with."""
    plan, warm, cold = results["plan"], results["warm"], results["cold"]
    rows = [["path", "medfed (img/s)", "plain loop (img/s)", "medfed / plain"]]
    rows.append(
        [
            "warm (cached tensors)",
            f"{warm['median']['medfed']:.1f}",
            f"{warm['median']['plain']:.1f}",
            f"{warm['ratio']:.2f} (goal >= {warm['goal']:.2f})",
        ]
    )
    rows.append(
        [
            "cold (nothing cached, one epoch)",
            f"{cold['medfed']['images_per_s']:.1f}",
            f"{cold['plain']['images_per_s']:.1f}",
            f"{results['cold_ratio']:.2f}",
        ]
    )
    features = results.get("features")
    if features:
        rows.append(feature_row(features))
    split = [["cold epoch", "images", "decode (s)", "model build (s)", "training (s)", "total (s)"]]
    for side, label in (("medfed", "medfed"), ("plain", "plain loop")):
        c = cold[side]
        split.append(
            [
                label,
                str(c["images"]),
                f"{c['decode_s']:.1f}",
                f"{c['model_s']:.1f}",
                f"{c['train_s']:.1f}",
                f"{c['total_s']:.1f}",
            ]
        )
    device = results["device"]
    load = results.get("load_average")
    shape = "x".join(map(str, results["input_shape"]))
    settings = (
        f"{plan['backbone']} at {plan['image_size']} px ({shape} stored float16), batch "
        f"{plan['batch_size']}, AdamW, left-right flips, "
        f"{results['n_train']} training photos of a synthetic fundus site; warm: "
        f"{plan['repeats']} repeats of {plan['steps']} steps per side, the two back to back "
        "(in turn first), medians of each side's images/s and, as the ratio, the median of the "
        "repeats' ratios (medfed: a "
        "whole FedAvg round of its site worker, payload in and update out; plain: "
        f"torchvision.models.{TV_NETS[plan['backbone']].constructor} on random batches of the "
        "same stored tensor); cold: an empty cache (medfed decodes every photo into the cache, "
        "then trains one epoch) against a DataLoader with "
        f"{plan['workers']} worker(s) decoding, resizing and centre-cropping each photo as the "
        f"epoch reads it; 'decode' on the plain side is the time its loop waited for batches. "
        f"Device: {device['device']}, {device['cpu']} ({device['cpu_count']} cores), torch "
        f"{device['torch']}" + (f"; load average {load[0]:g} at the end" if load else "") + "."
        " torchvision is imported before either side is timed (both use it)."
    )
    if features:
        settings += " " + feature_words(features, plan["workers"])
    compiled = results.get("compile")
    if compiled:
        rows.insert(2, compiled_row(compiled, warm))
        settings += " " + compiled_words(compiled)
    tables = f"{markdown_table(rows[0], rows[1:])}\n\n{markdown_table(split[0], split[1:])}"
    return f"{tables}\n\n{settings}"


def compiled_row(compiled: dict[str, Any], warm: dict[str, Any]) -> list[str]:
    """The warm row of medfed's worker under ``compile = true``: its images/s, the plain
    loop's, and its gain over the eager worker."""
    label = "warm, compiled" if compiled["compiled"] else "warm, compile fell back to eager"
    return [
        label,
        f"{warm['median']['medfed_compiled']:.1f}",
        f"{warm['median']['plain']:.1f}",
        f"{compiled['ratio']:.2f} x the eager worker",
    ]


def compiled_words(compiled: dict[str, Any]) -> str:
    """How the compiled row was measured, and what compiling cost."""
    how = (
        "torch.compile of the model its local training runs"
        if compiled["compiled"]
        else f"compile = true, which fell back to eager ({compiled['fallback']})"
    )
    return (
        f"Compiled: medfed's worker with {how}, timed in turn with the eager worker and the "
        "plain loop; its gain is the median of the repeats' compiled / eager ratios; its first "
        f"round, compiling included, took {compiled['first_round_s']:.1f} s and is not counted."
    )
