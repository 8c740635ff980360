"""One orientation for every CT site: DICOM series and NIfTI files of one anatomy read the same.

The phantom is an asymmetric volume drawn in DICOM's LPS+ frame: voxel ``hu[k, r, c]`` has its
column c towards the patient's left, its row r towards the back and its slice k upwards, with a
marker in the right-front-foot corner (k, r, c) = (0, 0, 0). Every reader must return it in the
closest canonical orientation, RAS+, as (z, y, x): there the marker sits at [0, -1, -1].
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Sequence
from pathlib import Path

import nibabel as nib
import numpy as np
import pydicom
import pytest
from typer.testing import CliRunner

from medfed.cli import app
from medfed.config import CTPreprocess, Modality, load_manifest
from medfed.core.errors import DataError
from medfed.data import synth, synth_ct
from medfed.data.cards import render_card
from medfed.data.checks import SiteReport
from medfed.data.io import Volume, read_dicom_series, read_nifti
from medfed.data.modality import read_record
from medfed.data.preprocess import apply_pipeline
from medfed.data.records import Record
from tests.realfiles import write_ct_slice

SHAPE = (5, 7, 6)  # (slices, rows, columns): no two alike, so a swapped axis shows
ROW_MM, COL_MM, GAP_MM = 0.7, 0.9, 2.5  # anisotropic, so spacing must follow its axis
ORIGIN = (-40.0, 25.0, 110.0)  # LPS+ centre of the first voxel
AXIAL = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0)
SAGITTAL = (0.0, 1.0, 0.0, 0.0, 0.0, -1.0)  # columns to the back, rows to the feet
MARKER_HU = 200
OPTIONS = CTPreprocess(hu_window=(-160.0, 240.0), spacing=(2.0, 1.0, 1.0), shape=(8, 6, 6))
LPS_TO_RAS = np.diag([-1.0, -1.0, 1.0, 1.0])


def phantom() -> np.ndarray:
    """int16 HU (slice, row, column) in the soft-tissue window, a marker at (0, 0, 0)."""
    hu = np.random.default_rng(7).integers(-100, 100, size=SHAPE).astype(np.int16)
    hu[0, 0, 0] = MARKER_HU
    return hu


def rotated(iop: Sequence[float], degrees: float) -> tuple[float, ...]:
    """``iop`` with both of its directions turned by ``degrees`` about the patient's z axis."""
    t = np.deg2rad(degrees)
    turn = np.array([[np.cos(t), -np.sin(t), 0.0], [np.sin(t), np.cos(t), 0.0], [0.0, 0.0, 1.0]])
    return tuple(float(v) for v in np.concatenate([turn @ iop[:3], turn @ iop[3:]]))


def lps_affine(iop: Sequence[float]) -> np.ndarray:
    """The LPS+ affine of voxels (column, row, slice) of a series written by write_series."""
    along_row, along_column = np.array(iop[:3]), np.array(iop[3:])
    affine = np.eye(4)
    affine[:3, 0] = along_row * COL_MM
    affine[:3, 1] = along_column * ROW_MM
    affine[:3, 2] = np.cross(along_row, along_column) * GAP_MM
    affine[:3, 3] = ORIGIN
    return affine


def write_series(folder: Path, hu: np.ndarray, iop: Sequence[float] = AXIAL) -> Record:
    """One file per slice, file names shuffled so that only positions give the order."""
    affine = lps_affine(iop)
    names = list(range(len(hu)))
    random.Random(3).shuffle(names)
    files = []
    for k, pixels in enumerate(hu):
        position = (affine @ [0.0, 0.0, k, 1.0])[:3]
        files.append(
            write_ct_slice(
                folder / f"IM{names[k]:03d}.dcm",
                pixels + 1024,  # stored values; the default intercept is -1024
                position=position,
                orientation=iop,
                pixel_spacing=(ROW_MM, COL_MM),
                thickness=GAP_MM,
            )
        )
    return Record(path=folder, label=0, patient_id="P1", files=tuple(files))


