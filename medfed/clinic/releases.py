"""Replacing the served model by a newer run, and going back, with one clinic record throughout.

A served run directory (LIVE) holds what training wrote (:data:`TRAINING_OUTPUTS`: the model
and everything that describes it: config, summary, predictions, site overview) and the clinic's
record of the scans it answered (the audit log, review/, pacs/, the service's token).
:func:`promote` replaces the first by a newer run's and keeps the second, so the audit log stays
one continuous trail in which every decision names the model that gave it (its model id,
:meth:`medfed.runs.rundir.RunDir.model_id`). The model it replaces is kept, whole, under
LIVE/releases/MODEL_ID/, and :func:`rollback` puts it back. LIVE/releases/history.jsonl records
every change: when, which model, the one it replaced, where it came from, who, and why.

A change is made under an exclusive lock on LIVE/releases/lock, the new model staged in full
first, so that a reader (a service loading the model under the shared lock) sees the old model
or the new one, never a mix. A running ``medfed serve``, ``pacs watch`` or ``pacs listen``
(:class:`LiveModel`) notices the change before its next scan (history.jsonl changed) and
answers from then on with the new model; a scan already being answered finishes with the old
one, and its audit row names it.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import json
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from medfed.core.errors import ConfigError, MedfedError, RunDirError
from medfed.core.fileio import private_dir
from medfed.runs.rundir import TRAINING_OUTPUTS, RunDir

__all__ = [
    "RELEASES",
    "LiveModel",
    "Release",
    "history",
    "kept_models",
    "promote",
    "rollback",
]

RELEASES = "releases"
HISTORY = "history.jsonl"
_INCOMING = ".incoming"
_LOCK = "lock"


@dataclass(frozen=True)
class Release:
    """One change of the served model: ``action`` (promote or rollback), the ``model`` served
    from then on, the one it ``replaced``, where the new one came from, who and why."""

    time: str
    action: str
    model: str
    replaced: str
    source: str
    by: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return dict(self.__dict__)


def _folder(live: Path) -> Path:
    return live / RELEASES


def marker(live: Path) -> tuple[int, int]:
    """What changes when the served model does: history.jsonl's size and modification time."""
    try:
        found = (_folder(live) / HISTORY).stat()
    except OSError:
        return (0, 0)
    return (found.st_size, found.st_mtime_ns)


