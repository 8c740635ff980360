"""A loaded site is held once: in the cache's storage dtype, memory-mapped from its stacked
cache file, and normalized batch by batch as the model reads it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from medfed.config import Modality, load_manifest
from medfed.data import preprocess, sitedata
from medfed.data.cache import TensorCache
from medfed.data.modality import read_record
from medfed.data.preprocess import (
    STORAGE_TOLERANCE,
    NormalizedView,
    apply_pipeline,
    pipeline_fingerprint,
    storage_dtype,
)
from medfed.data.records import Split
from medfed.data.sitedata import SiteData, load_site
from medfed.experiments.memory import write_ct_site
from medfed.models.device import DeviceSetup

N_CT = 6


@pytest.fixture
def ct_manifest(tmp_path: Path):
    return load_manifest(write_ct_site(tmp_path / "ct", N_CT))


@pytest.fixture
def fundus_manifest(make_acrima_site, site_manifest):
    names = [f"Im{i:03d}_g_ACRIMA.jpg" if i % 2 else f"Im{i:03d}_ACRIMA.jpg" for i in range(12)]
    return site_manifest("acrima", make_acrima_site(names))


def _mapped_file(tensor: torch.Tensor) -> str | None:
    """The file whose mapping holds ``tensor``'s storage, or None (anonymous memory)."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("needs /proc/self/maps (Linux) to see what memory is file-backed")
    ptr = tensor.untyped_storage().data_ptr()
    for line in maps.read_text().splitlines():
        parts = line.split(maxsplit=5)
        start, end = (int(v, 16) for v in parts[0].split("-"))
        if start <= ptr < end:
            return parts[5] if len(parts) == 6 else None
    return None


