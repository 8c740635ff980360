"""Synthetic abdominal CT sites: body phantoms with or without a liver lesion, one site as
DICOM series and one as NIfTI files, each with its own scanner protocol."""

from __future__ import annotations

import gzip
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from medfed.core.manifest import Modality
from medfed.data._phantoms import (
    FAINT_CONTRAST_HU,
    FAINT_FRACTION,
    FAINT_RADIUS_MM,
    LESION_CONTRAST_HU,
    LESION_RADIUS_MM,
    BodyAnatomy,
    Scanner,
    render_ct,
    sample_body,
)
from medfed.data.synth_common import (
    GENERATOR,
    class_sequence,
    csv_text,
    rounded,
    seeded_rng,
    site_manifest,
    site_truth,
    write_bytes,
)

# The CT sites' manifests read a liver window (width 200 HU, level 60): a lesion 60 HU below the
# liver spans almost a third of it, where the soft-tissue window [-160, 240] gives it a seventh.
CT_LIVER_WINDOW = (-40.0, 160.0)
_STUDY_DATE = "20000101"


@dataclass(frozen=True)
class CTSite:
    """A synthetic CT hospital: its scanner protocol and its file format."""

    id: str
    folder: str
    layout: str
    scanner: Scanner
    slices: int  # typical number of slices; each patient varies by a few
    patient_prefix: str
    modality: ClassVar[Modality] = Modality.CT

    def write(self, out: Path, n: int, seed: int, scale: float) -> dict[str, Any]:
        """Write the site's volumes and labels.csv; ``scale`` sizes fundus cameras only."""
        return _write_ct_site(out, self, n, seed)

    def manifest(self, seed: int, scale: float) -> dict[str, Any]:
        """The site's manifest, as a table for ``sites/<id>.toml``."""
        return _ct_manifest(self, seed)


# Each site's scanner protocol: Scanner's fields in order (matrix, pixel_spacing and
# slice_thickness in mm, hu_offset, noise_hu, kernel_sigma in pixels, kernel_name).
_SCANNERS = {
    "dicom": Scanner(64, 2.8, 2.5, 0.0, 14.0, 0.5, "B45f"),
    "nifti": Scanner(64, 3.4, 5.0, 15.0, 8.0, 1.2, "B20f"),
}
CT_SITES: tuple[CTSite, ...] = (
    CTSite("ct_dicom", "CT_DICOM", "dicom", _SCANNERS["dicom"], slices=24, patient_prefix="CTD"),
    CTSite("ct_nifti", "CT_NIFTI", "nifti", _SCANNERS["nifti"], slices=12, patient_prefix="CTN"),
)

# -------------------------------------------------------------------------------------- CT


@dataclass(frozen=True)
class _Patient:
    patient_id: str
    lesion: bool
    body: BodyAnatomy
    hu: np.ndarray  # (slice, row, column), slice 0 lowest


