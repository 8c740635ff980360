"""Does a scan look like its modality? Cheap checks of what a decoded scan shows, so that a site
folder holding other pictures (a cat, a rocket) or volumes that are not CT is warned of before
it trains, where it would only lower the figures.

Fundus: a colour photo of a round camera field on a dark surround, warm (red over blue) inside
the field. CT: values in Hounsfield units, with the air around the body (about -1000 HU) at the
slice's edge. Each check returns what it misses, in words; none refuses a scan (a photo cropped
inside the camera field has no dark surround and is still a fundus photo).
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from medfed.data.io import Volume

__all__ = ["ct_doubts", "fundus_doubts", "modality_doubts"]

_SIDE = 128  # pixels: the photo is judged at this size (the shapes, not the details, matter)
_FLAT = 0.015  # luminance spread (0-1) below which a picture is one flat colour
_DARK = 0.12  # luminance (0-1) below which a corner counts as the dark surround
_CORNER = 0.04  # side of each corner patch, as a share of the photo's side
_DARK_CORNERS = 2  # corners (of 4) that must be dark
_WARM = 1.05  # red over blue inside the field, at the least
_AIR_HU = -500.0  # below this a CT voxel is air
_MAX_HU = 4000.0  # a 99th percentile above this is no CT in HU (even dense bone is lower)
_EDGE_AIR = 0.2  # share of the middle slice's edge that must be air (the body is inside it)

FLAT = "one flat colour: it shows nothing"
NO_SURROUND = "no dark surround around a round camera field"
NOT_RED = "its colours are not red to orange as a retina's are"

# How these thresholds were chosen: on 2,378 real fundus photos of three sources (ODIR-5K,
# Kim's Eye Hospital, EyePACS; docs/onboarding.md, "Real photos") they warn of 10 (0.4%), each
# a photo with a white surround or a strong colour artefact; everyday pictures, grey pictures,
# documents and blank images are still warned of. The surround is judged at the photo's four
# corners only: real cameras' fields often fill the frame but for its corners (EyePACS), and a
# field cropped at the top and bottom (Kim's Eye Hospital) keeps them dark too. The colour asks
# only for red above blue: cataract photos are pale yellow, others green-tinged, and retinas seen
# through other cameras far less red than a synthetic one.


def fundus_doubts(image: np.ndarray) -> list[str]:
    """What an RGB (or grey) photo misses of a fundus photo: something shown at all, a dark
    surround at the corners, a warm (red over blue) field (``[]`` when it looks like one)."""
    pixels = np.asarray(image)
    if pixels.ndim == 2:
        pixels = np.repeat(pixels[..., None], 3, axis=-1)
    small = Image.fromarray(np.ascontiguousarray(pixels[..., :3], dtype=np.uint8))
    small.thumbnail((_SIDE, _SIDE))
    rgb = np.asarray(small, dtype=np.float64) / 255.0
    h, w = rgb.shape[:2]
    luminance = rgb.mean(axis=2)
    if luminance.std() < _FLAT:
        return [FLAT]
    doubts = []
    ph, pw = max(2, round(h * _CORNER)), max(2, round(w * _CORNER))
    corners = (
        luminance[:ph, :pw],
        luminance[:ph, -pw:],
        luminance[-ph:, :pw],
        luminance[-ph:, -pw:],
    )
    if sum(float(np.median(c)) < _DARK for c in corners) < _DARK_CORNERS:
        doubts.append(NO_SURROUND)
    yy, xx = np.mgrid[:h, :w]
    radius = np.hypot((yy - (h - 1) / 2) / (h / 2), (xx - (w - 1) / 2) / (w / 2))
    inside = (radius < 0.8) & (luminance >= _DARK)
    field = rgb[inside] if inside.any() else rgb.reshape(-1, 3)
    red, _, blue = field.mean(axis=0)
    if red < _WARM * blue:
        doubts.append(NOT_RED)
    return doubts


def ct_doubts(volume: Volume) -> list[str]:
    """What a volume misses of a CT scan in Hounsfield units: air (about -1000 HU), values in
    the HU range, and air at the middle slice's edge around the body (``[]`` when it looks
    like one)."""
    array = np.asarray(volume.array, dtype=np.float64)
    low, high = np.nanpercentile(array, [1, 99]) if array.size else (0.0, 0.0)
    doubts = []
    if low > _AIR_HU:
        doubts.append(f"no air (1st percentile {low:.0f}): its values are not Hounsfield units")
    if high > _MAX_HU:
        doubts.append(f"values up to {high:.0f} (99th percentile), beyond the HU range of CT")
    middle = array[array.shape[0] // 2]
    edge = np.concatenate([middle[0], middle[-1], middle[:, 0], middle[:, -1]])
    if not doubts and (edge < _AIR_HU).mean() < _EDGE_AIR:
        doubts.append("no air at the slice's edge around a body outline")
    return doubts


def modality_doubts(modality: str, decoded: np.ndarray | Volume) -> list[str]:
    """:func:`fundus_doubts` or :func:`ct_doubts`, as the site's modality asks."""
    if str(modality) == "fundus" and isinstance(decoded, np.ndarray):
        return fundus_doubts(decoded)
    if str(modality) == "ct" and isinstance(decoded, Volume):
        return ct_doubts(decoded)
    return []
