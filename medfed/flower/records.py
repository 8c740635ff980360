"""Packing medfed's payloads into Flower records and back.

Wire payloads (already encoded by :mod:`medfed.federation.wire`) travel as one ``uint8`` array,
so their length is exactly what the in-process engine counts. Whole weights travel the same way,
as one safetensors file: Flower stores and fetches every array of a message as an object of its
own, one request each, so a state sent tensor by tensor would cost a request per tensor on the
SuperLink and the SuperNode. Everything else goes as JSON in a ``ConfigRecord``.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from medfed.federation.wire import header_metadata

State = dict[str, torch.Tensor]
ORDER = "medfed.order"  # the safetensors metadata entry that keeps a state's key order


def payload_record(payload: bytes) -> ArrayRecord:
    return ArrayRecord({"payload": Array(np.frombuffer(payload, dtype=np.uint8).copy())})


def payload_of(content: RecordDict, name: str = "payload") -> bytes:
    record = content.array_records[name]
    return record["payload"].numpy().tobytes() if "payload" in record else b""


def state_record(state: State) -> ArrayRecord:
    """A state dict as one array: its safetensors file (names, dtypes, shapes and the order of
    the names kept)."""
    # (a copy each: safetensors refuses tensors that share memory, as tied weights would)
    tensors = {
        k: v.detach().cpu().clone(memory_format=torch.contiguous_format) for k, v in state.items()
    }
    order = {ORDER: json.dumps(list(tensors))}
    return payload_record(save_safetensors(tensors, metadata=order))


def state_of(content: RecordDict, name: str) -> State:
    blob = payload_of(content, name)
    tensors = load_safetensors(blob)
    return {k: tensors[k] for k in json.loads(header_metadata(blob)[ORDER])}


def json_record(data: Any) -> ConfigRecord:
    return ConfigRecord({"json": json.dumps(data)})


def json_of(content: RecordDict, name: str) -> Any:
    return json.loads(str(content.config_records[name]["json"]))


def weights_records(weights: dict[str, State]) -> dict[str, ArrayRecord]:
    """A federation's weights (``TrainedFederation.weights()``), one record each."""
    return {f"w.{name}": state_record(state) for name, state in weights.items()}


def weights_of(content: RecordDict) -> dict[str, State]:
    return {name[2:]: state_of(content, name) for name in content.array_records if name[:2] == "w."}
