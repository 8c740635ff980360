"""The run directory: the one place training writes and every reader (evaluate, route, bench,
dashboard) reads.

    RUN/config.toml      fully resolved training config and site manifests
    RUN/metrics.jsonl    one record per round per site
    RUN/events.jsonl     run-level events (start, resume, round skipped, finish)
    RUN/summary.json     final per-site and federation figures
    RUN/checkpoints/     round_NNNN/ (safetensors + state.json), written atomically
    RUN/model/           model.json + one safetensors file per site
    RUN/site_overview/   data cards, class counts, sample scans, site distances (siteview.py)
    RUN/audit.sqlite     every scan routed with this run (audit.py)
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

import tomli_w
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from medfed.errors import RunDirError

State = dict[str, torch.Tensor]


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, path)


def save_state(path: Path, state: State) -> None:
    save_file({k: v.detach().to("cpu").contiguous() for k, v in state.items()}, str(path))


def load_state(path: Path) -> State:
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise RunDirError(f"{path}: cannot read weights ({exc}); the file may be damaged") from exc


class RunDir:
    """Read and write one run directory."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    # --- paths ---
    config_path = property(lambda self: self.path / "config.toml")
    metrics_path = property(lambda self: self.path / "metrics.jsonl")
    events_path = property(lambda self: self.path / "events.jsonl")
    summary_path = property(lambda self: self.path / "summary.json")
    checkpoints = property(lambda self: self.path / "checkpoints")
    model_dir = property(lambda self: self.path / "model")

    def require(self) -> RunDir:
        """Fail with a clear message unless this looks like a run directory."""
        if not self.path.is_dir():
            raise RunDirError(f"{self.path}: no such run directory")
        if not self.config_path.is_file():
            raise RunDirError(
                f"{self.path}: not a medfed run directory (no config.toml); "
                "point at the folder given to 'medfed train --out'"
            )
        return self

    # --- config ---
    def write_config(self, config: dict[str, Any]) -> None:
        _atomic_write(self.config_path, tomli_w.dumps(config))

    def read_config(self) -> dict[str, Any]:
        try:
            return tomllib.loads(self.config_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise RunDirError(f"{self.config_path}: missing") from None
        except tomllib.TOMLDecodeError as exc:
            raise RunDirError(f"{self.config_path}: not valid TOML ({exc})") from exc

    # --- metrics and events ---
    def append_metrics(self, records: list[dict[str, Any]]) -> None:
        self._append(self.metrics_path, records)

    def log_event(self, kind: str, **fields: Any) -> None:
        self._append(self.events_path, [{"event": kind, "time": time.time(), **fields}])

    @staticmethod
    def _append(path: Path, records: list[dict[str, Any]]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as handle:
            for record in records:
                handle.write(json.dumps(record, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    @staticmethod
    def _read_jsonl(path: Path) -> list[dict[str, Any]]:
        if not path.is_file():
            return []
        records = []
        lines = path.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, start=1):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                if number == len(lines):
                    continue  # the last line cut short by a killed process; resume rewrites it
                raise RunDirError(f"{path}:{number}: not valid JSON; the file is damaged") from None
        return records

    def read_metrics(self) -> list[dict[str, Any]]:
        return self._read_jsonl(self.metrics_path)

    def read_events(self) -> list[dict[str, Any]]:
        return self._read_jsonl(self.events_path)

    def truncate_metrics(self, last_round: int) -> None:
        """Drop records after ``last_round`` (work a killed run did past its last checkpoint)."""
        kept = [r for r in self.read_metrics() if r.get("round", 0) <= last_round]
        text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept)
        _atomic_write(self.metrics_path, text)

    # --- summary ---
    def write_summary(self, summary: dict[str, Any]) -> None:
        _atomic_write(self.summary_path, json.dumps(summary, indent=2, sort_keys=True) + "\n")

    def read_summary(self) -> dict[str, Any]:
        if not self.summary_path.is_file():
            raise RunDirError(
                f"{self.summary_path}: missing; the run has not finished "
                "(resume it with 'medfed train ... --resume')"
            )
        try:
            return json.loads(self.summary_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise RunDirError(f"{self.summary_path}: not valid JSON ({exc})") from exc

    # --- checkpoints ---
    def save_checkpoint(
        self, round_: int, states: dict[str, State], meta: dict[str, Any], keep: int
    ) -> Path:
        """Write ``checkpoints/round_NNNN`` atomically; keep the newest ``keep`` of them."""
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        final = self.checkpoints / f"round_{round_:04d}"
        tmp = Path(tempfile.mkdtemp(dir=self.checkpoints, prefix=".tmp_round_"))
        for name, state in states.items():
            save_state(tmp / f"{name}.safetensors", state)
        (tmp / "state.json").write_text(json.dumps({"round": round_, **meta}, sort_keys=True))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        for old in self.list_checkpoints()[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def list_checkpoints(self) -> list[Path]:
        if not self.checkpoints.is_dir():
            return []
        done = [p for p in self.checkpoints.glob("round_*") if (p / "state.json").is_file()]
        return sorted(done)

    def load_checkpoint(self, folder: Path) -> tuple[dict[str, State], dict[str, Any]]:
        try:
            meta = json.loads((folder / "state.json").read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise RunDirError(f"{folder / 'state.json'}: damaged checkpoint ({exc})") from exc
        states = {p.stem: load_state(p) for p in sorted(folder.glob("*.safetensors"))}
        return states, meta

    # --- final model ---
    def save_model(self, model_json: dict[str, Any], states: dict[str, State]) -> None:
        self.model_dir.mkdir(parents=True, exist_ok=True)
        for name, state in states.items():
            save_state(self.model_dir / f"{name}.safetensors", state)
        _atomic_write(self.model_dir / "model.json", json.dumps(model_json, indent=2) + "\n")

    def read_model_json(self) -> dict[str, Any]:
        path = self.model_dir / "model.json"
        if not path.is_file():
            raise RunDirError(f"{path}: missing; the run has not finished training")
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise RunDirError(f"{path}: not valid JSON ({exc})") from exc

    def load_model_state(self, name: str) -> State:
        path = self.model_dir / f"{name}.safetensors"
        if not path.is_file():
            raise RunDirError(f"{path}: missing model weights")
        return load_state(path)