def restored(
    data: np.ndarray, affine: np.ndarray, axes: Sequence[int], flips: Sequence[bool]
) -> tuple[np.ndarray, np.ndarray]:
    """The same voxels stored another way: new axis a is old axis axes[a], reversed if flips[a].

    Worked out by hand (not with nibabel's orientation tools, which the readers use)."""
    out = data.transpose(axes)
    new = np.eye(4)
    new[:3, 3] = affine[:3, 3]
    for a, (old, flip) in enumerate(zip(axes, flips, strict=True)):
        column = affine[:3, old]
        new[:3, a] = -column if flip else column
        if flip:
            out = np.flip(out, axis=a)
            new[:3, 3] += column * (data.shape[old] - 1)
    return np.ascontiguousarray(out), new


def write_nifti(
    path: Path,
    hu: np.ndarray,
    iop: Sequence[float] = AXIAL,
    axes: Sequence[int] = (0, 1, 2),
    flips: Sequence[bool] = (False, False, False),
) -> Record:
    """The NIfTI file a DICOM-to-NIfTI conversion gives write_series' series, stored with its
    voxel axes permuted and flipped as asked (the affine follows, so the anatomy is the same)."""
    data = hu.astype(np.int16).transpose(2, 1, 0)  # (column, row, slice)
    data, affine = restored(data, LPS_TO_RAS @ lps_affine(iop), axes, flips)
    image = nib.Nifti1Image(data, affine)
    image.set_qform(affine, code=1)
    image.set_sform(affine, code=1)
    nib.save(image, path)
    return Record(path=path, label=0, patient_id="P1")


def preprocessed(record: Record) -> np.ndarray:
    """A record through the CT site path: decode, window, resample to spacing, crop/pad."""
    volume = read_record(record, Modality.CT)
    return apply_pipeline(Modality.CT, OPTIONS, volume).numpy()


# --------------------------------------------------------------- DICOM and NIfTI agree


# (stored axes, flips) -> the stored orientation's axis codes, from the LPS conversion
STORED = {
    "LPS": ((0, 1, 2), (False, False, False)),
    "LAI": ((0, 1, 2), (False, True, True)),
    "RAS": ((0, 1, 2), (True, True, False)),
    "SLA": ((2, 0, 1), (False, False, True)),
}


@pytest.mark.parametrize("stored", STORED)
def test_a_dicom_series_and_its_nifti_preprocess_to_the_same_array(tmp_path, stored) -> None:
    hu = phantom()
    axes, flips = STORED[stored]
    dicom = write_series(tmp_path / "series", hu)
    nifti = write_nifti(tmp_path / "volume.nii.gz", hu, axes=axes, flips=flips)

    from_dicom, from_nifti = read_record(dicom, Modality.CT), read_record(nifti, Modality.CT)

    assert from_nifti.orientation.source == tuple(stored)
    np.testing.assert_array_equal(from_dicom.array, from_nifti.array)
    assert from_dicom.spacing == pytest.approx(from_nifti.spacing)
    np.testing.assert_allclose(preprocessed(dicom), preprocessed(nifti), atol=1e-6)


def test_an_axial_lps_series_reads_as_ras_with_its_marker_front_right_foot(tmp_path) -> None:
    hu = phantom()

    volume = read_dicom_series(write_series(tmp_path, hu).files)

    assert volume.orientation.source == ("L", "P", "S") and volume.orientation.result == "RAS"
    assert volume.orientation.describe() == "RAS (from LPS DICOM)"
    np.testing.assert_array_equal(volume.array, hu[:, ::-1, ::-1])  # x to the right, y forward
    assert volume.array[0, -1, -1] == MARKER_HU
    assert volume.spacing == pytest.approx((GAP_MM, ROW_MM, COL_MM))


def test_a_sagittal_series_is_turned_axial_and_its_spacing_follows_the_axes(tmp_path) -> None:
    hu = phantom()

    volume = read_dicom_series(write_series(tmp_path / "series", hu, SAGITTAL).files)
    nifti = read_nifti(write_nifti(tmp_path / "v.nii", hu, SAGITTAL).path)

    # columns ran to the back (y reversed), rows to the feet (z reversed), slices to the right
    assert volume.orientation.source == ("P", "I", "R")
    np.testing.assert_array_equal(volume.array, hu.transpose(1, 2, 0)[::-1, ::-1, :])
    assert volume.spacing == pytest.approx((ROW_MM, COL_MM, GAP_MM))
    np.testing.assert_array_equal(volume.array, nifti.array)
    assert nifti.spacing == pytest.approx(volume.spacing)


