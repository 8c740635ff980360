"""Decoding scans: fundus images to uint8 RGB, CT series and NIfTI files to HU volumes.

Every failure is a :class:`DataError` naming the file and what is wrong; decoder libraries'
own exceptions never reach the caller. Which decoder a modality uses is decided in one place,
:mod:`medfed.data.modality`.
"""

from __future__ import annotations

import errno
import stat
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from medfed.data.records import Record
from medfed.errors import DataError

if TYPE_CHECKING:
    from pydicom.dataset import Dataset

# File names the decoders accept, for every reader that picks files by name (layouts, serving).
IMAGE_SUFFIXES = (".bmp", ".jpeg", ".jpg", ".png", ".tif", ".tiff")
NIFTI_SUFFIXES = (".nii.gz", ".nii")  # longest first, so stripping one leaves the stem
DICOM_SUFFIX = ".dcm"  # DICOM files may also have no suffix at all: see probe_dicom

_DICOM_MAGIC_OFFSET = 128
# Two slices closer than this (mm) along the normal are the same position: a mixed series.
_SAME_POSITION_MM = 1e-3
# Slice gaps may jitter by rounding in the headers; beyond this fraction a slice is missing.
_SPACING_TOLERANCE = 0.1
# No fundus camera comes near this many pixels; a bigger image is refused before it is decoded
# (PIL's own decompression-bomb guard, Image.MAX_IMAGE_PIXELS, stays in force behind it).
MAX_IMAGE_PIXELS = 100_000_000


@dataclass(frozen=True)
class Volume:
    """A CT volume in Hounsfield units, axes (slice, row, column), spacing in mm in that order."""

    array: np.ndarray
    spacing: tuple[float, float, float]

    def __post_init__(self) -> None:
        if self.array.ndim != 3:
            raise ValueError(f"a Volume is 3-D (slice, row, column), got shape {self.array.shape}")
        if len(self.spacing) != 3 or not all(s > 0 for s in self.spacing):
            raise ValueError(f"Volume spacing must be three positive numbers, got {self.spacing}")


Decoded = np.ndarray | Volume  # what a decoder returns: a photo (H, W, 3) or a volume


_SPECIAL_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def special_kind(path: Path) -> str | None:
    """What ``path`` is when it is there but is neither a regular file nor a folder (links
    followed): "a FIFO", "a character device", ..., "a broken link"; None otherwise (also
    when nothing is there). Opening such a path could block forever or read without end."""
    try:
        mode = Path(path).stat().st_mode
    except FileNotFoundError:
        return "a broken link" if Path(path).is_symlink() else None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symbolic link that loops"
        return None  # unreadable: opening it reports that in its own words
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return next((kind for test, kind in _SPECIAL_KINDS if test(mode)), "a special file")


def require_regular(path: Path) -> None:
    """DataError before ``path`` is opened when it is a FIFO, a device or a socket."""
    kind = special_kind(path)
    if kind is not None:
        raise DataError(
            f"{path}: not a regular file ({kind}); replace it with the scan file itself"
        )


def read_image(path: Path) -> np.ndarray:
    """Decode a fundus image to uint8 RGB of shape (H, W, 3)."""
    path = Path(path)
    require_regular(path)
    try:
        with _open_image(path) as image:
            _check_pixel_count(image, path)
            image.load()  # decode now: PIL is lazy, and a truncated file only fails here
            image = ImageOps.exif_transpose(image)
            return _to_rgb(image, path)
    except (FileNotFoundError, IsADirectoryError) as exc:
        raise DataError(f"{path}: no image file at this path") from exc
    except PermissionError as exc:
        raise DataError(permission_denied(path)) from exc
    except UnidentifiedImageError as exc:
        raise DataError(f"{path}: not a readable image format (or the file is damaged)") from exc
    except Image.DecompressionBombError as exc:
        raise DataError(f"{path}: image is too large to decode safely ({exc})") from exc
    except (OSError, SyntaxError, ValueError) as exc:
        # PIL reports truncated or corrupt data as OSError / SyntaxError / ValueError
        raise DataError(
            f"{path}: image cannot be decoded; the file is truncated or corrupt ({exc})"
        ) from exc


