"""Where a glaucoma photo's optic disc lies when the site's layout says so: the centroid of its
disc mask (REFUGE's Disc_Cup_Masks) or a label table's disc x/y columns. The disc-centred crop
(``disc_crop``) centres on it instead of estimating the disc from the photo."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from medfed.core.errors import DataError
from medfed.data.records import Record

META_KEY = "disc"  # a Record's meta entry holding its DiscPosition


@dataclass(frozen=True)
class DiscPosition:
    """A disc position a layout gives: a point (``x``, ``y``: pixels from the photo's top-left
    corner) or a ``mask`` whose disc pixels' centroid is the point; ``source`` names where it
    was read (a table's file and row, or the mask), for messages."""

    source: str
    x: float | None = None
    y: float | None = None
    mask: Path | None = None

    def cache_part(self) -> str:
        """What of the position the cached crop depends on (a mask: its bytes)."""
        if self.mask is not None:
            from medfed.data.cache import content_hash

            return f"mask:{content_hash((self.mask,))}"
        return f"xy:{self.x!r},{self.y!r}"

    def locate(self, height: int, width: int) -> tuple[float, float]:
        """The disc centre (x, y) in a ``height`` x ``width`` photo; DataError naming the
        source where it lies outside the photo, or the mask is unusable."""
        if self.mask is not None:
            x, y = mask_centroid(self.mask, height, width)
        else:
            x, y = float(self.x), float(self.y)  # type: ignore[arg-type]
        if not (0 <= x < width and 0 <= y < height):
            raise DataError(
                f"{self.source}: disc position ({x:g}, {y:g}) lies outside the {width}x{height} "
                "photo; fix the position (pixels from the top-left corner) or remove it"
            )
        return x, y


def disc_of(record: Record) -> DiscPosition | None:
    """The disc position the layout gave ``record`` (None: the crop estimates it)."""
    found = record.meta.get(META_KEY)
    return found if isinstance(found, DiscPosition) else None


def parse_coordinate(value: str, column: str, place: str) -> float:
    """One disc coordinate read from a label table; DataError naming the place (file and row)
    and the column where it is not a finite number."""
    try:
        number = float(str(value).strip())
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise DataError(
            f"{place}: disc column {column!r} holds {value!r}, not a number of pixels; fix the "
            "value, or leave both disc columns empty to have the crop estimate the disc"
        )
    return number


def mask_centroid(mask: Path, height: int, width: int) -> tuple[float, float]:
    """The centroid (x, y) of a disc mask's disc pixels: every pixel unlike the mask's most
    common value (its background: white in REFUGE's masks, where rim and cup are darker; black
    in a plain binary mask)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(mask) as image:
            pixels = np.asarray(image.convert("L"))
    except FileNotFoundError:
        raise DataError(f"{mask}: the disc mask is missing; add it or remove the photo") from None
    except (OSError, UnidentifiedImageError) as exc:
        raise DataError(f"{mask}: the disc mask cannot be read ({exc}); replace it") from None
    if pixels.shape != (height, width):
        raise DataError(
            f"{mask}: the disc mask is {pixels.shape[1]}x{pixels.shape[0]} pixels, its photo "
            f"{width}x{height}; a mask must match its photo pixel for pixel"
        )
    values, counts = np.unique(pixels, return_counts=True)
    disc = pixels != values[int(np.argmax(counts))]
    if not disc.any():
        raise DataError(f"{mask}: the disc mask is one value everywhere, no disc in it; fix it")
    ys, xs = np.nonzero(disc)
    return float(xs.mean()) + 0.5, float(ys.mean()) + 0.5
