"""Weights in a run directory: safetensors files of named tensors (the final model, checkpoints).

Kept apart from :mod:`medfed.runs.rundir` and :mod:`medfed.runs.schema` because it needs torch,
and the readers of a run's records (dashboard, report tables) must not.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from medfed.errors import RunDirError

if TYPE_CHECKING:
    from medfed.runs.rundir import RunDir

State = dict[str, torch.Tensor]


def save_state(path: Path, state: State) -> None:
    save_file({k: v.detach().to("cpu").contiguous() for k, v in state.items()}, str(path))


def load_state(path: Path) -> State:
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise RunDirError(f"{path}: cannot read weights ({exc}); the file may be damaged") from exc


def save_model(run: RunDir, model_json: Mapping[str, Any], states: Mapping[str, State]) -> None:
    """The final model: one safetensors file per name, then model.json (which marks it done)."""
    run.model_dir.mkdir(parents=True, exist_ok=True)
    for name, state in states.items():
        save_state(run.model_weights_path(name), state)
    run.write_model_json(model_json)


def load_model_state(run: RunDir, name: str) -> State:
    """The final model's weights called ``name`` (``site_<id>``, ``abstention``)."""
    path = run.model_weights_path(name)
    if not path.is_file():
        raise RunDirError(f"{path}: missing model weights; the run has not finished training")
    return load_state(path)
