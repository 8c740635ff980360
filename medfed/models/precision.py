"""Local training's number format: the device's capability and the ``precision`` setting in,
bf16, fp16 (with a gradient scaler) or fp32 out."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from medfed.core.errors import ConfigError
from medfed.models.device import DeviceSetup, cpu_bf16_supported

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# Opacus clips each scan's gradient to --dp-clip before summing: a loss scale would multiply
# those gradients first, so the clip would bound the scaled ones and the noise would be
# calibrated to the wrong norm; unscaling after the clip is too late.
DP_FP16_REASON = (
    "DP-SGD trains in fp32 here, not fp16: Opacus clips each scan's gradient before a gradient "
    "scaler could unscale it, so the clip bound would apply to the scaled gradients"
)


def choose_precision(
    device_type: str, bf16_supported: bool, asked: str = "auto", *, private: bool = False
) -> tuple[str, str]:
    """The precision local training runs in, and why where it is not the one asked for.

    ``auto``: bf16 on a CUDA device that has it, fp16 on one that has not, fp32 on the CPU.
    A forced bf16 needs the device to have it. fp16 under DP-SGD falls back to fp32.
    """
    if asked == "auto":
        name = ("bf16" if bf16_supported else "fp16") if device_type == "cuda" else "fp32"
    elif asked in ("fp16", "fp32"):
        name = asked
    elif asked == "bf16":
        if not bf16_supported:
            raise ConfigError(
                f"training setting precision (--precision) bf16: this {device_type} device (or "
                "this torch build) has no bf16; use auto, fp16 or fp32"
            )
        name = "bf16"
    else:
        raise ConfigError(
            f"training setting precision (--precision) {asked!r}: choose auto, bf16, fp16 or fp32"
        )
    if private and name == "fp16":
        return "fp32", DP_FP16_REASON
    return name, ""


@dataclass(frozen=True)
class Precision:
    """What a site's local training computes in: ``name`` (bf16, fp16 or fp32) on a device
    kind, and why it differs from what the setting asked for ("": it does not)."""

    name: str
    device_type: str
    reason: str = ""

    def autocast(self) -> Callable[[], Any]:
        if self.name not in DTYPES:
            return contextlib.nullcontext
        kind, dtype = self.device_type, DTYPES[self.name]
        return lambda: torch.autocast(kind, dtype=dtype)

    def scaler(self) -> torch.amp.GradScaler | None:
        """A fresh gradient scaler for fp16 (None otherwise: bf16 and fp32 need none)."""
        if self.name != "fp16":
            return None
        return torch.amp.GradScaler(self.device_type)

    def describe(self) -> str:
        words = {
            "bf16": "bf16 autocast",
            "fp16": "fp16 autocast with a gradient scaler",
            "fp32": "float32",
        }[self.name]
        return f"{words} ({self.reason})" if self.reason else words


def training_precision(setup: DeviceSetup, asked: str, *, private: bool = False) -> Precision:
    """The precision a site trains in on ``setup`` (``--device cpu-bf16`` counts as asking for
    bf16 where the setting is auto)."""
    kind = setup.device.type
    if asked == "auto" and kind == "cpu" and setup.autocast_dtype == torch.bfloat16:
        asked = "bf16"
    if kind == "cuda":
        bf16 = setup.autocast_dtype == torch.bfloat16  # resolve_device asked the device
    else:
        bf16 = asked == "bf16" and cpu_bf16_supported()
    name, reason = choose_precision(kind, bf16, asked, private=private)
    return Precision(name, kind, reason)


def setup_precision(setup: DeviceSetup) -> str:
    """The precision ``setup`` evaluates in (what its description names)."""
    names = {torch.bfloat16: "bf16", torch.float16: "fp16"}
    return names.get(setup.autocast_dtype, "fp32") if setup.autocast_dtype else "fp32"
