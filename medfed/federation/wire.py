"""State <-> bytes: what a site actually sends and receives, and exact byte accounting.

Payloads are safetensors (no pickle) whose metadata records how they were encoded, so a
receiver never has to guess. Options:

- ``float32`` (exact), ``float16`` (half the bytes, relative error <= 2**-11);
- ``int8``: per-tensor symmetric quantization with a float32 scale (error <= scale / 2);
- ``int8-channel``: one scale per output channel (dim 0), for weights whose rows differ in range;
- ``delta``: send ``state - reference`` (the global state the site received this round), which
  quantizes far better than the weights themselves because updates are small.

Only floating-point tensors are compressed; integer buffers travel as they are. Byte counts in
``metrics.jsonl`` are ``len()`` of these payloads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save

from medfed.config import WIRE_PRECISIONS as PRECISIONS
from medfed.core.errors import ConfigError, MedfedError

State = dict[str, torch.Tensor]
_SCALE = ".__scale__"
_META_KEY = "medfed_wire"


class WireError(MedfedError):
    """A payload could not be decoded."""


@dataclass(frozen=True)
class WireFormat:
    """How model state is put on the wire."""

    precision: str = "float32"
    delta: bool = False

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ConfigError(f"wire precision {self.precision!r}: choose one of {PRECISIONS}")

    def to_json(self) -> str:
        return json.dumps({"precision": self.precision, "delta": self.delta}, sort_keys=True)


def _quantize(x: torch.Tensor, per_channel: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if per_channel and x.dim() >= 2:
        peak = x.abs().reshape(x.shape[0], -1).amax(dim=1)
        scale = (peak / 127.0).clamp_min(1e-12)
        view = scale.view(-1, *([1] * (x.dim() - 1)))
    else:
        scale = (x.abs().amax() / 127.0).clamp_min(1e-12).reshape(1)
        view = scale
    q = torch.clamp(torch.round(x / view), -127, 127).to(torch.int8)
    return q, scale.float()


def _dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    view = scale.view(-1, *([1] * (q.dim() - 1))) if scale.numel() > 1 else scale
    return q.float() * view


def encode(state: State, fmt: WireFormat = WireFormat(), reference: State | None = None) -> bytes:
    """Serialize ``state`` (minus ``reference`` when ``fmt.delta``) to bytes."""
    if fmt.delta and reference is None:
        raise ValueError("delta encoding needs the reference state both ends hold")
    tensors: State = {}
    for key, value in state.items():
        x = value.detach().to("cpu")
        if not x.is_floating_point():
            tensors[key] = x.contiguous()
            continue
        x = x.float()
        if fmt.delta:
            x = x - reference[key].detach().to("cpu").float()
        if fmt.precision == "float16":
            tensors[key] = x.half().contiguous()
        elif fmt.precision.startswith("int8"):
            q, scale = _quantize(x, per_channel=fmt.precision == "int8-channel")
            tensors[key], tensors[key + _SCALE] = q.contiguous(), scale.contiguous()
        else:
            tensors[key] = x.contiguous()
    return save(tensors, metadata={_META_KEY: fmt.to_json()})


def decode(payload: bytes, reference: State | None = None, dtypes: State | None = None) -> State:
    """Bytes back to a float32 state on the CPU (``reference`` is added back for delta payloads).

    ``dtypes``, when given, casts each tensor back to the dtype of the same key there.
    """
    try:
        raw = load(payload)

        meta = json.loads(header_metadata(payload).get(_META_KEY, "{}"))
    except (SafetensorError, ValueError) as exc:
        raise WireError(f"could not decode a model payload of {len(payload)} bytes: {exc}") from exc
    fmt = WireFormat(**meta) if meta else WireFormat()
    if fmt.delta and reference is None:
        raise WireError("payload is a delta against the global state, but no reference was given")
    out: State = {}
    for key, value in raw.items():
        if key.endswith(_SCALE):
            continue
        if key + _SCALE in raw:
            value = _dequantize(value, raw[key + _SCALE])
        elif value.is_floating_point():
            value = value.float()
        if fmt.delta and value.is_floating_point():
            value = value + reference[key].detach().to("cpu").float()
        if dtypes is not None and key in dtypes:
            value = value.to(dtypes[key].dtype)
        out[key] = value
    return out


def lossless_subset(payload: bytes, keys: list[str]) -> bytes:
    """The float32 payload of ``keys`` alone, from a float32 ``payload`` of a whole state: the
    bytes :func:`encode` gives those keys of the state it came from (float32 survives the
    round trip exactly, and the file's layout depends on its tensors only)."""
    state = decode(payload)
    meta = json.loads(header_metadata(payload).get(_META_KEY, "{}"))
    if meta and WireFormat(**meta) != WireFormat():
        raise WireError(f"a {WireFormat(**meta).to_json()} payload is not a lossless state")
    missing = sorted(set(keys) - set(state))
    if missing:
        raise WireError(f"the state holds no {missing}")
    return encode({k: state[k] for k in keys})


def header_metadata(payload: bytes) -> dict[str, str]:
    """The safetensors header's metadata (the first 8 bytes give the header length)."""
    size = int.from_bytes(payload[:8], "little")
    header = json.loads(payload[8 : 8 + size])
    return header.get("__metadata__", {}) or {}
