"""Copies of uploaded scans, kept with the run so that every routed scan can be read.

An upload exists only in the browser and a temporary folder while it is routed, so the audit log
(which keeps a hash, never the image) would leave the Review page nothing to show. The upload's
bytes are kept as ``RUN/review/scans/<sha256>/<name>``, inside the run directory like the audit
log, under the same access rules; a kept copy is shown only while its bytes still hash to the
logged SHA-256.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from medfed.core.fileio import private_dir, private_file

__all__ = ["KEPT_FOLDER", "keep_scan", "keep_series", "kept_scan"]

KEPT_FOLDER = Path("review") / "scans"
"""Where, in a run directory, uploaded scans are kept (one folder per SHA-256)."""
_CHUNK = 1 << 20


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _folder(run_dir: str | Path, sha256: str) -> Path | None:
    """The scan's folder, or None for a digest that is no SHA-256 (it must not name a path)."""
    if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
        return None
    return Path(run_dir) / KEPT_FOLDER / sha256


def keep_scan(run_dir: str | Path, path: str | Path, sha256: str, name: str) -> Path | None:
    """Keep a copy of the single-file scan at ``path`` (routed with ``sha256``) in the run, as
    ``name``; the kept file, or None when it cannot be kept (no digest, or other bytes)."""
    folder = _folder(run_dir, sha256)
    if folder is None or not Path(path).is_file() or _sha256(Path(path)) != sha256:
        return None
    found = kept_scan(run_dir, sha256)
    if found is not None:
        return found
    private_dir(folder)
    target = folder / (Path(name).name or "scan")
    partial = folder / f".{target.name}.partial"
    shutil.copyfile(path, partial)
    private_file(partial)
    os.replace(partial, target)  # a reader never sees half a copy
    return target


def keep_series(run_dir: str | Path, series: str | Path, sha256: str) -> Path | None:
    """Keep a copy of the DICOM series folder ``series`` (routed with ``sha256``, the hash of
    its slices) in the run as ``RUN/review/scans/<sha256>/series/``; the kept folder, or None
    when it cannot be kept (no digest, no folder, or other slices)."""
    from medfed.data.cache import content_hash  # imports torch: only when a series is kept
    from medfed.routing.scans import read_scan

    folder = _folder(run_dir, sha256)
    if folder is None or not Path(series).is_dir():
        return None
    found = kept_scan(run_dir, sha256)
    if found is not None:
        return found
    private_dir(folder)
    partial = folder / ".series.partial"
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(series, partial, copy_function=_private_copy)
    if content_hash(read_scan(partial).files) != sha256:
        shutil.rmtree(partial, ignore_errors=True)
        return None
    os.replace(partial, folder / "series")  # a reader never sees half a series
    return folder / "series"


def kept_scan(run_dir: str | Path, sha256: str) -> Path | None:
    """The kept copy of the scan routed with ``sha256`` (a file, or a series folder), or None
    when none is kept."""
    folder = _folder(run_dir, sha256)
    if folder is None or not folder.is_dir():
        return None
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    if files:
        return files[0]
    return folder / "series" if (folder / "series").is_dir() else None


def _private_copy(source: str, target: str) -> str:
    """shutil's copy of one file, made owner-only (a kept scan is patient data)."""
    shutil.copy2(source, target)
    private_file(Path(target))
    return target
