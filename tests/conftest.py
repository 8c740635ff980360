"""Fixtures that write small sites in the on-disk layouts the readers understand."""

from __future__ import annotations

import os
import random
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from medfed.config import SiteManifest, parse_manifest
from tests import realfiles
from tests.badinput import shared  # noqa: F401  (the bad-input corpus' session fixture)

FUNDUS_LABELS = {"normal": 0, "glaucoma": 1}

# The test models are tiny: one thread is faster than two, and immune to a busy machine.
torch.set_num_threads(1)
# A run's evaluation times routing one scan at a time (16 per router by default): on the tests'
# tiny federations that is much of a run's cost. Six, the fewest the median's CI needs, keeps
# every figure (processes the tests start inherit it); tests of the setting set their own.
os.environ.setdefault("MEDFED_LATENCY_SCANS", "6")


@pytest.fixture
def site_manifest(tmp_path: Path) -> Callable[..., SiteManifest]:
    """Factory: a validated manifest for a layout rooted at ``root``."""

    def make(
        layout: str,
        root: Path,
        *,
        modality: str = "fundus",
        labels: dict[str, int] | None = None,
        layout_options: dict[str, Any] | None = None,
        site_id: str = "site_a",
    ) -> SiteManifest:
        data = {
            "id": site_id,
            "modality": modality,
            "layout": layout,
            "root": str(root),
            "labels": labels or dict(FUNDUS_LABELS),
            "layout_options": layout_options or {},
        }
        path = tmp_path / "sites" / f"{site_id}.toml"
        manifest = parse_manifest(data, where=str(path), base_dir=tmp_path)
        return replace(manifest, manifest_path=path)

    return make


@pytest.fixture
def write_fundus_image() -> Callable[..., Path]:
    """Factory: write a small RGB image whose colour encodes ``seed``."""
    from PIL import Image

    def write(path: Path, seed: int = 0, size: tuple[int, int] = (24, 20)) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(seed)
        pixels = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
        Image.fromarray(pixels).save(path)
        return path

    return write


@pytest.fixture
def make_acrima_site(tmp_path: Path, write_fundus_image) -> Callable[..., Path]:
    """Factory: an ACRIMA folder with the given file names."""

    def make(names: Sequence[str]) -> Path:
        root = tmp_path / "ACRIMA"
        root.mkdir(exist_ok=True)
        for i, name in enumerate(names):
            write_fundus_image(root / name, seed=i)
        return root

    return make


@pytest.fixture
def make_rimone_site(tmp_path: Path, write_fundus_image) -> Callable[..., Path]:
    """Factory: a RIM-ONE DL tree; ``counts`` maps 'partition/split/class' to an image count."""

    def make(counts: dict[str, int]) -> Path:
        root = tmp_path / "RIM-ONE_DL"
        for folder, n in counts.items():
            (root / folder).mkdir(parents=True, exist_ok=True)
            for i in range(n):
                write_fundus_image(root / folder / f"{folder.split('/')[-1]}_{i}.png", seed=i)
        return root

    return make


@pytest.fixture
def make_refuge_site(tmp_path: Path, write_fundus_image) -> Callable[..., Path]:
    """REFUGE tree: Training400 class folders, Validation400 with an xlsx, Test400 with a csv."""

    def make() -> Path:
        from openpyxl import Workbook

        root = tmp_path / "REFUGE"
        write_fundus_image(root / "Training400" / "Glaucoma" / "g0001.jpg", seed=1)
        write_fundus_image(root / "Training400" / "Non-Glaucoma" / "n0001.jpg", seed=2)
        write_fundus_image(root / "Training400" / "Non-Glaucoma" / "n0002.jpg", seed=3)
        for name in ("V0001.jpg", "V0002.jpg", "V0003.jpg"):
            write_fundus_image(root / "Validation400" / name, seed=4)
        book = Workbook()
        sheet = book.active
        sheet.append(["ImgName", "Fovea_X", "Fovea_Y", "Glaucoma Label"])
        sheet.append(["V0001.jpg", 1.5, 2.5, 1])
        sheet.append(["V0002.jpg", 1.5, 2.5, 0.0])
        sheet.append(["V0003.jpg", 1.5, 2.5, 1.0])
        (root / "Validation400-GT").mkdir()
        book.save(root / "Validation400-GT" / "labels.xlsx")
        for name in ("T0001.jpg", "T0002.jpg"):
            write_fundus_image(root / "Test400" / name, seed=5)
        (root / "Test400-GT").mkdir()
        (root / "Test400-GT" / "labels.csv").write_text(
            "ImgName,Glaucoma Label\nT0001.jpg,0\nT0002.jpg,1\n"
        )
        return root

    return make


