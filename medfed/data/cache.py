"""Decode once: preprocessed tensors cached on disk, keyed by file content and pipeline.

The key is the SHA-256 of every byte of the scan's files plus the pipeline fingerprint, so an
edited file or a changed preprocessing option misses the cache and is decoded again; a renamed
or moved file with the same bytes still hits. Entries are safetensors files (no pickle).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from medfed.data.io import permission_denied
from medfed.errors import ConfigError, DataError

_CHUNK = 1 << 20


def default_cache_dir() -> Path:
    """``$MEDFED_CACHE``, else ``~/.cache/medfed``."""
    env = os.environ.get("MEDFED_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "medfed"


# Hashes already computed in this process, keyed by each file's path, size and modification
# time: onboarding hashes a scan for the cache key and again to find duplicates.
_HASHES: dict[tuple, str] = {}


def content_hash(files: tuple[Path, ...]) -> str:
    """SHA-256 over the bytes of the files, in order (a DICOM series hashes all its slices)."""
    try:
        stamp = tuple((str(p), st.st_size, st.st_mtime_ns) for p in files for st in [os.stat(p)])
        if stamp in _HASHES:
            return _HASHES[stamp]
        digest = hashlib.sha256()
        for path in files:
            digest.update(path.name.encode() if len(files) > 1 else b"")
            with open(path, "rb") as handle:
                while chunk := handle.read(_CHUNK):
                    digest.update(chunk)
    except PermissionError as exc:
        raise DataError(permission_denied(Path(exc.filename or files[0]))) from exc
    except OSError as exc:
        raise DataError(f"{exc.filename or files[0]}: cannot be read ({exc.strerror})") from exc
    _HASHES[stamp] = digest.hexdigest()
    return _HASHES[stamp]


def writable_folder(folder: Path, what: str = "cache folder") -> Path:
    """``folder``, created if needed; ConfigError naming it when it cannot be written."""
    folder = Path(folder).expanduser()
    hint = "pass --cache-dir with a folder you can write to (or set MEDFED_CACHE)"
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{what} {folder} is a file, not a folder; {hint}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise ConfigError(
            f"{what} {folder} cannot be written ({exc.strerror or exc}); {hint}"
        ) from exc
    return folder


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0


class TensorCache:
    """A folder of preprocessed tensors. ``None`` as folder keeps everything in memory only."""

    def __init__(self, folder: Path | None) -> None:
        """ConfigError naming ``folder`` when it cannot be created or written."""
        self.folder = writable_folder(folder) if folder is not None else None
        self.stats = CacheStats()
        self._memory: dict[str, torch.Tensor] = {}

    def _path(self, key: str) -> Path:
        assert self.folder is not None
        return self.folder / key[:2] / f"{key}.safetensors"

    def get(self, key: str) -> torch.Tensor | None:
        if key in self._memory:
            self.stats.hits += 1
            return self._memory[key]
        if self.folder is not None:
            path = self._path(key)
            if path.is_file():
                try:
                    tensor = load_file(path)["image"]
                except (SafetensorError, KeyError, OSError):
                    path.unlink(missing_ok=True)  # a half-written entry: recompute it
                else:
                    self._memory[key] = tensor
                    self.stats.hits += 1
                    return tensor
        self.stats.misses += 1
        return None

    def put(self, key: str, tensor: torch.Tensor) -> None:
        self._memory[key] = tensor
        if self.folder is None:
            return
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Write then rename, so a killed process never leaves a truncated entry under the key.
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        except OSError as exc:
            raise ConfigError(
                f"cache folder {self.folder} cannot be written ({exc.strerror or exc}); pass "
                "--cache-dir with a folder you can write to (or set MEDFED_CACHE)"
            ) from exc
        os.close(fd)
        try:
            save_file({"image": tensor.contiguous()}, tmp)
            os.replace(tmp, path)
        except OSError as exc:
            raise ConfigError(
                f"cache folder {self.folder}: writing {path.name} failed ({exc}); free some "
                "space there or pass --cache-dir with another folder"
            ) from exc
        finally:
            Path(tmp).unlink(missing_ok=True)


def cache_key(files: tuple[Path, ...], fingerprint: str) -> str:
    return hashlib.sha256(f"{content_hash(files)}:{fingerprint}".encode()).hexdigest()
