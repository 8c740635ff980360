"""Preprocessing, the decode-once cache, patient-level splits and site loading."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from skimage import data as skdata

from medfed.config import CTPreprocess, FundusPreprocess, Modality, SplitOptions
from medfed.core.errors import DataError
from medfed.data import sitedata
from medfed.data.cache import TensorCache
from medfed.data.io import Volume
from medfed.data.preprocess import Normalization, apply_pipeline, pipeline_fingerprint
from medfed.data.records import Record, Split
from medfed.data.sitedata import load_site
from medfed.data.splits import assign_splits


def test_fundus_pipeline_crops_to_the_camera_field() -> None:
    retina = skdata.retina()  # a real fundus photograph, (1411, 1411, 3)
    small = np.asarray(Image.fromarray(retina).resize((200, 200)))
    padded = np.zeros((300, 420, 3), np.uint8)
    padded[50:250, 110:310] = small  # the same photo inside a wide black frame
    options = FundusPreprocess(image_size=32)
    a = apply_pipeline(Modality.FUNDUS, options, small)
    b = apply_pipeline(Modality.FUNDUS, options, padded)
    assert a.shape == b.shape == (3, 32, 32) and a.dtype == torch.float32
    assert float(a.min()) >= 0.0 and float(a.max()) <= 1.0
    assert float((a - b).abs().mean()) < 0.02  # the frame is cropped away
    no_crop = apply_pipeline(Modality.FUNDUS, replace(options, roi_crop=False), padded)
    assert float((a - no_crop).abs().mean()) > 0.05


def _monai_fundus(options: FundusPreprocess, with_disc: bool):
    """The fundus stage as MONAI's own transforms: what medfed's written-out steps must equal."""
    from monai.transforms import (
        Compose,
        CropForegroundd,
        EnsureChannelFirstd,
        EnsureTyped,
        Resized,
        ScaleIntensityRanged,
        SpatialPadd,
    )

    from medfed.data.transforms import DISC_KEY, CameraField, DiscCrop

    steps = [EnsureChannelFirstd(keys="image", channel_dim=-1)]
    if options.roi_crop:
        keys = ["image", DISC_KEY] if with_disc else "image"
        steps.append(
            CropForegroundd(
                keys=keys,
                source_key="image",
                select_fn=CameraField(options.roi_threshold),
                allow_smaller=True,
            )
        )
    if options.disc_crop:
        steps.append(DiscCrop(options.disc_crop))
    size = options.image_size
    steps += [
        Resized(keys="image", spatial_size=size, size_mode="longest", mode="area"),
        SpatialPadd(keys="image", spatial_size=(size, size)),
        ScaleIntensityRanged(keys="image", a_min=0.0, a_max=255.0, b_min=0.0, b_max=1.0),
        EnsureTyped(keys="image", data_type="tensor", dtype=torch.float32, track_meta=False),
    ]
    return Compose(steps)


@pytest.mark.parametrize(
    ("shape", "options"),
    [
        ((300, 420), FundusPreprocess(image_size=32)),
        ((420, 300), FundusPreprocess(image_size=64)),
        ((224, 224), FundusPreprocess(image_size=224)),  # no resize
        ((97, 131), FundusPreprocess(image_size=128)),  # enlarged
        ((300, 420), FundusPreprocess(image_size=48, roi_crop=False)),
        ((300, 420), FundusPreprocess(image_size=40, disc_crop=0.5)),
        ((301, 419), FundusPreprocess(image_size=33, roi_threshold=0.3)),
    ],
)
def test_the_fundus_steps_equal_monais_value_for_value(shape, options) -> None:
    from medfed.data.transforms import DISC_KEY, disc_map, fundus_pipeline

    rng = np.random.default_rng(sum(shape) + options.image_size)
    retina = np.asarray(Image.fromarray(skdata.retina()).resize((shape[1] // 2, shape[0] // 2)))
    photo = np.zeros((*shape, 3), np.float32)
    top, left = shape[0] // 5, shape[1] // 7
    photo[top : top + retina.shape[0], left : left + retina.shape[1]] = retina
    photo += rng.uniform(0, 4, photo.shape).astype(np.float32)  # sensor noise in the border
    for with_disc in (False, True) if options.disc_crop else (False,):
        ours, theirs = {"image": photo.copy()}, {"image": photo.copy()}
        if with_disc:
            ours[DISC_KEY] = theirs[DISC_KEY] = disc_map(*shape, shape[1] * 0.4, shape[0] * 0.6)
        got = fundus_pipeline(options, with_disc=with_disc)(ours)["image"]
        want = _monai_fundus(options, with_disc)(theirs)["image"]
        assert got.shape == want.shape == (3, options.image_size, options.image_size)
        assert got.dtype == want.dtype == torch.float32
        assert torch.equal(got.contiguous(), torch.as_tensor(want).contiguous())


def test_ct_pipeline_windows_resamples_and_fixes_the_shape() -> None:
    hu = np.full((10, 40, 30), 40.0, np.float32)
    hu[:, :, :6] = -1000.0  # air, below the window
    hu[:, :, -6:] = 1500.0  # bone, above the window
    volume = Volume(hu, spacing=(5.0, 1.0, 1.0))
    options = CTPreprocess(hu_window=(-160.0, 240.0), spacing=(2.5, 2.0, 2.0), shape=(8, 16, 16))
    out = apply_pipeline(Modality.CT, options, volume)
    assert out.shape == (1, 8, 16, 16)
    assert float(out.min()) == pytest.approx(0.0) and float(out.max()) == pytest.approx(1.0)
    center = float(out[0, 4, 8, 8])
    assert center == pytest.approx((40 + 160) / 400, abs=1e-4)


def test_normalization_centres_the_training_split() -> None:
    x = torch.rand(20, 3, 8, 8) * 5 + 2
    norm = Normalization.fit(x)
    z = norm.apply(x)
    assert z.mean(dim=(0, 2, 3)).abs().max() < 1e-5
    assert Normalization.from_dict(norm.to_dict()) == norm


def test_fingerprint_changes_with_the_pipeline_not_with_normalization(site_manifest, tmp_path):
    m = site_manifest("acrima", tmp_path)
    bigger = replace(m, preprocess=replace(m.preprocess, image_size=96))
    no_norm = replace(m, preprocess=replace(m.preprocess, normalize=False))
    assert pipeline_fingerprint(m) != pipeline_fingerprint(bigger)
    assert pipeline_fingerprint(m) == pipeline_fingerprint(no_norm)


def _records(n_patients: int, per_patient: int = 2) -> list[Record]:
    return [
        Record(Path(f"p{p}_{k}.png"), label=p % 2, patient_id=f"p{p}")
        for p in range(n_patients)
        for k in range(per_patient)
    ]


def test_splits_keep_each_patient_whole_and_are_seeded() -> None:
    records = _records(40)
    options = SplitOptions(val_fraction=0.2, test_fraction=0.25, seed=3)
    splits = assign_splits(records, options)
    by_patient: dict[str, set] = {}
    for record, split in zip(records, splits, strict=True):
        by_patient.setdefault(record.patient_id, set()).add(split)
    assert all(len(s) == 1 for s in by_patient.values())
    assert splits == assign_splits(list(reversed(records)), options)[::-1]
    assert splits != assign_splits(records, replace(options, seed=4))
    counts = {s: splits.count(s) // 2 for s in Split}
    assert counts == {Split.TRAIN: 22, Split.VAL: 8, Split.TEST: 10}
    for split in Split:  # stratified: both classes everywhere
        assert {r.label for r, s in zip(records, splits, strict=True) if s is split} == {0, 1}


def test_layout_test_split_is_kept_and_validation_comes_from_training() -> None:
    records = [
        replace(r, split=Split.TEST if i < 8 else Split.TRAIN) for i, r in enumerate(_records(20))
    ]
    splits = assign_splits(records, SplitOptions(val_fraction=0.2))
    assert splits[:8] == [Split.TEST] * 8
    assert Split.VAL in splits[8:] and Split.TEST not in splits[8:]


def test_a_patient_in_two_layout_splits_is_an_error() -> None:
    records = [
        Record(Path("a.png"), 0, "p1", split=Split.TRAIN),
        Record(Path("b.png"), 0, "p1", split=Split.TEST),
    ]
    with pytest.raises(DataError, match="p1"):
        assign_splits(records, SplitOptions())


def _acrima(make_acrima_site, n: int = 16) -> list[str]:
    return [f"Im{i:03d}_g_ACRIMA.jpg" if i % 2 else f"Im{i:03d}_ACRIMA.jpg" for i in range(n)]


def test_second_load_never_decodes_and_edits_invalidate(
    make_acrima_site, site_manifest, tmp_path, monkeypatch
) -> None:
    root = make_acrima_site(_acrima(make_acrima_site))
    manifest = site_manifest("acrima", root)
    decodes = []
    real = sitedata.read_record
    monkeypatch.setattr(sitedata, "read_record", lambda r, m: decodes.append(r.path) or real(r, m))
    cache_dir = tmp_path / "cache"

    first = load_site(manifest, TensorCache(cache_dir))
    assert len(decodes) == 16 and first.cache_misses == 16
    second = load_site(manifest, TensorCache(cache_dir))  # a new process: the disk cache
    assert len(decodes) == 16 and second.cache_hits == 16
    assert torch.equal(first.raw[Split.TRAIN], second.raw[Split.TRAIN])

    edited = root / "Im003_g_ACRIMA.jpg"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(
        edited
    )
    load_site(manifest, TensorCache(cache_dir))
    assert decodes[16:] == [edited]

    resized = replace(manifest, preprocess=replace(manifest.preprocess, image_size=32))
    load_site(resized, TensorCache(cache_dir))
    assert len(decodes) == 17 + 16


def test_load_site_refuses_a_site_with_problems_and_names_the_file(
    make_acrima_site, site_manifest, tmp_path
) -> None:
    root = make_acrima_site(_acrima(make_acrima_site))
    broken = root / "Im004_ACRIMA.jpg"
    broken.write_bytes(broken.read_bytes()[:100])
    with pytest.raises(DataError, match="Im004_ACRIMA.jpg") as info:
        load_site(site_manifest("acrima", root), TensorCache(None))
    assert "medfed sites check" in str(info.value)