def _draw_ct_patient(site: CTSite, i: int, lesion: bool, seed: int) -> _Patient:
    """One patient of one CT site; depends only on (seed, site, i), never on other patients."""
    rng = seeded_rng(seed, "ct", site.id, i)
    n_slices = site.slices + int(rng.integers(-site.slices // 12, site.slices // 12 + 1))
    body = sample_body(rng, lesion, n_slices * site.scanner.slice_thickness)
    hu = render_ct(rng, body, site.scanner, n_slices)
    return _Patient(f"{site.patient_prefix}{i + 1:04d}", lesion, body, hu)


def _ct_labels(site: CTSite, n: int, seed: int) -> list[bool]:
    return class_sequence(n, 1.0, seeded_rng(seed, "labels", site.id))


def _write_ct_site(out: Path, site: CTSite, n: int, seed: int) -> dict[str, Any]:
    root = out / site.folder
    root.mkdir(parents=True)
    rows: list[list[object]] = [["patient_id", "label"]]
    items = []
    labels = _ct_labels(site, n, seed)
    n_lesion = sum(labels)
    for i, lesion in enumerate(labels):
        patient = _draw_ct_patient(site, i, lesion, seed)
        if site.layout == "dicom":
            files = _write_dicom_series(
                root, site, patient, seed, seeded_rng(seed, "order", site.id, i)
            )
        else:
            files = [_write_nifti(root, site, patient)]
        rows.append([patient.patient_id, "lesion" if lesion else "normal"])
        items.append(_ct_item(patient, site, files))
    write_bytes(root / "labels.csv", csv_text(rows).encode())
    return site_truth(
        site,
        class_counts={"lesion": n_lesion, "normal": n - n_lesion},
        scanner=asdict(site.scanner),
        items=items,
    )


def _ct_item(patient: _Patient, site: CTSite, files: list[str]) -> dict[str, Any]:
    s = site.scanner
    lesion = patient.body.lesion
    return {
        "patient_id": patient.patient_id,
        "label": "lesion" if patient.lesion else "normal",
        "files": files,
        "shape": list(patient.hu.shape),
        "spacing": [s.slice_thickness, s.pixel_spacing, s.pixel_spacing],
        "liver_hu": rounded(patient.body.liver_hu + s.hu_offset),
        "lesion": None
        if lesion is None
        else {
            "center_mm_zyx": [rounded(c) for c in lesion.center],
            "radius_mm": rounded(lesion.radius),
            "contrast_hu": rounded(lesion.contrast_hu),
        },
    }


# DICOM patient coordinates are LPS+ (x to the patient's left, y to the back), NIfTI's RAS+:
# the change negates x and y (and is its own inverse).
_RAS_FROM_LPS = np.diag([-1.0, -1.0, 1.0, 1.0])
_TABLE_Z = -200.0  # table position (mm) of the bottom of every scan


def _phantom_lps_affine(s: Scanner) -> np.ndarray:
    """Where a drawn volume's voxels (column, row, slice) lie in LPS+ patient millimetres.

    ``render_ct`` draws columns towards the patient's left, rows towards the back and slice 0
    lowest, centred in-plane. Both CT writers take their geometry from here, so a patient's
    DICOM series and NIfTI file hold one anatomy and read back in one orientation.
    """
    half = (s.matrix - 1) / 2.0 * s.pixel_spacing
    return np.array(
        [
            [s.pixel_spacing, 0.0, 0.0, -half],
            [0.0, s.pixel_spacing, 0.0, -half],
            [0.0, 0.0, s.slice_thickness, 0.5 * s.slice_thickness + _TABLE_Z],
            [0.0, 0.0, 0.0, 1.0],
        ]
    )


def _stored_int16(hu: np.ndarray, intercept: float) -> np.ndarray:
    # Round in HU first, so that decoding gives back the rounded HU whatever the intercept.
    return np.clip(np.round(hu) - intercept, -32768, 32767).astype(np.int16)


def _write_dicom_series(
    root: Path, site: CTSite, patient: _Patient, seed: int, rng: np.random.Generator
) -> list[str]:
    """One CT series; file numbers are shuffled so that only positions give the slice order."""
    from pydicom.uid import generate_uid

    def uid(*parts: object) -> str:
        return generate_uid(entropy_srcs=[GENERATOR, str(seed), site.id, *map(str, parts)])

    series = {
        "study": uid(patient.patient_id, "study"),
        "series": uid(patient.patient_id, "series"),
        "frame": uid(patient.patient_id, "frame"),
    }
    folder = root / patient.patient_id / "series-1"
    folder.mkdir(parents=True)
    stored = _stored_int16(patient.hu, -1024.0)
    files = []
    for file_no, k in enumerate(rng.permutation(len(stored)).tolist(), start=1):
        name = f"IM_{file_no:04d}.dcm"
        uids = {**series, "sop": uid(patient.patient_id, "slice", k)}
        ds = _ct_slice(site.scanner, patient.patient_id, stored[k], k, file_no, uids)
        ds.save_as(folder / name, enforce_file_format=True)
        files.append(f"{patient.patient_id}/series-1/{name}")
    return sorted(files)


def _ct_slice(
    s: Scanner, patient_id: str, pixels: np.ndarray, k: int, instance: int, uids: dict[str, str]
) -> Any:
    """A CT Image Storage dataset for slice ``k`` (0 = lowest) of a series."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = CTImageStorage
    meta.MediaStorageSOPInstanceUID = uids["sop"]
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID, ds.SOPInstanceUID = CTImageStorage, uids["sop"]
    ds.StudyInstanceUID, ds.SeriesInstanceUID = uids["study"], uids["series"]
    ds.FrameOfReferenceUID = uids["frame"]
    ds.Modality, ds.Manufacturer = "CT", "medfed synthetic"
    ds.PatientID, ds.PatientName = patient_id, f"Synthetic^{patient_id}"
    ds.StudyDate = ds.SeriesDate = ds.ContentDate = _STUDY_DATE
    ds.StudyID, ds.SeriesNumber, ds.InstanceNumber = "1", 1, instance
    ds.ImageType = ["ORIGINAL", "PRIMARY", "AXIAL"]
    ds.ConvolutionKernel, ds.KVP = s.kernel_name, 120
    # The first pixel's centre in LPS+; rows run along +x and columns along +y, as the
    # phantom's affine says (its first two columns are +x and +y times the pixel spacing).
    position = _phantom_lps_affine(s) @ np.array([0.0, 0.0, k, 1.0])
    ds.ImagePositionPatient = [rounded(v) for v in position[:3]]
    ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
    ds.SliceLocation = rounded(position[2])
    ds.PixelSpacing = [s.pixel_spacing, s.pixel_spacing]
    ds.SliceThickness = s.slice_thickness
    ds.Rows, ds.Columns = pixels.shape
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 1
    ds.RescaleIntercept, ds.RescaleSlope, ds.RescaleType = -1024, 1, "HU"
    ds.WindowCenter, ds.WindowWidth = 40, 400
    ds.PixelData = np.ascontiguousarray(pixels, dtype="<i2").tobytes()
    return ds


def _write_nifti(root: Path, site: CTSite, patient: _Patient) -> str:
    """A gzipped NIfTI-1 file whose affine maps voxels to RAS millimetres.

    The affine is the one a DICOM-to-NIfTI conversion gives the same patient's DICOM series:
    voxels stored as drawn, LPS (columns to the patient's left, rows to the back).
    """
    import nibabel as nib

    affine = _RAS_FROM_LPS @ _phantom_lps_affine(site.scanner)
    data = _stored_int16(patient.hu, 0.0).transpose(2, 1, 0)  # NIfTI voxels: (i, j, k)
    image = nib.Nifti1Image(data, affine)
    image.header.set_xyzt_units("mm")
    image.header["descrip"] = b"medfed synthetic CT"
    image.set_qform(affine, code=1)
    image.set_sform(affine, code=1)
    name = f"{patient.patient_id}.nii.gz"
    # gzip.compress with mtime=0 keeps the bytes identical from run to run.
    write_bytes(root / name, gzip.compress(image.to_bytes(), compresslevel=6, mtime=0))
    return name


def _ct_manifest(site: CTSite, seed: int) -> dict[str, Any]:
    s = site.scanner
    files = "one DICOM series per patient" if site.layout == "dicom" else "one .nii.gz per patient"
    return site_manifest(
        site,
        seed,
        description=(
            "Synthetic abdominal CT phantoms: body, fat, lungs, spine and liver; 'lesion' "
            f"patients have a hypodense sphere in the liver. {files}, labels in labels.csv."
        ),
        scans="scans",
        acquisition=(
            f"simulated scanner: {s.matrix}x{s.matrix} matrix, {s.pixel_spacing} mm pixels, "
            f"{s.slice_thickness} mm slices (about {site.slices}), kernel {s.kernel_name}"
        ),
        known_shifts=(
            f"simulated scanner: HU offset {s.hu_offset:+.0f}, noise {s.noise_hu:.0f} HU, "
            f"slice thickness {s.slice_thickness} mm, pixel spacing {s.pixel_spacing} mm, "
            f"kernel blur sigma {s.kernel_sigma} px; {_lesions_text()}"
        ),
        labels={"normal": 0, "lesion": 1},
        preprocess={
            "hu_window": list(CT_LIVER_WINDOW),
            "spacing": [4.0, 4.0, 4.0],
            "shape": [16, 48, 48],
        },
    )


def _lesions_text() -> str:
    def span(pair: tuple[float, float], scale: float = 1.0) -> str:
        return f"{pair[0] * scale:g}-{pair[1] * scale:g}"

    return (
        f"lesions {span(LESION_CONTRAST_HU)} HU below the liver, {span(LESION_RADIUS_MM, 2)} mm "
        f"across; {FAINT_FRACTION:.0%} small and faint ({span(FAINT_CONTRAST_HU)} HU, "
        f"{span(FAINT_RADIUS_MM, 2)} mm), mostly missed on a 4 mm grid"
    )
