"""A small picture of a scan for the Routing page: a fundus photo as it is, a CT volume as its
middle slice (no Streamlit; the picture stays in the page's memory, never on disk)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from medfed.core.errors import MedfedError
from medfed.data.io import Volume
from medfed.routing.scans import read_scan

SIZE = 256  # longest side in pixels; the page shows it smaller still
LOW, HIGH = 0.5, 99.5  # percentiles a CT slice is stretched between (any scanner's units)


def picture(
    decoded: np.ndarray | Volume,
    size: int = SIZE,
    window: tuple[float, float] | None = None,
) -> np.ndarray:
    """An 8-bit picture of a decoded scan, its longest side at most ``size`` pixels: RGB for a
    photo; for a volume the middle slice, in grey, drawn with the volume's pixel spacing
    (non-square pixels look right) and stretched over ``window`` (HU centre and width, as the
    DICOM file names it), else between its 0.5th and 99.5th percentiles."""
    if isinstance(decoded, Volume):
        middle = np.asarray(decoded.array[decoded.array.shape[0] // 2], dtype=np.float64)
        low, high = np.nanpercentile(middle, [LOW, HIGH]) if middle.size else (0.0, 0.0)
        if window is not None:
            low, high = window[0] - window[1] / 2, window[0] + window[1] / 2
        scaled = (middle - low) / (high - low) if high > low else np.zeros_like(middle)
        grey = (np.clip(np.nan_to_num(scaled), 0, 1) * 255).round().astype(np.uint8)
        image = Image.fromarray(grey)
        rows, columns = decoded.spacing[1], decoded.spacing[2]
        if not np.isclose(rows, columns):
            height = max(1, round(grey.shape[0] * rows / columns))
            image = image.resize((grey.shape[1], height), Image.Resampling.BILINEAR)
    else:
        image = Image.fromarray(np.ascontiguousarray(decoded, dtype=np.uint8))
    image.thumbnail((size, size), Image.Resampling.LANCZOS)
    return np.asarray(image)


def _first(value: object) -> float:
    """A DICOM number, or the first of several (a file may name a window per preset)."""
    many = isinstance(value, Sequence) and not isinstance(value, str)
    return float(value[0] if many else value)  # type: ignore[index, arg-type]


def dicom_window(files: tuple[Path, ...]) -> tuple[float, float] | None:
    """The display window (centre, width in HU) a DICOM scan names, from its middle file; None
    for a scan that is no DICOM or names none."""
    if not files:
        return None
    try:
        import pydicom

        ds = pydicom.dcmread(files[len(files) // 2], stop_before_pixels=True)
        centre, width = ds.get("WindowCenter"), ds.get("WindowWidth")
    except Exception:  # noqa: BLE001 - no DICOM, or an unreadable header: no window
        return None
    if centre is None or width is None:
        return None
    try:
        c, w = _first(centre), _first(width)
    except (TypeError, ValueError, IndexError):
        return None
    return (c, w) if w > 0 else None


def scan_picture(path: str | Path, size: int = SIZE) -> np.ndarray | None:
    """The picture of the scan at ``path`` (a file or a DICOM series folder; DICOM in its own
    window); None when it cannot be read (the routing answer already says why)."""
    try:
        scan = read_scan(path)
        return picture(scan.decoded, size, dicom_window(scan.files))
    except (MedfedError, OSError, ValueError):
        return None