# ----------------------------------------------------------------------- oblique series


def test_an_oblique_series_takes_the_closest_canonical_orientation(tmp_path) -> None:
    hu = phantom()
    tilted = rotated(AXIAL, 20.0)

    volume = read_dicom_series(write_series(tmp_path / "series", hu, tilted).files)
    nifti = read_nifti(write_nifti(tmp_path / "v.nii", hu, tilted, flips=(True, False, True)).path)

    assert volume.orientation.oblique and volume.orientation.source == ("L", "P", "S")
    assert volume.orientation.describe() == "RAS (closest canonical, from oblique LPS DICOM)"
    # only swaps and flips, as for the same series without the tilt; spacing is unchanged
    np.testing.assert_array_equal(volume.array, hu[:, ::-1, ::-1])
    assert volume.spacing == pytest.approx((GAP_MM, ROW_MM, COL_MM))
    assert nifti.orientation.oblique and nifti.orientation.source == ("R", "P", "I")
    np.testing.assert_array_equal(nifti.array, volume.array)


def test_a_tilt_below_half_a_degree_is_not_called_oblique(tmp_path) -> None:
    volume = read_dicom_series(write_series(tmp_path, phantom(), rotated(AXIAL, 0.1)).files)

    assert not volume.orientation.oblique
    assert volume.orientation.describe() == "RAS (from LPS DICOM)"


# ----------------------------------------------------------------- missing orientation


def _without_orientation(path: Path) -> Path:
    ds = pydicom.dcmread(path)
    del ds.ImageOrientationPatient
    ds.save_as(path, enforce_file_format=True)
    return path


def test_a_slice_without_orientation_is_kept_as_stored_and_marked_unknown(tmp_path) -> None:
    hu = phantom()
    path = _without_orientation(write_series(tmp_path, hu[:1]).files[0])

    volume = read_dicom_series([path])

    assert volume.orientation.source is None and volume.orientation.result == "unknown"
    assert volume.orientation.describe().startswith("unknown (DICOM without")
    np.testing.assert_array_equal(volume.array, hu[:1])
    assert volume.spacing == pytest.approx((GAP_MM, ROW_MM, COL_MM))


def test_a_series_without_orientation_is_refused_naming_the_file(tmp_path) -> None:
    files = write_series(tmp_path, phantom()).files
    _without_orientation(files[2])

    with pytest.raises(DataError, match=rf"{files[2].name}: .*ImageOrientationPatient"):
        read_dicom_series(files)


def test_a_nifti_without_qform_or_sform_reads_as_before_and_is_marked_unknown(tmp_path) -> None:
    data = phantom().transpose(2, 1, 0)
    image = nib.Nifti1Image(data, np.diag([COL_MM, ROW_MM, GAP_MM, 1.0]))
    image.set_qform(None, code=0)
    image.set_sform(None, code=0)
    nib.save(image, tmp_path / "bare.nii")

    volume = read_nifti(tmp_path / "bare.nii")

    assert volume.orientation.result == "unknown"
    assert volume.orientation.describe().startswith("unknown (NIfTI without qform/sform")
    # nibabel's default affine for such a file, reoriented as the reader always did
    before = nib.as_closest_canonical(nib.load(tmp_path / "bare.nii")).get_fdata()
    np.testing.assert_array_equal(volume.array, before.transpose(2, 1, 0))


def test_orientation_tags_with_no_direction_are_refused_naming_the_file(tmp_path) -> None:
    files = write_series(tmp_path / "dicom", phantom()[:1]).files
    ds = pydicom.dcmread(files[0])
    ds.ImageOrientationPatient = [0, 0, 0, 0, 1, 0]
    ds.save_as(files[0], enforce_file_format=True)
    flat = nib.Nifti1Image(np.zeros((3, 3, 3), np.int16), None)
    flat.set_sform(np.diag([1.0, 0.0, 1.0, 1.0]), code=1)  # the y axis points nowhere
    nib.save(flat, tmp_path / "flat.nii")

    with pytest.raises(DataError, match=rf"{files[0].name}: ImageOrientationPatient"):
        read_dicom_series(files)
    with pytest.raises(DataError, match=r"flat\.nii: the NIfTI affine .* is degenerate"):
        read_nifti(tmp_path / "flat.nii")


# ---------------------------------------------------------------- the synthetic sites


