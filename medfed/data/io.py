"""Decoding scans: fundus images to uint8 RGB, CT series and NIfTI files to HU volumes.

Every failure is a :class:`DataError` naming the file and what is wrong; decoder libraries'
own exceptions never reach the caller. Which decoder a modality uses is decided in one place,
:mod:`medfed.data.modality`. DICOM series and NIfTI files share one reorientation step, so one
anatomy reads as one array, axes (z, y, x) of the closest canonical orientation (RAS+).
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

from medfed.core.errors import DataError
from medfed.data.records import Record

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
# Voxel axes tilted less than this against the patient's axes are taken as aligned (rounding
# in ImageOrientationPatient, a table set up a hair off); beyond it the volume is "oblique".
_OBLIQUE_DEGREES = 0.5
# Spacings are rounded to this many decimals of a millimetre: NIfTI headers hold float32
# (0.9 mm reads 0.89999998), DICOM holds decimal strings, and resampling may round a grid's size
# differently on either side of such a hair; one geometry must give one spacing.
_SPACING_DECIMALS = 6
# Every CT volume leaves the readers in the closest canonical orientation, nibabel's RAS+:
# array axes (slice, row, column) = (z, y, x) pointing to Superior, Anterior and Right.
CANONICAL = "RAS"
# No fundus camera comes near this many pixels; a bigger image is refused before it is decoded
# (PIL's own decompression-bomb guard, Image.MAX_IMAGE_PIXELS, stays in force behind it).
MAX_IMAGE_PIXELS = 100_000_000


@dataclass(frozen=True)
class Orientation:
    """Which way a volume's stored voxel axes pointed, and what reading made of them."""

    file_format: str  # "DICOM" or "NIfTI"
    # Axis codes of the stored (column, row, slice) = (i, j, k) axes in nibabel's terms, each
    # the patient direction the index grows towards: ("L", "P", "S") for an axial DICOM series.
    # None when the file does not say (no ImageOrientationPatient, no qform or sform).
    source: tuple[str, str, str] | None
    oblique: bool = False  # tilted axes, put in the closest canonical orientation unrotated

    @property
    def result(self) -> str:
        """The orientation of the volume as read: "RAS", or "unknown" when the file is silent."""
        return CANONICAL if self.source is not None else "unknown"

    def describe(self) -> str:
        """One phrase for a data card, e.g. "RAS (from LPS DICOM)"."""
        if self.source is None:
            if self.file_format == "DICOM":
                return "unknown (DICOM without ImageOrientationPatient, kept as stored)"
            return "unknown (NIfTI without qform/sform, read with nibabel's default affine)"
        codes = "".join(self.source)
        if self.oblique:
            return f"{CANONICAL} (closest canonical, from oblique {codes} {self.file_format})"
        return f"{CANONICAL} (from {codes} {self.file_format})"


@dataclass(frozen=True)
class Volume:
    """A CT volume in Hounsfield units, axes (slice, row, column), spacing in mm in that order.

    Read from a file, the axes are (z, y, x) of the closest canonical RAS+ orientation, whatever
    the file stored (see ``orientation``); None for a volume built in memory.
    """

    array: np.ndarray
    spacing: tuple[float, float, float]
    orientation: Orientation | None = None

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
    format: str = ""  # what the bytes are, whatever the suffix says: 'JPEG', 'PNG', ...

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
            return ImageInfo(mode=image.mode, size=image.size, format=image.format or "")
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
    """Decode the slices of one series to a HU volume in the closest canonical orientation.

    Slices are stacked along the slice normal, then the volume is reoriented to RAS+ like a
    NIfTI file (:func:`read_nifti`), so that one anatomy reads the same from either format.
    A single slice without ImageOrientationPatient is kept as stored, its orientation unknown.
    """
    if not files:
        raise DataError("a DICOM series needs at least one slice file; none was given")
    slices = [_read_slice(Path(f)) for f in files]
    _check_same_grid(slices)
    normal = _slice_normal(slices)
    slices.sort(key=lambda s: float(np.dot(s.position, normal)) if s.position is not None else 0.0)
    depth = _slice_spacing(slices, normal)
    array = np.stack([s.hu for s in slices]).astype(np.float32, copy=False)
    row_mm, col_mm = slices[0].pixel_spacing
    if slices[0].orientation is None:
        unknown = Orientation(file_format="DICOM", source=None)
        spacing = (_mm(depth), _mm(row_mm), _mm(col_mm))
        return Volume(array=array, spacing=spacing, orientation=unknown)
    affine = _dicom_affine(slices[0], slices[0].orientation, normal, depth)
    # (slice, row, column) -> (column, row, slice): the (i, j, k) voxel order of the affine
    array, spacing, orientation = _canonical(array.transpose(2, 1, 0), affine, "DICOM")
    return Volume(array=array, spacing=spacing, orientation=orientation)


def _dicom_affine(
    first: _Slice, orientation: np.ndarray, normal: np.ndarray, depth: float
) -> np.ndarray:
    """The RAS+ affine of voxels (column, row, slice): the usual DICOM-to-NIfTI affine.

    DICOM positions are LPS+ (x to the patient's left, y to the back); RAS+ negates x and y.
    """
    along_row, along_column = (_unit(v, first.path) for v in np.split(orientation, 2))
    row_mm, col_mm = first.pixel_spacing  # DICOM PixelSpacing: between rows, between columns
    lps = np.eye(4)
    lps[:3, 0] = along_row * col_mm  # the next column lies along the row direction
    lps[:3, 1] = along_column * row_mm
    lps[:3, 2] = normal * depth  # slices are sorted along the normal
    lps[:3, 3] = first.position if first.position is not None else 0.0
    return np.diag([-1.0, -1.0, 1.0, 1.0]) @ lps


