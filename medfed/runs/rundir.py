"""The run directory: the one place training writes and every reader (evaluate, route, bench,
dashboard) reads.

    RUN/config.toml      fully resolved training config and site manifests
    RUN/metrics.jsonl    one record per round per site (schema.RoundRecord)
    RUN/events.jsonl     run-level events (start, resume, dropout, round skipped, finish)
    RUN/summary.json     final per-site and federation figures (schema.Summary)
    RUN/predictions.csv  one row per test scan (schema.PREDICTION_COLUMNS), to recompute them
                         (a deployed run: only when it asked for them; summary.json says)
    RUN/checkpoints/     round_NNNN/ (safetensors + files.json + state.json), written atomically
    RUN/model/           model.json + one safetensors file per site (and abstention) + files.json
    RUN/site_overview/   data cards, class counts, sample scans, site distances
    RUN/audit.sqlite     every scan routed with this run
What training writes is :data:`TRAINING_OUTPUTS`; the rest (the audit log, review/, pacs/, a
service's token) is the clinic's record of the scans answered, kept when the served model is
replaced by a newer run (:mod:`medfed.clinic.releases`).

Every JSON, JSONL and TOML file carries ``schema_version``, added here on write and checked here
on read (:func:`write_json` / :func:`read_json` for files written elsewhere, such as a
checkpoint's state.json). Weights (safetensors) are read and written by
:mod:`medfed.runs.weights`, so this module, like the schema, loads without torch.

``files.json`` beside a folder's weight files lists each one's size, sha256 and the name, shape
and dtype of its tensors; :func:`verify_folder` checks a folder against it (reading only the
safetensors headers, so without torch) and refuses a missing, unlisted, edited or cut-short file
by name. Folders written before it existed have none and are checked when their weights load.

A run whose training failed (no round aggregated any site's update) keeps config.toml,
metrics.jsonl, checkpoints/ and events.jsonl, whose last event is ``failed``; it has no
summary.json and no model/, and :meth:`RunDir.read_summary` says why.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import stat
import time
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import tomli_w

from medfed.core.errors import MedfedError, RunDirError
from medfed.core.fileio import atomic_write
from medfed.core.units import human_bytes
from medfed.core.versions import SCHEMA_VERSION, VERSION_KEY, check_version, unversioned, versioned
from medfed.runs.schema import PREDICTION_COLUMNS, RoundRecord, Summary, prediction_row

FILES = "files.json"
TRAINING_OUTPUTS = (
    "config.toml",
    "metrics.jsonl",
    "events.jsonl",
    "summary.json",
    "predictions.csv",
    "model",
    "site_overview",
    "checkpoints",
)
"""What ``medfed train`` writes into a run directory (file or folder names): the model and
everything that describes it."""
SUFFIX = ".safetensors"
MODEL_FIX = "retrain the run, or restore the folder from the run's backup"


def write_json(path: Path, data: Mapping[str, Any], *, sort_keys: bool = True) -> None:
    """Write one JSON object of the run directory, stamped with ``schema_version``, atomically."""
    atomic_write(path, json.dumps(versioned(data), indent=2, sort_keys=sort_keys) + "\n")


DAMAGED_FIX = "restore it from the run's backup, or train the run again"

JSON_LIMIT = 64_000_000
"""The largest JSON or TOML file of a run read whole (summary.json, model.json, files.json,
state.json, config.toml): far above any medfed writes, far below what would exhaust memory."""
TABLE_LIMIT = 256_000_000
"""The largest metrics.jsonl, events.jsonl or predictions.csv read whole (one line per round
and site, or per test scan: a long study with many sites stays well under it)."""


def file_kind(path: Path) -> str | None:
    """What ``path`` is when it is not a regular file (``"a folder"``, ``"not a regular file
    (a device, pipe or socket)"``), or None when it is one (a link to one counts) or is absent."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder, not a file"
    return "not a regular file (a device, pipe or socket)"


def read_run_text(
    path: Path, missing: str | None = "missing", fix: str = DAMAGED_FIX, limit: int = JSON_LIMIT
) -> str | None:
    """The text of one run file, read whole once it is known to be a regular file of at most
    ``limit`` bytes in UTF-8; every refusal a RunDirError naming ``path`` (``missing``: the
    message for an absent file; None returns None for it instead)."""
    odd = file_kind(path)
    if odd is not None:
        raise RunDirError(f"{path}: is {odd}; {fix}")
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            data = handle.read(limit + 1) if size <= limit else b""
    except FileNotFoundError:
        if missing is None:
            return None
        raise RunDirError(f"{path}: {missing}") from None
    except OSError as exc:
        raise RunDirError(f"{path}: cannot read ({exc.strerror or exc}); {fix}") from exc
    if size > limit or len(data) > limit:
        raise RunDirError(
            f"{path}: {human_bytes(max(size, len(data)))}, over the {human_bytes(limit)} a "
            f"medfed run file may hold; the file is damaged or not medfed's; {fix}"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RunDirError(
            f"{path}: not UTF-8 text ({exc.reason}); the file is damaged; {fix}"
        ) from None


def read_json(path: Path, missing: str = "missing", fix: str = DAMAGED_FIX) -> dict[str, Any]:
    """One JSON object of the run directory, without ``schema_version`` once it is readable
    (``fix``: what to do when it is damaged)."""
    text = read_run_text(path, missing, fix)
    assert text is not None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RunDirError(f"{path}: not valid JSON ({exc}); the file is damaged; {fix}") from exc
    except RecursionError:
        raise RunDirError(f"{path}: nested too deeply to be medfed's; {fix}") from None
    return unversioned(data, str(path))


def _run_path(*parts: str) -> property:
    """A read-only attribute of :class:`RunDir`: the path ``parts`` below the run's folder."""
    return property(lambda run: run.path.joinpath(*parts))


class RunDir:
    """Read and write one run directory."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    # --- paths ---
    config_path = _run_path("config.toml")
    metrics_path = _run_path("metrics.jsonl")
    events_path = _run_path("events.jsonl")
    summary_path = _run_path("summary.json")
    checkpoints = _run_path("checkpoints")
    model_dir = _run_path("model")
    model_json_path = _run_path("model", "model.json")

    def model_weights_path(self, name: str) -> Path:
        """Where the final model's weights called ``name`` (``site_<id>``, ...) are kept."""
        return self.model_dir / f"{name}.safetensors"

    def model_id(self) -> str:
        """The final model's identity: the first 12 hex digits of the sha256 of model/files.json
        (which holds every weight file's sha256), or of model.json for a run written before
        files.json existed. Two runs with the same weights have the same id."""
        listed = self.model_dir / FILES
        return sha256(listed if listed.is_file() else self.model_json_path)[:12]

    def require(self) -> RunDir:
        """Fail with a clear message unless this looks like a run directory."""
        if self.path.is_file():
            raise RunDirError(
                f"{self.path}: is a file, not a run directory; "
                "point at the folder given to 'medfed train --out'"
            )
        if not self.path.is_dir():
            raise RunDirError(f"{self.path}: no such run directory")
        odd = file_kind(self.config_path)
        if odd is not None:
            raise RunDirError(
                f"{self.config_path}: is {odd}; a run directory keeps its settings there; "
                f"{DAMAGED_FIX}"
            )
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
        text = read_run_text(self.config_path)
        assert text is not None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise RunDirError(
                f"{self.config_path}: not valid TOML ({exc}); the file is damaged; {DAMAGED_FIX}"
            ) from exc
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
        text = read_run_text(path, None, limit=TABLE_LIMIT)
        if text is None:
            return []
        records = []
        lines = text.splitlines()
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
        if not self.summary_path.exists() and self.failed():
            missing = (
                f"missing; training failed ({self.failed()}; see {self.events_path}); "
                "train again into a new --out"
            )
        data = read_json(self.summary_path, missing)
        return Summary.from_dict(self._in_site_order(data), str(self.summary_path))

    def _in_site_order(self, data: dict[str, Any]) -> dict[str, Any]:
        """summary.json keeps its keys sorted; every reader shows the sites in the run's own
        order (config.toml's [[sites]], the manifests' order), as training printed them."""
        sites = data.get("sites")
        if not isinstance(sites, Mapping):
            return data
        try:
            listed = self.read_config().get("sites")
        except (MedfedError, OSError):
            return data  # a damaged config.toml is its own readers' to report
        if not isinstance(listed, list):
            return data
        order = [str(s.get("id")) for s in listed if isinstance(s, Mapping)]
        ranked = [k for k in order if k in sites] + [k for k in sites if k not in order]
        return {**data, "sites": {k: sites[k] for k in ranked}}

    def failed(self) -> str | None:
        """Why training failed, when its last event says it did (then there is no summary)."""
        try:
            events = self.read_events()
        except RunDirError:
            return None
        if events and events[-1].get("event") == "failed":
            return str(events[-1].get("reason") or "no reason recorded")
        return None

    def verify_model(self) -> None:
        """Check a finished run's model/: a folder holding model.json (a JSON object) and the
        weight files model/files.json lists, each as written (runs written before files.json
        have only model.json checked here; loading the model checks the rest). Every finished
        run has model/, so its absence is refused like any damage."""
        model = self.model_dir
        if not model.is_dir():
            if model.exists() or model.is_symlink():
                what = "is a file, not a folder" if model.is_file() else "is not a folder"
            else:
                what = "missing"
            raise RunDirError(
                f"{model}: {what}; a finished run keeps its trained model there, and without it "
                f"the run cannot be used; {MODEL_FIX}"
            )
        incomplete = f"missing; the trained model is incomplete; {MODEL_FIX}"
        read_json(self.model_json_path, incomplete, MODEL_FIX)
        verify_folder(model, MODEL_FIX)

    # --- per-scan predictions ---
    def _kept_at_sites(self) -> bool:
        """Whether summary.json says the sites kept the per-scan predictions."""
        try:
            data = json.loads(self.summary_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        return isinstance(data, dict) and data.get("predictions") == "sites"

    predictions_path = _run_path("predictions.csv")

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
        missing = (
            "missing; runs written before per-scan predictions have none "
            "(train the run again to get them)"
        )
        if not path.exists() and self._kept_at_sites():
            missing = (
                "not here: this deployed run kept each test scan's prediction at its site "
                "(STATE_DIR/RUN/SITE/predictions.csv on each SuperNode); ask the sites for "
                'them, or run again with run config predictions = "coordinator" where the '
                "sites' policies allow it"
            )
        text = read_run_text(path, missing, limit=TABLE_LIMIT)
        assert text is not None
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


# ---------------------------------------------------------------------- files.json
def tensor_header(path: Path, fix: str) -> dict[str, dict[str, Any]]:
    """Name -> shape and dtype of every tensor in a safetensors file, read without loading it."""
    from safetensors import SafetensorError, safe_open  # kept out of the torch-free readers

    try:
        with safe_open(str(path), framework="numpy") as handle:
            out = {}
            for key in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                piece = handle.get_slice(key)
                out[key] = {"shape": list(piece.get_shape()), "dtype": str(piece.get_dtype())}
            return out
    except FileNotFoundError:
        raise RunDirError(f"{path}: missing; {fix}") from None
    except (SafetensorError, OSError, ValueError) as exc:
        raise RunDirError(f"{path}: cannot read weights ({exc}); {fix}") from exc


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_entry(path: Path, fix: str = MODEL_FIX) -> dict[str, Any]:
    return {
        "size": path.stat().st_size,
        "sha256": sha256(path),
        "tensors": tensor_header(path, fix),
    }


def write_files_manifest(folder: Path, names: Iterable[str]) -> None:
    """``folder/files.json`` for the weight files ``names`` (file names inside ``folder``)."""
    files = {name: file_entry(folder / name) for name in sorted(names)}
    write_json(folder / FILES, {"files": files})


def read_files_manifest(folder: Path, fix: str) -> dict[str, dict[str, Any]] | None:
    """``folder/files.json``'s entries, or None for a folder written before it existed."""
    path = folder / FILES
    if not path.exists():
        return None
    data = read_json(path, fix=fix)
    files = data.get("files")
    bad = f"{path}: not a medfed weight manifest (%s); {fix}"
    if not isinstance(files, dict):
        raise RunDirError(bad % "no 'files' object")
    for name, entry in files.items():
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("size"), int)
            or not isinstance(entry.get("sha256"), str)
            or not isinstance(entry.get("tensors"), dict)
            or "/" in name
            or "\\" in name
            or not name.endswith(SUFFIX)
        ):
            raise RunDirError(bad % f"entry {name!r} is malformed")
    return files


def verify_folder(folder: Path, fix: str) -> dict[str, dict[str, Any]] | None:
    """Check every weight file of ``folder`` against its files.json (None: there is none).

    Refuses a listed file that is missing, any weight file that is not listed, and a file whose
    tensors (names, shapes, dtypes), size or bytes differ from what was written."""
    files = read_files_manifest(folder, fix)
    if files is None:
        return None
    manifest = folder / FILES
    present = {p.name for p in folder.glob(f"*{SUFFIX}")}
    for name in sorted(present - set(files)):
        raise RunDirError(
            f"{folder / name}: not listed in {manifest}, so not written with this run; "
            f"remove it, or {fix}"
        )
    for name, entry in files.items():
        path = folder / name
        odd = file_kind(path)
        if odd is not None:
            raise RunDirError(f"{path}: listed in {manifest} as a weight file, but is {odd}; {fix}")
        if not path.is_file():
            raise RunDirError(f"{path}: missing (listed in {manifest}); {fix}")
        compare_tensors(path, tensor_header(path, fix), entry["tensors"], fix, manifest.name)
        size = path.stat().st_size
        if size != entry["size"]:
            raise RunDirError(
                f"{path}: {size} bytes, but {entry['size']} were written ({manifest.name}); "
                f"the file was changed or cut short; {fix}"
            )
        if sha256(path) != entry["sha256"]:
            raise RunDirError(
                f"{path}: its bytes differ from those written (sha256 in {manifest.name}); "
                f"the file was changed; {fix}"
            )
    return files


def compare_tensors(
    path: Path,
    found: Mapping[str, Mapping[str, Any]],
    expected: Mapping[str, Mapping[str, Any]],
    fix: str,
    against: str,
) -> None:
    """Refuse missing or unexpected tensors and any changed shape or dtype, naming each."""
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    if missing:
        raise RunDirError(
            f"{path}: missing tensor(s) {_few(missing)} (expected by {against}); {fix}"
        )
    if extra:
        raise RunDirError(f"{path}: unexpected tensor(s) {_few(extra)} (not in {against}); {fix}")
    for key, want in expected.items():
        got = found[key]
        if list(got["shape"]) != list(want["shape"]):
            raise RunDirError(
                f"{path}: tensor {key!r} has shape {list(got['shape'])}, expected "
                f"{list(want['shape'])} ({against}); {fix}"
            )
        if got["dtype"] != want["dtype"]:
            raise RunDirError(
                f"{path}: tensor {key!r} has dtype {got['dtype']}, expected {want['dtype']} "
                f"({against}); {fix}"
            )


def _few(keys: list[str], n: int = 3) -> str:
    shown = ", ".join(repr(k) for k in keys[:n])
    return shown + (f" and {len(keys) - n} more" if len(keys) > n else "")