def _open_image(path: Path) -> Image.Image:
    """The image's header, pixels not yet decoded. Sizes between PIL's bomb warning and
    MAX_IMAGE_PIXELS are decoded without the warning; larger ones are refused by the caller."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        return Image.open(path)


def permission_denied(path: Path) -> str:
    """The message for a file the user running medfed may not read."""
    return (
        f"{path}: permission denied; the file exists but this user cannot read it "
        "(give it read access, e.g. chmod a+r, or run medfed as a user who can)"
    )


def _check_pixel_count(image: Image.Image, path: Path) -> None:
    width, height = image.size
    if width * height > MAX_IMAGE_PIXELS:
        raise DataError(
            f"{path}: image is {width}x{height} pixels ({width * height / 1e6:.0f} megapixels), "
            f"beyond any fundus camera (at most {MAX_IMAGE_PIXELS / 1e6:.0f} megapixels are "
            "decoded); the file is damaged or not a photograph, export it at camera size"
        )


@dataclass(frozen=True)
class ImageInfo:
    """What an image file's header says, without decoding its pixels."""

    mode: str  # PIL mode: 'RGB', 'L', 'RGBA', 'I;16', ...
    size: tuple[int, int]  # (width, height)

    @property
    def kind(self) -> tuple[str, str] | None:
        """(what the image is, how the decoder converts it), or None for plain 8-bit RGB."""
        mode = self.mode
        if mode.startswith("I;16"):
            return "16-bit", "reduced to 8 bits"
        if mode in ("L", "1", "LA", "La"):
            return "grayscale", "converted to RGB"
        if mode in ("RGBA", "RGBa", "PA"):
            return "RGBA", "transparency dropped"
        if mode == "CMYK":
            return "CMYK", "converted to RGB"
        return None


def image_info(path: Path) -> ImageInfo:
    """Mode and size of an image file from its header (cheap: no pixel is decoded)."""
    path = Path(path)
    require_regular(path)
    try:
        with _open_image(path) as image:
            return ImageInfo(mode=image.mode, size=image.size)
    except PermissionError as exc:
        raise DataError(permission_denied(path)) from exc
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise DataError(f"{path}: not a readable image format (or the file is damaged)") from exc


def _to_rgb(image: Image.Image, path: Path) -> np.ndarray:
    if image.mode.startswith("I;16"):
        # 16-bit greyscale: keep the top 8 bits rather than let PIL clip at 255
        grey = (np.asarray(image, dtype=np.uint16) >> 8).astype(np.uint8)
        return np.ascontiguousarray(np.repeat(grey[..., None], 3, axis=2))
    if image.mode in ("I", "F"):
        raise DataError(
            f"{path}: {image.mode!r} ({'32-bit integer' if image.mode == 'I' else 'float'}) "
            "pixels are not a photograph; export the image as 8-bit RGB"
        )
    return np.ascontiguousarray(np.asarray(image.convert("RGB"), dtype=np.uint8))


def probe_dicom(path: Path) -> bool:
    """True when the file carries the DICOM Part 10 marker ('DICM' after the 128-byte preamble).

    False for a FIFO or device, which is never opened."""
    if special_kind(path) is not None:
        return False
    try:
        with Path(path).open("rb") as handle:
            handle.seek(_DICOM_MAGIC_OFFSET)
            return handle.read(4) == b"DICM"
    except OSError:
        return False


def dicom_read_error(exc: Exception) -> str:
    """Why pydicom could not read a file, in words for the person who owns the file."""
    from pydicom.errors import InvalidDicomError

    if isinstance(exc, InvalidDicomError):
        return "no DICOM file meta header: the 'DICM' marker after the 128-byte preamble is missing"
    return f"{type(exc).__name__}: {exc}"


def read_dicom_series(files: Sequence[Path]) -> Volume:
    """Decode the slices of one series to a HU volume ordered along the slice normal."""
    if not files:
        raise DataError("a DICOM series needs at least one slice file; none was given")
    slices = [_read_slice(Path(f)) for f in files]
    _check_same_grid(slices)
    normal = _slice_normal(slices)
    slices.sort(key=lambda s: float(np.dot(s.position, normal)) if s.position is not None else 0.0)
    depth = _slice_spacing(slices, normal)
    array = np.stack([s.hu for s in slices]).astype(np.float32, copy=False)
    row_mm, col_mm = slices[0].pixel_spacing
    return Volume(array=array, spacing=(depth, row_mm, col_mm))


@dataclass(frozen=True)
class _Slice:
    path: Path
    hu: np.ndarray
    position: np.ndarray | None
    orientation: np.ndarray | None
    pixel_spacing: tuple[float, float]
    thickness: float | None


