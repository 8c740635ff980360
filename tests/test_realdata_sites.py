"""Real photos as sites: class folders without split folders, patient ids from file names, a
site holding some of the federation's classes, what real photos bring to the site check, and
the three real sites (sites/real/*.toml) read through scan, check and card.

The real photos are research-use only: they are read where they lie (``MEDFED_REALDATA``, by
default ``shared/realdata`` beside the repository checkout) and never copied; the tests that need
them skip when the folder is absent.
"""

from __future__ import annotations

import csv
import json
import os
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw
from typer.testing import CliRunner

from medfed.cli import app
from medfed.config import SplitOptions, parse_manifest
from medfed.data.layouts import scan_site
from medfed.data.plausibility import FLAT, NO_SURROUND, NOT_RED, fundus_doubts
from medfed.data.records import Split
from medfed.data.splits import assign_splits

REPO = Path(__file__).resolve().parent.parent
REAL_SITES = {
    name: REPO / "sites" / "real" / f"{name}.toml" for name in ("odir", "sjchoi86", "eyepacs")
}
LABELS = {"normal": 0, "glaucoma": 1, "cataract": 2, "dr": 3}
PATIENT_REGEX = r"^(\d+)_(left|right)\."
runner = CliRunner()


def realdata() -> Path:
    """The real photos' folder: $MEDFED_REALDATA, else shared/realdata beside the checkout."""
    return Path(os.environ.get("MEDFED_REALDATA") or REPO.parent / "shared" / "realdata")


needs_realdata = pytest.mark.skipif(
    not (realdata() / "MANIFEST.csv").is_file(),
    reason=f"real photos not found at {realdata()} (set MEDFED_REALDATA to the realdata folder)",
)


def manifest(root: Path, tmp_path: Path, **fields):
    data = {
        "id": "site_a",
        "modality": "fundus",
        "layout": "imagefolder",
        "root": str(root),
        "labels": dict(LABELS),
    }
    data.update(fields)
    path = tmp_path / "sites" / "site_a.toml"
    return replace(parse_manifest(data, where=str(path), base_dir=tmp_path), manifest_path=path)


def fundus_photo(size: tuple[int, int] = (48, 40), seed: int = 0) -> np.ndarray:
    """A tiny fundus-like photo: a warm round field on black, its shade set by ``seed``."""
    width, height = size
    yy, xx = np.mgrid[:height, :width]
    inside = np.hypot((yy - height / 2) / (height / 2), (xx - width / 2) / (width / 2)) < 0.95
    rng = np.random.default_rng(seed)
    colour = np.array([180, 90, 40]) + rng.integers(-20, 20, size=3)
    pixels = np.zeros((height, width, 3), dtype=np.uint8)
    pixels[inside] = np.clip(colour + rng.normal(0, 8, (int(inside.sum()), 3)), 0, 255)
    return pixels


def save(path: Path, pixels: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)
    return path


def check(*args: str | Path, env: dict[str, str] | None = None):
    return runner.invoke(app, ["sites", "check", *map(str, args)], env=env)


# ------------------------------------------------------------ imagefolder without split folders
def test_imagefolder_reads_class_folders_without_split_folders(tmp_path) -> None:
    root = tmp_path / "odir"
    for name in ("normal/1_left.png", "normal/1_right.png", "glaucoma/2_left.png"):
        save(root / name, fundus_photo())

    scan = scan_site(manifest(root, tmp_path))

    assert scan.problems == [] and scan.warnings == []
    got = [(r.path.relative_to(root).as_posix(), r.label, r.split) for r in scan.records]
    assert got == [("glaucoma/2_left.png", 1, None), ("normal/1_left.png", 0, None),
                   ("normal/1_right.png", 0, None)]  # fmt: skip


def test_patient_regex_puts_both_eyes_of_a_patient_in_one_split(tmp_path) -> None:
    root = tmp_path / "odir"
    for patient in range(20):
        for eye in ("left", "right"):
            save(root / ("normal" if patient % 2 else "glaucoma") / f"{patient}_{eye}.png",
                 fundus_photo(seed=patient))  # fmt: skip
    site = manifest(root, tmp_path, layout_options={"patient_regex": PATIENT_REGEX})

    scan = scan_site(site)
    splits = assign_splits(scan.records, SplitOptions(val_fraction=0.2, test_fraction=0.3))

    assert scan.problems == []
    assert {r.patient_id for r in scan.records} == {str(p) for p in range(20)}
    split_of: dict[str, set[Split]] = {}
    for record, split in zip(scan.records, splits, strict=True):
        split_of.setdefault(record.patient_id, set()).add(split)
    assert all(len(s) == 1 for s in split_of.values())
    assert set(splits) == {Split.TRAIN, Split.VAL, Split.TEST}


