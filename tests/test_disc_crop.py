"""The optic-disc-centred crop: a square around the photo's brightest spot, asked for by
``disc_crop`` in [preprocess]; refused outside its range; caches of sites without it keep
their keys."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np
import pytest

from medfed.config import FundusPreprocess, parse_manifest
from medfed.core.errors import ManifestError
from medfed.data.preprocess import PIPELINE_VERSION, pipeline_fingerprint, storage_dtype
from medfed.data.transforms import DiscCrop, fundus_tensor


def _photo(disc: tuple[int, int], size: int = 160) -> np.ndarray:
    """A round reddish camera field on black with a bright disc at ``disc`` (row, column) and a
    one-pixel glint elsewhere."""
    yy, xx = np.mgrid[:size, :size]
    image = np.zeros((size, size, 3), dtype=np.uint8)
    field = (yy - size / 2) ** 2 + (xx - size / 2) ** 2 < (0.48 * size) ** 2
    image[field] = (150, 60, 30)
    spot = (yy - disc[0]) ** 2 + (xx - disc[1]) ** 2 < 10**2
    image[spot] = (250, 230, 160)
    image[size // 2, size // 4] = (255, 255, 255)  # a glint: brighter, but one pixel
    return image


@pytest.mark.parametrize("disc", [(70, 110), (40, 60), (120, 100)])
def test_the_crop_is_centred_on_the_disc(disc):
    image = _photo(disc)
    chw = np.moveaxis(image.astype(np.float32), -1, 0)

    out = DiscCrop(0.4)({"image": chw})["image"]

    side = round(0.4 * 160)
    assert out.shape == (3, side, side)
    brightness = out.mean(axis=0)
    ys, xs = np.nonzero(brightness > 200)
    assert abs(ys.mean() - side / 2) <= 2 and abs(xs.mean() - side / 2) <= 2


def test_a_disc_near_the_edge_keeps_the_crop_inside_the_photo():
    chw = np.moveaxis(_photo((12, 150)).astype(np.float32), -1, 0)

    out = DiscCrop(0.5)({"image": chw})["image"]

    assert out.shape == (3, 80, 80)
    assert out.mean(axis=0).max() > 200  # the disc is in it


def test_the_pipeline_crops_then_trains_at_the_asked_size():
    options = FundusPreprocess(image_size=48, disc_crop=0.4)

    whole = fundus_tensor(FundusPreprocess(image_size=48), _photo((70, 110)))
    cropped = fundus_tensor(options, _photo((70, 110)))

    assert cropped.shape == whole.shape == (3, 48, 48)
    # the disc fills a far larger share of the crop than of the whole field
    assert (cropped.mean(0) > 0.8).float().mean() > 4 * (whole.mean(0) > 0.8).float().mean()


@pytest.mark.parametrize("value", [0.05, 1.5, -0.2])
def test_a_disc_crop_outside_its_range_is_refused_by_name(value, tmp_path):
    data = {
        "id": "a",
        "modality": "fundus",
        "layout": "acrima",
        "root": str(tmp_path),
        "labels": {"normal": 0, "glaucoma": 1},
        "preprocess": {"disc_crop": value},
    }

    with pytest.raises(ManifestError, match=r"sites/a.toml: \[preprocess\] disc_crop"):
        parse_manifest(data, where="sites/a.toml", base_dir=tmp_path)


def test_a_site_without_a_disc_crop_keeps_its_cache_keys(make_acrima_site, site_manifest):
    manifest = site_manifest("acrima", make_acrima_site(["Im000_ACRIMA.jpg"]))
    cropped = dataclasses.replace(
        manifest, preprocess=dataclasses.replace(manifest.preprocess, disc_crop=0.4)
    )

    # the payload as it was before disc_crop existed
    options = {"image_size": 64, "roi_crop": True, "roi_threshold": 0.08}
    payload = json.dumps(
        {
            "version": PIPELINE_VERSION,
            "modality": "fundus",
            "options": options,
            "storage": str(storage_dtype("fundus")),
        },
        sort_keys=True,
    )
    assert pipeline_fingerprint(manifest) == hashlib.sha256(payload.encode()).hexdigest()[:16]
    assert pipeline_fingerprint(cropped) != pipeline_fingerprint(manifest)
