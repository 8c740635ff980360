"""The DR grading layouts (aptos, eyepacs, idrid) on hand-made folders: what they read, and
every mismatch between the images and the grading table named as a problem."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from medfed.config import parse_manifest
from medfed.core.errors import ManifestError
from medfed.data.layouts import scan_site
from medfed.data.layouts.eyepacs import patient_of

LABELS = {"no_dr": 0, "mild": 1, "moderate": 2, "severe": 3, "proliferative": 4}


def _image(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), (120, 40, 20)).save(path)


def _manifest(root: Path, layout: str, **extra):
    data = {"id": "s", "modality": "fundus", "layout": layout, "root": str(root)}
    return parse_manifest(
        {**data, "labels": dict(LABELS), **extra}, where="test.toml", base_dir=root
    )


def _aptos(root: Path, rows: list[str], images: list[str]) -> None:
    for name in images:
        _image(root / "train_images" / f"{name}.png")
    (root / "train.csv").write_text("\n".join(["id_code,diagnosis", *rows]) + "\n")


def test_aptos_reads_each_image_with_its_grade(tmp_path: Path) -> None:
    _aptos(tmp_path, ["aa01,0", "bb02,3"], ["aa01", "bb02"])

    scan = scan_site(_manifest(tmp_path, "aptos"))

    assert scan.problems == []
    assert [(r.path.name, r.label, r.patient_id) for r in scan.records] == [
        ("aa01.png", 0, "aa01"),
        ("bb02.png", 3, "bb02"),
    ]
    assert scan.records[1].meta["class_name"] == "severe"


def test_table_and_folder_mismatches_are_problems(tmp_path: Path) -> None:
    _aptos(
        tmp_path,
        ["aa01,0", "aa01,1", "zz99,2", "cc03,7", "dd04,"],
        ["aa01", "bb02", "cc03", "dd04"],
    )

    scan = scan_site(_manifest(tmp_path, "aptos"))

    text = "\n".join(str(p) for p in scan.problems)
    assert "'aa01' is listed again" in text
    assert "'zz99', which does not exist" in text
    assert "grade '7', which is not one of" in text
    assert "grade '', which is not one of" in text
    assert "bb02.png: image has no grade" in text
    assert [r.path.name for r in scan.records] == ["aa01.png"]


def test_a_missing_table_or_folder_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    _image(tmp_path / "train_images" / "aa01.png")

    no_table = scan_site(_manifest(tmp_path, "aptos"))
    no_folder = scan_site(_manifest(tmp_path, "eyepacs"))
    no_base = scan_site(_manifest(tmp_path, "idrid"))

    assert "label file not found; the 1 image(s)" in str(no_table.problems[0])
    assert "expected folder" in str(no_folder.problems[0]) and "'eyepacs'" in str(
        no_folder.problems[0]
    )
    assert "B. Disease Grading" in str(no_base.problems[0])


def test_a_table_with_other_columns_names_the_expected_ones(tmp_path: Path) -> None:
    _image(tmp_path / "train" / "10_left.jpeg")
    (tmp_path / "trainLabels.csv").write_text("image;level\n10_left;0\n")

    scan = scan_site(_manifest(tmp_path, "eyepacs"))

    text = str(scan.problems[0])
    assert "'image'" in text and "'level'" in text and "semicolons" in text


def test_eyepacs_patient_is_the_number_before_the_eye() -> None:
    assert patient_of(Path("10_left.jpeg")) == "10"
    assert patient_of(Path("10_right.jpeg")) == "10"
    assert patient_of(Path("scan7.jpeg")) == "scan7"


def test_grade_names_map_other_grading_values(tmp_path: Path) -> None:
    _aptos(tmp_path, ["aa01,R0", "bb02,R2"], ["aa01", "bb02"])
    options = {"grade_names": {"R0": "no_dr", "R2": "moderate"}}

    scan = scan_site(_manifest(tmp_path, "aptos", layout_options=options))

    assert scan.problems == [] and [r.label for r in scan.records] == [0, 2]


def test_grade_names_must_name_declared_classes(tmp_path: Path) -> None:
    _aptos(tmp_path, ["aa01,0"], ["aa01"])
    options = {"grade_names": {"0": "healthy"}}

    with pytest.raises(ManifestError, match="healthy"):
        scan_site(_manifest(tmp_path, "aptos", layout_options=options))


def test_unknown_layout_options_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="unknown key"):
        scan_site(_manifest(tmp_path, "idrid", layout_options={"partition": "x"}))
