"""Device choice: CUDA with bf16 autocast and channels-last when present, CPU otherwise."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from medfed.config import DEVICES
from medfed.errors import ConfigError

if TYPE_CHECKING:
    from medfed.data.preprocess import NormalizedView

T = TypeVar("T", torch.Tensor, "NormalizedView")


@dataclass(frozen=True)
class DeviceSetup:
    device: torch.device
    autocast_dtype: torch.dtype | None

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def autocast(self) -> Callable[[], Any]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext
        return lambda: torch.autocast("cuda", dtype=self.autocast_dtype)

    def put(self, x: T) -> T:
        """Move a data tensor to the device once (through pinned memory on CUDA).

        A :class:`~medfed.data.preprocess.NormalizedView` moves its stored tensor, in its
        storage dtype; it is then normalized on the device, batch by batch.
        """
        if not self.is_cuda:
            return x
        return x.pin_memory().to(self.device, non_blocking=True)

    def describe(self) -> str:
        if self.is_cuda:
            return f"cuda ({torch.cuda.get_device_name(self.device)}, bf16 autocast)"
        return f"cpu ({torch.get_num_threads()} threads)"


def resolve_device(name: str) -> DeviceSetup:
    """``auto`` picks CUDA when available; asking for CUDA without one is an error."""
    if name not in DEVICES:
        raise ConfigError(f"--device {name!r}: choose one of {', '.join(DEVICES)}")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda was asked for, but no CUDA device is visible; use auto")
    if name == "cpu" or not torch.cuda.is_available():
        return DeviceSetup(torch.device("cpu"), None)
    return DeviceSetup(torch.device("cuda"), torch.bfloat16)
