"""Test studies for a PACS: fundus photos and CT volumes written as DICOM (Part 10 files).

A site that wants to try ``medfed pacs watch`` or ``listen`` before its modality sends real
studies turns the photos and volumes it already has into DICOM studies of one (test) patient:

* a photo (JPEG, PNG, TIFF) becomes an Ophthalmic Photography 8 Bit Image (``OP``) instance,
  or a Secondary Capture one (``XC`` / ``OT``), RGB, one series per photo;
* a CT volume (NIfTI, read as ``medfed`` reads it: Hounsfield units, closest canonical
  orientation) becomes a CT Image Storage series, one slice per file, positioned and oriented
  so that medfed (and any viewer) reads back the same volume.

Every instance of one call shares the study (patient, accession number, study date, study UID).
The files are meant for a test PACS: the patient is whoever the site names, never a real one.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import (
    CTImageStorage,
    ExplicitVRLittleEndian,
    SecondaryCaptureImageStorage,
    generate_uid,
)

from medfed.core.errors import ConfigError, DataError
from medfed.core.fileio import private_dir, private_file
from medfed.data.io import Volume, read_image, read_nifti

OP_STORAGE = "1.2.840.10008.5.1.4.1.1.77.1.5.1"  # Ophthalmic Photography 8 Bit Image Storage
PHOTO_MODALITIES = ("OP", "XC", "OT")
CT_INTERCEPT = -1024.0  # stored = HU + 1024, in int16
_NIFTI = (".nii", ".nii.gz")
_DATE = re.compile(r"\d{8}")
_DICOM_TEXT = re.compile(r"[ -~]*")  # printable ASCII, no backslash (checked apart)


@dataclass(frozen=True)
class StudyIds:
    """Who and when: the attributes every instance of the study shares."""

    patient_id: str
    accession: str = ""
    study_date: str = field(default_factory=lambda: dt.date.today().strftime("%Y%m%d"))
    patient_name: str = ""
    study_uid: str = field(default_factory=generate_uid)

    def __post_init__(self) -> None:
        for option, value, limit in (
            ("--patient-id", self.patient_id, 64),
            ("--accession", self.accession, 16),
            ("--patient-name", self.patient_name, 64),
        ):
            if len(value) > limit or "\\" in value or not _DICOM_TEXT.fullmatch(value):
                raise ConfigError(
                    f"{option} {value!r}: at most {limit} printable ASCII characters, no "
                    "backslash (DICOM's rule for this attribute)"
                )
        if not self.patient_id.strip():
            raise ConfigError("--patient-id is empty; name the test patient")
        if not _DATE.fullmatch(self.study_date) or not _valid_date(self.study_date):
            raise ConfigError(
                f"--study-date {self.study_date!r}: expected a date as YYYYMMDD, e.g. 20261205"
            )

    def fill(self, ds: Dataset, series_number: int, modality: str) -> None:
        ds.PatientID = self.patient_id
        ds.PatientName = self.patient_name or f"Test^{self.patient_id}"
        ds.PatientBirthDate, ds.PatientSex = "", "O"
        ds.StudyInstanceUID = self.study_uid
        ds.StudyDate = ds.SeriesDate = ds.ContentDate = self.study_date
        ds.StudyTime = ds.SeriesTime = ds.ContentTime = "120000"
        ds.AccessionNumber = self.accession
        ds.StudyID, ds.ReferringPhysicianName = "1", ""
        ds.SeriesInstanceUID = generate_uid()
        ds.SeriesNumber = series_number
        ds.Modality = modality
        ds.Manufacturer = "medfed pacs make-study (test study)"


def _valid_date(text: str) -> bool:
    try:
        dt.datetime.strptime(text, "%Y%m%d")
    except ValueError:
        return False
    return True


def _file_meta(sop_class: str) -> FileMetaDataset:
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = sop_class
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    return meta


def photo_instance(pixels: np.ndarray, ids: StudyIds, series_number: int = 1,
                   modality: str = "OP") -> Dataset:  # fmt: skip
    """An RGB photo (H, W, 3 uint8) as one instance of the study, in its own series."""
    if modality not in PHOTO_MODALITIES:
        raise ConfigError(f"--modality {modality!r}: one of {', '.join(PHOTO_MODALITIES)}")
    sop_class = OP_STORAGE if modality == "OP" else SecondaryCaptureImageStorage
    ds = Dataset()
    ds.file_meta = _file_meta(sop_class)
    ds.preamble = b"\0" * 128
    ids.fill(ds, series_number, modality)
    ds.SOPClassUID, ds.SOPInstanceUID = sop_class, ds.file_meta.MediaStorageSOPInstanceUID
    ds.InstanceNumber = 1
    ds.ImageType = ["ORIGINAL", "PRIMARY"]
    ds.Rows, ds.Columns = pixels.shape[:2]
    ds.SamplesPerPixel, ds.PhotometricInterpretation, ds.PlanarConfiguration = 3, "RGB", 0
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 8, 7, 0
    ds.PixelData = np.ascontiguousarray(pixels, dtype=np.uint8).tobytes()
    return ds


def ct_series(volume: Volume, ids: StudyIds, series_number: int = 1) -> list[Dataset]:
    """A HU volume with axes (z, y, x) of RAS+ (as medfed reads NIfTI and DICOM) as a CT
    series: slice k at z = k * spacing, rows towards the patient's back and columns towards
    the patient's left (DICOM's LPS+), so that reading the series gives the volume back."""
    stored = np.round(volume.array) - CT_INTERCEPT
    if stored.min() < -32768 or stored.max() > 32767:
        raise DataError("the volume's values do not fit 16-bit CT pixels (are they in HU?)")
    # RAS+ to LPS+: x and y reversed
    pixels = stored.astype(np.int16)[:, ::-1, ::-1]
    dz, dy, dx = volume.spacing
    series, frame = generate_uid(), generate_uid()
    out = []
    for k in range(pixels.shape[0]):
        ds = Dataset()
        ds.file_meta = _file_meta(CTImageStorage)
        ds.preamble = b"\0" * 128
        ids.fill(ds, series_number, "CT")
        ds.SeriesInstanceUID, ds.FrameOfReferenceUID = series, frame
        ds.SOPClassUID, ds.SOPInstanceUID = CTImageStorage, ds.file_meta.MediaStorageSOPInstanceUID
        ds.InstanceNumber = k + 1
        ds.ImageType = ["ORIGINAL", "PRIMARY", "AXIAL"]
        ds.ImagePositionPatient = [0.0, 0.0, round(k * dz, 4)]
        ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
        ds.SliceLocation = round(k * dz, 4)
        ds.PixelSpacing = [dy, dx]
        ds.SliceThickness = dz
        ds.Rows, ds.Columns = pixels.shape[1:]
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 1
        ds.RescaleIntercept, ds.RescaleSlope, ds.RescaleType = CT_INTERCEPT, 1, "HU"
        ds.WindowCenter, ds.WindowWidth = 40, 400
        ds.PixelData = np.ascontiguousarray(pixels[k], dtype="<i2").tobytes()
        out.append(ds)
    return out


def is_volume(path: Path) -> bool:
    return path.name.lower().endswith(_NIFTI)


def make_study(inputs: Sequence[Path], ids: StudyIds, modality: str = "OP") -> list[Dataset]:
    """Every input (photos and NIfTI volumes) as one study, a series each, in the order
    given. DataError names the input that cannot be read."""
    if not inputs:
        raise ConfigError("give at least one photo or NIfTI volume")
    out: list[Dataset] = []
    for number, path in enumerate(inputs, start=1):
        if is_volume(path):
            out += ct_series(read_nifti(path), ids, number)
        else:
            out.append(photo_instance(read_image(path), ids, number, modality))
    return out


def write_study(datasets: Sequence[Dataset], folder: Path) -> list[Path]:
    """Each instance as FOLDER/series-NNN/NNNN.dcm (DICOM Part 10), owner-only (the photos
    may be a site's own patients'); the paths."""
    paths = []
    for ds in datasets:
        series = private_dir(folder / f"series-{int(ds.SeriesNumber):03d}")
        path = series / f"{int(ds.InstanceNumber):04d}.dcm"
        partial = path.with_name(f".{path.name}.partial")
        ds.save_as(partial, enforce_file_format=True)
        private_file(partial).replace(path)
        paths.append(path)
    return paths
