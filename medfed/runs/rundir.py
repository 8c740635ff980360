"""The run directory: the one place training writes and every reader (evaluate, route, bench,
dashboard) reads.

    RUN/config.toml      fully resolved training config and site manifests
    RUN/metrics.jsonl    one record per round per site (schema.RoundRecord)
    RUN/events.jsonl     run-level events (start, resume, dropout, round skipped, finish)
    RUN/summary.json     final per-site and federation figures (schema.Summary)
    RUN/predictions.csv  one row per test scan (schema.PREDICTION_COLUMNS), to recompute them
    RUN/checkpoints/     round_NNNN/ (safetensors + state.json), written atomically
    RUN/model/           model.json + one safetensors file per site
    RUN/site_overview/   data cards, class counts, sample scans, site distances
    RUN/audit.sqlite     every scan routed with this run

Every JSON, JSONL and TOML file carries ``schema_version``, added here on write and checked here
on read (:func:`write_json` / :func:`read_json` for files written elsewhere, such as a
checkpoint's state.json). Weights (safetensors) are read and written by
:mod:`medfed.runs.weights`, so this module, like the schema, loads without torch.
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import tomli_w

from medfed.errors import RunDirError
from medfed.fileio import atomic_write
from medfed.runs.schema import PREDICTION_COLUMNS, RoundRecord, Summary, prediction_row
from medfed.versions import SCHEMA_VERSION, VERSION_KEY, check_version, unversioned, versioned


def write_json(path: Path, data: Mapping[str, Any], *, sort_keys: bool = True) -> None:
    """Write one JSON object of the run directory, stamped with ``schema_version``, atomically."""
    atomic_write(path, json.dumps(versioned(data), indent=2, sort_keys=sort_keys) + "\n")


def read_json(path: Path, missing: str = "missing") -> dict[str, Any]:
    """One JSON object of the run directory, without ``schema_version`` once it is readable."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RunDirError(f"{path}: {missing}") from None
    except OSError as exc:
        raise RunDirError(f"{path}: cannot read ({exc})") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RunDirError(f"{path}: not valid JSON ({exc}); the file is damaged") from exc
    return unversioned(data, str(path))


