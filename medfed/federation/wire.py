"""State <-> bytes: what a site actually sends and receives, and exact byte accounting.

Payloads are safetensors (no pickle). Byte counts in metrics are ``len()`` of these payloads.
"""

from __future__ import annotations

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save

from medfed.errors import MedfedError

State = dict[str, torch.Tensor]


class WireError(MedfedError):
    """A payload could not be decoded."""


def encode(state: State) -> bytes:
    """Serialize a state dict (CPU, contiguous tensors) to bytes."""
    return save({k: v.detach().to("cpu").contiguous() for k, v in state.items()})


def decode(payload: bytes) -> State:
    """Bytes back to a state dict (on CPU)."""
    try:
        return load(payload)
    except (SafetensorError, ValueError) as exc:
        raise WireError(f"could not decode a model payload of {len(payload)} bytes: {exc}") from exc
