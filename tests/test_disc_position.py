"""The optic disc's position from a site's layout (REFUGE-style disc masks, or a label table's
disc x/y columns): read into the records, used by the disc crop in place of its estimate,
counted by the check and the data card, and part of the cached scan's key."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from medfed.config import FundusPreprocess, load_manifest
from medfed.core.errors import DataError
from medfed.data.cache import TensorCache
from medfed.data.cards import render_card
from medfed.data.checks import check_site
from medfed.data.disc import DiscPosition, disc_of, mask_centroid
from medfed.data.layouts import scan_site
from medfed.data.preprocess import disc_key_part
from medfed.data.sitedata import load_site, preprocess_record
from medfed.data.synth import synthesize
from medfed.data.transforms import fundus_tensor

SIZE = 160


def _photo() -> np.ndarray:
    """A round reddish camera field on black, a bright blob (what the estimate finds) at row
    120, column 120, and a small green mark at row 50, column 45 (where the disc truly is)."""
    yy, xx = np.mgrid[:SIZE, :SIZE]
    image = np.zeros((SIZE, SIZE, 3), dtype=np.uint8)
    image[(yy - SIZE / 2) ** 2 + (xx - SIZE / 2) ** 2 < (0.48 * SIZE) ** 2] = (150, 60, 30)
    image[(yy - 120) ** 2 + (xx - 120) ** 2 < 10**2] = (250, 230, 160)
    image[48:52, 43:47] = (0, 255, 0)
    return image


def _green_share(tensor: torch.Tensor) -> float:
    """How much of a preprocessed photo the green mark covers."""
    green = (tensor[1] > 0.8) & (tensor[0] < 0.3)
    return float(green.float().mean())


@pytest.fixture(scope="module")
def refuge(tmp_path_factory) -> Path:
    """The synthetic REFUGE-style site, which ships a disc mask per photo, with a disc crop."""
    out = tmp_path_factory.mktemp("refuge")
    manifests = synthesize(out, "fundus", n_per_site=12, seed=0, image_size=64)
    manifest = next(p for p in manifests if p.stem == "refuge")
    text = manifest.read_text(encoding="utf-8")
    manifest.write_text(text.replace("[preprocess]\n", "[preprocess]\ndisc_crop = 0.4\n", 1))
    return manifest


def test_the_crop_centres_on_the_layouts_disc_not_the_brightest_spot() -> None:
    options = FundusPreprocess(image_size=48, disc_crop=0.2)
    given = DiscPosition("labels.csv:2", x=45.0, y=50.0)

    estimated = fundus_tensor(options, _photo())
    placed = fundus_tensor(options, _photo(), given)

    assert _green_share(estimated) == 0.0  # the estimate went to the bright blob
    assert _green_share(placed) > 0.005
    # the camera field crop moved the photo's pixels; the position moved with them: the mark
    # sits at the crop's centre
    ys, xs = np.nonzero(((placed[1] > 0.8) & (placed[0] < 0.3)).numpy())
    assert abs(ys.mean() - 24) <= 4 and abs(xs.mean() - 24) <= 4


def test_without_a_disc_crop_the_layouts_position_changes_nothing() -> None:
    options = FundusPreprocess(image_size=48)
    given = DiscPosition("labels.csv:2", x=45.0, y=50.0)

    assert torch.equal(fundus_tensor(options, _photo()), fundus_tensor(options, _photo(), given))
    assert disc_key_part(options, given) == ""
    assert disc_key_part(FundusPreprocess(disc_crop=0.4), None) == ""
    a = disc_key_part(FundusPreprocess(disc_crop=0.4), given)
    b = disc_key_part(FundusPreprocess(disc_crop=0.4), dataclasses.replace(given, x=46.0))
    assert a and b and a != b


def test_a_position_outside_the_photo_is_refused_naming_its_row() -> None:
    with pytest.raises(DataError, match=r"labels.csv:7: disc position \(170, 50\) lies outside"):
        DiscPosition("labels.csv:7", x=170.0, y=50.0).locate(SIZE, SIZE)


def test_a_mask_gives_its_disc_pixels_centroid_whatever_its_background(tmp_path) -> None:
    refuge_style = np.full((40, 60), 255, dtype=np.uint8)  # white background, darker disc
    refuge_style[10:20, 30:40] = 128
    refuge_style[13:17, 33:37] = 0  # the cup, inside the disc
    Image.fromarray(refuge_style).save(tmp_path / "a.png")
    binary = np.zeros((40, 60), dtype=np.uint8)  # black background, white disc
    binary[10:20, 30:40] = 255
    Image.fromarray(binary).save(tmp_path / "b.bmp")

    assert mask_centroid(tmp_path / "a.png", 40, 60) == (35.0, 15.0)
    assert mask_centroid(tmp_path / "b.bmp", 40, 60) == (35.0, 15.0)
    with pytest.raises(DataError, match="a.png: the disc mask is 60x40 pixels, its photo 50x40"):
        mask_centroid(tmp_path / "a.png", 40, 50)


def test_the_synthetic_refuge_site_gives_every_photo_its_disc_mask(refuge) -> None:
    scan = scan_site(load_manifest(refuge))

    assert not scan.problems and scan.records
    positions = [disc_of(r) for r in scan.records]
    assert all(p is not None and p.mask is not None for p in positions)
    assert all(p.mask.stem == r.path.stem for p, r in zip(positions, scan.records, strict=True))
    # the mask's disc is the drawn disc: the photo is brightest around it
    record = scan.records[0]
    photo = np.asarray(Image.open(record.path), dtype=np.float32).mean(axis=2)
    x, y = disc_of(record).locate(*photo.shape)
    assert photo[int(y), int(x)] > np.percentile(photo, 90)


def test_the_check_and_the_card_count_layout_positions(refuge, tmp_path) -> None:
    manifest = load_manifest(refuge)
    report = check_site(manifest, TensorCache(tmp_path / "cache"))

    assert report.ready, report.problems
    assert report.disc == {"layout": report.n_readable, "estimated": 0}
    assert report.to_dict()["disc"] == report.disc
    card = render_card(manifest, report)
    assert f"| optic disc position | {report.n_readable} from the layout, 0 estimated" in card


def test_a_site_without_masks_counts_its_discs_as_estimated(refuge, tmp_path) -> None:
    manifest = load_manifest(refuge)
    options = {k: v for k, v in manifest.layout_options.items() if k != "disc_masks"}
    plain = dataclasses.replace(manifest, layout_options=options)

    report = check_site(plain, TensorCache(tmp_path / "cache"))

    assert report.disc == {"layout": 0, "estimated": report.n_readable}


def test_training_data_is_cropped_at_the_masks_disc(refuge, tmp_path) -> None:
    manifest = load_manifest(refuge)
    cache = TensorCache(tmp_path / "cache")
    site = load_site(manifest, cache)
    record = site.records[next(iter(site.records))][0]
    options = {k: v for k, v in manifest.layout_options.items() if k != "disc_masks"}
    estimated = dataclasses.replace(manifest, layout_options=options)
    [plain] = [r for r in scan_site(estimated).records if r.path == record.path]

    from_mask = preprocess_record(manifest, record, cache)
    from_photo = preprocess_record(estimated, plain, cache)

    assert from_mask.shape == from_photo.shape == (3, 64, 64)
    # two cache entries: the mask's crop is not mistaken for the estimate's
    assert disc_of(plain) is None and not torch.equal(from_mask, from_photo)
