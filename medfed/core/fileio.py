"""Writing a file so that a reader sees the old one or the new one, never half of it."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it over ``path``.

    The file gets the permissions a plain write would give it (those of the file it replaces,
    or the user's umask), not the owner-only ones of a temporary file: a report or a summary
    is meant to be read by the study's other members."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, _mode_for(path))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _mode_for(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


# Patient data at rest (scans, answers, the audit and PACS logs): owner-only.
PRIVATE_FILE, PRIVATE_DIR = 0o600, 0o700
PRIVATE_UMASK = 0o077


def private_dir(path: Path) -> Path:
    """``path`` as an owner-only folder (made with its missing parents, each owner-only)."""
    path = Path(path)
    missing = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for folder in reversed(missing):
        folder.mkdir(mode=PRIVATE_DIR, exist_ok=True)
        folder.chmod(PRIVATE_DIR)  # mkdir's mode is cut by the umask
    if path.is_dir() and not missing:
        path.chmod(PRIVATE_DIR)
    return path


def private_file(path: Path) -> Path:
    """Make the file at ``path`` owner-only (it exists); returns it."""
    os.chmod(path, PRIVATE_FILE)
    return Path(path)


def new_private_file(path: Path) -> None:
    """Create ``path`` empty and owner-only unless it exists (a database about to be opened:
    SQLite gives its journal, WAL and shared-memory files the database file's mode)."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, PRIVATE_FILE))


def keep_private(*paths: Path) -> None:
    """For a service that writes patient data: every file it makes from now on owner-only
    (umask 077), and what ``paths`` already hold (folders and files) made owner-only too (data
    an older version left readable by others)."""
    os.umask(PRIVATE_UMASK)
    for path in paths:
        path = Path(path)
        if path.is_file():
            private_file(path)
        elif path.is_dir():
            path.chmod(PRIVATE_DIR)
            for root, dirs, files in os.walk(path):
                for name in dirs:
                    os.chmod(os.path.join(root, name), PRIVATE_DIR)
                for name in files:
                    os.chmod(os.path.join(root, name), PRIVATE_FILE)


def check_out_folder(path: Path, option: str = "--out") -> None:
    """Refuse an output folder that could not be made or written, before any work is done (and
    without making it: a refused command leaves nothing behind): an existing file, a file on
    the way to it, a place this user may not write to. A clear ConfigError naming ``option``."""
    from medfed.core.errors import ConfigError

    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{option} {path} is an existing file; give a folder (new or existing)")
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(
            f"{option} {path}: {existing} is an existing file, so the folder cannot be made "
            "there; choose another path"
        )
    try:
        with tempfile.TemporaryFile(dir=existing):  # can files be written there?
            pass
    except OSError as exc:
        raise ConfigError(
            f"{option} {path}: the folder cannot be written ({exc.strerror or exc}); "
            "choose a folder this user can write to"
        ) from None


# A run folder's own records (docs/architecture.md, "The run folder"): at its top, these files;
# below it, everything in these folders. Only training and the run's readers (through
# medfed.runs and the audit log) write them; no output option of any command may name one.
RUN_FILES = frozenset(
    {"config.toml", "metrics.jsonl", "events.jsonl", "summary.json", "predictions.csv"}
    | {f"audit.sqlite{tail}" for tail in ("", "-journal", "-wal", "-shm")}
)
RUN_FOLDERS = frozenset({"checkpoints", "model", "site_overview", "warmup"})
_RUN_RECORDS = ("metrics.jsonl", "events.jsonl", "summary.json")


def run_folder_of(path: Path) -> Path | None:
    """The run folder ``path`` is or lies in (resolved), or None: the nearest folder, ``path``
    included, with a config.toml beside a metrics.jsonl, events.jsonl or summary.json."""
    for folder in (p := Path(path).resolve(), *p.parents):
        if (folder / "config.toml").is_file() and any(
            (folder / name).exists() for name in _RUN_RECORDS
        ):
            return folder
    return None


def check_not_in_run(path: Path, option: str = "--out", *, may_be_run: bool = False) -> None:
    """Refuse an output folder that is a run folder or lies inside one (with ``may_be_run``,
    only one inside: training writes, and resumes, its own run): what the command writes there
    would mix with the run's records and replace some of them."""
    from medfed.core.errors import ConfigError

    path = Path(path)
    run = run_folder_of(path)
    if run is None or (may_be_run and run == path.resolve()):
        return
    where = "is the run folder" if run == path.resolve() else "lies inside the run folder"
    raise ConfigError(
        f"{option} {path} {where} {run}: what this command writes would replace that run's "
        "files; choose a folder outside every run folder"
    )


def check_out_file(path: Path, option: str = "--out") -> None:
    """Refuse an output file that could not be written (see :func:`check_out_folder`, for its
    folder) or that is one of a run's own records (:data:`RUN_FILES`, a file in a run's
    model/ or checkpoints/): ``medfed review RUN --export RUN/summary.json`` would otherwise
    replace the run's figures with a reads sheet. A ConfigError naming ``option``."""
    from medfed.core.errors import ConfigError

    path = Path(path)
    check_out_folder(path.parent, f"{option} {path}: its folder")
    # the path as named, and the file it leads to when it is a link
    for candidate in (path.parent.resolve() / path.name, path.resolve()):
        run = run_folder_of(candidate.parent)
        if run is None:
            continue
        inside = candidate.relative_to(run).parts
        if (len(inside) == 1 and inside[0] in RUN_FILES) or (
            len(inside) > 1 and inside[0] in RUN_FOLDERS
        ):
            raise ConfigError(
                f"{option} {path} is one of the run {run}'s own files "
                f"({'/'.join(inside)}): writing it would replace the run's record; choose a "
                "file outside the run's records (another name, or another folder)"
            )


def fresh_folder(folder: Path) -> Path:
    """``folder``, emptied of what an earlier run of an experiment left there (it is created
    by whoever writes into it)."""
    if folder.exists():
        shutil.rmtree(folder)
    return folder