def _unit(vector: np.ndarray, path: Path) -> np.ndarray:
    return _normalized(
        vector,
        f"{path}: ImageOrientationPatient has a zero direction {vector.tolist()}; "
        "each half must be a unit vector (fix the header or export the series as NIfTI)",
    )


def _normalized(vector: np.ndarray, problem: str) -> np.ndarray:
    """``vector`` scaled to length 1; DataError ``problem`` when it has no direction."""
    length = float(np.linalg.norm(vector))
    if not np.isfinite(length) or length < 1e-6:
        raise DataError(problem)
    return vector / length


def _canonical(
    data: np.ndarray, affine: np.ndarray, file_format: str, known: bool = True
) -> tuple[np.ndarray, tuple[float, float, float], Orientation]:
    """Voxels (i, j, k) mapped to RAS+ mm by ``affine``, reoriented to the closest canonical
    orientation: the (z, y, x) array, its spacing in that order, and where it came from.

    The one path of both readers. Only axis swaps and flips are made, never a resampling: an
    oblique volume keeps its tilt (the card says so). ``known``: the affine comes from the
    file's orientation tags, not from a default.
    """
    from nibabel import orientations
    from nibabel.affines import voxel_sizes

    ornt = orientations.io_orientation(affine)
    if np.isnan(ornt).any():
        raise DataError(
            f"the {file_format} affine {np.round(affine[:3], 4).tolist()} is degenerate (an axis "
            "has no direction); fix the orientation in the header or re-export the volume"
        )
    i_code, j_code, k_code = (str(c) for c in orientations.ornt2axcodes(ornt))
    to_ras = orientations.ornt_transform(ornt, orientations.axcodes2ornt(CANONICAL))
    reoriented = orientations.apply_orientation(data, to_ras)
    ras_affine = affine @ orientations.inv_ornt_aff(to_ras, data.shape)
    x_mm, y_mm, z_mm = (_mm(v) for v in voxel_sizes(ras_affine))
    orientation = Orientation(
        file_format=file_format,
        source=(i_code, j_code, k_code) if known else None,
        oblique=known and _is_oblique(affine),
    )
    array = np.ascontiguousarray(reoriented.transpose(2, 1, 0), dtype=np.float32)
    return array, (z_mm, y_mm, x_mm), orientation


def _mm(value: float) -> float:
    return round(float(value), _SPACING_DECIMALS)


def _is_oblique(affine: np.ndarray) -> bool:
    """True when some voxel axis is tilted beyond _OBLIQUE_DEGREES from every patient axis."""
    axes = affine[:3, :3] / np.linalg.norm(affine[:3, :3], axis=0)
    closest = np.abs(axes).max(axis=0)  # cosine of each axis to its nearest patient axis
    return bool(closest.min() < np.cos(np.deg2rad(_OBLIQUE_DEGREES)))


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
        if orientation is None:
            return np.array([0.0, 0.0, 1.0])
        return _normal(orientation, slices[0].path)
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
    return _normal(slices[0].orientation, slices[0].path)


def _normal(orientation: np.ndarray, path: Path) -> np.ndarray:
    return _normalized(
        np.cross(orientation[:3], orientation[3:]),
        f"{path}: ImageOrientationPatient {orientation.tolist()} has parallel or zero axes, "
        "so the slice direction is unknown; fix the header or export the series as NIfTI",
    )


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
    """Decode a 3-D NIfTI file to a HU volume with axes (slice, row, column) = (z, y, x).

    The volume is reoriented to the closest canonical orientation (RAS+), as DICOM series are.
    A file with neither qform nor sform is read with nibabel's default affine, and its
    orientation is recorded as unknown.
    """
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
        data = image.get_fdata(dtype=np.float32)
        affine = image.affine
        known = int(image.header["qform_code"]) > 0 or int(image.header["sform_code"]) > 0
    except DataError:
        raise
    except Exception as exc:  # nibabel and gzip raise many types on damaged files
        raise DataError(f"{path}: not a readable NIfTI file ({exc})") from exc
    if not np.isfinite(affine).all():
        raise DataError(
            f"{path}: the header's qform/sform affine has non-finite entries; "
            "fix the orientation in the header or re-export the volume"
        )
    try:
        # closest canonical orientation (RAS+), so every site's volumes share axis directions;
        # the spacing comes from the reoriented affine, which follows the new axes
        array, zooms, orientation = _canonical(data, affine, "NIfTI", known=known)
    except DataError as exc:
        raise DataError(f"{path}: {exc}") from exc
    if not all(z > 0 for z in zooms):
        raise DataError(f"{path}: voxel sizes {zooms} must be positive (fix the header's pixdim)")
    if not np.isfinite(array).all():
        raise DataError(
            f"{path}: {int((~np.isfinite(array)).sum())} voxel(s) are NaN or infinite; "
            "re-export the volume with finite HU values"
        )
    return Volume(array=array, spacing=zooms, orientation=orientation)


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