@pytest.fixture
def write_ct_slice() -> Callable[..., Path]:
    """Factory: write one CT slice as a DICOM Part 10 file with full geometry."""
    return realfiles.write_ct_slice


@pytest.fixture
def write_ct_series(write_ct_slice) -> Callable[..., list[Path]]:
    """Factory: a series of ``n`` slices 2.5 mm apart; slice k holds the stored value 10*k.

    File names are shuffled so that name order never matches position order.
    """

    def write(
        folder: Path,
        n: int,
        *,
        patient_id: str = "P1",
        series_uid: str = "1.2.826.0.1.3680043.8.498.1",
        shape: tuple[int, int] = (6, 5),
        suffix: str = ".dcm",
        **kwargs: Any,
    ) -> list[Path]:
        names = list(range(n))
        random.Random(n).shuffle(names)
        paths = []
        for k in range(n):
            pixels = np.full(shape, 10 * k, dtype=np.int16)
            path = folder / f"slice_{names[k]:03d}{suffix}"
            position = (-10.0, -20.0, 30.0 + 2.5 * k)
            paths.append(
                write_ct_slice(
                    path,
                    pixels,
                    position=position,
                    patient_id=patient_id,
                    series_uid=series_uid,
                    **kwargs,
                )  # fmt: skip
            )
        return paths

    return write


@pytest.fixture
def write_nifti() -> Callable[..., Path]:
    """Factory: write a NIfTI volume with the given (x, y, z) data and voxel sizes."""

    def write(path: Path, data: np.ndarray, zooms: Sequence[float] = (1.0, 1.0, 1.0)) -> Path:
        import nibabel as nib

        path.parent.mkdir(parents=True, exist_ok=True)
        nib.save(nib.Nifti1Image(data, np.diag([*zooms, 1.0])), path)
        return path

    return write


# ------------------------------------------------------------------------------ markers
# Markers are registered in pyproject.toml. Whole files are marked by their ``pytestmark``;
# the long tests below are marked here, from CPU seconds measured on a 2-core machine, so that
# ``make test-fast`` stays a quick loop. ``make test`` runs them all.
SLOW_FIXTURES = {
    "bench_run": "a whole medfed bench over two seeds and both modalities (~90 s)",
}
SLOW_TESTS = {
    "test_engine.py::test_sigkill_mid_run_then_resume_matches_an_uninterrupted_run": "~20 s",
    "test_pfedme.py::test_personalized_models_beat_the_fedavg_model_on_their_own_sites": "~20 s",
    "test_fedgmi.py::test_three_distributions_are_recovered_too": "~7 s",
}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark SLOW_TESTS and the users of SLOW_FIXTURES ``slow``; warn on a stale name."""
    found, files = set(), {item.path.name for item in items}
    for item in items:
        key = f"{item.path.name}::{getattr(item, 'originalname', item.name)}"
        if key in SLOW_TESTS or SLOW_FIXTURES.keys() & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
            found.add(key)
    for key in SLOW_TESTS.keys() - found:
        if key.split("::")[0] in files:
            warnings.warn(f"conftest SLOW_TESTS names {key}, which no longer exists", stacklevel=1)


@pytest.fixture(scope="module")
def tiny_sites(tmp_path_factory) -> tuple[dict[str, Path], Path]:
    """Three small fundus sites for the Flower deployment tests, decoded once into a cache."""
    from medfed.data.synth import synthesize
    from medfed.federation.training import load_sites

    root = tmp_path_factory.mktemp("flower_sites")
    manifests = synthesize(root / "data", "fundus", n_per_site=24, seed=0, image_size=48)
    cache = root / "cache"
    load_sites(manifests, cache)  # decode once: the SuperNodes read the same cache
    return {p.stem: p for p in manifests}, cache


@pytest.fixture(autouse=True)
def _umask_kept():
    """A service run in-process (pacs watch, listen) makes its process's files owner-only
    (umask 077); the next test starts from the umask the suite started with."""
    before = os.umask(0o022)
    os.umask(before)
    yield
    os.umask(before)
