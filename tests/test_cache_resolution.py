"""The training resolution is a setting (fundus up to 512 px, refused beyond), and the cache
holds each split once at that resolution, written straight into its mapped file."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from medfed.config import FundusPreprocess, parse_manifest
from medfed.core.errors import ConfigError, DataError, ManifestError
from medfed.core.manifest import FUNDUS_MAX_IMAGE_SIZE
from medfed.data.cache import TensorCache
from medfed.data.records import Split
from medfed.data.sitedata import load_site


def _acrima(make_acrima_site, site_manifest, size: int):
    names = [f"Im{i:03d}_g_ACRIMA.jpg" if i % 2 else f"Im{i:03d}_ACRIMA.jpg" for i in range(8)]
    manifest = site_manifest("acrima", make_acrima_site(names))
    return dataclasses.replace(manifest, preprocess=FundusPreprocess(image_size=size))


@pytest.mark.parametrize("size", [513, 1024])
def test_a_fundus_image_size_over_512_is_refused_naming_the_setting(size, tmp_path: Path):
    data = {
        "id": "a",
        "modality": "fundus",
        "layout": "acrima",
        "root": str(tmp_path),
        "labels": {"normal": 0, "glaucoma": 1},
        "preprocess": {"image_size": size},
    }

    with pytest.raises(ManifestError) as caught:
        parse_manifest(data, where="sites/a.toml", base_dir=tmp_path)

    message = str(caught.value)
    assert "sites/a.toml" in message and "[preprocess]" in message
    assert f"image_size = {size}" in message and str(FUNDUS_MAX_IMAGE_SIZE) in message


def test_a_site_loads_at_512_px_mapped_from_one_stacked_file(
    make_acrima_site, site_manifest, tmp_path: Path
):
    manifest = _acrima(make_acrima_site, site_manifest, FUNDUS_MAX_IMAGE_SIZE)
    cache_dir = tmp_path / "cache"

    cold = load_site(manifest, TensorCache(cache_dir))
    warm = load_site(manifest, TensorCache(cache_dir))

    train = warm.raw[Split.TRAIN]
    assert train.shape[1:] == (3, 512, 512) and train.dtype == torch.float16
    assert all(torch.equal(cold.raw[s], warm.raw[s]) for s in Split)
    assert warm.cache_misses == 0
    stacks = sorted((cache_dir / "stacks").rglob("*"))
    files = [p for p in stacks if p.is_file()]
    assert files and all(p.suffix == ".stack" for p in files)  # no temporary file left
    row_bytes = 3 * 512 * 512 * 2
    assert sum(p.stat().st_size for p in files) == sum(
        4096 + warm.n(s) * row_bytes for s in Split if warm.n(s)
    )


def test_a_stacked_file_of_another_shape_is_rebuilt(make_acrima_site, site_manifest, tmp_path):
    manifest = _acrima(make_acrima_site, site_manifest, 32)
    cache_dir = tmp_path / "cache"
    first = load_site(manifest, TensorCache(cache_dir))
    stack = max((cache_dir / "stacks").rglob("*.stack"), key=lambda p: p.stat().st_size)
    data = bytearray(stack.read_bytes())
    data[: data.index(b"}") + 1] = data[: data.index(b"}") + 1].replace(b"32, 32", b"32, 31")
    stack.write_bytes(bytes(data))

    again = load_site(manifest, TensorCache(cache_dir))

    assert all(torch.equal(again.raw[s], first.raw[s]) for s in Split)
    assert b"32, 31" not in stack.read_bytes()[:4096]


def test_an_unfinished_stack_leaves_no_file(tmp_path: Path):
    cache = TensorCache(tmp_path / "cache")
    writer = cache.stack_writer("ab" * 32, 3, (1, 4, 4), torch.float16)
    writer.rows[0] = 1.0

    writer.discard()

    assert [p for p in (tmp_path / "cache").rglob("*") if p.is_file()] == []
    assert cache.get_stack("ab" * 32, 3, torch.float16) is None


def test_a_full_disk_while_stacking_names_the_cache_folder(tmp_path: Path, monkeypatch):
    cache = TensorCache(tmp_path / "cache")

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("medfed.data.cache.np.memmap", full)
    with pytest.raises(ConfigError, match="cache folder .*No space left"):
        cache.stack_writer("cd" * 32, 2, (1, 4, 4), torch.float16)
    assert [p for p in (tmp_path / "cache").rglob("*") if p.is_file()] == []


def test_decoding_on_several_threads_gives_the_one_by_one_tensors_in_order(
    make_acrima_site, site_manifest, tmp_path: Path, monkeypatch
):
    manifest = _acrima(make_acrima_site, site_manifest, 48)
    loaded = {}
    for workers in ("1", "3"):
        monkeypatch.setenv("MEDFED_DECODE_WORKERS", workers)
        site = load_site(manifest, TensorCache(tmp_path / f"cache{workers}"))
        assert site.cache_misses == 8 and site.cache_hits == 0
        loaded[workers] = site

    one, three = loaded["1"], loaded["3"]
    assert all(torch.equal(one.raw[s], three.raw[s]) for s in Split)
    assert all(
        [r.path for r in one.records[s]] == [r.path for r in three.records[s]] for s in Split
    )


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_a_bad_decode_worker_count_is_refused_by_name(
    value, make_acrima_site, site_manifest, tmp_path: Path, monkeypatch
):
    manifest = _acrima(make_acrima_site, site_manifest, 32)
    monkeypatch.setenv("MEDFED_DECODE_WORKERS", value)

    with pytest.raises(ConfigError, match=f"MEDFED_DECODE_WORKERS={value!r}"):
        load_site(manifest, TensorCache(tmp_path / "cache"))


def test_a_broken_photo_is_named_whichever_thread_decoded_it(
    make_acrima_site, site_manifest, tmp_path: Path, monkeypatch
):
    manifest = _acrima(make_acrima_site, site_manifest, 32)
    broken = sorted(Path(manifest.root).glob("*.jpg"))[3]
    broken.write_bytes(b"not a photo")
    monkeypatch.setenv("MEDFED_DECODE_WORKERS", "3")

    with pytest.raises(DataError, match=broken.name):
        load_site(manifest, TensorCache(tmp_path / "cache"))
