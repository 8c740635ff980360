"""Decode once: preprocessed tensors cached on disk, keyed by file content and pipeline.

The key is the SHA-256 of every byte of the scan's files plus the pipeline fingerprint, so an
edited file or a changed preprocessing option misses the cache and is decoded again; a renamed
or moved file with the same bytes still hits. Entries are safetensors files (no pickle).

A loaded site is held from a second kind of entry: one stacked file per site split, keyed by
the ordered keys of its scans, at the training resolution, memory-mapped: the split's tensor
*is* the file's pages and nothing is copied. A cold load writes the scans row by row straight
into the new file's pages (:class:`StackWriter`), so even then the split is never held in
anonymous memory: the kernel can write those pages back and drop them under pressure, which a
5,000-scan site at 224 px (1.5 GB in float16) would otherwise keep resident. The file is a
4 KiB JSON header (key, dtype, shape, SHA-256 of the data) then the raw rows; the digest is
checked on opening: a damaged or truncated file is deleted and rebuilt from the per-scan
entries, never used.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from medfed.core.errors import ConfigError, DataError
from medfed.data.io import permission_denied

_CHUNK = 1 << 20
_STACK_MAGIC = b"medfed-stack 1\n"
_STACK_HEADER = 4096  # bytes before the rows: the magic line, then JSON, padded with spaces


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
        self._counting = threading.Lock()  # scans are decoded on several threads at once

    def _count(self, hits: int = 0, misses: int = 0) -> None:
        with self._counting:
            self.stats.hits += hits
            self.stats.misses += misses

    def _path(self, key: str) -> Path:
        assert self.folder is not None
        return self.folder / key[:2] / f"{key}.safetensors"

    def _stack_path(self, key: str) -> Path:
        assert self.folder is not None
        return self.folder / "stacks" / key[:2] / f"{key}.stack"

    def get(self, key: str) -> torch.Tensor | None:
        if self.folder is not None:
            path = self._path(key)
            if path.is_file():
                try:
                    tensor = load_file(path)["image"]
                except (SafetensorError, KeyError, OSError):
                    path.unlink(missing_ok=True)  # a half-written entry: recompute it
                else:
                    self._count(hits=1)
                    return tensor
        self._count(misses=1)
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
        self._count(hits=rows)
        return tensor

    def stack_writer(
        self, key: str, rows: int, row_shape: Sequence[int], dtype: torch.dtype
    ) -> StackWriter:
        """A stacked split of ``rows`` scans to fill row by row (in memory without a folder)."""
        return StackWriter(self, key, rows, tuple(int(d) for d in row_shape), dtype)

    def put_stack(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        """Store a stacked split and return it memory-mapped from its file (``tensor`` itself
        without a folder)."""
        writer = self.stack_writer(key, int(tensor.shape[0]), tensor.shape[1:], tensor.dtype)
        try:
            writer.rows.copy_(tensor)
            return writer.finish()
        finally:
            writer.discard()

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


class StackWriter:
    """One stacked split being written: ``rows`` is the new file's pages, mapped (a plain tensor
    when the cache has no folder); :meth:`finish` seals it under its key and returns it mapped
    for reading, :meth:`discard` drops an unfinished one."""

    def __init__(
        self, cache: TensorCache, key: str, rows: int, row_shape: tuple[int, ...], dtype
    ) -> None:
        self.cache, self.key, self.shape, self.dtype = cache, key, (rows, *row_shape), dtype
        self._tmp: Path | None = None
        if cache.folder is None:
            self.rows = torch.empty(self.shape, dtype=dtype)
            return
        path = cache._stack_path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            self._tmp = Path(tmp)
            with os.fdopen(fd, "wb") as handle:
                handle.truncate(_STACK_HEADER + _nbytes(self.shape, dtype))
            self._map = np.memmap(
                tmp, dtype=_numpy_dtype(dtype), mode="r+", offset=_STACK_HEADER, shape=self.shape
            )
        except OSError as exc:
            self.discard()
            raise ConfigError(
                f"cache folder {cache.folder} cannot be written ({exc.strerror or exc}); free "
                "some space there or pass --cache-dir with another folder"
            ) from exc
        self.rows = torch.from_numpy(self._map)

    def finish(self) -> torch.Tensor:
        """The filled split, sealed under its key and mapped again read-only."""
        if self._tmp is None:
            return self.rows
        digest = data_digest(self.rows)
        self._map.flush()
        del self.rows, self._map  # the writable mapping goes before the file is read back
        header = {"key": self.key, "dtype": str(self.dtype), "shape": list(self.shape)}
        header["sha256"] = digest
        path = self.cache._stack_path(self.key)
        try:
            with open(self._tmp, "r+b") as handle:
                handle.write(_header_bytes(header))
            os.replace(self._tmp, path)
        except OSError as exc:
            raise ConfigError(
                f"cache folder {self.cache.folder}: writing {path.name} failed ({exc}); free "
                "some space there or pass --cache-dir with another folder"
            ) from exc
        self._tmp = None
        mapped = _open_stack(path, self.key, self.shape[0], self.dtype)
        if mapped is None:
            raise ConfigError(
                f"cache folder {self.cache.folder}: {path.name} reads back different from what "
                "was written; check the disk, or pass --cache-dir with another folder"
            )
        return mapped

    def discard(self) -> None:
        if self._tmp is not None:
            self.__dict__.pop("rows", None)
            self.__dict__.pop("_map", None)
            self._tmp.unlink(missing_ok=True)
            self._tmp = None


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty(0, dtype=dtype).numpy().dtype


def _nbytes(shape: Sequence[int], dtype: torch.dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * torch.empty(0, dtype=dtype).element_size()


def _header_bytes(header: dict) -> bytes:
    body = _STACK_MAGIC + json.dumps(header, sort_keys=True).encode()
    if len(body) > _STACK_HEADER:
        raise ConfigError(f"a stacked cache file's header is {len(body)} bytes, over 4 KiB")
    return body.ljust(_STACK_HEADER, b" ")


def data_digest(tensor: torch.Tensor) -> str:
    """SHA-256 of a contiguous CPU tensor's bytes."""
    return hashlib.sha256(tensor.reshape(-1).view(torch.uint8).numpy()).hexdigest()


def _open_stack(path: Path, key: str, rows: int, dtype: torch.dtype) -> torch.Tensor | None:
    """The tensor of a stacked file, mapped, or None when the file is not sound: unreadable or
    truncated, another key's, another shape or dtype, or bytes that fail the digest."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(_STACK_HEADER)
        if not head.startswith(_STACK_MAGIC) or len(head) < _STACK_HEADER:
            return None
        header = json.loads(head[len(_STACK_MAGIC) :].decode())
        shape = tuple(int(d) for d in header["shape"])
        if header.get("key") != key or header.get("dtype") != str(dtype):
            return None
        if len(shape) < 2 or shape[0] != rows:
            return None
        if path.stat().st_size != _STACK_HEADER + _nbytes(shape, dtype):
            return None
        # copy-on-write: the pages are the file's; nothing ever writes to them
        array = np.memmap(
            path, dtype=_numpy_dtype(dtype), mode="c", offset=_STACK_HEADER, shape=shape
        )
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None  # any failure to read a cache entry means: rebuild it
    tensor = torch.from_numpy(array)
    if header.get("sha256") != data_digest(tensor):
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