class RunDir:
    """Read and write one run directory."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    # --- paths ---
    @property
    def config_path(self) -> Path:
        return self.path / "config.toml"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def events_path(self) -> Path:
        return self.path / "events.jsonl"

    @property
    def summary_path(self) -> Path:
        return self.path / "summary.json"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def model_dir(self) -> Path:
        return self.path / "model"

    @property
    def model_json_path(self) -> Path:
        return self.model_dir / "model.json"

    def model_weights_path(self, name: str) -> Path:
        """Where the final model's weights called ``name`` (``site_<id>``, ...) are kept."""
        return self.model_dir / f"{name}.safetensors"

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
    def write_config(self, config: Mapping[str, Any]) -> None:
        atomic_write(self.config_path, tomli_w.dumps(versioned(config)))

    def read_config(self) -> dict[str, Any]:
        """config.toml as written (without ``schema_version``)."""
        try:
            data = tomllib.loads(self.config_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise RunDirError(f"{self.config_path}: missing") from None
        except tomllib.TOMLDecodeError as exc:
            raise RunDirError(f"{self.config_path}: not valid TOML ({exc})") from exc
        return unversioned(data, str(self.config_path))

    # --- metrics and events ---
    def append_metrics(self, records: Iterable[RoundRecord | Mapping[str, Any]]) -> None:
        """Append one round's records (typed, or plain dicts checked as :class:`RoundRecord`)."""
        where = f"{self.metrics_path} (record to write)"
        typed = [RoundRecord.of(r, where) for r in records]
        self._append(self.metrics_path, [r.to_dict() for r in typed])

    def read_metrics(self) -> list[RoundRecord]:
        return [
            RoundRecord.from_dict(data, where)
            for where, data in self._read_jsonl(self.metrics_path)
        ]

    def truncate_metrics(self, last_round: int) -> None:
        """Drop records after ``last_round`` (work a killed run did past its last checkpoint)."""
        kept = [r for r in self.read_metrics() if r.round <= last_round]
        atomic_write(self.metrics_path, "".join(_line(r.to_dict()) for r in kept))

    def log_event(self, kind: str, **fields: Any) -> None:
        self._append(self.events_path, [{"event": kind, "time": time.time(), **fields}])

    def read_events(self) -> list[dict[str, Any]]:
        """events.jsonl: each event's ``event`` (its kind), ``time`` and its own fields."""
        events = []
        for where, data in self._read_jsonl(self.events_path):
            if not isinstance(data.get("event"), str):
                raise RunDirError(f"{where}: an event without its kind; the file is damaged")
            events.append({k: v for k, v in data.items() if k != VERSION_KEY})
        return events

    @staticmethod
    def _append(path: Path, records: list[dict[str, Any]]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as handle:
            for record in records:
                handle.write(_line(record))
            handle.flush()
            os.fsync(handle.fileno())

    @staticmethod
    def _read_jsonl(path: Path) -> list[tuple[str, dict[str, Any]]]:
        """Each readable record with where it stands (``path:line``), its version checked."""
        if not path.is_file():
            return []
        records = []
        lines = path.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, start=1):
            where = f"{path}:{number}"
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                if number == len(lines):
                    continue  # the last line cut short by a killed process; resume rewrites it
                raise RunDirError(f"{where}: not valid JSON; the file is damaged") from None
            if not isinstance(data, dict):
                raise RunDirError(f"{where}: not a JSON object; the file is damaged")
            check_version(data, where)
            records.append((where, data))
        return records

    # --- summary ---
    def write_summary(self, summary: Summary | Mapping[str, Any]) -> None:
        """Write summary.json (a :class:`Summary`, or a plain dict checked as one)."""
        if not isinstance(summary, Summary):
            summary = Summary.from_dict(summary, f"{self.summary_path} (summary to write)")
        write_json(self.summary_path, summary.to_dict())

    def read_summary(self) -> Summary:
        missing = "missing; the run has not finished (resume it with 'medfed train ... --resume')"
        return Summary.from_dict(read_json(self.summary_path, missing), str(self.summary_path))

    # --- per-scan predictions ---
    @property
    def predictions_path(self) -> Path:
        return self.path / "predictions.csv"

    def write_predictions(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """predictions.csv: one row per test scan, with ``schema_version`` as its last column."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow([*PREDICTION_COLUMNS, VERSION_KEY])
        for row in rows:
            writer.writerow([*(_cell(row[c]) for c in PREDICTION_COLUMNS), SCHEMA_VERSION])
        atomic_write(self.predictions_path, out.getvalue())

    def read_predictions(self) -> list[dict[str, Any]]:
        """predictions.csv's rows, typed (see :func:`medfed.runs.schema.prediction_row`)."""
        path = self.predictions_path
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise RunDirError(
                f"{path}: missing; runs written before per-scan predictions have none "
                "(train the run again to get them)"
            ) from None
        rows = []
        for k, raw in enumerate(csv.DictReader(io.StringIO(text)), start=2):
            where = f"{path} line {k}"
            check_version({VERSION_KEY: _version_cell(raw.get(VERSION_KEY))}, where)
            rows.append(prediction_row(raw, where))
        return rows

    # --- final model ---
    def write_model_json(self, model_json: Mapping[str, Any]) -> None:
        """model.json, written after the weights: its presence marks the model complete."""
        write_json(self.model_json_path, model_json, sort_keys=False)

    def read_model_json(self) -> dict[str, Any]:
        return read_json(self.model_json_path, "missing; the run has not finished training")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _version_cell(text: str | None) -> Any:
    return int(text) if text is not None and text.isdigit() else text


def _line(record: Mapping[str, Any]) -> str:
    return json.dumps(versioned(record), sort_keys=True) + "\n"
