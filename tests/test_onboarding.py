"""``medfed sites check`` and ``medfed sites card``: exit codes, and messages naming the file."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import tomli_w
from typer.testing import CliRunner

from medfed.cli import app

runner = CliRunner()
FUNDUS = {"normal": 0, "glaucoma": 1}


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MEDFED_CACHE", str(tmp_path / "cache"))


def write_manifest(folder: Path, site_id: str, layout: str, root: Path | str, **extra) -> Path:
    data = {
        "id": site_id,
        "modality": extra.pop("modality", "fundus"),
        "layout": layout,
        "root": str(root),
        "labels": extra.pop("labels", FUNDUS),
        **extra,
    }
    path = folder / "sites" / f"{site_id}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(data))
    return path


def acrima_names(n: int = 12) -> list[str]:
    return [f"Im{i:03d}_g_ACRIMA.jpg" if i % 2 else f"Im{i:03d}_ACRIMA.jpg" for i in range(n)]


def check(*args: str):
    return runner.invoke(app, ["sites", "check", *args])


def test_a_clean_site_is_ready(make_acrima_site, tmp_path) -> None:
    manifest = write_manifest(tmp_path, "acrima", "acrima", make_acrima_site(acrima_names()))
    result = check(str(manifest))
    assert result.exit_code == 0, result.output
    assert "[READY] site acrima" in result.output
    # read as text, not as Python's dicts: "sizes: 64x64 pixels", "intensity: mean ... (std ...)"
    assert "{'" not in result.output and "[3" not in result.output
    assert re.search(r"^  sizes: \d+x\d+( to \d+x\d+)? pixels", result.output, re.M)
    assert re.search(r"^  intensity: mean [\d.]+, [\d.]+, [\d.]+ \(std ", result.output, re.M)
    report = json.loads(check(str(manifest), "--json").output)[0]
    assert report["ready"] and report["n_readable"] == 12
    assert sum(report["counts"]["train"].values()) > 0


def test_a_truncated_jpeg_is_reported_with_its_file(make_acrima_site, tmp_path) -> None:
    root = make_acrima_site(acrima_names())
    bad = root / "Im005_g_ACRIMA.jpg"
    bad.write_bytes(bad.read_bytes()[: len(bad.read_bytes()) // 3])
    result = check(str(write_manifest(tmp_path, "acrima", "acrima", root)))
    assert result.exit_code == 1
    assert "Im005_g_ACRIMA.jpg" in result.output and "truncated" in result.output
    assert "11 readable" in result.output  # counted, not silently dropped


def test_an_unreadable_dicom_is_reported_with_its_file(write_ct_series, tmp_path) -> None:
    root = tmp_path / "CT"
    for p in range(4):
        write_ct_series(root / f"P{p}", 3, patient_id=f"P{p}", series_uid=f"1.2.3.{p}")
    (root / "P9").mkdir()
    (root / "P9" / "broken.dcm").write_bytes(b"not a dicom file at all" * 10)
    (root / "labels.csv").write_text(
        "patient_id,label\n"
        + "".join(f"P{p},{'lesion' if p % 2 else 'normal'}\n" for p in range(4))
    )
    manifest = write_manifest(
        tmp_path, "ct", "dicom", root, modality="ct", labels={"normal": 0, "lesion": 1}
    )
    result = check(str(manifest))
    assert result.exit_code == 1
    assert "broken.dcm" in result.output


def test_a_label_file_naming_a_missing_image_is_reported(make_refuge_site, tmp_path) -> None:
    root = make_refuge_site()
    (root / "Test400" / "T0002.jpg").unlink()
    result = check(str(write_manifest(tmp_path, "refuge", "refuge", root)))
    assert result.exit_code == 1
    assert "T0002.jpg" in result.output


def test_an_empty_class_folder_is_reported(make_rimone_site, tmp_path) -> None:
    root = make_rimone_site(
        {
            "partitioned_by_hospital/training_set/glaucoma": 4,
            "partitioned_by_hospital/training_set/normal": 4,
            "partitioned_by_hospital/test_set/glaucoma": 2,
            "partitioned_by_hospital/test_set/normal": 0,
        }
    )
    result = check(str(write_manifest(tmp_path, "rimone", "rimone", root)))
    assert result.exit_code == 1
    assert "test_set/normal" in result.output


def test_a_manifest_pointing_nowhere_is_unusable(tmp_path) -> None:
    result = check(str(write_manifest(tmp_path, "ghost", "acrima", tmp_path / "nowhere")))
    assert result.exit_code == 2
    assert "nowhere" in result.output and "does not exist" in result.output


def test_an_unknown_layout_or_unset_variable_is_unusable(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("MEDFED_DATA", raising=False)
    unknown = check(str(write_manifest(tmp_path, "a", "kaggle", tmp_path)))
    assert unknown.exit_code == 2 and "unknown layout 'kaggle'" in unknown.output
    unset = check(str(write_manifest(tmp_path, "b", "acrima", "${MEDFED_DATA}/ACRIMA")))
    assert unset.exit_code == 2 and "MEDFED_DATA is not set" in unset.output


def test_distances_between_sites_are_reported(make_acrima_site, make_rimone_site, tmp_path):
    acrima = write_manifest(tmp_path, "acrima", "acrima", make_acrima_site(acrima_names()))
    rimone = make_rimone_site(
        {
            f"partitioned_by_hospital/{s}/{c}": 4
            for s in ("training_set", "test_set")
            for c in ("glaucoma", "normal")
        }
    )
    rim = write_manifest(tmp_path, "rimone", "rimone", rimone)
    reports = json.loads(check(str(acrima), str(rim), "--json").output)
    assert set(reports[0]["distances"]) == {"rimone"}
    assert reports[0]["distances"]["rimone"] >= 0.0


def test_card_is_written_with_counts_and_fields_to_fill(make_acrima_site, tmp_path) -> None:
    manifest = write_manifest(tmp_path, "acrima", "acrima", make_acrima_site(acrima_names()))
    out = tmp_path / "cards"
    result = runner.invoke(app, ["sites", "card", str(manifest), "--out-dir", str(out)])
    assert result.exit_code == 0, result.output
    assert "checking site acrima: reading every scan" in result.output  # said before the wait
    card = (out / "acrima.md").read_text()
    assert "# Data card: acrima" in card
    assert re.search(r"^- image sizes: \d+x\d+.* pixels", card, re.M), card
    assert re.search(r"^- intensity before preprocessing: mean .*, 0-255$", card, re.M), card
    assert "| all | 6 | 6 | 12 |" in card.replace("  ", " ")
    assert "## Licence" in card and "to fill in" in card


def test_synth_then_check_every_generated_manifest_exits_0(tmp_path) -> None:
    out = tmp_path / "federation"
    made = runner.invoke(app, ["synth", "--out", str(out), "--n-per-site", "12", "--seed", "3"])
    assert made.exit_code == 0, made.output
    manifests = sorted((out / "sites").glob("*.toml"))
    assert [m.stem for m in manifests] == ["acrima", "ct_dicom", "ct_nifti", "refuge", "rimone"]
    result = check(*map(str, manifests))
    assert result.exit_code == 0, result.output
    assert result.output.count("[READY]") == 5


def test_example_manifests_work_against_synthetic_data(tmp_path, monkeypatch) -> None:
    out = tmp_path / "federation"
    assert runner.invoke(app, ["synth", "--out", str(out), "--n-per-site", "12"]).exit_code == 0
    monkeypatch.setenv("MEDFED_DATA", str(out))
    examples = sorted((Path(__file__).parent.parent / "sites").glob("*.toml"))
    assert len(examples) == 5
    result = check(*map(str, examples))
    assert result.exit_code == 0, result.output


def test_small_splits_are_warned_about_but_the_site_stays_ready(make_acrima_site, tmp_path):
    manifest = write_manifest(tmp_path, "acrima", "acrima", make_acrima_site(acrima_names()))
    result = check(str(manifest))
    assert result.exit_code == 0, result.output
    assert "[READY] site acrima" in result.output
    # read as text, not as Python's dicts: "sizes: 64x64 pixels", "intensity: mean ... (std ...)"
    assert "{'" not in result.output and "[3" not in result.output
    assert re.search(r"^  sizes: \d+x\d+( to \d+x\d+)? pixels", result.output, re.M)
    assert re.search(r"^  intensity: mean [\d.]+, [\d.]+, [\d.]+ \(std ", result.output, re.M)
    report = json.loads(check(str(manifest), "--json").output)[0]
    assert report["ready"] and report["problems"] == []
    for split, per in report["counts"].items():  # 12 scans: every split is small
        pos, neg = per["glaucoma"], per["normal"]
        expected = (
            f"{split} split has {pos} positive ('glaucoma') and {neg} negative ('normal') "
            f"scans, fewer than 10 positives ({pos}) and fewer than 10 negatives ({neg}): "
            "figures on it will be flagged unreliable"
        )
        assert any(w.startswith(expected) for w in report["warnings"]), report["warnings"]
        assert f"warning: {split} split has {pos} positive" in result.output


def test_splits_with_ten_of_each_class_get_no_small_split_warning(make_acrima_site, tmp_path):
    split = {"val_fraction": 0.0, "test_fraction": 0.5}
    root = make_acrima_site(acrima_names(40))
    manifest = write_manifest(tmp_path, "acrima", "acrima", root, split=split)
    report = json.loads(check(str(manifest), "--json").output)[0]
    assert report["counts"] == {
        "train": {"normal": 10, "glaucoma": 10},
        "test": {"normal": 10, "glaucoma": 10},
    }
    assert report["ready"]
    assert not [w for w in report["warnings"] if "unreliable" in w], report["warnings"]


# ---------------------------------------------------------------------------- what the images are
def _photos(root: Path, pictures: dict[str, object]) -> Path:
    """An ACRIMA folder holding ``pictures`` (name: RGB array), saved as JPEG."""
    from PIL import Image

    root.mkdir(parents=True, exist_ok=True)
    for name, pixels in pictures.items():
        Image.fromarray(pixels).convert("RGB").save(root / name)  # type: ignore[arg-type]
    return root


def test_sites_check_warns_of_photos_that_are_no_fundus_photos(tmp_path) -> None:
    from skimage import data

    retina = data.retina()[::4, ::4]
    others = {"astronaut": data.astronaut(), "coffee": data.coffee()}
    others |= {"cat": data.chelsea(), "rocket": data.rocket()}
    names = acrima_names(12)
    pictures = {names[i]: retina for i in range(8)}  # the real fundus photo, and not
    pictures |= {names[8 + i]: pixels for i, pixels in enumerate(others.values())}
    root = _photos(tmp_path / "ACRIMA", pictures)
    result = check(str(write_manifest(tmp_path, "acrima", "acrima", root)))
    assert result.exit_code == 0, result.output  # warnings, not refusals
    warned = [line for line in result.output.splitlines() if "do not look like fundus" in line]
    listed = " ".join(warned)
    assert all(names[8 + i] in listed for i in range(4))  # astronaut, coffee, cat, rocket
    assert not any(names[i] in listed for i in range(8))  # the retina photos pass
    assert "no dark surround" in listed and "not red to orange" in listed


def test_synthetic_fundus_and_ct_sites_look_like_their_modality(tmp_path) -> None:
    for modality, n in (("fundus", "12"), ("ct", "4")):
        out = tmp_path / modality
        made = runner.invoke(
            app, ["synth", "--out", str(out), "--modality", modality, "--n-per-site", n]
        )
        assert made.exit_code == 0, made.output
        manifests = sorted(str(p) for p in (out / "sites").glob("*.toml"))
        result = check(*manifests)
        assert "do not look like" not in result.output, result.output
        assert "byte-identical to scans of site" not in result.output


def test_sites_check_warns_of_scans_byte_identical_across_sites(tmp_path) -> None:
    from skimage import data

    retina = data.retina()[::4, ::4]
    shifted = {n: np.roll(retina, i, axis=1) for i, n in enumerate(acrima_names(12))}
    first = _photos(tmp_path / "one" / "ACRIMA", shifted)
    second = tmp_path / "two" / "ACRIMA"
    shutil.copytree(first, second)
    manifests = [
        str(write_manifest(tmp_path / "one", "acrima", "acrima", first)),
        str(write_manifest(tmp_path / "two", "copy", "acrima", second)),
    ]
    result = check(*manifests)
    assert result.exit_code == 0, result.output
    assert "12 scan(s) byte-identical to scans of site copy (same SHA-256)" in result.output
    assert "12 scan(s) byte-identical to scans of site acrima" in result.output
    assert f"{first / 'Im000_ACRIMA.jpg'} = {second / 'Im000_ACRIMA.jpg'}" in result.output
