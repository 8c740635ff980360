"""Writing a file so that a reader sees the old one or the new one, never half of it."""

from __future__ import annotations

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


def check_out_folder(path: Path, option: str = "--out") -> None:
    """Refuse an output folder that could not be made or written, before any work is done (and
    without making it: a refused command leaves nothing behind): an existing file, a file on
    the way to it, a place this user may not write to. A clear ConfigError naming ``option``."""
    from medfed.errors import ConfigError

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


def fresh_folder(folder: Path) -> Path:
    """``folder``, emptied of what an earlier run of an experiment left there (it is created
    by whoever writes into it)."""
    if folder.exists():
        shutil.rmtree(folder)
    return folder
