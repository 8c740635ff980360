"""Weights in a run directory: safetensors files of named tensors (the final model, checkpoints).

Every folder of weights (``RUN/model/``, each ``RUN/checkpoints/round_NNNN/``) carries
``files.json``, written with the weights: for each weight file its size, sha256 and the name,
shape and dtype of every tensor. Readers check it before trusting a file, so an edited, truncated,
missing or swapped file is refused by name instead of loading as something else. Folders written
before ``files.json`` existed still load; their tensors are then checked against the model built
from the run's config (see :func:`check_tensors`). Every loaded tensor must be finite.

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

from medfed.core.errors import MedfedError, RunDirError
from medfed.runs.rundir import (
    FILES,
    MODEL_FIX,
    SUFFIX,
    compare_tensors,
    file_kind,
    read_files_manifest,
    verify_folder,
    write_files_manifest,
)

if TYPE_CHECKING:
    from medfed.runs.rundir import RunDir

State = dict[str, torch.Tensor]
__all__ = [
    "FILES",
    "MODEL_FIX",
    "check_finite",
    "check_tensors",
    "load_model_state",
    "load_state",
    "read_files_manifest",
    "save_model",
    "save_state",
    "verify_folder",
]

# safetensors' dtype names, as its header and files.json spell them
_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPES.get(dtype, str(dtype).removeprefix("torch."))


def save_state(path: Path, state: State) -> None:
    save_file({k: v.detach().to("cpu").contiguous() for k, v in state.items()}, str(path))


def load_state(path: Path, fix: str = "the file may be damaged") -> State:
    """One weight file's tensors, each finite (NaN or infinity is refused naming the tensor)."""
    try:
        state = load_file(str(path))
    except FileNotFoundError:
        raise RunDirError(f"{path}: missing; {fix}") from None
    except (SafetensorError, OSError, ValueError) as exc:
        raise RunDirError(f"{path}: cannot read weights ({exc}); {fix}") from exc
    check_finite(path, state, fix)
    return state


def check_finite(
    path: Path | str,
    state: Mapping[str, torch.Tensor],
    fix: str,
    error: type[MedfedError] = RunDirError,
) -> None:
    """Refuse NaN or infinite weights, naming ``path`` (a file, or how the user gave it) and
    the tensor."""
    for key, value in state.items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            bad = "NaN" if bool(torch.isnan(value).any()) else "infinite values"
            raise error(f"{path}: tensor {key!r} holds {bad}; {fix}")


def describe_state(state: Mapping[str, torch.Tensor]) -> dict[str, dict[str, Any]]:
    """Name -> shape and dtype, as files.json and :func:`tensor_header` spell them."""
    return {k: {"shape": list(v.shape), "dtype": dtype_name(v.dtype)} for k, v in state.items()}


def check_tensors(
    path: Path, state: Mapping[str, torch.Tensor], expected: State, fix: str, against: str
) -> None:
    """``state`` (loaded from ``path``) holds exactly ``expected``'s tensors, shapes, dtypes."""
    compare_tensors(path, describe_state(state), describe_state(expected), fix, against)


# ---------------------------------------------------------------------- the final model
def save_model(run: RunDir, model_json: Mapping[str, Any], states: Mapping[str, State]) -> None:
    """The final model: one safetensors file per name, files.json, then model.json (which marks
    it done)."""
    run.model_dir.mkdir(parents=True, exist_ok=True)
    for stale in run.model_dir.glob(f"*{SUFFIX}"):  # from an earlier finish of this run
        if stale.name.removesuffix(SUFFIX) not in states:
            stale.unlink()
    for name, state in states.items():
        save_state(run.model_weights_path(name), state)
    write_files_manifest(run.model_dir, [f"{name}{SUFFIX}" for name in states])
    run.write_model_json(model_json)


def load_model_state(run: RunDir, name: str) -> State:
    """The final model's weights called ``name`` (``site_<id>``, ``abstention``)."""
    path = run.model_weights_path(name)
    odd = file_kind(path)
    if odd:
        raise RunDirError(f"{path}: is {odd}; {MODEL_FIX}")
    if not path.is_file():
        raise RunDirError(f"{path}: missing model weights; the run has not finished training")
    return load_state(path, MODEL_FIX)
