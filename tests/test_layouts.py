"""Layout readers: records, labels, splits, patient ids, and every reported problem."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from medfed.core.errors import ManifestError
from medfed.data.layouts import scan_site
from medfed.data.modality import read_record
from medfed.data.records import Split

CT_LABELS = {"benign": 0, "malignant": 1}


def _problems_about(scan, text: str) -> list[str]:
    return [str(p) for p in scan.problems if text in str(p)]


# --- ACRIMA -----------------------------------------------------------------------------------


def test_acrima_labels_come_from_the_g_marker(make_acrima_site, site_manifest):
    root = make_acrima_site(["Im310_g_ACRIMA.jpg", "Im001_ACRIMA.jpg", "Im002_ACRIMA.jpg"])

    scan = scan_site(site_manifest("acrima", root))

    assert scan.problems == []
    assert [r.path.name for r in scan.records] == [
        "Im001_ACRIMA.jpg",
        "Im002_ACRIMA.jpg",
        "Im310_g_ACRIMA.jpg",
    ]
    assert [r.label for r in scan.records] == [0, 0, 1]
    assert [r.patient_id for r in scan.records] == [
        "Im001_ACRIMA",
        "Im002_ACRIMA",
        "Im310_g_ACRIMA",
    ]
    assert all(r.split is None for r in scan.records)
    assert scan.records[2].meta["source_file"] == "Im310_g_ACRIMA.jpg"


def test_acrima_patient_regex_groups_images_of_one_patient(make_acrima_site, site_manifest):
    root = make_acrima_site(["P7_left_ACRIMA.jpg", "P7_right_g_ACRIMA.jpg", "P8_ACRIMA.jpg"])
    manifest = site_manifest("acrima", root, layout_options={"patient_regex": r"^(P\d+)_"})

    scan = scan_site(manifest)

    assert [r.patient_id for r in scan.records] == ["P7", "P7", "P8"]


def test_acrima_patient_regex_that_does_not_match_is_reported(make_acrima_site, site_manifest):
    root = make_acrima_site(["Im001_ACRIMA.jpg"])
    manifest = site_manifest("acrima", root, layout_options={"patient_regex": r"^(P\d+)_"})

    scan = scan_site(manifest)

    assert scan.records[0].patient_id == "Im001_ACRIMA"
    assert _problems_about(scan, "does not match")


def test_acrima_real_retina_photo_is_listed_and_decodes(tmp_path, site_manifest):
    from PIL import Image
    from skimage.data import retina

    root = tmp_path / "ACRIMA"
    root.mkdir()
    photo = retina()
    Image.fromarray(photo).save(root / "Im500_g_ACRIMA.jpg", quality=95)

    scan = scan_site(site_manifest("acrima", root))
    image = read_record(scan.records[0], "fundus")

    assert scan.records[0].label == 1
    assert image.shape == photo.shape and image.dtype == np.uint8
    assert np.abs(image.astype(int) - photo.astype(int)).mean() < 3  # JPEG is lossy


def test_acrima_manifest_without_glaucoma_class_raises(make_acrima_site, site_manifest):
    root = make_acrima_site(["Im001_ACRIMA.jpg"])
    manifest = site_manifest("acrima", root, labels={"healthy": 0, "sick": 1})

    with pytest.raises(ManifestError, match=r"site_a\.toml.*glaucoma"):
        scan_site(manifest)


def test_unknown_layout_option_raises_naming_the_manifest(make_acrima_site, site_manifest):
    root = make_acrima_site(["Im001_ACRIMA.jpg"])
    manifest = site_manifest("acrima", root, layout_options={"partiton": "x"})

    with pytest.raises(ManifestError, match=r"site_a\.toml.*partiton"):
        scan_site(manifest)


def test_invalid_patient_regex_raises(make_acrima_site, site_manifest):
    root = make_acrima_site(["Im001_ACRIMA.jpg"])
    manifest = site_manifest("acrima", root, layout_options={"patient_regex": "P\\d+"})

    with pytest.raises(ManifestError, match="needs a group"):
        scan_site(manifest)


def test_acrima_empty_root_and_stray_files_are_reported(tmp_path, site_manifest):
    root = tmp_path / "ACRIMA"
    (root / "nested").mkdir(parents=True)
    (root / "notes.txt").write_text("x")
    (root / ".DS_Store").write_text("x")

    scan = scan_site(site_manifest("acrima", root))

    assert scan.records == []
    assert _problems_about(scan, "no images found")
    assert _problems_about(scan, "nested: unexpected folder")
    assert not _problems_about(scan, "notes.txt") and not _problems_about(scan, "DS_Store")
    # stray files are warned about (listed), not problems that keep the site out of training
    assert sorted(Path(w.file).name for w in scan.warnings) == [".DS_Store", "notes.txt"]


# --- RIM-ONE DL -------------------------------------------------------------------------------


def test_rimone_reads_splits_and_classes_of_the_hospital_partition(make_rimone_site, site_manifest):
    root = make_rimone_site(
        {
            "partitioned_by_hospital/training_set/glaucoma": 2,
            "partitioned_by_hospital/training_set/normal": 1,
            "partitioned_by_hospital/test_set/glaucoma": 1,
            "partitioned_by_hospital/test_set/normal": 1,
            "partitioned_randomly/training_set/normal": 7,
        }
    )

    scan = scan_site(site_manifest("rimone", root))

    assert scan.problems == []
    assert len(scan.records) == 5
    summary = sorted((r.split.value, r.label) for r in scan.records)
    assert summary == [("test", 0), ("test", 1), ("train", 0), ("train", 1), ("train", 1)]
    assert [r.path for r in scan.records] == sorted(r.path for r in scan.records)


def test_rimone_partition_option_picks_the_random_partition(make_rimone_site, site_manifest):
    root = make_rimone_site(
        {
            "partitioned_randomly/training_set/normal": 3,
            "partitioned_randomly/test_set/glaucoma": 2,
        }
    )
    manifest = site_manifest("rimone", root, layout_options={"partition": "partitioned_randomly"})

    scan = scan_site(manifest)

    assert len(scan.records) == 5
    assert {r.split for r in scan.records} == {Split.TRAIN, Split.TEST}


def test_rimone_without_partition_folder_names_the_expected_path(tmp_path, site_manifest):
    root = tmp_path / "RIM-ONE_DL"
    root.mkdir()

    scan = scan_site(site_manifest("rimone", root))

    assert scan.records == []
    assert len(scan.problems) == 1
    assert str(root / "partitioned_by_hospital") in scan.problems[0].message


def test_rimone_empty_class_folder_is_reported(make_rimone_site, site_manifest):
    root = make_rimone_site(
        {
            "partitioned_by_hospital/training_set/glaucoma": 0,
            "partitioned_by_hospital/training_set/normal": 2,
            "partitioned_by_hospital/test_set/normal": 1,
        }
    )

    scan = scan_site(site_manifest("rimone", root))

    assert len(scan.records) == 3
    assert _problems_about(scan, "training_set/glaucoma: class folder is empty")


def test_rimone_undeclared_class_folder_is_reported_and_not_used(make_rimone_site, site_manifest):
    root = make_rimone_site(
        {
            "partitioned_by_hospital/training_set/normal": 2,
            "partitioned_by_hospital/training_set/suspect": 3,
            "partitioned_by_hospital/test_set/glaucoma": 1,
        }
    )

    scan = scan_site(site_manifest("rimone", root))

    assert len(scan.records) == 3
    assert _problems_about(scan, "class folder 'suspect' is not declared in [labels]")


def test_rimone_unknown_partition_raises(make_rimone_site, site_manifest):
    root = make_rimone_site({"partitioned_by_hospital/training_set/normal": 1})
    manifest = site_manifest("rimone", root, layout_options={"partition": "by_hospital"})

    with pytest.raises(ManifestError, match="partitioned_by_hospital"):
        scan_site(manifest)


# --- REFUGE -----------------------------------------------------------------------------------


def test_refuge_reads_class_folders_and_both_label_tables(make_refuge_site, site_manifest):
    root = make_refuge_site()

    scan = scan_site(site_manifest("refuge", root))

    assert scan.problems == []
    got = {r.path.name: (r.split.value, r.label) for r in scan.records}
    assert got == {
        "g0001.jpg": ("train", 1),
        "n0001.jpg": ("train", 0),
        "n0002.jpg": ("train", 0),
        "V0001.jpg": ("val", 1),  # xlsx integer 1
        "V0002.jpg": ("val", 0),  # xlsx float 0.0
        "V0003.jpg": ("val", 1),  # xlsx float 1.0
        "T0001.jpg": ("test", 0),
        "T0002.jpg": ("test", 1),
    }


def test_refuge_without_test_set_uses_only_existing_default_folders(
    make_refuge_site, site_manifest
):
    root = make_refuge_site()
    shutil.rmtree(root / "Test400")

    scan = scan_site(site_manifest("refuge", root))

    assert scan.problems == []
    assert {r.split for r in scan.records} == {Split.TRAIN, Split.VAL}


def test_refuge_label_naming_a_missing_image_is_reported(make_refuge_site, site_manifest):
    root = make_refuge_site()
    (root / "Test400" / "T0002.jpg").unlink()

    scan = scan_site(site_manifest("refuge", root))

    problems = _problems_about(scan, "names image 'T0002.jpg', which does not exist")
    assert problems and problems[0].startswith(str(root / "Test400-GT" / "labels.csv") + ":3")
    assert "T0002.jpg" not in {r.path.name for r in scan.records}


def test_refuge_image_without_label_is_reported(
    make_refuge_site, write_fundus_image, site_manifest
):
    root = make_refuge_site()
    write_fundus_image(root / "Test400" / "T0099.jpg")

    scan = scan_site(site_manifest("refuge", root))

    assert _problems_about(scan, "T0099.jpg: image has no label")
    assert "T0099.jpg" not in {r.path.name for r in scan.records}


def test_refuge_undeclared_label_value_is_reported(make_refuge_site, site_manifest):
    root = make_refuge_site()
    (root / "Test400-GT" / "labels.csv").write_text("ImgName,Glaucoma Label\nT0001,2\nT0002,1\n")

    scan = scan_site(site_manifest("refuge", root))

    assert _problems_about(scan, "label value '2'")
    assert {r.path.name for r in scan.records if r.split is Split.TEST} == {"T0002.jpg"}


def test_refuge_missing_label_file_is_reported(make_refuge_site, site_manifest):
    root = make_refuge_site()
    (root / "Validation400-GT" / "labels.xlsx").unlink()

    scan = scan_site(site_manifest("refuge", root))

    assert _problems_about(scan, "labels.xlsx: label file not found; the 3 image(s)")
    assert Split.VAL not in {r.split for r in scan.records}


def test_refuge_label_file_with_wrong_columns_is_reported(make_refuge_site, site_manifest):
    root = make_refuge_site()
    (root / "Test400-GT" / "labels.csv").write_text("Image,Label\nT0001.jpg,0\n")

    scan = scan_site(site_manifest("refuge", root))

    assert _problems_about(scan, "column(s) ['ImgName', 'Glaucoma Label'] not found")


def test_refuge_custom_label_files_class_folders_and_values(
    tmp_path, write_fundus_image, site_manifest
):
    root = tmp_path / "REFUGE"
    write_fundus_image(root / "Training400" / "G" / "a.jpg")
    write_fundus_image(root / "Training400" / "N" / "b.jpg")
    write_fundus_image(root / "Extra" / "c.jpg")
    (root / "extra.csv").write_text("name,dx\nc.jpg,yes\n")
    options = {
        "class_folders": {"G": "glaucoma", "N": "normal"},
        "label_values": {"yes": "glaucoma", "no": "normal"},
        "label_files": [
            {
                "images": "Extra",
                "file": "extra.csv",
                "image_column": "name",
                "label_column": "dx",
                "split": "test",
            }
        ],
    }

    scan = scan_site(site_manifest("refuge", root, layout_options=options))

    assert scan.problems == []
    assert [(r.path.name, r.label, r.split) for r in scan.records] == [
        ("c.jpg", 1, Split.TEST),
        ("a.jpg", 1, Split.TRAIN),
        ("b.jpg", 0, Split.TRAIN),
    ]


def test_refuge_declared_label_set_with_missing_folder_is_reported(make_refuge_site, site_manifest):
    root = make_refuge_site()
    options = {"label_files": [{"images": "Online400", "file": "x.csv", "split": "test"}]}

    scan = scan_site(site_manifest("refuge", root, layout_options=options))

    assert _problems_about(scan, "Online400 is missing")


def test_refuge_label_files_entry_without_split_raises(make_refuge_site, site_manifest):
    root = make_refuge_site()
    options = {"label_files": [{"images": "Test400", "file": "Test400-GT/labels.csv"}]}

    with pytest.raises(ManifestError, match=r"label_files\[0\].*\['split'\]"):
        scan_site(site_manifest("refuge", root, layout_options=options))


def test_refuge_class_folder_mapped_to_undeclared_class_raises(make_refuge_site, site_manifest):
    root = make_refuge_site()
    options = {"class_folders": {"Glaucoma": "glaucomatous"}}

    with pytest.raises(ManifestError, match="glaucomatous"):
        scan_site(site_manifest("refuge", root, layout_options=options))


# --- image folder -----------------------------------------------------------------------------


def test_imagefolder_maps_training_and_testing_folders(tmp_path, write_fundus_image, site_manifest):
    root = tmp_path / "retina_balanced" / "RIM"
    write_fundus_image(root / "Training" / "glaucoma" / "a.png")
    write_fundus_image(root / "Training" / "normal" / "b.png")
    write_fundus_image(root / "Testing" / "normal" / "c.png")

    scan = scan_site(site_manifest("imagefolder", root))

    assert scan.problems == []
    got = [(r.path.name, r.split, r.label) for r in scan.records]
    assert got == [("c.png", Split.TEST, 0), ("a.png", Split.TRAIN, 1), ("b.png", Split.TRAIN, 0)]


def test_imagefolder_custom_splits_and_unknown_folders(tmp_path, write_fundus_image, site_manifest):
    root = tmp_path / "site"
    write_fundus_image(root / "dev" / "normal" / "a.png")
    write_fundus_image(root / "holdout" / "glaucoma" / "b.png")
    write_fundus_image(root / "scratch" / "normal" / "c.png")
    options = {"splits": {"dev": "train", "holdout": "test"}}

    scan = scan_site(site_manifest("imagefolder", root, layout_options=options))

    assert [(r.path.name, r.split) for r in scan.records] == [
        ("a.png", Split.TRAIN),
        ("b.png", Split.TEST),
    ]
    assert _problems_about(scan, "scratch: not a split folder")


def test_imagefolder_bad_split_name_raises(tmp_path, write_fundus_image, site_manifest):
    root = tmp_path / "site"
    write_fundus_image(root / "dev" / "normal" / "a.png")
    manifest = site_manifest("imagefolder", root, layout_options={"splits": {"dev": "develop"}})

    with pytest.raises(ManifestError, match="'develop' is not a split"):
        scan_site(manifest)


# --- DICOM ------------------------------------------------------------------------------------


def _dicom_site(tmp_path: Path, write_ct_series, labels_csv: str) -> Path:
    root = tmp_path / "CT_DICOM"
    write_ct_series(root / "P1" / "study" / "series", 4, patient_id="P1", series_uid="1.2.3.1")
    # extension-less slice files, as PACS exports often write them
    write_ct_series(root / "P2", 3, patient_id="P2", series_uid="1.2.3.2", suffix="")
    (root / "labels.csv").write_text(labels_csv)
    return root


def test_dicom_groups_slices_into_one_series_per_patient(tmp_path, write_ct_series, site_manifest):
    root = _dicom_site(tmp_path, write_ct_series, "patient_id,label\nP1,malignant\nP2,benign\n")
    manifest = site_manifest("dicom", root, modality="ct", labels=CT_LABELS)

    scan = scan_site(manifest)

    assert scan.problems == []
    first, second = scan.records
    assert (first.patient_id, first.label, len(first.files)) == ("P1", 1, 4)
    assert (second.patient_id, second.label, len(second.files)) == ("P2", 0, 3)
    assert first.path == root / "P1" / "study" / "series"
    assert list(first.files) == sorted(first.files)
    assert first.meta["series_uid"] == "1.2.3.1"
    assert first.meta["n_slices"] == 4
    assert first.meta["manufacturer"] == "Test Scanner Co"


def test_dicom_unreadable_file_is_reported_by_name(tmp_path, write_ct_series, site_manifest):
    root = _dicom_site(tmp_path, write_ct_series, "patient_id,label\nP1,malignant\nP2,benign\n")
    garbage = root / "P1" / "broken.dcm"
    garbage.write_bytes(b"this is not dicom" * 20)

    scan = scan_site(site_manifest("dicom", root, modality="ct", labels=CT_LABELS))

    problems = _problems_about(scan, "DICOM header cannot be read")
    assert len(problems) == 1 and problems[0].startswith(str(garbage))
    assert len(scan.records) == 2


def test_dicom_label_and_series_mismatches_are_reported(tmp_path, write_ct_series, site_manifest):
    csv = "patient_id,label\nP1,malignant\nP9,benign\nP1,benign\n"
    root = _dicom_site(tmp_path, write_ct_series, csv)

    scan = scan_site(site_manifest("dicom", root, modality="ct", labels=CT_LABELS))

    assert [r.patient_id for r in scan.records] == ["P1"]
    assert _problems_about(scan, "series of patient 'P2' has no row")
    assert _problems_about(scan, "patient 'P9' is listed but has no DICOM series")
    assert _problems_about(scan, "patient 'P1' is listed again")


def test_dicom_undeclared_label_value_is_reported(tmp_path, write_ct_series, site_manifest):
    root = _dicom_site(tmp_path, write_ct_series, "patient_id,label\nP1,malignant\nP2,unsure\n")

    scan = scan_site(site_manifest("dicom", root, modality="ct", labels=CT_LABELS))

    assert [r.patient_id for r in scan.records] == ["P1"]
    assert _problems_about(scan, "label 'unsure', which [labels] does not declare")


def test_dicom_two_series_of_one_patient_keeps_the_larger(tmp_path, write_ct_series, site_manifest):
    root = _dicom_site(tmp_path, write_ct_series, "patient_id,label\nP1,malignant\nP2,benign\n")
    write_ct_series(root / "P1" / "scout", 2, patient_id="P1", series_uid="1.2.3.9")

    scan = scan_site(site_manifest("dicom", root, modality="ct", labels=CT_LABELS))

    p1 = next(r for r in scan.records if r.patient_id == "P1")
    assert p1.meta["series_uid"] == "1.2.3.1"
    problems = _problems_about(scan, "patient 'P1' has another series (2 slices")
    assert problems and problems[0].startswith(str(root / "P1" / "scout"))


def test_dicom_missing_labels_csv_is_reported(tmp_path, write_ct_series, site_manifest):
    root = _dicom_site(tmp_path, write_ct_series, "")
    (root / "labels.csv").unlink()

    scan = scan_site(site_manifest("dicom", root, modality="ct", labels=CT_LABELS))

    assert scan.records == []
    assert [p.message for p in scan.problems] == ["label file not found; no scan can be labelled"]


def test_dicom_labels_file_option_and_stray_files(tmp_path, write_ct_series, site_manifest):
    root = _dicom_site(tmp_path, write_ct_series, "")
    (root / "labels.csv").unlink()
    (root / "meta").mkdir()
    (root / "meta" / "dx.csv").write_text("patient_id,label\nP1,benign\nP2,benign\n")
    (root / "P1" / "README").write_text("not dicom")
    options = {"labels_file": "meta/dx.csv"}
    manifest = site_manifest("dicom", root, modality="ct", labels=CT_LABELS, layout_options=options)

    scan = scan_site(manifest)

    assert [r.patient_id for r in scan.records] == ["P1", "P2"]
    assert scan.problems == []
    assert [(Path(w.file).name, w.message) for w in scan.warnings] == [
        ("README", "neither *.dcm nor extension-less DICOM; ignored")
    ]


def test_dicom_real_ct_small_file_scans_and_decodes(tmp_path, site_manifest):
    from pydicom.data import get_testdata_file

    root = tmp_path / "CT_DICOM"
    (root / "case1").mkdir(parents=True)
    shutil.copy(get_testdata_file("CT_small.dcm"), root / "case1" / "CT_small.dcm")
    (root / "labels.csv").write_text("patient_id,label\n1CT1,benign\n")

    scan = scan_site(site_manifest("dicom", root, modality="ct", labels=CT_LABELS))
    volume = read_record(scan.records[0], "ct")

    assert scan.problems == []
    assert scan.records[0].meta["manufacturer"] == "GE MEDICAL SYSTEMS"
    assert volume.array.shape == (1, 128, 128)
    assert volume.spacing == pytest.approx((5.0, 0.661468, 0.661468))


# --- NIfTI ------------------------------------------------------------------------------------


def test_nifti_matches_files_by_name_and_by_file_column(tmp_path, write_nifti, site_manifest):
    root = tmp_path / "CT_NIFTI"
    write_nifti(root / "P1.nii.gz", np.zeros((4, 5, 6), np.float32))
    write_nifti(root / "scans" / "anon_07.nii", np.zeros((4, 5, 3), np.float32))
    (root / "labels.csv").write_text(
        "patient_id,label,file\nP1,benign,\nP2,malignant,scans/anon_07.nii\n"
    )

    scan = scan_site(site_manifest("nifti", root, modality="ct", labels=CT_LABELS))

    assert scan.problems == []
    assert [(r.patient_id, r.label, r.path.name) for r in scan.records] == [
        ("P1", 0, "P1.nii.gz"),
        ("P2", 1, "anon_07.nii"),
    ]
    assert scan.records[0].meta["shape"] == (4, 5, 6)
    assert scan.records[1].meta["source_file"] == "scans/anon_07.nii"


def test_nifti_mismatches_are_reported(tmp_path, write_nifti, site_manifest):
    root = tmp_path / "CT_NIFTI"
    write_nifti(root / "P1.nii.gz", np.zeros((4, 5, 6), np.float32))
    write_nifti(root / "P3.nii.gz", np.zeros((4, 5, 6), np.float32))
    write_nifti(root / "P4.nii", np.zeros((4, 5, 6, 2), np.float32))
    (root / "P5.nii").write_bytes(b"garbage" * 10)
    (root / "labels.csv").write_text(
        "patient_id,label,file\nP1,benign,\nP2,benign,\nP4,benign,\nP5,benign,\nP6,benign,x.nii\n"
    )

    scan = scan_site(site_manifest("nifti", root, modality="ct", labels=CT_LABELS))

    assert [r.patient_id for r in scan.records] == ["P1"]
    assert _problems_about(scan, "patient 'P2' is listed but no P2.nii(.gz) exists")
    assert _problems_about(scan, "P3.nii.gz: file has no row")
    assert _problems_about(scan, "P4.nii: image has shape (4, 5, 6, 2)")
    assert _problems_about(scan, "P5.nii: NIfTI header cannot be read")
    assert _problems_about(scan, "patient 'P6': file 'x.nii' does not exist")


def test_nifti_real_nibabel_file_scans_and_decodes(tmp_path, site_manifest):
    from nibabel.testing import data_path

    root = tmp_path / "CT_NIFTI"
    root.mkdir()
    shutil.copy(Path(data_path) / "anatomical.nii", root / "anatomical.nii")
    (root / "labels.csv").write_text("patient_id,label\nanatomical,malignant\n")

    scan = scan_site(site_manifest("nifti", root, modality="ct", labels=CT_LABELS))
    volume = read_record(scan.records[0], "ct")

    assert scan.problems == []
    assert scan.records[0].meta["shape"] == (33, 41, 25)
    assert volume.array.shape == (25, 41, 33)
    assert volume.spacing == (2.0, 2.0, 2.0)