def test_without_patient_regex_each_image_is_its_own_patient(tmp_path) -> None:
    root = tmp_path / "sjchoi86"
    for name in (
        "glaucoma/Glaucoma_001.png",
        "glaucoma/Glaucoma_002.png",
        "cataract/cataract_001.png",
    ):
        save(root / name, fundus_photo())

    scan = scan_site(manifest(root, tmp_path))

    assert sorted(r.patient_id for r in scan.records) == [
        "Glaucoma_001",
        "Glaucoma_002",
        "cataract_001",
    ]


def test_patient_regex_that_misses_a_file_name_is_a_problem_naming_it(tmp_path) -> None:
    root = tmp_path / "odir"
    save(root / "normal" / "1_left.png", fundus_photo())
    save(root / "normal" / "scan-7.png", fundus_photo())

    scan = scan_site(manifest(root, tmp_path, layout_options={"patient_regex": PATIENT_REGEX}))

    assert [Path(p.file).name for p in scan.problems] == ["scan-7.png"]
    assert "does not match this file name" in scan.problems[0].message


def test_split_folders_are_still_read_as_splits_beside_a_class_folder(tmp_path) -> None:
    root = tmp_path / "site"
    save(root / "train" / "normal" / "a.png", fundus_photo())
    save(root / "normal" / "b.png", fundus_photo())

    scan = scan_site(manifest(root, tmp_path))

    assert [(r.path.name, r.split) for r in scan.records] == [("a.png", Split.TRAIN)]
    assert [Path(p.file).name for p in scan.problems] == ["normal"]
    assert "not a split folder" in scan.problems[0].message
    assert "root/<class>/<image>" in scan.problems[0].hint


def test_a_root_of_undeclared_folders_says_both_layouts(tmp_path) -> None:
    root = tmp_path / "site"
    save(root / "photos" / "normal" / "a.png", fundus_photo())

    scan = scan_site(manifest(root, tmp_path))

    assert scan.records == []
    assert "not a split folder" in scan.problems[0].message
    assert "split folders" in scan.problems[0].hint and "class folders" in scan.problems[0].hint


# --------------------------------------------------------------- sites holding some of the classes
def _dr_site(tmp_path: Path, **fields) -> Path:
    root = tmp_path / "eyepacs"
    for patient in range(12):
        save(root / "dr" / f"{patient}_left.png", fundus_photo(seed=patient))
    path = tmp_path / "eyepacs.toml"
    lines = [
        'id = "eyepacs"', 'modality = "fundus"', 'layout = "imagefolder"', f'root = "{root}"',
        *(f"{k} = {json.dumps(v)}" for k, v in fields.items()),
        "[labels]", *(f"{k} = {v}" for k, v in LABELS.items()),
        "[preprocess]", "image_size = 32",
    ]  # fmt: skip
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_site_holding_one_declared_class_is_ready_when_classes_held_says_so(tmp_path) -> None:
    result = check(_dr_site(tmp_path, classes_held=["dr"]), "--cache-dir", tmp_path / "cache")

    assert result.exit_code == 0, result.output
    assert "holds scans of dr only (classes_held)" in result.output
    assert "AUC is undefined" in result.output
    assert "has only class" not in result.output  # said once, not once per split


def test_a_site_missing_declared_classes_without_classes_held_has_problems(tmp_path) -> None:
    result = check(_dr_site(tmp_path), "--cache-dir", tmp_path / "cache")

    assert result.exit_code == 1, result.output
    assert "no scans of class 'normal'" in result.output and "classes_held" in result.output


def test_scans_of_a_class_that_classes_held_leaves_out_are_a_problem(tmp_path) -> None:
    result = check(_dr_site(tmp_path, classes_held=["normal"]), "--cache-dir", tmp_path / "cache")

    assert result.exit_code == 1, result.output
    assert "12 scan(s) of class 'dr', which classes_held ['normal'] leaves out" in result.output


# ------------------------------------------------------------------------ is it a fundus photo?
def _document() -> np.ndarray:
    page = Image.new("RGB", (300, 400), "white")
    draw = ImageDraw.Draw(page)
    for y in range(30, 370, 16):
        draw.rectangle([25, y, 25 + (y * 37) % 200 + 50, y + 6], fill="black")
    return np.asarray(page)


