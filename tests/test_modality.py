"""The modality registry and the names defined once for the data layer (layouts, ids, classes)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from medfed.config import (
    LAYOUTS_BY_MODALITY,
    PREPROCESS_BY_MODALITY,
    CTPreprocess,
    FundusPreprocess,
    Modality,
    class_names,
    valid_site_id,
)
from medfed.core.errors import ManifestError
from medfed.data.io import Volume
from medfed.data.layouts import LAYOUT_MODULES, get_reader
from medfed.data.modality import MODALITIES, modality_spec
from medfed.data.preprocess import apply_pipeline
from medfed.models.backbones import spatial_dims


def test_every_modality_has_one_registry_entry() -> None:
    assert set(MODALITIES) == set(Modality)
    for modality, spec in MODALITIES.items():
        assert spec.modality is modality
        assert spec.layouts == LAYOUTS_BY_MODALITY[modality]
        assert spec.options is PREPROCESS_BY_MODALITY[modality]


def test_lookup_accepts_names_and_rejects_unknown_modalities() -> None:
    assert modality_spec("ct") is modality_spec(Modality.CT)
    with pytest.raises(ManifestError, match=r"'mri'.*fundus.*ct"):
        modality_spec("mri")


def test_default_backbones_fit_the_spatial_dims_of_the_scans() -> None:
    fundus, ct = modality_spec(Modality.FUNDUS), modality_spec(Modality.CT)
    assert (fundus.default_backbone(False), fundus.default_backbone(True)) == ("cnn-gn", "cnn")
    ct_defaults = (ct.default_backbone(False), ct.default_backbone(True))
    assert ct_defaults == ("slices-cnn-gn", "slices-cnn")
    for spec in MODALITIES.values():
        for batch_norm in (False, True):
            assert spatial_dims(spec.default_backbone(batch_norm)) == spec.spatial_dims


def test_only_fundus_photos_are_flipped_in_training() -> None:
    assert modality_spec(Modality.FUNDUS).horizontal_flip
    assert not modality_spec(Modality.CT).horizontal_flip


def test_each_pipeline_gives_a_scan_of_its_spatial_dims() -> None:
    photo = np.random.default_rng(0).integers(0, 256, (40, 50, 3), dtype=np.uint8)
    volume = Volume(np.zeros((6, 10, 10), np.float32), (4.0, 4.0, 4.0))
    fundus = apply_pipeline("fundus", FundusPreprocess(image_size=16, roi_crop=False), photo)
    ct = apply_pipeline(Modality.CT, CTPreprocess(shape=(4, 8, 8)), volume)
    assert fundus.dim() - 1 == modality_spec("fundus").spatial_dims
    assert ct.dim() - 1 == modality_spec("ct").spatial_dims


def test_every_layout_a_manifest_may_name_has_a_reader() -> None:
    named = [layout for layouts in LAYOUTS_BY_MODALITY.values() for layout in layouts]
    assert sorted(LAYOUT_MODULES) == sorted(named)
    assert all(callable(get_reader(layout)) for layout in named)


def test_registry_imports_no_training_serving_or_run_code() -> None:
    code = (
        "import sys, medfed.data.modality, medfed.data.overview\n"
        "bad = ('medfed.models', 'medfed.algorithms', 'medfed.federation', 'medfed.routing',"
        " 'medfed.clinic', 'medfed.runs')\n"
        "print(sorted(m for m in sys.modules if m.startswith(bad)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_class_names_join_names_that_share_an_index_in_index_order() -> None:
    labels = {"glaucoma": 1, "suspect": 1, "normal": 0}
    assert class_names(labels) == {0: "normal", 1: "glaucoma/suspect"}
    assert list(class_names(labels)) == [0, 1]


@pytest.mark.parametrize(
    ("text", "ok"),
    [("acrima", True), ("site_1.b-2", True), ("_x", False), (".x", False), ("a b", False),
     ("a\n", False), ("", False)],
)  # fmt: skip
def test_site_ids_must_be_file_safe(text: str, ok: bool) -> None:
    assert valid_site_id(text) is ok
