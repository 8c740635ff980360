"""An upload to the routing service, checked against the service's limits and written where
routing reads it: a photo, a DICOM file (a photo's pixels become a PNG), a zipped DICOM series
(unpacked into one folder), or a NIfTI file.

Sizes and pixel counts are read from headers before anything is decoded (PNG's IHDR, JPEG's
frame header, DICOM's Rows and Columns, NIfTI's shape), so an oversized scan is refused
(LimitError: 413, never routed, never logged) without using the memory it asks for.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

from medfed.clinic.pacs import MAX_BYTES, MAX_FILES, MAX_PIXELS
from medfed.clinic.pacs.headers import OVER_DECODER, image_size
from medfed.clinic.pacs.instances import PHOTO_MODALITIES, modality_of, write_photo
from medfed.core.errors import DataError
from medfed.core.names import printable
from medfed.data.io import DICOM_SUFFIX, NIFTI_SUFFIXES, probe_dicom

__all__ = ["Limits", "LimitError", "unpack_upload"]


class LimitError(DataError):
    """An upload over one of the service's limits."""


@dataclass(frozen=True)
class Limits:
    """What the service accepts: bytes per request, pixels (voxels) per scan, files per zip."""

    max_bytes: int = MAX_BYTES
    max_pixels: int = MAX_PIXELS
    max_files: int = MAX_FILES

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_pixels", "max_files"):
            if int(getattr(self, name)) < 1:
                raise DataError(f"--{name.replace('_', '-')} must be at least 1")


def safe_name(name: str) -> str:
    """The upload's file name without folders; DataError when nothing is left."""
    base = printable(Path(str(name).replace("\\", "/")).name).strip()
    if not base or base in {".", ".."}:
        raise DataError(f"{name!r}: not a file name; name the scan (e.g. scan.png)")
    return base


def _over(what: str, pixels: int, limits: Limits) -> LimitError:
    return LimitError(
        f"{what}: {pixels} pixels, over the limit of {limits.max_pixels} this service accepts "
        "(--max-pixels)"
    )


def _check_image(path: Path, limits: Limits) -> None:
    """Refuse an image whose header claims more pixels than the limit, whatever its suffix."""
    size = image_size(path)
    if size is None:
        return  # routing names what is wrong with the file
    width, height = size
    if width == OVER_DECODER:
        raise LimitError(
            f"{path.name}: more pixels than can be decoded safely, over the limit of "
            f"{limits.max_pixels} pixels this service accepts (--max-pixels)"
        )
    if width * height > limits.max_pixels:
        raise _over(path.name, width * height, limits)


def _check_nifti(path: Path, limits: Limits) -> None:
    import nibabel as nib

    try:
        shape = nib.load(path).header.get_data_shape()
    except Exception:  # nibabel raises many kinds; routing names what is wrong
        return
    voxels = 1
    for n in shape:
        voxels *= max(int(n), 1)
    if voxels > limits.max_pixels:
        raise _over(path.name, voxels, limits)


def _dicom_pixels(path: Path) -> int:
    import pydicom

    try:
        ds = pydicom.dcmread(path, stop_before_pixels=True)
        frames = int(ds.get("NumberOfFrames", 1) or 1)
        return int(ds.get("Rows", 0) or 0) * int(ds.get("Columns", 0) or 0) * max(frames, 1)
    except Exception:  # pydicom raises many kinds; routing names what is wrong
        return 0


def _dicom_file(path: Path, limits: Limits) -> Path:
    """A DICOM upload as routing reads it: a photo's pixels as a PNG, a CT slice as it is."""
    import pydicom

    pixels = _dicom_pixels(path)
    if pixels > limits.max_pixels:
        raise _over(path.name, pixels, limits)
    try:
        ds = pydicom.dcmread(path)
    except Exception:  # routing names what is wrong
        return path
    if modality_of(ds) in PHOTO_MODALITIES:
        return write_photo(ds, path.parent / "photo", path.name)
    return path


def _unzip(folder: Path, archive: Path, limits: Limits) -> Path:
    """A zipped DICOM series unpacked flat into ``folder/series`` (member paths are dropped)."""
    try:
        with zipfile.ZipFile(archive) as zipped:
            members = [m for m in zipped.infolist() if not m.is_dir()]
            if len(members) > limits.max_files:
                raise LimitError(
                    f"{archive.name}: {len(members)} files, over the limit of "
                    f"{limits.max_files} (--max-files)"
                )
            unpacked = sum(m.file_size for m in members)
            if unpacked > limits.max_bytes:
                raise LimitError(
                    f"{archive.name}: unpacks to {unpacked} bytes, over the limit "
                    f"of {limits.max_bytes} (--max-bytes)"
                )
            out = folder / "series"
            out.mkdir()
            for i, member in enumerate(members):
                data = zipped.read(member)
                if len(data) != member.file_size:
                    raise DataError(f"{archive.name}: {member.filename} is damaged")
                (out / f"{i:05d}.dcm").write_bytes(data)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, RuntimeError, ValueError) as exc:
        raise DataError(f"{archive.name}: not a readable zip of DICOM files ({exc})") from exc
    total = sum(_dicom_pixels(p) for p in out.iterdir())
    if total > limits.max_pixels:
        raise _over(archive.name, total, limits)
    return out


def unpack_upload(folder: Path, name: str, data: bytes, limits: Limits) -> Path:
    """Write the upload ``data`` (named ``name``) under ``folder``; the path routing reads.

    LimitError when it is over a limit; other problems are left to routing, which answers
    them as an 'error' decision naming the file."""
    base = safe_name(name)
    if len(data) > limits.max_bytes:
        raise LimitError(
            f"{base}: {len(data)} bytes, over the limit of {limits.max_bytes} (--max-bytes)"
        )
    path = folder / base
    path.write_bytes(data)
    lower = base.lower()
    if lower.endswith(".zip"):
        return _unzip(folder, path, limits)
    if lower.endswith(NIFTI_SUFFIXES):
        _check_nifti(path, limits)
    elif lower.endswith(DICOM_SUFFIX) or probe_dicom(path):
        return _dicom_file(path, limits)
    else:  # a photo, by its suffix or by its bytes (PNG, JPEG, ...): the header decides
        _check_image(path, limits)
    return path