def test_a_real_fundus_photo_raises_no_doubt() -> None:
    from skimage import data

    assert fundus_doubts(data.retina()) == []
    assert fundus_doubts(fundus_photo((400, 264))) == []  # a field cut at top and bottom


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("astronaut", {NO_SURROUND}),
        ("camera", {NO_SURROUND, NOT_RED}),
        ("document", {NO_SURROUND, NOT_RED}),
        ("black", {FLAT}),
        ("white", {FLAT}),
    ],
)
def test_clear_non_fundus_images_raise_doubts(name: str, expected: set[str]) -> None:
    from skimage import data

    pictures = {
        "astronaut": data.astronaut,
        "camera": data.camera,
        "document": _document,
        "black": lambda: np.zeros((200, 200, 3), dtype=np.uint8),
        "white": lambda: np.full((200, 200, 3), 255, dtype=np.uint8),
    }
    assert set(fundus_doubts(pictures[name]())) == expected


# ------------------------------------------------------------- what real photos bring to a check
def _write_site(tmp_path: Path, site_id: str, files: dict[str, np.ndarray], **preprocess) -> Path:
    root = tmp_path / site_id
    for name, pixels in files.items():
        save(root / name, pixels)
    options = {"image_size": 32, **preprocess}
    path = tmp_path / f"{site_id}.toml"
    path.write_text(
        f'id = "{site_id}"\nmodality = "fundus"\nlayout = "imagefolder"\nroot = "{root}"\n'
        'classes_held = ["normal", "glaucoma"]\n[labels]\n'
        + "".join(f"{k} = {v}\n" for k, v in LABELS.items())
        + "[preprocess]\n"
        + "".join(f"{k} = {json.dumps(v)}\n" for k, v in options.items()),
        encoding="utf-8",
    )
    return path


def _photos(suffix: str, size: tuple[int, int] = (48, 48), n: int = 6) -> dict[str, np.ndarray]:
    return {
        f"{cls}/{i}.{suffix}": fundus_photo(size, seed=i + 100 * k)
        for k, cls in enumerate(("normal", "glaucoma"))
        for i in range(n)
    }


def test_photos_of_two_formats_in_one_site_are_counted_per_class(tmp_path) -> None:
    files = _photos("jpg") | {"glaucoma/extra.png": fundus_photo(seed=9)}
    result = check(_write_site(tmp_path, "mixed", files), "--cache-dir", tmp_path / "cache")

    assert result.exit_code == 0, result.output
    assert "photos in 2 file formats (12 JPEG, 1 PNG; by class: normal: 6 JPEG; " in result.output
    assert "glaucoma: 6 JPEG, 1 PNG" in result.output


def test_sites_of_other_formats_and_shapes_are_told_apart(tmp_path) -> None:
    square = _write_site(tmp_path, "square", _photos("jpg"))
    wide = _write_site(tmp_path, "wide", _photos("png", size=(60, 40)))

    result = check(square, wide, "--cache-dir", tmp_path / "cache")

    assert result.exit_code == 0, result.output
    assert "file formats differ between sites (this site: 12 JPEG; wide: 12 PNG)" in result.output
    assert "photo shape (width/height) 1 differs from other sites' (wide: 1.5)" in result.output
    assert "photo shape (width/height) 1.5 differs from other sites' (square: 1)" in result.output


def test_black_borders_that_no_crop_removes_are_named(tmp_path) -> None:
    framed = {}
    for name, pixels in _photos("png").items():
        big = np.zeros((96, 96, 3), dtype=np.uint8)
        big[24:72, 24:72] = pixels
        framed[name] = big
    kept = _write_site(tmp_path, "kept", framed, roi_crop=False)
    cropped = _write_site(tmp_path / "b", "cropped", framed, roi_crop=True)

    kept_out = check(kept, "--cache-dir", tmp_path / "cache").output
    cropped_out = check(cropped, "--cache-dir", tmp_path / "cache").output

    assert "12 photo(s) have black borders around the camera field" in kept_out
    assert "roi_crop = true" in kept_out
    assert "black borders" not in cropped_out


# ---------------------------------------------------------------------------- the real photos
def _real_subset(tmp_path: Path, per_class: int = 8) -> Path:
    """A folder of links to a few dozen real photos, laid out as realdata is (nothing copied)."""
    source = realdata()
    with (source / "MANIFEST.csv").open(newline="", encoding="utf-8") as handle:
        rows = sorted(csv.DictReader(handle), key=lambda r: r["file"])
    taken: Counter[tuple[str, str]] = Counter()
    out = tmp_path / "realdata"
    for row in rows:
        key = (row["source"], row["label"])
        if taken[key] < per_class:
            taken[key] += 1
            link = out / row["file"]
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(source / row["file"])
    return out


