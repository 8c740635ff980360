"""Memory of a loaded site: peak RSS and the bytes its tensors hold, cold and warm cache.

A synthetic CT site (the ``ct_nifti`` site of :mod:`medfed.data.synth`, at its manifest's
[preprocess] shape) is written once, then loaded twice, each time in a fresh Python process
so that the peak resident set size is that of the load alone: first with an empty cache
(every volume decoded, the per-scan entries and the stacked split files written), then with
the cache that load left (the stacked splits memory-mapped). The loading process reads every
scan once after loading, as a training epoch would, so mapped pages count in its RSS.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import tomli_w

from medfed.core.errors import MedfedError

CT_SITE = "ct_nifti"  # the NIfTI layout: the quickest synthetic CT site to write and read
_MANIFEST = "site.toml"


@dataclass(frozen=True)
class LoadMemory:
    """One load of the site in a fresh process."""

    peak_rss_bytes: int  # peak RSS of the loading process, start to end
    import_rss_bytes: int  # peak RSS once medfed and torch were imported, before loading
    site_bytes: int  # bytes of the site's split tensors, each held once
    mapped: bool  # every split tensor is backed by its stacked cache file
    cache_hits: int
    cache_misses: int
    seconds: float


@dataclass(frozen=True)
class SiteMemory:
    """Peak RSS and tensor bytes of loading one synthetic CT site, cold and warm."""

    patients: int
    input_shape: list[int]
    storage_dtype: str
    float32_bytes: int  # one float32 copy of the site's scans (before, two were held)
    cold: LoadMemory
    warm: LoadMemory

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def site_memory(
    n_patients: int = 500, *, workdir: str | Path | None = None, seed: int = 0
) -> SiteMemory:
    """Write a CT site of ``n_patients`` and measure loading it with a cold, then a warm cache.

    ``workdir``: where the site and its cache are written (a temporary folder, removed
    afterwards, when None).
    """
    if n_patients < 4:
        raise ValueError("n_patients must be at least 4 (a train and a test split per class)")
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="medfed-memory-") as tmp:
            return _measure(Path(tmp), n_patients, seed)
    return _measure(Path(workdir), n_patients, seed)


def _measure(workdir: Path, n_patients: int, seed: int) -> SiteMemory:
    return _measured(write_ct_site(workdir / "data", n_patients, seed), workdir / "cache")


def _measured(manifest: Path, cache: Path) -> SiteMemory:
    cold = _load_in_subprocess(manifest, cache)
    warm = _load_in_subprocess(manifest, cache)
    shape = [int(d) for d in warm["shape"]]
    return SiteMemory(
        patients=int(warm["scans"]),
        input_shape=shape,
        storage_dtype=str(warm["dtype"]),
        float32_bytes=4 * math.prod(shape) * int(warm["scans"]),
        cold=LoadMemory(**cold["load"]),
        warm=LoadMemory(**warm["load"]),
    )


def write_ct_site(out: Path, n_patients: int, seed: int = 0) -> Path:
    """Write only the synthetic ``ct_nifti`` site under ``out``; return its manifest's path."""
    from medfed.data.synth import CT_SITES

    site = next(s for s in CT_SITES if s.id == CT_SITE)
    out.mkdir(parents=True, exist_ok=True)
    site.write(out, n_patients, seed, 1.0)
    table = site.manifest(seed, 1.0)
    table["root"] = str((out / site.folder).resolve())
    path = out / _MANIFEST
    path.write_text(tomli_w.dumps(table), encoding="utf-8")
    return path


FUNDUS_SITE = "acrima"  # a flat folder of JPEGs: the quickest synthetic fundus site to write


