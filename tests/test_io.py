"""Decoding: fundus images to uint8 RGB, DICOM series and NIfTI files to HU volumes."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from medfed.core.errors import DataError
from medfed.data.io import (
    Volume,
    probe_dicom,
    read_dicom_series,
    read_image,
    read_nifti,
)
from medfed.data.modality import read_record
from medfed.data.records import Record

# --- fundus images ----------------------------------------------------------------------------


def test_read_image_returns_rgb_uint8(tmp_path, write_fundus_image):
    path = write_fundus_image(tmp_path / "a.png", size=(24, 20))

    image = read_image(path)

    assert image.shape == (20, 24, 3) and image.dtype == np.uint8
    assert np.array_equal(image, np.asarray(Image.open(path)))


def test_read_image_converts_greyscale_and_rgba(tmp_path):
    grey = np.arange(12, dtype=np.uint8).reshape(3, 4) * 20
    Image.fromarray(grey).save(tmp_path / "grey.png")
    rgba = np.zeros((3, 4, 4), np.uint8)
    rgba[..., 0], rgba[..., 3] = 200, 255
    Image.fromarray(rgba).save(tmp_path / "rgba.png")

    from_grey = read_image(tmp_path / "grey.png")
    from_rgba = read_image(tmp_path / "rgba.png")

    assert from_grey.shape == (3, 4, 3)
    assert all(np.array_equal(from_grey[..., c], grey) for c in range(3))
    assert from_rgba.shape == (3, 4, 3)
    assert from_rgba[0, 0].tolist() == [200, 0, 0]


def test_read_image_keeps_the_top_byte_of_16_bit_greyscale(tmp_path):
    pixels = np.array([[0, 256, 65535]], dtype=np.uint16)
    Image.fromarray(pixels).save(tmp_path / "deep.png")

    image = read_image(tmp_path / "deep.png")

    assert image[0, :, 0].tolist() == [0, 1, 255]


def test_truncated_jpeg_raises_data_error_naming_the_file(tmp_path, write_fundus_image):
    whole = write_fundus_image(tmp_path / "whole.jpg", size=(64, 64)).read_bytes()
    truncated = tmp_path / "Im007_g_ACRIMA.jpg"
    truncated.write_bytes(whole[: len(whole) // 2])

    with pytest.raises(DataError, match=r"Im007_g_ACRIMA\.jpg.*truncated or corrupt"):
        read_image(truncated)


def test_non_image_and_missing_files_raise_data_error(tmp_path):
    garbage = tmp_path / "x.png"
    garbage.write_bytes(b"\x00" * 50)

    with pytest.raises(DataError, match=r"x\.png: not a readable image"):
        read_image(garbage)
    with pytest.raises(DataError, match=r"nothing\.jpg: no image file at this path"):
        read_image(tmp_path / "nothing.jpg")


# --- DICOM ------------------------------------------------------------------------------------


def test_dicom_slices_are_ordered_by_position_not_by_file_name(tmp_path, write_ct_series):
    files = write_ct_series(tmp_path, 5, intercept=0.0)

    volume = read_dicom_series(sorted(files))

    # slice k (stored value 10*k) lies at z = 30 + 2.5k, whatever its file name
    assert volume.array[:, 0, 0].tolist() == [0, 10, 20, 30, 40]
    assert sorted(files) != files  # the names really were shuffled


def test_dicom_order_follows_the_slice_normal_then_runs_foot_to_head(tmp_path, write_ct_slice):
    # columns run towards -y, so the normal (row x column) points to -z: the slices are stacked
    # head to foot, and reorienting to RAS+ turns the volume to run from foot (low z) to head
    orientation = (1, 0, 0, 0, -1, 0)
    for k, z in enumerate([0.0, 5.0, 10.0]):
        write_ct_slice(
            tmp_path / f"s{k}.dcm",
            np.full((3, 3), k, np.int16),
            position=(0, 0, z),
            orientation=orientation,
            intercept=0.0,
        )

    volume = read_dicom_series(list(tmp_path.glob("*.dcm")))

    assert volume.array[:, 0, 0].tolist() == [0, 1, 2]
    assert volume.spacing[0] == pytest.approx(5.0)


def test_dicom_applies_slope_intercept_and_reports_spacing(tmp_path, write_ct_series):
    files = write_ct_series(tmp_path, 3, slope=2.0, intercept=-1000.0, pixel_spacing=(0.7, 0.8))

    volume = read_dicom_series(files)

    assert volume.array.dtype == np.float32
    assert volume.array.shape == (3, 6, 5)
    assert volume.array[:, 2, 2].tolist() == [-1000.0, -980.0, -960.0]
    assert volume.spacing == pytest.approx((2.5, 0.7, 0.8))


def test_dicom_slope_and_intercept_may_differ_per_slice(tmp_path, write_ct_slice):
    write_ct_slice(tmp_path / "a.dcm", np.full((2, 2), 100, np.int16), position=(0, 0, 0))
    write_ct_slice(
        tmp_path / "b.dcm",
        np.full((2, 2), 100, np.int16),
        position=(0, 0, 1),
        slope=0.5,
        intercept=0.0,
    )

    volume = read_dicom_series([tmp_path / "b.dcm", tmp_path / "a.dcm"])

    assert volume.array[:, 0, 0].tolist() == [-924.0, 50.0]


def test_dicom_single_real_slice_uses_slice_thickness(tmp_path):
    from pydicom import dcmread
    from pydicom.data import get_testdata_file

    source = Path(get_testdata_file("CT_small.dcm"))
    stored = dcmread(source).pixel_array

    volume = read_dicom_series([source])

    assert volume.array.shape == (1, 128, 128)
    # an axial LPS slice: RAS+ runs its columns to the patient's right and its rows to the front
    assert volume.orientation is not None and volume.orientation.source == ("L", "P", "S")
    assert np.array_equal(volume.array[0], stored[::-1, ::-1].astype(np.float32) - 1024.0)
    assert volume.spacing == pytest.approx((5.0, 0.661468, 0.661468))


def test_dicom_slices_of_different_size_raise(tmp_path, write_ct_slice):
    write_ct_slice(tmp_path / "a.dcm", np.zeros((4, 4), np.int16), position=(0, 0, 0))
    write_ct_slice(tmp_path / "b.dcm", np.zeros((4, 5), np.int16), position=(0, 0, 1))

    with pytest.raises(DataError, match=r"b\.dcm: slice is 4x5.*a\.dcm is 4x4"):
        read_dicom_series([tmp_path / "a.dcm", tmp_path / "b.dcm"])


def test_dicom_duplicate_position_raises(tmp_path, write_ct_slice):
    write_ct_slice(tmp_path / "a.dcm", np.zeros((2, 2), np.int16), position=(0, 0, 0))
    write_ct_slice(tmp_path / "b.dcm", np.zeros((2, 2), np.int16), position=(0, 0, 0))

    with pytest.raises(DataError, match="same slice position"):
        read_dicom_series([tmp_path / "a.dcm", tmp_path / "b.dcm"])


def test_dicom_series_with_a_missing_slice_raises(tmp_path, write_ct_series):
    files = write_ct_series(tmp_path, 5)
    by_position = sorted(files, key=lambda f: read_dicom_series([f]).array[0, 0, 0])
    by_position[2].unlink()

    with pytest.raises(DataError, match="a slice is probably missing"):
        read_dicom_series([f for f in files if f.exists()])


def test_dicom_garbage_and_empty_input_raise_data_error(tmp_path):
    garbage = tmp_path / "slice.dcm"
    garbage.write_bytes(b"garbage" * 40)

    with pytest.raises(DataError, match=r"slice\.dcm: not a readable DICOM file"):
        read_dicom_series([garbage])
    with pytest.raises(DataError, match="at least one slice"):
        read_dicom_series([])


def test_dicom_truncated_pixel_data_raises_data_error(tmp_path, write_ct_slice):
    path = write_ct_slice(tmp_path / "a.dcm", np.zeros((64, 64), np.int16), position=(0, 0, 0))
    path.write_bytes(path.read_bytes()[:-4000])

    with pytest.raises(DataError, match=r"a\.dcm: pixel data cannot be decoded.*truncated"):
        read_dicom_series([path])


def test_probe_dicom_recognises_part10_files(tmp_path, write_ct_slice):
    dicom = write_ct_slice(tmp_path / "IM0001", np.zeros((2, 2), np.int16), position=(0, 0, 0))
    other = tmp_path / "README"
    other.write_text("hello")

    assert probe_dicom(dicom)
    assert not probe_dicom(other)
    assert not probe_dicom(tmp_path / "missing")


# --- NIfTI ------------------------------------------------------------------------------------


def test_nifti_axes_become_slice_row_column_with_matching_spacing(tmp_path, write_nifti):
    data = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)  # (x, y, z)
    path = write_nifti(tmp_path / "v.nii.gz", data, zooms=(0.5, 0.75, 3.0))

    volume = read_nifti(path)

    assert volume.array.shape == (4, 3, 2)
    assert volume.array[3, 2, 1] == data[1, 2, 3]
    assert volume.spacing == (3.0, 0.75, 0.5)


def test_nifti_is_reoriented_to_canonical(tmp_path):
    import nibabel as nib

    data = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    # first axis runs right-to-left and has 2 mm voxels; the z axis 5 mm
    affine = np.diag([-2.0, 1.0, 5.0, 1.0])
    nib.save(nib.Nifti1Image(data, affine), tmp_path / "flipped.nii")

    volume = read_nifti(tmp_path / "flipped.nii")

    assert volume.spacing == (5.0, 1.0, 2.0)
    assert np.array_equal(volume.array, data[::-1].transpose(2, 1, 0))


def test_nifti_scaling_is_applied(tmp_path):
    import nibabel as nib

    image = nib.Nifti1Image(np.full((2, 2, 2), 10, np.int16), np.eye(4))
    image.header.set_slope_inter(2.0, -1024.0)
    nib.save(image, tmp_path / "scaled.nii")

    volume = read_nifti(tmp_path / "scaled.nii")

    assert volume.array.dtype == np.float32
    assert np.all(volume.array == -1004.0)


def test_nifti_4d_and_truncated_files_raise_data_error(tmp_path, write_nifti):
    four_d = write_nifti(tmp_path / "4d.nii", np.zeros((3, 3, 3, 2), np.float32))
    whole = write_nifti(tmp_path / "whole.nii", np.ones((16, 16, 16), np.float32))
    truncated = tmp_path / "cut.nii.gz"
    truncated.write_bytes(gzip.compress(whole.read_bytes())[:-200])

    with pytest.raises(DataError, match=r"4d\.nii: image has shape \(3, 3, 3, 2\)"):
        read_nifti(four_d)
    with pytest.raises(DataError, match=r"cut\.nii\.gz: not a readable NIfTI file"):
        read_nifti(truncated)
    with pytest.raises(DataError, match="not found"):
        read_nifti(tmp_path / "missing.nii")


def test_nifti_real_nibabel_file_decodes(tmp_path):
    from nibabel.testing import data_path

    path = tmp_path / "anatomical.nii"
    shutil.copy(Path(data_path) / "anatomical.nii", path)

    volume = read_nifti(path)

    assert volume.array.shape == (25, 41, 33)
    assert volume.array.dtype == np.float32
    assert volume.spacing == (2.0, 2.0, 2.0)
    assert float(volume.array.max()) > 0


# --- dispatch and Volume ----------------------------------------------------------------------


def test_read_record_dispatches_on_modality_and_files(
    tmp_path, write_fundus_image, write_ct_series
):
    image = write_fundus_image(tmp_path / "a.png")
    slices = write_ct_series(tmp_path / "series", 3)

    fundus = read_record(Record(path=image, label=0, patient_id="a"), "fundus")
    ct = read_record(
        Record(path=tmp_path / "series", label=0, patient_id="P1", files=tuple(slices)), "ct"
    )

    assert fundus.shape == (20, 24, 3)
    assert isinstance(ct, Volume) and ct.array.shape == (3, 6, 5)


def test_volume_rejects_wrong_shape_or_spacing():
    with pytest.raises(ValueError, match="3-D"):
        Volume(np.zeros((2, 2), np.float32), (1.0, 1.0, 1.0))
    with pytest.raises(ValueError, match="positive"):
        Volume(np.zeros((2, 2, 2), np.float32), (1.0, 0.0, 1.0))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nifti_with_non_finite_voxels_is_refused(tmp_path: Path, write_nifti, bad: float) -> None:
    data = np.zeros((8, 8, 6), dtype=np.float32)
    data[2, 3, 1] = bad
    path = write_nifti(tmp_path / "p1.nii.gz", data)
    with pytest.raises(DataError, match="NaN or infinite"):
        read_nifti(path)
