"""``medfed pacs make-study``: photos and CT volumes as DICOM test studies that read back as
medfed reads the originals (pixels, Hounsfield units, spacing, orientation), one study for
every input of a call, files owner-only."""

from __future__ import annotations

import stat
from pathlib import Path

import numpy as np
import pydicom
import pytest
from PIL import Image
from typer.testing import CliRunner

from medfed.cli import app as cli
from medfed.data.io import read_dicom_series, read_image, read_nifti


def _make(*argv: object) -> str:
    result = CliRunner().invoke(cli, ["pacs", "make-study", *map(str, argv)])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def ct_volume(tmp_path_factory) -> Path:
    """A synthetic CT patient as medfed's NIfTI site writes it (an oblique-free RAS affine)."""
    from medfed.data.synth import synthesize

    base = tmp_path_factory.mktemp("ct")
    synthesize(base / "data", modality="ct", n_per_site=4, seed=3)
    return sorted((base / "data" / "CT_NIFTI").glob("*.nii.gz"))[0]


def test_a_photo_and_a_ct_volume_make_one_study_that_reads_back_the_same(
    tmp_path: Path, ct_volume: Path
) -> None:
    photo = tmp_path / "eye.png"
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)).save(photo)
    out = tmp_path / "study"

    said = _make(photo, ct_volume, "--out", out, "--patient-id", "TEST01",
                 "--accession", "ACC123", "--study-date", "20240229")  # fmt: skip

    files = sorted(out.rglob("*.dcm"))
    volume = read_nifti(ct_volume)
    assert len(files) == 1 + volume.array.shape[0]
    assert f"wrote {len(files)} instance(s) in 2 series" in said
    read = [pydicom.dcmread(f) for f in files]
    assert {ds.StudyInstanceUID for ds in read} == {read[0].StudyInstanceUID}
    assert {(ds.PatientID, ds.AccessionNumber, ds.StudyDate) for ds in read} == {
        ("TEST01", "ACC123", "20240229")
    }
    # the photo: an ophthalmic photography instance with the very pixels medfed decodes
    (op,) = [ds for ds in read if ds.Modality == "OP"]
    assert np.array_equal(op.pixel_array, read_image(photo))
    # the CT series reads back as medfed reads the NIfTI file: same HU, spacing, axes
    series = sorted(f for f, ds in zip(files, read, strict=True) if ds.Modality == "CT")
    again = read_dicom_series(series)
    assert again.array.shape == volume.array.shape
    assert np.allclose(again.spacing, volume.spacing)
    assert np.abs(again.array - np.round(volume.array)).max() <= 0.5
    # test studies may be made from a site's own patients' photos: owner-only
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
        assert stat.S_IMODE(f.parent.stat().st_mode) == 0o700


def test_photos_as_secondary_capture_and_today_by_default(tmp_path: Path) -> None:
    import datetime as dt

    photo = tmp_path / "eye.jpg"
    Image.fromarray(np.full((16, 16, 3), 90, np.uint8)).save(photo)

    _make(photo, photo, "--out", tmp_path / "s", "--patient-id", "T2", "--modality", "XC")

    read = [pydicom.dcmread(f) for f in sorted((tmp_path / "s").rglob("*.dcm"))]
    assert [ds.Modality for ds in read] == ["XC", "XC"]
    assert len({ds.SeriesInstanceUID for ds in read}) == 2  # a series per photo
    assert read[0].SOPClassUID == "1.2.840.10008.5.1.4.1.1.7"
    assert read[0].StudyDate == dt.date.today().strftime("%Y%m%d")
    assert str(read[0].PatientName) == "Test^T2"
