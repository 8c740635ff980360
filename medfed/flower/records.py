"""Packing medfed's payloads into Flower records and back.

Wire payloads (already encoded by :mod:`medfed.federation.wire`) travel as one ``uint8`` array,
so their length is exactly what the in-process engine counts; whole weights travel as an
``ArrayRecord`` keyed by state-dict name; everything else as JSON in a ``ConfigRecord``.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

State = dict[str, torch.Tensor]


def payload_record(payload: bytes) -> ArrayRecord:
    return ArrayRecord({"payload": Array(np.frombuffer(payload, dtype=np.uint8).copy())})


def payload_of(content: RecordDict, name: str = "payload") -> bytes:
    record = content.array_records[name]
    return record["payload"].numpy().tobytes() if "payload" in record else b""


def state_record(state: State) -> ArrayRecord:
    return ArrayRecord({k: v.detach().cpu().contiguous() for k, v in state.items()})


def state_of(content: RecordDict, name: str) -> State:
    return dict(content.array_records[name].to_torch_state_dict())


def json_record(data: Any) -> ConfigRecord:
    return ConfigRecord({"json": json.dumps(data)})


def json_of(content: RecordDict, name: str) -> Any:
    return json.loads(str(content.config_records[name]["json"]))


def weights_records(weights: dict[str, State]) -> dict[str, ArrayRecord]:
    """A federation's weights (``TrainedFederation.weights()``), one record each."""
    return {f"w.{name}": state_record(state) for name, state in weights.items()}


def weights_of(content: RecordDict) -> dict[str, State]:
    return {
        name[2:]: dict(record.to_torch_state_dict())
        for name, record in content.array_records.items()
        if name.startswith("w.")
    }
