"""An image's width and height read from its header bytes, nothing decoded.

PNG (IHDR) and JPEG (its frame header, SOFn) are read here byte by byte, whatever size they
claim; other formats through PIL's header reader. PIL refuses to open an image over twice its
own pixel limit (a decompression bomb) without saying its size, which would leave such a file
to routing: the readers here give the size for every claim, so the service refuses all
oversized images alike.
"""

from __future__ import annotations

import struct
import warnings
from pathlib import Path
from typing import BinaryIO

__all__ = ["OVER_DECODER", "image_size"]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# JPEG markers that start a frame (SOF0-SOF15); C4 (DHT), C8 (JPG) and CC (DAC) are not frames.
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# Markers that stand alone, with no length after them: TEM, RST0-7, SOI, EOI.
_STANDALONE = frozenset({0x01, *range(0xD0, 0xDA)})
_MAX_SEGMENTS = 10_000  # a JPEG header with more segments before its frame is not a photo

OVER_DECODER = -1
"""What :func:`image_size` gives as the pixel count of an image the decoder refuses as a
decompression bomb without its size."""


def image_size(path: Path) -> tuple[int, int] | None:
    """(width, height) of the image in ``path`` from its header; None when the file is no
    image this service reads (routing then names what is wrong); (OVER_DECODER, 1) when the
    decoder refuses it as too large to decode safely."""
    with path.open("rb") as handle:
        head = handle.read(2)
        handle.seek(0)
        if head == PNG_SIGNATURE[:2]:
            return _png(handle)
        if head == b"\xff\xd8":
            return _jpeg(handle)
    return _other(path)


def _png(handle: BinaryIO) -> tuple[int, int] | None:
    data = handle.read(24)
    if len(data) < 24 or data[:8] != PNG_SIGNATURE or data[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def _jpeg(handle: BinaryIO) -> tuple[int, int] | None:
    handle.read(2)  # SOI
    for _ in range(_MAX_SEGMENTS):
        byte = handle.read(1)
        if byte != b"\xff":
            return None
        marker = handle.read(1)
        while marker == b"\xff":  # fill bytes before a marker
            marker = handle.read(1)
        if not marker:
            return None
        code = marker[0]
        if code in _STANDALONE:
            continue
        length_bytes = handle.read(2)
        if len(length_bytes) < 2:
            return None
        (length,) = struct.unpack(">H", length_bytes)
        if code in _SOF:
            frame = handle.read(5)
            if len(frame) < 5:
                return None
            height, width = struct.unpack(">HH", frame[1:5])
            return width, height
        if code == 0xDA or length < 2:  # the scan starts, or a broken length: no frame header
            return None
        handle.seek(length - 2, 1)
    return None


def _other(path: Path) -> tuple[int, int] | None:
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                return image.size
    except Image.DecompressionBombError:
        return OVER_DECODER, 1
    except (OSError, SyntaxError, ValueError, UnidentifiedImageError):
        return None