def _tensors_in(value: object, seen: set[int] | None = None) -> list[torch.Tensor]:
    """Every tensor reachable from ``value`` through containers and object attributes."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return []
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        children = [*value.keys(), *value.values()]
    elif isinstance(value, list | tuple | set):
        children = list(value)
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        children = list(vars(value).values())
    else:
        children = []
    return [t for child in children for t in _tensors_in(child, seen)]


def _old_float32_path(site: SiteData, split: Split) -> tuple[torch.Tensor, torch.Tensor]:
    """The split as the float32 pipeline made it, and normalized as it was before: statistics
    of the float32 training split, then the whole split normalized at once."""

    def stacked(s: Split) -> torch.Tensor:
        m = site.manifest
        return torch.stack(
            [
                apply_pipeline(m.modality, m.preprocess, read_record(r, m.modality))
                for r in site.records[s]
            ]
        )

    train = stacked(Split.TRAIN).double()
    dims = [0, *range(2, train.dim())]
    shape = (1, -1) + (1,) * (train.dim() - 2)
    mean = train.mean(dim=dims).float().view(shape)
    std = train.std(dim=dims).clamp_min(1e-6).float().view(shape)
    raw = stacked(split)
    return raw, (raw - mean) / std


def test_a_loaded_site_is_held_once_mapped_from_its_stacked_cache_file(ct_manifest, tmp_path):
    cache_dir = tmp_path / "cache"
    load_site(ct_manifest, TensorCache(cache_dir))  # cold: decodes and writes the stacks
    cache = TensorCache(cache_dir)
    site = load_site(ct_manifest, cache)

    assert site.cache_misses == 0 and site.cache_hits == N_CT
    stacks = cache_dir / "stacks"
    for split, stored in site.raw.items():
        if stored.shape[0]:
            path = _mapped_file(stored)
            assert path is not None and Path(path).is_relative_to(stacks.resolve()), split
        view = site.x[split]
        assert isinstance(view, NormalizedView) and view.stored is stored
    # no float32 (or any other) copy of the scans anywhere in the site, nor in the cache
    floating = [t for t in _tensors_in(dataclasses.asdict(site)) if t.is_floating_point()]
    assert {t.dtype for t in floating} == {torch.float16}
    assert sum(t.numel() * t.element_size() for t in floating) == site.nbytes()
    assert _tensors_in(cache) == []


def test_the_cache_keeps_no_per_scan_copy_after_a_cold_load(ct_manifest, tmp_path):
    cache = TensorCache(tmp_path / "cache")

    site = load_site(ct_manifest, cache)

    assert site.cache_misses == N_CT
    assert _tensors_in(cache) == []
    assert all(_mapped_file(t) is not None for t in site.raw.values() if t.shape[0])


def test_a_cache_without_folder_holds_the_stacked_split_only(ct_manifest):
    site = load_site(ct_manifest, TensorCache(None))

    assert site.raw[Split.TRAIN].dtype == torch.float16
    assert site.x[Split.TRAIN].stored is site.raw[Split.TRAIN]


@pytest.mark.parametrize("modality", [Modality.CT, Modality.FUNDUS])
def test_scans_are_stored_in_the_documented_dtype_within_its_tolerance(
    modality, ct_manifest, fundus_manifest, tmp_path
):
    manifest = ct_manifest if modality == Modality.CT else fundus_manifest
    cache_dir = tmp_path / "cache"

    site = load_site(manifest, TensorCache(cache_dir))

    assert storage_dtype(modality) == preprocess.STORAGE_DTYPE[modality] == torch.float16
    assert all(t.dtype == torch.float16 for t in site.raw.values())
    entry = next(p for p in cache_dir.glob("*/*.safetensors"))
    assert load_file(entry)["image"].dtype == torch.float16
    for split in Split:
        if not site.n(split):
            continue
        raw32, _ = _old_float32_path(site, split)
        error = (site.raw[split].float() - raw32).abs().max()
        assert float(error) <= STORAGE_TOLERANCE


def test_the_storage_dtype_is_part_of_the_pipeline_fingerprint(ct_manifest, monkeypatch):
    before = pipeline_fingerprint(ct_manifest)

    monkeypatch.setitem(preprocess.STORAGE_DTYPE, Modality.CT, torch.float32)

    assert pipeline_fingerprint(ct_manifest) != before


@pytest.mark.parametrize("modality", [Modality.CT, Modality.FUNDUS])
def test_normalized_batches_equal_the_old_float32_path_within_the_storage_tolerance(
    modality, ct_manifest, fundus_manifest, tmp_path
):
    manifest = ct_manifest if modality == Modality.CT else fundus_manifest
    site = load_site(manifest, TensorCache(tmp_path / "cache"))
    tolerance = 4 * STORAGE_TOLERANCE / min(site.normalization.std)

    for split in (Split.TRAIN, Split.TEST):
        _, old = _old_float32_path(site, split)
        view = site.x[split]
        index = torch.tensor([len(view) - 1, 0])
        for got, want in [
            (view[:], old),
            (view[1:3], old[1:3]),
            (view[index], old[index]),
            (view[-1], old[-1]),
        ]:
            assert got.dtype == torch.float32 and got.shape == want.shape
            assert float((got - want).abs().max()) <= tolerance
        assert view.shape == old.shape and len(view) == old.shape[0]


def test_a_view_moves_its_stored_tensor_and_normalizes_on_arrival(ct_manifest):
    site = load_site(ct_manifest, TensorCache(None))
    view = site.x[Split.TRAIN]

    moved = view.to("cpu")
    kept = DeviceSetup(torch.device("cpu"), None).put(view)

    assert moved.stored.dtype == torch.float16 and kept is view
    assert torch.equal(moved[:], view[:])
    assert torch.equal(torch.cat([view, view]), torch.cat([view[:], view[:]]))


@pytest.mark.parametrize("damage", ["truncated", "flipped byte", "empty"])
def test_a_damaged_stacked_file_is_rebuilt_never_used(damage, ct_manifest, tmp_path, monkeypatch):
    cache_dir = tmp_path / "cache"
    first = load_site(ct_manifest, TensorCache(cache_dir))
    expected = {s: t.clone() for s, t in first.raw.items()}
    stack = max((cache_dir / "stacks").glob("*/*.stack"), key=lambda p: p.stat().st_size)
    data = bytearray(stack.read_bytes())
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "flipped byte":
        data[len(data) // 2] ^= 0xFF
    else:
        data = bytearray()
    stack.write_bytes(bytes(data))
    decodes = []
    real = sitedata.read_record
    monkeypatch.setattr(sitedata, "read_record", lambda r, m: decodes.append(r) or real(r, m))

    again = load_site(ct_manifest, TensorCache(cache_dir))

    assert decodes == []  # rebuilt from the per-scan entries
    assert all(torch.equal(again.raw[s], expected[s]) for s in Split)
    assert stack.read_bytes() != bytes(data)  # written afresh
    third = load_site(ct_manifest, TensorCache(cache_dir))
    assert third.cache_hits == N_CT and all(torch.equal(third.raw[s], expected[s]) for s in Split)


# site_memory's figures (two fresh processes, cold then warm cache) are checked where the bench
# measures them: tests/test_bench.py::test_bench_measures_the_memory_of_loading_a_ct_site.
