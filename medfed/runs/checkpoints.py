"""Checkpoints: one folder per finished round, written atomically, the newest few kept.

The same store keeps the server's checkpoints (``RUN/checkpoints/``: the global state and, in
one process, every site's state) and a Flower SuperNode's (its own state, private state and what
it last received, under its state directory), so both resume the same way.

    FOLDER/round_NNNN/<name>.safetensors   one file per named state
    FOLDER/round_NNNN/files.json           size, sha256, tensor names/shapes/dtypes of each file
    FOLDER/round_NNNN/state.json           {"round": N, ...}; written last, marks it complete

Loading a checkpoint checks it against its files.json (checkpoints written before files.json
existed load without it) and refuses NaN or infinite weights, naming the file.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from medfed.core.errors import RunDirError
from medfed.runs.rundir import read_json, write_json
from medfed.runs.weights import load_state, save_state, verify_folder, write_files_manifest

State = dict[str, torch.Tensor]
ROUND_DIR = re.compile(r"round_(\d{4,})$")
MARKER = "state.json"


def damaged_fix(folder: Path) -> str:
    """What to do about a damaged checkpoint ``folder``."""
    return (
        f"the checkpoint {folder} is damaged (changed or cut short since it was written): "
        f"delete {folder} and resume again to continue from the checkpoint before it, or "
        "train from the start into a new --out folder"
    )


class CheckpointStore:
    """The round checkpoints in one folder."""

    def __init__(self, folder: str | Path, keep: int) -> None:
        if keep < 1:
            raise ValueError("a checkpoint store keeps at least one round")
        self.folder, self.keep = Path(folder), keep

    def save(self, round_: int, states: dict[str, State], meta: dict[str, Any] | None = None):
        """Write ``round_NNNN`` atomically, then drop all but the newest ``keep`` rounds."""
        self.folder.mkdir(parents=True, exist_ok=True)
        final = self.folder / f"round_{round_:04d}"
        tmp = Path(tempfile.mkdtemp(dir=self.folder, prefix=".tmp_round_"))
        for name, state in states.items():
            save_state(tmp / f"{name}.safetensors", state)
        write_files_manifest(tmp, [f"{name}.safetensors" for name in states])
        write_json(tmp / MARKER, {**(meta or {}), "round": round_})
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        for _, old in self.rounds()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def rounds(self) -> list[tuple[int, Path]]:
        """Complete checkpoints, oldest first."""
        if not self.folder.is_dir():
            return []
        found = [
            (int(m.group(1)), p)
            for p in self.folder.iterdir()
            if (m := ROUND_DIR.match(p.name)) and (p / MARKER).is_file()
        ]
        return sorted(found)

    def latest(self, upto: int | None = None) -> Path | None:
        """The newest checkpoint, or the newest of rounds ``<= upto``."""
        done = [p for r, p in self.rounds() if upto is None or r <= upto]
        return done[-1] if done else None

    def load(self, folder: Path) -> tuple[dict[str, State], dict[str, Any]]:
        """The named states and the metadata of one checkpoint, checked against its files.json;
        ``meta["round"]`` is the round it was written after (a whole number, as its folder)."""
        fix = damaged_fix(folder)
        meta = read_json(folder / MARKER, f"missing; the checkpoint is incomplete; {fix}", fix)
        done = meta.get("round")
        m = ROUND_DIR.match(folder.name)
        if not isinstance(done, int) or isinstance(done, bool) or done < 0:
            raise RunDirError(f"{folder / MARKER}: 'round' is {done!r}, not a round number; {fix}")
        if m and int(m.group(1)) != done:
            raise RunDirError(
                f"{folder / MARKER}: says round {done}, but the folder is {folder.name}; {fix}"
            )
        verify_folder(folder, fix)
        states = {p.stem: load_state(p, fix) for p in sorted(folder.glob("*.safetensors"))}
        return states, meta
