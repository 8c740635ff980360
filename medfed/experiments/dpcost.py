"""What DP-SGD costs per step, and how much of it is Opacus itself.

Four loops on one GroupNorm backbone at one resolution, each timed over the same number of
steps after a warm-up step: medfed's site worker without and with DP-SGD, and a plain loop on
the same network (medfed's ``-gn`` torchvision twin, nothing of the federation around it)
without and with Opacus (``PrivacyEngine.make_private``: per-sample gradients, clipping, noise,
Poisson batches). The plain pair's ratio is what Opacus itself costs; medfed's ratio over it is what
medfed adds on top.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from medfed.core.errors import ConfigError
from medfed.data.records import Split
from medfed.data.sitedata import SiteData
from medfed.experiments.throughput import LR, WEIGHT_DECAY, MedfedSide, ThroughputPlan
from medfed.models.device import DeviceSetup
from medfed.models.fedmodel import ModelSpec, build_model
from medfed.models.torchvision_nets import TV_NETS
from medfed.reports.markdown import markdown_table

NOISE, CLIP = 1.0, 1.0  # the noise multiplier and clip of both DP loops


def _sync(setup: DeviceSetup) -> None:
    if setup.is_cuda:
        torch.cuda.synchronize(setup.device)


def _per_step(setup: DeviceSetup, run: Callable[[int], Any], steps: int) -> float:
    run(1)  # warm-up: hooks attached, memory allocated
    _sync(setup)
    start = time.perf_counter()
    run(steps)
    _sync(setup)
    return (time.perf_counter() - start) / steps


class _Logits(nn.Module):
    """The model's class logits alone, as a plain loop's network returns them."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x).target_logits


def _plain_net(backbone: str, site: SiteData) -> nn.Module:
    """The very network medfed trains (torchvision's, GroupNorm for BatchNorm, its residual
    additions out of place so that Opacus' hooks can see them), with no federation around it."""
    spec = ModelSpec(backbone, int(site.x[Split.TRAIN].shape[1]), site.manifest.n_classes, 1)
    return _Logits(build_model(spec))


class PlainLoop:
    """The same network trained by the loop Opacus' tutorials write, on the site's normalized
    cached tensors; through ``PrivacyEngine.make_private`` when ``private``."""

    def __init__(
        self,
        site: SiteData,
        plan: ThroughputPlan,
        backbone: str,
        setup: DeviceSetup,
        private: bool,
    ) -> None:
        from torch.utils.data import DataLoader, TensorDataset

        torch.manual_seed(plan.seed)
        self.setup = setup
        model = _plain_net(backbone, site).to(setup.device)
        if setup.channels_last:
            model = model.to(memory_format=torch.channels_last)
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
        x, y = site.x[Split.TRAIN][:], site.y[Split.TRAIN]
        loader = DataLoader(TensorDataset(x, y), batch_size=plan.batch_size, shuffle=True)
        if private:
            from opacus import PrivacyEngine

            for module in model.modules():  # Opacus' hooks keep each activation's output
                if getattr(module, "inplace", False):
                    module.inplace = False
            with warnings.catch_warnings():  # secure RNG off: a timing, not a release
                warnings.simplefilter("ignore")
                engine = PrivacyEngine()
            model, optimizer, loader = engine.make_private(
                module=model,
                optimizer=optimizer,
                data_loader=loader,
                noise_multiplier=NOISE,
                max_grad_norm=CLIP,
                poisson_sampling=True,
            )
        self.model, self.optimizer, self.loader = model, optimizer, loader

    def train(self, steps: int) -> None:
        self.model.train()
        done = 0
        while done < steps:
            for xb, yb in self.loader:
                xb = xb.to(self.setup.device, non_blocking=True)
                yb = yb.to(self.setup.device, non_blocking=True)
                self.optimizer.zero_grad(set_to_none=True)
                with self.setup.autocast()():  # an empty Poisson batch too, as Opacus expects
                    loss = F.cross_entropy(self.model(xb).float(), yb)
                loss.backward()
                self.optimizer.step()
                done += 1
                if done == steps:
                    return


def checked_backbone(backbone: str) -> str:
    """``backbone``, or ConfigError when it is not a GroupNorm torchvision twin."""
    if not backbone.endswith("-gn") or backbone.removesuffix("-gn") not in TV_NETS:
        raise ConfigError(
            f"--dp-backbone {backbone!r}: DP-SGD needs a GroupNorm torchvision backbone, one of "
            f"{', '.join(f'{n}-gn' for n in sorted(TV_NETS))}"
        )
    return backbone


def dp_cost(
    site: SiteData, plan: ThroughputPlan, setup: DeviceSetup, steps: int, backbone: str
) -> dict[str, Any]:
    """Seconds per step of the four loops on ``backbone`` (a ``-gn`` torchvision twin)."""
    checked_backbone(backbone)
    config = dataclasses.replace(plan.config(), backbone=backbone, rounds=1)
    private = dataclasses.replace(config, dp_noise=NOISE, dp_clip=CLIP)
    medfed = MedfedSide(site, config, setup)
    medfed_dp = MedfedSide(site, private, setup)
    seconds = {
        "medfed": _per_step(setup, medfed.train, steps),
        "medfed_dp": _per_step(setup, medfed_dp.train, steps),
        "plain": _per_step(setup, PlainLoop(site, plan, backbone, setup, False).train, steps),
        "opacus": _per_step(setup, PlainLoop(site, plan, backbone, setup, True).train, steps),
    }
    medfed_ratio = seconds["medfed_dp"] / seconds["medfed"]
    opacus_ratio = seconds["opacus"] / seconds["plain"]
    return {
        "backbone": backbone,
        "steps": steps,
        "batch_size": plan.batch_size,
        "noise": NOISE,
        "clip": CLIP,
        "seconds_per_step": seconds,
        "medfed_dp_ratio": medfed_ratio,
        "opacus_ratio": opacus_ratio,
        "medfed_over_opacus": seconds["medfed_dp"] / seconds["opacus"],
    }


def dp_markdown(found: dict[str, Any], image_size: int) -> str:
    s = found["seconds_per_step"]
    rows = [
        ["medfed site worker", f"{s['medfed']:.2f}", f"{s['medfed_dp']:.2f}"],
        ["plain loop, Opacus' make_private", f"{s['plain']:.2f}", f"{s['opacus']:.2f}"],
    ]
    rows[0].append(f"{found['medfed_dp_ratio']:.2f}")
    rows[1].append(f"{found['opacus_ratio']:.2f}")
    table = markdown_table(["loop", "s/step without DP", "s/step with DP-SGD", "DP / no DP"], rows)
    return (
        f"{table}\n\nDP-SGD's cost per step on {found['backbone']} at {image_size} px, batch "
        f"{found['batch_size']} (Poisson batches of that expected size under DP; noise "
        f"{found['noise']:g}, clip {found['clip']:g}), {found['steps']} timed steps after a "
        f"warm-up step each; medfed's figures are its site worker's whole round (payload in, "
        "update out) divided by the round's steps. Opacus itself multiplies a step's time by "
        f"{found['opacus_ratio']:.2f} on the plain loop; medfed's DP step takes "
        f"{found['medfed_over_opacus']:.2f} times the plain Opacus step."
    )