@needs_realdata
def test_real_sites_scan_check_and_card_on_a_few_dozen_photos(tmp_path) -> None:
    subset = _real_subset(tmp_path)
    env = {"MEDFED_REALDATA": str(subset)}
    manifests = list(REAL_SITES.values())

    result = check(*manifests, "--json", "--cache-dir", tmp_path / "cache", env=env)

    assert result.exit_code == 0, result.output
    reports = {r["site"]: r for r in json.loads(result.output)}
    assert {s: r["n_readable"] for s, r in reports.items()} == {
        "real-odir": 24, "real-sjchoi86": 16, "real-eyepacs": 8,
    }  # fmt: skip
    assert all(r["ready"] for r in reports.values())
    assert reports["real-sjchoi86"]["formats"] == {"PNG": 16}
    assert reports["real-odir"]["formats"] == {"JPEG": 24}
    totals = {s: Counter() for s in reports}
    for site, report in reports.items():
        for per in report["counts"].values():
            totals[site].update({k: v for k, v in per.items() if v})
    assert set(totals["real-eyepacs"]) == {"dr"}
    assert set(totals["real-sjchoi86"]) == {"glaucoma", "cataract"}
    assert any("file formats differ between sites" in w for w in reports["real-odir"]["warnings"])
    assert any("photo shape" in w for w in reports["real-sjchoi86"]["warnings"])

    cards = tmp_path / "cards"
    made = runner.invoke(app, ["sites", "card", str(REAL_SITES["odir"]), "--out-dir", str(cards),
                               "--cache-dir", str(tmp_path / "cache")], env=env)  # fmt: skip
    assert made.exit_code == 0, made.output
    card = (cards / "real-odir.md").read_text(encoding="utf-8")
    assert "## Provenance" in card and "aliiakbarkhan/eye-disease-detection-DL" in card
    assert "Research use only" in card and "to fill in" not in card


@needs_realdata
def test_real_eyes_of_one_odir_patient_share_a_patient_id() -> None:
    site = manifest(realdata() / "odir", REPO, layout_options={"patient_regex": PATIENT_REGEX})

    scan = scan_site(site)

    assert scan.problems == [] and len(scan.records) == 1339
    both = {r.meta["class_name"] for r in scan.records if r.patient_id == "2074"}
    assert both == {"glaucoma", "cataract"}  # one patient, one eye in each class folder
    assert len({r.patient_id for r in scan.records}) == 807


@needs_realdata
def test_a_real_photo_in_two_sites_is_reported_as_a_counted_pair(tmp_path) -> None:
    subset = _real_subset(tmp_path, per_class=6)
    copy = sorted((subset / "odir" / "normal").iterdir())[0]
    (subset / "eyepacs" / "dr" / "999_left.jpeg").symlink_to(copy.resolve())
    env = {"MEDFED_REALDATA": str(subset)}

    result = check(
        REAL_SITES["odir"], REAL_SITES["eyepacs"], "--cache-dir", tmp_path / "c", env=env
    )

    assert result.exit_code == 0, result.output  # a warning, not a refusal
    assert "1 scan(s) byte-identical to scans of site real-eyepacs (same SHA-256)" in result.output
    assert "1 scan(s) byte-identical to scans of site real-odir" in result.output


@needs_realdata
def test_few_real_fundus_photos_are_doubted() -> None:
    """The measured false-warning rate of docs/onboarding.md: 10 of 2,378 real photos."""
    source = realdata()
    with (source / "MANIFEST.csv").open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    doubted = [
        row["file"]
        for row in rows
        if fundus_doubts(np.asarray(Image.open(source / row["file"]).convert("RGB")))
    ]
    assert len(rows) == 2378
    assert len(doubted) <= 12, doubted  # 0.5%: rare, each an odd photo (white surround, artefact)


def test_four_disease_classes_get_no_dr_grading_bands() -> None:
    from medfed.reports.heterogeneity import task_of

    def counts(names: list[str]) -> dict:
        return {"a": {"train": dict.fromkeys(names, 1)}, "b": {"train": dict.fromkeys(names, 1)}}

    assert task_of("fundus", counts(list(LABELS))) == "fundus"  # no band calibrated for it
    assert task_of("fundus", counts(["normal", "glaucoma"])) == "glaucoma"
    assert task_of("fundus", counts(["0", "1", "2", "3", "4"])) == "dr"
