"""Test files in real formats, written on the spot (no file is shipped with the tests)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np


def write_ct_slice(
    path: Path,
    pixels: np.ndarray,
    *,
    position: Sequence[float],
    patient_id: str = "P1",
    series_uid: str = "1.2.826.0.1.3680043.8.498.1",
    orientation: Sequence[float] = (1, 0, 0, 0, 1, 0),
    pixel_spacing: Sequence[float] = (0.7, 0.8),
    slope: float = 1.0,
    intercept: float = -1024.0,
    thickness: float | None = 2.5,
) -> Path:
    """One CT slice as a DICOM Part 10 file with full geometry."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian, generate_uid

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = CTImageStorage
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = CTImageStorage
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.Modality = "CT"
    ds.Manufacturer = "Test Scanner Co"
    ds.PatientID = patient_id
    ds.StudyInstanceUID = series_uid + ".0"
    ds.SeriesInstanceUID = series_uid
    ds.ImagePositionPatient = [float(v) for v in position]
    ds.ImageOrientationPatient = [float(v) for v in orientation]
    ds.PixelSpacing = [float(v) for v in pixel_spacing]
    if thickness is not None:
        ds.SliceThickness = thickness
    ds.RescaleSlope = slope
    ds.RescaleIntercept = intercept
    ds.Rows, ds.Columns = pixels.shape
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.BitsAllocated = ds.BitsStored = 16
    ds.HighBit = 15
    ds.PixelRepresentation = 1
    ds.PixelData = np.ascontiguousarray(pixels, dtype="<i2").tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.save_as(path, enforce_file_format=True)
    return path