def write_fundus_site(out: Path, n_scans: int, image_size: int, seed: int = 0) -> Path:
    """Write only the synthetic ``acrima`` site under ``out``, photos ``image_size`` px high and
    a manifest that trains at ``image_size`` px; return the manifest's path."""
    from medfed.data.synth import FUNDUS_SITES

    site = next(s for s in FUNDUS_SITES if s.id == FUNDUS_SITE)
    scale = image_size / site.camera.height
    out.mkdir(parents=True, exist_ok=True)
    site.write(out, n_scans, seed, scale)
    table = site.manifest(seed, scale)
    table["root"] = str((out / site.folder).resolve())
    table.setdefault("preprocess", {})["image_size"] = image_size
    path = out / _MANIFEST
    path.write_text(tomli_w.dumps(table), encoding="utf-8")
    return path


def fundus_site_memory(
    n_scans: int = 5000, image_size: int = 224, *, workdir: str | Path | None = None, seed: int = 0
) -> SiteMemory:
    """Write a fundus site of ``n_scans`` photos and measure loading it at ``image_size`` px
    with a cold, then a warm cache (each in a fresh process, every scan read once after)."""
    if n_scans < 8:
        raise ValueError("n_scans must be at least 8 (a train and a test split per class)")
    with tempfile.TemporaryDirectory(prefix="medfed-memory-", dir=workdir) as tmp:
        manifest = write_fundus_site(Path(tmp) / "data", n_scans, image_size, seed)
        return _measured(manifest, Path(tmp) / "cache")


def _load_in_subprocess(manifest: Path, cache: Path) -> dict[str, Any]:
    command = [sys.executable, "-m", "medfed.experiments.memory", str(manifest), str(cache)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise MedfedError(
            f"loading {manifest} in a separate process failed (exit {done.returncode}):\n"
            f"{done.stderr.strip()[-2000:]}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _peak_rss_bytes() -> int:
    """This process's peak RSS since it started its program.

    Linux keeps ``ru_maxrss`` across fork and exec, so a process started by a large one (the
    bench, after training) would report its parent's size; VmHWM is this program's own peak.
    """
    import resource

    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text(encoding="utf-8").splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024  # Linux counts KiB


def _file_backed(ptr: int, folder: Path) -> bool:
    """Whether address ``ptr`` lies in a mapping of a file under ``folder`` (Linux only)."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return False
    root = str(folder.resolve())
    for line in maps.read_text().splitlines():
        parts = line.split(maxsplit=5)
        start, end = (int(v, 16) for v in parts[0].split("-"))
        if start <= ptr < end:
            return len(parts) == 6 and parts[5].startswith(root)
    return False


def _load(manifest: Path, cache_dir: Path) -> dict[str, Any]:
    """Load the site once (in this process) and report its figures."""
    import time

    from medfed.config import load_manifest
    from medfed.data.cache import TensorCache
    from medfed.data.sitedata import load_site

    site_manifest = load_manifest(manifest)
    imported = _peak_rss_bytes()
    start = time.perf_counter()
    site = load_site(site_manifest, TensorCache(cache_dir))
    for view in site.x.values():  # read every scan once, normalized, as an epoch does
        for first in range(0, len(view), 64):
            float(view[first : first + 64].sum())
    seconds = time.perf_counter() - start
    tensors = [t for t in site.raw.values() if t.numel()]
    stored = tensors[0]
    load = LoadMemory(
        peak_rss_bytes=_peak_rss_bytes(),
        import_rss_bytes=imported,
        site_bytes=site.nbytes(),
        mapped=all(_file_backed(t.untyped_storage().data_ptr(), cache_dir) for t in tensors),
        cache_hits=site.cache_hits,
        cache_misses=site.cache_misses,
        seconds=round(seconds, 3),
    )
    return {
        "load": asdict(load),
        "scans": sum(int(t.shape[0]) for t in site.raw.values()),
        "shape": list(stored.shape[1:]),
        "dtype": str(stored.dtype).removeprefix("torch."),
    }


def _main(argv: list[str]) -> int:
    manifest, cache = (Path(a) for a in argv)
    print(json.dumps(_load(manifest, cache)))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
