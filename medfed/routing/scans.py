"""Reading one new patient scan of any supported kind, for routing.

JPEG/PNG/TIFF fundus photos, a DICOM file or a DICOM series folder, or a NIfTI file. The kind
is decided from the path (and the DICOM marker), never guessed from the pixels.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from medfed.config import Modality
from medfed.core.errors import DataError
from medfed.data.io import (
    DICOM_SUFFIX,
    IMAGE_SUFFIXES,
    NIFTI_SUFFIXES,
    Volume,
    dicom_read_error,
    probe_dicom,
    read_dicom_series,
    read_image,
    read_nifti,
    require_regular,
)


@dataclass(frozen=True)
class Scan:
    """A decoded scan, its modality and the files its bytes come from."""

    path: Path
    modality: Modality
    decoded: np.ndarray | Volume
    files: tuple[Path, ...]


def _dicom_files(folder: Path) -> list[Path]:
    files = [p for p in sorted(folder.rglob("*")) if p.is_file() and probe_dicom(p)]
    if not files:
        raise DataError(
            f"{folder}: is a folder and holds no DICOM files (no 'DICM' marker found); pass "
            "scan files themselves, or one DICOM series folder"
        )
    return files


def _one_series(files: list[Path], folder: Path | None) -> list[Path]:
    """``files`` when they are one CT series; DataError naming the file or folder otherwise."""
    import pydicom

    by_series: dict[str, list[Path]] = {}
    for path in files:
        try:
            header = pydicom.dcmread(path, stop_before_pixels=True)
        except Exception as exc:  # pydicom raises many kinds on damaged headers
            raise DataError(
                f"{path}: DICOM header cannot be read ({dicom_read_error(exc)})"
            ) from exc
        _require_ct(header, path)
        by_series.setdefault(str(header.get("SeriesInstanceUID", "")), []).append(path)
    if len(by_series) > 1:
        raise DataError(
            f"{folder}: holds {len(by_series)} DICOM series; route one series folder at a time"
        )
    return files


def _require_ct(header: object, path: Path) -> None:
    """Refuse a DICOM file whose Modality says it is not CT (a missing Modality is let through)."""
    modality = str(getattr(header, "Modality", "") or "").strip().upper()
    if modality and modality != "CT":
        raise DataError(
            f"{path}: DICOM modality is {modality!r}, not CT; only CT scans (and fundus photos) "
            "can be routed"
        )


def _require_readable(path: Path) -> None:
    """Refuse a path this user may not read (or list), and an empty file, before decoding."""
    need = os.R_OK | os.X_OK if path.is_dir() else os.R_OK
    if not os.access(path, need):
        kind = "folder" if path.is_dir() else "file"
        raise DataError(
            f"{path}: permission denied: this user may not read the {kind}; ask its owner for "
            "read access (e.g. chmod a+r), or route a copy"
        )
    if path.is_file() and path.stat().st_size == 0:
        with path.open("rb") as handle:  # a regular file: reading it never blocks
            has_content = bool(handle.read(1))
        if has_content:  # e.g. /proc/self/status: its size says 0, its bytes are made on read
            raise DataError(
                f"{path}: not a scan file (a system file whose size reads 0 bytes but which "
                "has content); route JPEG/PNG/TIFF photos, DICOM or NIfTI files"
            )
        raise DataError(f"{path}: the file is empty (0 bytes); copy the scan again")


def read_scan(path: str | Path) -> Scan:
    """Decode a scan file or DICOM series folder; DataError names the path on any problem."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    require_regular(path)  # a FIFO or a device would block or read without end
    _require_readable(path)
    name = path.name.lower()
    if path.is_dir():
        files = _one_series(_dicom_files(path), path)
        return Scan(path, Modality.CT, read_dicom_series(files), tuple(files))
    if name.endswith(NIFTI_SUFFIXES):
        return Scan(path, Modality.CT, read_nifti(path), (path,))
    if name.endswith(DICOM_SUFFIX) or probe_dicom(path):
        _one_series([path], None)
        return Scan(path, Modality.CT, read_dicom_series([path]), (path,))
    if name.endswith(IMAGE_SUFFIXES):
        return Scan(path, Modality.FUNDUS, read_image(path), (path,))
    raise DataError(
        f"{path}: unsupported file type; route JPEG/PNG/TIFF fundus photos, DICOM files or "
        "series folders, or NIfTI (.nii, .nii.gz) files"
    )