def test_both_synthetic_ct_writers_store_one_anatomy(tmp_path) -> None:
    site = synth_ct.CT_SITES[0]
    site = dataclasses.replace(site, scanner=dataclasses.replace(site.scanner, noise_hu=0.0))
    patient = synth_ct._draw_ct_patient(site, 0, True, seed=0)
    files = synth_ct._write_dicom_series(tmp_path, site, patient, 0, np.random.default_rng(0))
    name = synth_ct._write_nifti(tmp_path, site, patient)

    from_dicom = read_dicom_series([tmp_path / f for f in files])
    from_nifti = read_nifti(tmp_path / name)

    assert from_dicom.orientation.describe() == "RAS (from LPS DICOM)"
    assert from_nifti.orientation.describe() == "RAS (from LPS NIfTI)"
    np.testing.assert_array_equal(from_dicom.array, from_nifti.array)
    assert from_dicom.spacing == pytest.approx(from_nifti.spacing)
    # the liver lies on the patient's right: the high-x half of the RAS array, below the dome
    body = patient.body
    assert abs(body.liver_hu - body.soft_tissue_hu) > 6  # told apart by HU alone
    liver = np.abs(from_dicom.array[2] - body.liver_hu - site.scanner.hu_offset) < 2
    half = liver.shape[1] // 2
    assert liver[:, half:].sum() > 20 * max(liver[:, :half].sum(), 1)


# ------------------------------------------------------------------------ data cards


def test_the_data_card_states_each_sites_orientation(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MEDFED_CACHE", str(tmp_path / "cache"))
    manifests = synth.synthesize(tmp_path / "data", "ct", n_per_site=4, seed=0)

    cards = {}
    for manifest in manifests:
        out = tmp_path / "cards"
        result = CliRunner().invoke(app, ["sites", "card", str(manifest), "--out-dir", str(out)])
        assert result.exit_code == 0, result.output
        cards[manifest.stem] = (out / f"{manifest.stem}.md").read_text()

    assert "- orientation: RAS (from LPS DICOM), all 4 scan(s)" in cards["ct_dicom"]
    assert "- orientation: RAS (from LPS NIfTI), all 4 scan(s)" in cards["ct_nifti"]


def test_a_card_counts_each_orientation_when_a_site_mixes_them(tmp_path) -> None:
    manifests = synth.synthesize(tmp_path, "ct", n_per_site=4, seed=0)
    manifest = load_manifest(manifests[0])
    report = SiteReport(
        manifest=str(manifests[0]),
        orientation={
            "RAS (from LPS DICOM)": 40,
            "RAS (closest canonical, from oblique LPS DICOM)": 3,
            "unknown (DICOM without ImageOrientationPatient, kept as stored)": 1,
        },
    )

    card = render_card(manifest, report)

    assert (
        "- orientation: RAS (from LPS DICOM) for 40 scan(s); RAS (closest canonical, from "
        "oblique LPS DICOM) for 3 scan(s); unknown (DICOM without ImageOrientationPatient, "
        "kept as stored) for 1 scan(s)"
    ) in card
    assert "their tilt is kept, not resampled away" in card


def test_sites_check_warns_of_volumes_without_orientation(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MEDFED_CACHE", str(tmp_path / "cache"))
    manifests = synth.synthesize(tmp_path / "data", "ct", n_per_site=4, seed=0)
    root = tmp_path / "data" / "CT_NIFTI"
    bare = sorted(root.glob("*.nii.gz"))[0]
    image = nib.load(bare)
    image = nib.Nifti1Image(np.asarray(image.dataobj), image.affine)
    image.set_qform(None, code=0)
    image.set_sform(None, code=0)
    nib.save(image, bare)

    result = CliRunner().invoke(app, ["sites", "check", str(manifests[1]), "--json"])

    report = json.loads(result.output)[0]
    assert report["orientation"] == {
        "RAS (from LPS NIfTI)": 3,
        "unknown (NIfTI without qform/sform, read with nibabel's default affine)": 1,
    }
    assert any("1 volume(s) have no orientation" in w for w in report["warnings"])


def test_a_volume_built_in_memory_has_no_orientation() -> None:
    assert Volume(np.zeros((2, 2, 2), np.float32), (1.0, 1.0, 1.0)).orientation is None