def _read_slice(path: Path) -> _Slice:
    import pydicom

    require_regular(path)
    try:
        ds = pydicom.dcmread(path)
    except FileNotFoundError as exc:
        raise DataError(f"{path}: DICOM file not found") from exc
    except PermissionError as exc:
        raise DataError(permission_denied(path)) from exc
    except Exception as exc:  # pydicom raises many unrelated types on damaged files
        raise DataError(f"{path}: not a readable DICOM file ({dicom_read_error(exc)})") from exc
    if int(ds.get("NumberOfFrames", 1) or 1) > 1:
        raise DataError(
            f"{path}: multi-frame (enhanced) DICOM is not supported; convert the series to "
            "single-frame slices or to NIfTI (e.g. with dcm2niix)"
        )
    if int(ds.get("SamplesPerPixel", 1) or 1) != 1:
        raise DataError(f"{path}: colour DICOM image; a CT slice has one sample per pixel")
    return _Slice(
        path=path,
        hu=_hounsfield(ds, path),
        position=_floats(ds, "ImagePositionPatient", 3, path),
        orientation=_floats(ds, "ImageOrientationPatient", 6, path),
        pixel_spacing=_pixel_spacing(ds, path),
        thickness=_positive(ds.get("SliceThickness")),
    )


def _hounsfield(ds: Dataset, path: Path) -> np.ndarray:
    if "PixelData" not in ds:
        raise DataError(f"{path}: DICOM file has no pixel data (not an image slice)")
    try:
        stored = ds.pixel_array
    except Exception as exc:  # missing codec, truncated pixel data, bad attributes
        syntax = getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", None)
        if syntax is not None and syntax.is_compressed:
            hint = (
                f"it is compressed ({syntax.name}); install a decoder such as pylibjpeg, "
                "or decompress the files first (e.g. gdcmconv --raw)"
            )
        else:
            hint = "the file is truncated or its image attributes are wrong"
        raise DataError(f"{path}: pixel data cannot be decoded ({exc}); {hint}") from exc
    slope = float(ds.get("RescaleSlope", 1.0) or 1.0)
    intercept = float(ds.get("RescaleIntercept", 0.0) or 0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        hu = stored.astype(np.float32) * np.float32(slope) + np.float32(intercept)
    bad = int((~np.isfinite(hu)).sum())
    if bad:
        raise DataError(
            f"{path}: {bad} pixel(s) are NaN or infinite after RescaleSlope {slope:g} and "
            f"RescaleIntercept {intercept:g}; fix the rescale values in the header or re-export "
            "the series"
        )
    return hu


def _floats(ds: Dataset, keyword: str, n: int, path: Path) -> np.ndarray | None:
    value = ds.get(keyword)
    if value is None or len(value) == 0:
        return None
    try:
        numbers = np.array([float(v) for v in value], dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{path}: {keyword} {value!r} is not a list of numbers") from exc
    if numbers.size != n:
        raise DataError(f"{path}: {keyword} has {numbers.size} values, expected {n}")
    return numbers


def _pixel_spacing(ds: Dataset, path: Path) -> tuple[float, float]:
    for keyword in ("PixelSpacing", "ImagerPixelSpacing"):
        numbers = _floats(ds, keyword, 2, path)
        if numbers is not None and all(numbers > 0):
            return float(numbers[0]), float(numbers[1])
    raise DataError(f"{path}: no PixelSpacing; the in-plane size of a pixel (mm) is unknown")


def _positive(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def _check_same_grid(slices: list[_Slice]) -> None:
    first = slices[0]
    for s in slices[1:]:
        if s.hu.shape != first.hu.shape:
            raise DataError(
                f"{s.path}: slice is {s.hu.shape[0]}x{s.hu.shape[1]} (rows x columns) but "
                f"{first.path} is {first.hu.shape[0]}x{first.hu.shape[1]}; "
                "the files are not one series"
            )
        if not np.allclose(s.pixel_spacing, first.pixel_spacing, rtol=1e-3):
            raise DataError(
                f"{s.path}: PixelSpacing {s.pixel_spacing} differs from {first.pixel_spacing} "
                f"in {first.path}; the files are not one series"
            )


def _slice_normal(slices: list[_Slice]) -> np.ndarray:
    """The unit normal of the slice planes, from ImageOrientationPatient (row x column)."""
    if len(slices) == 1:
        orientation = slices[0].orientation
        return _normal(orientation) if orientation is not None else np.array([0.0, 0.0, 1.0])
    for s in slices:
        if s.position is None or s.orientation is None:
            raise DataError(
                f"{s.path}: ImagePositionPatient or ImageOrientationPatient is missing, so the "
                "slice order is unknown; export the series with full geometry or as NIfTI"
            )
        if not np.allclose(s.orientation, slices[0].orientation, atol=1e-4):
            raise DataError(
                f"{s.path}: ImageOrientationPatient differs from {slices[0].path}; "
                "the files are not one series (or the series is not a stack of parallel slices)"
            )
    return _normal(slices[0].orientation)


def _normal(orientation: np.ndarray) -> np.ndarray:
    normal = np.cross(orientation[:3], orientation[3:])
    length = float(np.linalg.norm(normal))
    if length < 1e-6:
        raise DataError(f"ImageOrientationPatient {orientation.tolist()} has parallel axes")
    return normal / length


def _slice_spacing(slices: list[_Slice], normal: np.ndarray) -> float:
    """Distance between consecutive slices (mm); SliceThickness for a single slice."""
    if len(slices) == 1:
        thickness = slices[0].thickness
        if thickness is None:
            raise DataError(f"{slices[0].path}: single slice without SliceThickness")
        return thickness
    positions = np.array([float(np.dot(s.position, normal)) for s in slices])
    gaps = np.diff(positions)
    i = int(np.argmin(gaps))
    if gaps[i] < _SAME_POSITION_MM:
        raise DataError(
            f"{slices[i + 1].path}: same slice position as {slices[i].path}; "
            "the folder mixes series or holds a duplicate slice"
        )
    median = float(np.median(gaps))
    j = int(np.argmax(np.abs(gaps - median)))
    if abs(gaps[j] - median) > _SPACING_TOLERANCE * median:
        raise DataError(
            f"{slices[j + 1].path}: gap of {gaps[j]:.3g} mm to {slices[j].path}, but slices are "
            f"{median:.3g} mm apart elsewhere; a slice is probably missing from the series"
        )
    return float(np.mean(gaps))


def read_nifti(path: Path) -> Volume:
    """Decode a 3-D NIfTI file to a HU volume with axes (slice, row, column) = (z, y, x)."""
    import nibabel as nib

    path = Path(path)
    require_regular(path)
    if not path.is_file():
        raise DataError(f"{path}: NIfTI file not found")
    problem = nifti_header_problem(path)
    if problem is not None:
        raise DataError(f"{path}: {problem}")
    try:
        image = nib.squeeze_image(nib.load(path))
        if len(image.shape) != 3:
            raise DataError(
                f"{path}: image has shape {image.shape}; a CT volume must be 3-D "
                "(split 4-D files into one volume per file)"
            )
        # closest canonical orientation (RAS+), so every site's volumes share axis directions
        image = nib.as_closest_canonical(image)
        data = image.get_fdata(dtype=np.float32)
        # from the reoriented affine, which (unlike the header's pixdim) follows the new axes
        zooms = tuple(float(z) for z in nib.affines.voxel_sizes(image.affine))
    except DataError:
        raise
    except Exception as exc:  # nibabel and gzip raise many types on damaged files
        raise DataError(f"{path}: not a readable NIfTI file ({exc})") from exc
    if not all(z > 0 for z in zooms):
        raise DataError(f"{path}: voxel sizes {zooms} must be positive (fix the header's pixdim)")
    if not np.isfinite(data).all():
        raise DataError(
            f"{path}: {int((~np.isfinite(data)).sum())} voxel(s) are NaN or infinite; "
            "re-export the volume with finite HU values"
        )
    array = np.ascontiguousarray(data.transpose(2, 1, 0))
    return Volume(array=array, spacing=(zooms[2], zooms[1], zooms[0]))


def nifti_header_problem(path: Path) -> str | None:
    """What is wrong with a NIfTI header's voxel sizes as stored, or None (also when the header
    cannot be parsed at all: loading the file then reports that).

    nibabel quietly repairs zero (to 1) and negative (to their absolute value) pixdim entries
    on load; a volume whose voxel size is unknown must be refused instead.
    """
    import nibabel as nib
    from nibabel.openers import ImageOpener

    try:
        with ImageOpener(path) as handle:
            size = handle.read(4)
            handle.seek(0)
            nifti2 = 540 in (int.from_bytes(size, "little"), int.from_bytes(size, "big"))
            klass = nib.Nifti2Header if nifti2 else nib.Nifti1Header
            header = klass.from_fileobj(handle, check=False)
        ndim = int(header["dim"][0])
        pixdim = [float(v) for v in header["pixdim"][1 : 1 + min(max(ndim, 0), 3)]]
    except PermissionError:
        return permission_denied(path).removeprefix(f"{path}: ")
    except Exception:  # a damaged file: loading it says what is wrong, in its own words
        return None
    bad = [v for v in pixdim if not (np.isfinite(v) and v > 0)]
    if bad:
        return (
            f"header pixdim (voxel size) {pixdim} has zero, negative or non-finite entries, so "
            "the spacing is unknown; re-export the volume with its voxel sizes in mm"
        )
    return None


def read_photo(record: Record) -> np.ndarray:
    """Decode a photo record (one image file) to uint8 RGB."""
    return read_image(record.path)


def read_volume(record: Record) -> Volume:
    """Decode a volume record: its DICOM slice files when it lists them, else its NIfTI file."""
    if record.files:
        return read_dicom_series(record.files)
    return read_nifti(record.path)