@contextlib.contextmanager
def locked(live: Path, exclusive: bool) -> Iterator[None]:
    """Hold LIVE/releases/lock: exclusive to change the served model, shared to read it."""
    folder = _folder(live)
    private_dir(folder)
    fd = os.open(folder / _LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def history(live: Path) -> list[Release]:
    """Every change of LIVE's served model, oldest first."""
    path = _folder(live) / HISTORY
    if not path.is_file():
        return []
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            out.append(Release(**json.loads(line)))
        except (json.JSONDecodeError, TypeError) as exc:
            raise RunDirError(
                f"{path}:{number}: not a release record ({exc}); the file was edited or "
                "damaged; restore it from the run's backup"
            ) from None
    return out


def kept_models(live: Path) -> list[str]:
    """The model ids kept under LIVE/releases/ (each can be put back with rollback)."""
    folder = _folder(live)
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def _describe(run: Path) -> tuple[str, str, list[str]]:
    """A run's model, checked whole: (model id, modality, class names)."""
    from medfed.routing.bundle import TrainedFederation

    fed = TrainedFederation.load(run, "cpu")  # every file checked, as a service would load it
    assert fed.model_id is not None
    return fed.model_id, fed.modality, fed.class_names()


def _compatible(live: Path, new: Path) -> tuple[str, str]:
    """(current model id, new model id) once ``new`` may replace LIVE's model."""
    current, modality, classes = _describe(live)
    model, new_modality, new_classes = _describe(new)
    if (new_modality, new_classes) != (modality, classes):
        raise ConfigError(
            f"{new}: answers {new_modality} scans with classes {new_classes}, but {live} "
            f"answers {modality} with {classes}; one audit log holds one task's decisions and "
            "reads, so serve that run from its own directory instead"
        )
    if model == current:
        raise ConfigError(f"{new}: its model ({model}) is the one {live} already serves")
    return current, model


def _move_outputs(source: Path, target: Path) -> None:
    """Move every training output present in ``source`` into ``target`` (renames only)."""
    private_dir(target)
    for name in TRAINING_OUTPUTS:
        if (source / name).exists():
            os.replace(source / name, target / name)


def _record(live: Path, release: Release) -> Release:
    path = _folder(live) / HISTORY
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(release.to_dict(), sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(path, 0o600)
    return release


def _release(action: str, model: str, replaced: str, source: Path, reason: str) -> Release:
    when = datetime.now(UTC).isoformat(timespec="seconds")
    return Release(when, action, model, replaced, str(source.resolve()), _user(), reason)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


def _live(live: Path) -> Path:
    RunDir(live).require()
    if not RunDir(live).model_json_path.is_file():
        raise RunDirError(f"{live}: has no model to replace; serve a finished run")
    return live


def promote(live: Path, new: Path, reason: str) -> Release:
    """Serve ``new``'s model from ``live``: its training outputs copied in, the current ones
    kept under LIVE/releases/MODEL_ID/, the audit log and review kept (see the module)."""
    live, new = _live(live), Path(new)
    RunDir(new).require()
    if new.resolve() == live.resolve() or live.resolve() in new.resolve().parents:
        raise ConfigError(f"{new}: give a run directory other than {live} and outside it")
    current, model = _compatible(live, new)
    incoming = _folder(live) / _INCOMING
    with locked(live, exclusive=True):
        shutil.rmtree(incoming, ignore_errors=True)  # a change interrupted before
        private_dir(incoming)
        for name in TRAINING_OUTPUTS:  # staged in full before anything served is touched
            found = new / name
            if found.is_dir():
                shutil.copytree(found, incoming / name)
            elif found.is_file():
                shutil.copy2(found, incoming / name)
        shutil.rmtree(_folder(live) / current, ignore_errors=True)
        _move_outputs(live, _folder(live) / current)
        _move_outputs(incoming, live)
        incoming.rmdir()
        return _record(live, _release("promote", model, current, new, reason))


def rollback(live: Path, reason: str, to: str | None = None) -> Release:
    """Serve again the model LIVE served before the current one (or the kept model ``to``)."""
    live = _live(live)
    with locked(live, exclusive=True):
        current = RunDir(live).model_id()
        changes = history(live)
        if to is None:
            if not changes:
                raise ConfigError(
                    f"{live}: its model was never replaced, so there is nothing to roll back to"
                )
            to = changes[-1].replaced
        kept = _folder(live) / to
        if to == current:
            raise ConfigError(f"{live}: model {to} is the one it serves now")
        if not kept.is_dir():
            raise ConfigError(
                f"{live}: model {to} is not kept under {_folder(live)}; kept: "
                f"{', '.join(kept_models(live)) or 'none'}"
            )
        _move_outputs(live, _folder(live) / current)
        _move_outputs(kept, live)
        shutil.rmtree(kept)
        if RunDir(live).model_id() != to:
            raise RunDirError(
                f"{live}: the model put back is not {to}: LIVE/releases/{to} was changed; "
                "restore the run directory from its backup"
            )
        source = next((Path(c.source) for c in reversed(changes) if c.model == to), live)
        return _record(live, _release("rollback", to, current, source, reason))


Swapped = Callable[[str | None, str | None, str | None], Any]


class LiveModel:
    """The model a service answers with from one run directory, replaced in place when that
    directory's served model changes (:func:`promote`, :func:`rollback`).

    :meth:`current` checks LIVE/releases/history.jsonl before each scan; when it changed, the
    new model is loaded (under the shared lock) and served from then on. A replacement that
    cannot be loaded leaves the old model answering, and ``on_swap`` is told why."""

    def __init__(
        self, run: Path, fed: Any, router: Any, rule: str = "auto", device: str = "auto"
    ) -> None:
        self.run, self.rule, self.device = Path(run), rule, device
        self._model = (fed, router)
        self._marker = marker(self.run)
        self._lock = threading.Lock()
        self.problem: str | None = None
        self.on_swap: Swapped | None = None

    @classmethod
    def open(cls, run: Path, rule: str, device: str) -> LiveModel:
        """Load ``run``'s served model (under the shared lock)."""
        fed, router = _load(Path(run), rule, device)
        return cls(run, fed, router, rule, device)

    def current(self) -> tuple[Any, Any]:
        """(federation, router) to answer the next scan with."""
        now = marker(self.run)
        if now == self._marker:
            return self._model
        with self._lock:
            if now != self._marker:
                self._swap(now)
            return self._model

    def _swap(self, now: tuple[int, int]) -> None:
        before = self._model[0].model_id
        self._marker = now  # a replacement that fails is not retried until the next change
        try:
            self._model = _load(self.run, self.rule, self.device)
            self.problem = None
        except MedfedError as exc:
            self.problem = f"the replacement model could not be loaded ({exc})"
        if self.on_swap is not None:
            self.on_swap(before, self._model[0].model_id, self.problem)


def _load(run: Path, rule: str, device: str) -> tuple[Any, Any]:
    from medfed.routing.bundle import TrainedFederation
    from medfed.routing.routers import make_router

    with locked(run, exclusive=False):
        fed = TrainedFederation.load(run, device)
    return fed, make_router(rule, fed)
