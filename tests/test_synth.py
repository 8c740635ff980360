"""The synthetic federation: deterministic, in the real layouts, with the intended shifts."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
from collections import Counter
from pathlib import Path

import nibabel as nib
import numpy as np
import openpyxl
import pydicom
import pytest

from medfed.config import CTPreprocess, FundusPreprocess, Modality, load_manifest
from medfed.core.errors import MedfedError
from medfed.data import _phantoms, synth, synth_ct
from medfed.data.io import Volume
from medfed.data.layouts import scan_site
from medfed.data.modality import read_record
from medfed.data.records import Split
from medfed.data.synth import SynthesisError, load_synth_meta, synthesize

N = 12
SITE_IDS = ("acrima", "rimone", "refuge", "ct_dicom", "ct_nifti")
NATIVE_SHAPES = {"acrima": (224, 224, 3), "rimone": (192, 192, 3), "refuge": (160, 213, 3)}
CT_SPACING = {"ct_dicom": (2.5, 2.8, 2.8), "ct_nifti": (5.0, 3.4, 3.4)}


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fed") / "synthetic"
    synthesize(out, "all", n_per_site=N, seed=0)
    return out


@pytest.fixture(scope="module")
def fundus60(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fundus60")
    synthesize(out, "fundus", n_per_site=60, seed=5)
    return out


def _hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _manifest(out: Path, site_id: str):
    return load_manifest(out / "sites" / f"{site_id}.toml")


def _items(out: Path, site_id: str) -> dict[str, dict]:
    return {it["patient_id"]: it for it in load_synth_meta(out)["sites"][site_id]["items"]}


# ------------------------------------------------------------------------ reproducibility


def test_same_seed_writes_byte_identical_files(federation: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    synthesize(again, "all", n_per_site=N, seed=0)

    first, second = _hashes(federation), _hashes(again)

    assert first.keys() == second.keys()
    differing = [name for name in first if first[name] != second[name]]
    assert differing == []
    assert any(name.endswith(".xlsx") for name in first)  # the file format that embeds times
    assert any(name.endswith(".nii.gz") for name in first)


def test_different_seeds_give_different_scans(federation: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    synthesize(other, "all", n_per_site=N, seed=1)

    first, second = _hashes(federation), _hashes(other)

    scans = [n for n in first if n.endswith((".jpg", ".png", ".dcm", ".nii.gz"))]
    assert scans
    assert not set(first[n] for n in scans) & set(second.values())


def test_returns_the_manifests_it_wrote_in_site_order(tmp_path: Path) -> None:
    paths = synthesize(tmp_path / "ct", "ct", n_per_site=4, seed=0)

    assert [p.name for p in paths] == ["ct_dicom.toml", "ct_nifti.toml"]
    assert all(p.is_file() and p.parent == tmp_path / "ct" / "sites" for p in paths)


# -------------------------------------------------------------------------------- manifests


def test_every_manifest_loads_and_describes_the_site(federation: Path) -> None:
    for site_id in SITE_IDS:
        manifest = _manifest(federation, site_id)

        assert manifest.id == site_id
        assert manifest.root.is_dir()
        assert manifest.licence == "synthetic, no restrictions"
        assert manifest.ethics == "synthetic data, no patients"
        assert manifest.known_shifts.startswith("simulated")
        assert manifest.description and manifest.source and manifest.acquisition


def test_manifests_set_preprocessing_for_small_inputs(federation: Path) -> None:
    fundus = _manifest(federation, "acrima").preprocess
    ct = _manifest(federation, "ct_dicom").preprocess

    assert isinstance(fundus, FundusPreprocess) and fundus.image_size == 64
    assert isinstance(ct, CTPreprocess) and ct.shape == (16, 48, 48)
    assert ct.spacing == (4.0, 4.0, 4.0)


def test_known_shifts_state_each_cameras_settings(federation: Path) -> None:
    for site in synth.FUNDUS_SITES:
        text = _manifest(federation, site.id).known_shifts

        assert site.cast_name in text
        assert f"gamma {site.camera.gamma:.2f}" in text
        assert f"{site.glaucoma_ratio:.2f}" in text


# ------------------------------------------------------------------ reading back, fundus


def test_each_site_reads_back_without_problems(federation: Path) -> None:
    for site_id in SITE_IDS:
        manifest = _manifest(federation, site_id)

        scan = scan_site(manifest)

        assert scan.problems == [], site_id
        assert len(scan.records) == N, site_id
        assert len({r.patient_id for r in scan.records}) == N, site_id


def test_labels_read_back_match_the_ground_truth(federation: Path) -> None:
    for site_id in SITE_IDS:
        manifest = _manifest(federation, site_id)
        names = {index: name for name, index in manifest.labels.items()}
        truth = _items(federation, site_id)

        for record in scan_site(manifest).records:
            assert names[record.label] == truth[record.patient_id]["label"], record.path


def test_label_ratios_follow_the_site_targets(fundus60: Path) -> None:
    for site in synth.FUNDUS_SITES:
        manifest = _manifest(fundus60, site.id)
        counts = Counter(r.label for r in scan_site(manifest).records)

        ratio = counts[manifest.labels["glaucoma"]] / counts[manifest.labels["normal"]]

        assert ratio == pytest.approx(site.glaucoma_ratio, rel=0.08), site.id


def test_ct_sites_are_roughly_balanced(federation: Path) -> None:
    for site_id in ("ct_dicom", "ct_nifti"):
        counts = Counter(r.label for r in scan_site(_manifest(federation, site_id)).records)

        assert abs(counts[0] - counts[1]) <= 1


def test_rimone_partitions_hold_the_same_images_split_differently(fundus60: Path) -> None:
    manifest = _manifest(fundus60, "rimone")
    randomly = dataclasses.replace(manifest, layout_options={"partition": "partitioned_randomly"})

    by_hospital = {r.patient_id: r.split for r in scan_site(manifest).records}
    scan_random = scan_site(randomly)
    by_random = {r.patient_id: r.split for r in scan_random.records}

    assert scan_random.problems == []
    assert by_hospital.keys() == by_random.keys()
    assert by_hospital != by_random
    for splits in (by_hospital, by_random):
        share_train = sum(s is Split.TRAIN for s in splits.values()) / len(splits)
        assert share_train == pytest.approx(0.7, abs=0.05)
    test_hospitals = {pid.split("_")[0] for pid, s in by_hospital.items() if s is Split.TEST}
    assert test_hospitals == {"r3"}


def test_refuge_spreads_images_over_train_val_and_test(fundus60: Path) -> None:
    records = scan_site(_manifest(fundus60, "refuge")).records

    shares = Counter(r.split for r in records)

    assert shares[Split.TRAIN] / len(records) == pytest.approx(0.6, abs=0.05)
    assert shares[Split.VAL] / len(records) == pytest.approx(0.2, abs=0.05)
    assert shares[Split.TEST] / len(records) == pytest.approx(0.2, abs=0.05)
    for split in Split:
        assert {r.label for r in records if r.split is split} == {0, 1}


def test_refuge_label_tables_name_existing_images(federation: Path) -> None:
    root = federation / "REFUGE"
    sheet = openpyxl.load_workbook(root / "Validation400-GT" / "labels.xlsx").active
    xlsx_rows = list(sheet.iter_rows(values_only=True))
    with open(root / "Test400-GT" / "labels.csv", newline="") as handle:
        csv_rows = list(csv.reader(handle))

    for folder, rows in (("Validation400", xlsx_rows), ("Test400", csv_rows)):
        header = list(rows[0])
        assert header[0] == "ImgName" and "Glaucoma Label" in header
        names = [row[0] for row in rows[1:]]
        assert names and sorted(names) == sorted(p.name for p in (root / folder).iterdir())


def test_acrima_marks_glaucoma_in_the_file_name(federation: Path) -> None:
    for item in _items(federation, "acrima").values():
        assert ("_g_" in item["files"][0]) == (item["label"] == "glaucoma")


def test_fundus_images_decode_at_each_cameras_native_size(federation: Path) -> None:
    for site_id, shape in NATIVE_SHAPES.items():
        record = scan_site(_manifest(federation, site_id)).records[0]

        image = read_record(record, Modality.FUNDUS)

        assert image.dtype == np.uint8 and image.shape == shape
        assert image[:3, :3].max() < 20  # outside the camera field
        h, w = shape[:2]
        assert image[h // 2 - 4 : h // 2 + 4, w // 2 - 4 : w // 2 + 4].mean() > 40


def test_image_size_scales_every_camera(tmp_path: Path) -> None:
    synthesize(tmp_path, "fundus", n_per_site=12, seed=0, image_size=112)

    for site_id, (h, w, _) in NATIVE_SHAPES.items():
        record = scan_site(_manifest(tmp_path, site_id)).records[0]
        assert read_record(record, "fundus").shape == (round(h / 2), round(w / 2), 3)


def test_glaucoma_eyes_have_larger_cup_to_disc_ratio(fundus60: Path) -> None:
    for site in synth.FUNDUS_SITES:
        items = _items(fundus60, site.id).values()
        cdr = {
            label: np.mean([it["cdr"] for it in items if it["label"] == label])
            for label in ("glaucoma", "normal")
        }

        assert cdr["glaucoma"] > cdr["normal"] + 0.1, site.id


def test_cup_to_disc_ratio_is_visible_in_the_pixels() -> None:
    camera = synth.FUNDUS_SITES[0].camera
    anatomy = _phantoms.sample_fundus_anatomy(np.random.default_rng(0), False, camera)
    anatomy = dataclasses.replace(anatomy, cup_contrast=0.9, eye="OD")

    def bright_pixels(cdr: float) -> int:
        drawn = dataclasses.replace(anatomy, cdr=cdr)
        image = _phantoms.render_fundus(np.random.default_rng(1), drawn, camera)
        return int((image[..., 1] > 200).sum())  # the cup is the palest, greenest region

    assert bright_pixels(0.7) > 1.5 * bright_pixels(0.3)


# ---------------------------------------------------------------------- reading back, CT


def test_ct_volumes_decode_with_each_scanners_spacing(federation: Path) -> None:
    for site_id, spacing in CT_SPACING.items():
        truth = _items(federation, site_id)
        for record in scan_site(_manifest(federation, site_id)).records[:3]:
            volume = read_record(record, Modality.CT)

            assert isinstance(volume, Volume)
            assert volume.spacing == pytest.approx(spacing, rel=1e-5)
            assert list(volume.array.shape) == truth[record.patient_id]["shape"]
            assert volume.array.min() < -900 and volume.array.max() > 400  # air and bone


def test_dicom_series_reads_back_the_drawn_volume_in_order_and_in_ras(federation: Path) -> None:
    site = synth.CT_SITES[0]
    labels = synth_ct._ct_labels(site, N, seed=0)
    record = scan_site(_manifest(federation, site.id)).records[0]
    index = int(record.patient_id[len(site.patient_prefix) :]) - 1

    drawn = synth_ct._draw_ct_patient(site, index, labels[index], seed=0)
    volume = read_record(record, Modality.CT)

    # drawn in LPS (columns to the left, rows to the back); read in RAS+, both flipped
    np.testing.assert_array_equal(volume.array, np.round(drawn.hu)[:, ::-1, ::-1])
    by_name = sorted(record.files, key=lambda f: f.name)
    heights = [float(pydicom.dcmread(f).ImagePositionPatient[2]) for f in by_name]
    assert heights != sorted(heights)  # only the positions give the slice order


def test_dicom_files_carry_the_ct_image_header(federation: Path) -> None:
    record = scan_site(_manifest(federation, "ct_dicom")).records[0]

    ds = pydicom.dcmread(record.files[0])

    assert ds.file_meta.MediaStorageSOPClassUID == pydicom.uid.CTImageStorage
    assert ds.SOPClassUID == pydicom.uid.CTImageStorage
    assert ds.PatientID == record.patient_id
    assert ds.RescaleIntercept == -1024 and ds.RescaleSlope == 1
    assert ds.pixel_array.dtype == np.int16
    assert len({pydicom.dcmread(f).SeriesInstanceUID for f in record.files}) == 1


def test_nifti_affine_maps_voxels_to_the_scanner_geometry(federation: Path) -> None:
    site = synth.CT_SITES[1]
    labels = synth_ct._ct_labels(site, N, seed=0)
    record = scan_site(_manifest(federation, site.id)).records[0]
    index = int(record.patient_id[len(site.patient_prefix) :]) - 1

    image = nib.load(record.path)
    drawn = synth_ct._draw_ct_patient(site, index, labels[index], seed=0)

    assert nib.affines.voxel_sizes(image.affine) == pytest.approx((3.4, 3.4, 5.0))
    assert nib.aff2axcodes(image.affine) == ("L", "P", "S")
    data = np.asarray(image.dataobj).transpose(2, 1, 0)
    np.testing.assert_array_equal(data, np.round(drawn.hu))


def test_lesion_is_darker_than_the_liver_around_it() -> None:
    scanner = dataclasses.replace(synth.CT_SITES[0].scanner, noise_hu=0.0, hu_offset=0.0)
    body = _phantoms.sample_body(np.random.default_rng(3), True, 60.0)
    lesion = dataclasses.replace(body.lesion, radius=8.0, contrast_hu=-30.0)
    body = dataclasses.replace(body, lesion=lesion)

    hu = _phantoms.render_ct(np.random.default_rng(0), body, scanner, 24)
    z, y, x = lesion.center
    coords = (np.arange(scanner.matrix) - (scanner.matrix - 1) / 2) * scanner.pixel_spacing
    k = int(z / scanner.slice_thickness)
    row, col = int(np.argmin(abs(coords - y))), int(np.argmin(abs(coords - x)))

    assert hu[k, row, col] < body.liver_hu - 20
    assert hu[k, row, col] > body.liver_hu - 35


def test_most_lesions_are_large_and_clear_and_about_one_in_ten_is_small_and_faint() -> None:
    lesions = [
        _phantoms.sample_body(np.random.default_rng(seed), True, 60.0).lesion for seed in range(400)
    ]
    faint = [les for les in lesions if les.radius < _phantoms.LESION_RADIUS_MM[0]]

    assert 0.05 < len(faint) / len(lesions) < 0.16
    for lesion in lesions:
        small = lesion in faint
        radius = _phantoms.FAINT_RADIUS_MM if small else _phantoms.LESION_RADIUS_MM
        contrast = _phantoms.FAINT_CONTRAST_HU if small else _phantoms.LESION_CONTRAST_HU
        assert radius[0] <= lesion.radius <= radius[1]
        assert contrast[0] <= -lesion.contrast_hu <= contrast[1]
    assert all(
        _phantoms.sample_body(np.random.default_rng(1), False, 60.0).lesion is None for _ in "ab"
    )


def test_ct_manifests_read_a_liver_window_and_describe_the_lesions(tmp_path: Path) -> None:
    manifests = synthesize(tmp_path, "ct", n_per_site=4, seed=0)

    for path in manifests:
        manifest = load_manifest(path)
        assert manifest.preprocess.hu_window == synth.CT_LIVER_WINDOW
        assert "18-32 mm across" in manifest.known_shifts
        assert "60-100 HU below the liver" in manifest.known_shifts


# ---------------------------------------------------------------------- the output folder


def test_refuses_to_write_into_a_folder_it_did_not_write(tmp_path: Path) -> None:
    (tmp_path / "patients.csv").write_text("keep me\n")

    with pytest.raises(SynthesisError, match="not empty") as info:
        synthesize(tmp_path, "ct", n_per_site=4)

    assert isinstance(info.value, MedfedError)
    assert (tmp_path / "patients.csv").read_text() == "keep me\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["patients.csv"]


def test_overwrites_a_previous_output_cleanly(tmp_path: Path) -> None:
    synthesize(tmp_path, "ct", n_per_site=4, seed=0)

    paths = synthesize(tmp_path, "fundus", n_per_site=12, seed=2)

    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["ACRIMA", "RIM-ONE_DL", "REFUGE", "sites", "synth_meta.json"]
    )
    assert sorted(p.name for p in (tmp_path / "sites").iterdir()) == sorted(p.name for p in paths)
    meta = load_synth_meta(tmp_path)
    assert meta["complete"] and meta["seed"] == 2 and meta["modality"] == "fundus"


def test_refuses_to_delete_files_added_to_a_previous_output(tmp_path: Path) -> None:
    synthesize(tmp_path, "ct", n_per_site=4, seed=0)
    (tmp_path / "sites" / "my_hospital.toml").write_text('id = "mine"\n')

    with pytest.raises(SynthesisError, match="my_hospital.toml"):
        synthesize(tmp_path, "ct", n_per_site=4, seed=0)

    assert (tmp_path / "sites" / "my_hospital.toml").exists()


def test_refuses_a_file_as_output_folder(tmp_path: Path) -> None:
    target = tmp_path / "file.txt"
    target.write_text("x")

    with pytest.raises(SynthesisError, match="is a file"):
        synthesize(target)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"modality": "mri"}, "modality"),
        ({"n_per_site": 3}, "n_per_site"),
        ({"modality": "fundus", "n_per_site": 8}, "at least 12"),
        ({"seed": -1}, "seed"),
        ({"image_size": 16}, "image_size"),
    ],
)
def test_rejects_arguments_it_cannot_honour(tmp_path: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(SynthesisError, match=message):
        synthesize(tmp_path / "out", **kwargs)

    assert not (tmp_path / "out").exists()
