"""Decode once: preprocessed tensors cached on disk, keyed by file content and pipeline.

The key is the SHA-256 of every byte of the scan's files plus the pipeline fingerprint, so an
edited file or a changed preprocessing option misses the cache and is decoded again; a renamed
or moved file with the same bytes still hits. Entries are safetensors files (no pickle).

A loaded site is held from a second kind of entry: one stacked file per site split, keyed by
the ordered keys of its scans, written once and then memory-mapped (``torch.load(mmap=True,
weights_only=True)``), so the split's tensor *is* the file's pages and nothing is copied.
Each stacked file carries the SHA-256 of its data, checked on opening: a damaged or truncated
file is deleted and rebuilt from the per-scan entries, never used.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator, Sequence
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
    """A folder of preprocessed tensors. ``None`` as folder keeps nothing: every load decodes.

    Nothing is kept in memory: a per-scan entry is read from disk when asked for, and a stacked
    split is handed out memory-mapped, so the caller's tensor is the only copy.
    """

    def __init__(self, folder: Path | None) -> None:
        """ConfigError naming ``folder`` when it cannot be created or written."""
        self.folder = writable_folder(folder) if folder is not None else None
        self.stats = CacheStats()

    def _path(self, key: str) -> Path:
        assert self.folder is not None
        return self.folder / key[:2] / f"{key}.safetensors"

    def _stack_path(self, key: str) -> Path:
        assert self.folder is not None
        return self.folder / "stacks" / key[:2] / f"{key}.pt"

    def get(self, key: str) -> torch.Tensor | None:
        if self.folder is not None:
            path = self._path(key)
            if path.is_file():
                try:
                    tensor = load_file(path)["image"]
                except (SafetensorError, KeyError, OSError):
                    path.unlink(missing_ok=True)  # a half-written entry: recompute it
                else:
                    self.stats.hits += 1
                    return tensor
        self.stats.misses += 1
        return None

    def put(self, key: str, tensor: torch.Tensor) -> None:
        if self.folder is None:
            return
        path = self._path(key)
        with self._writing(path) as tmp:
            save_file({"image": tensor.contiguous()}, tmp)

    def get_stack(self, key: str, rows: int, dtype: torch.dtype) -> torch.Tensor | None:
        """The stacked split ``key`` memory-mapped, if a sound one of ``rows`` scans in ``dtype``
        is on disk (each of its scans counts as a hit); None otherwise."""
        if self.folder is None:
            return None
        path = self._stack_path(key)
        if not path.is_file():
            return None
        tensor = _open_stack(path, key, rows, dtype)
        if tensor is None:
            path.unlink(missing_ok=True)  # damaged or truncated: rebuilt by the caller
            return None
        self.stats.hits += rows
        return tensor

    def put_stack(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        """Store a stacked split and return it memory-mapped from its file (``tensor`` itself
        without a folder); the caller drops ``tensor`` to keep a single copy."""
        if self.folder is None:
            return tensor
        path = self._stack_path(key)
        tensor = tensor.contiguous()
        with self._writing(path) as tmp:
            torch.save({"image": tensor, "key": key, "sha256": data_digest(tensor)}, tmp)
        mapped = _open_stack(path, key, int(tensor.shape[0]), tensor.dtype)
        if mapped is None:
            raise ConfigError(
                f"cache folder {self.folder}: {path.name} reads back different from what was "
                "written; check the disk, or pass --cache-dir with another folder"
            )
        return mapped

    @contextlib.contextmanager
    def _writing(self, path: Path) -> Iterator[str]:
        """A temporary file next to ``path``, renamed onto it once written: a killed process
        never leaves a truncated entry under the key."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        except OSError as exc:
            raise ConfigError(
                f"cache folder {self.folder} cannot be written ({exc.strerror or exc}); pass "
                "--cache-dir with a folder you can write to (or set MEDFED_CACHE)"
            ) from exc
        os.close(fd)
        try:
            yield tmp
            os.replace(tmp, path)
        except (OSError, RuntimeError) as exc:  # torch.save reports a failed write as RuntimeError
            raise ConfigError(
                f"cache folder {self.folder}: writing {path.name} failed ({exc}); free some "
                "space there or pass --cache-dir with another folder"
            ) from exc
        finally:
            Path(tmp).unlink(missing_ok=True)


def data_digest(tensor: torch.Tensor) -> str:
    """SHA-256 of a contiguous CPU tensor's bytes."""
    return hashlib.sha256(tensor.reshape(-1).view(torch.uint8).numpy()).hexdigest()


def _open_stack(path: Path, key: str, rows: int, dtype: torch.dtype) -> torch.Tensor | None:
    """The tensor of a stacked file, mapped, or None when the file is not sound: unreadable or
    truncated, another key's, another shape or dtype, or bytes that fail the digest."""
    try:
        entry = torch.load(path, mmap=True, weights_only=True, map_location="cpu")
    except Exception:  # any failure to read a cache entry means: rebuild it
        return None
    if not isinstance(entry, dict) or entry.get("key") != key:
        return None
    tensor = entry.get("image")
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != dtype:
        return None
    if tensor.dim() < 2 or tensor.shape[0] != rows or not tensor.is_contiguous():
        return None
    if entry.get("sha256") != data_digest(tensor):
        return None
    return tensor


def stack_key(scan_keys: Sequence[str]) -> str:
    """The key of a stacked split: its scans' keys (content + pipeline), in order."""
    return hashlib.sha256("\n".join(["stack", *scan_keys]).encode()).hexdigest()


def scan_key(content: str, fingerprint: str) -> str:
    """The key of one scan's entry: its content hash and the pipeline fingerprint."""
    return hashlib.sha256(f"{content}:{fingerprint}".encode()).hexdigest()


def cache_key(files: tuple[Path, ...], fingerprint: str) -> str:
    return scan_key(content_hash(files), fingerprint)
