"""What real fundus photos bring that a site check should name: file formats mixed within a
site or differing between sites, photo shapes (aspect ratios) that differ between sites, and black
borders around the camera field that no crop removes.

Each is a warning, not a problem: nothing here stops a site from training. Each matters because
a model learns what tells sites (or classes) apart, and a file format's compression artefacts or
the black bands that pad a wide photo to a square tell them apart without any retina in them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from medfed.config import SiteManifest
from medfed.core.names import printable

# Two sites' photo shapes (width over height) differing by more than this share are told apart.
ASPECT_TOLERANCE = 0.05
# Share of a photo's frame outside its camera field above which the black border is named.
BORDER_SHARE = 0.2
# Brightness (0-255) below which a pixel counts as a black border.
_BLACK = 20


def border_share(image: np.ndarray) -> float:
    """The share of a photo's frame outside the bounding box of its non-black pixels."""
    bright = np.asarray(image).max(axis=-1) > _BLACK
    rows, cols = np.flatnonzero(bright.any(axis=1)), np.flatnonzero(bright.any(axis=0))
    if rows.size == 0:
        return 1.0
    box = (rows[-1] - rows[0] + 1) * (cols[-1] - cols[0] + 1)
    return float(1.0 - box / bright.size)


def format_warnings(manifest: SiteManifest, formats: Mapping[str, Counter[str]]) -> list[str]:
    """A warning when one site stores its photos in several formats (``formats``: class name ->
    format -> photos), with the count per format and class."""
    total: Counter[str] = Counter()
    for per in formats.values():
        total.update(per)
    if len(total) < 2:
        return []
    order = {name: i for i, name in enumerate(manifest.labels)}  # the manifest's class order
    by_class = "; ".join(
        f"{name}: " + ", ".join(f"{n} {fmt}" for fmt, n in sorted(per.items()))
        for name, per in sorted(formats.items(), key=lambda kv: order.get(kv[0], len(order)))
    )
    return [
        f"photos in {len(total)} file formats ({_counted(total)}; by class: {by_class}): "
        "lossy and lossless files differ in fine texture, so where a format goes with a class "
        "a model can learn the format; save the site's photos in one format if you can"
    ]


def border_warnings(manifest: SiteManifest, borders: Sequence[float]) -> list[str]:
    """A warning when photos carry black borders that the manifest does not crop away."""
    if not borders or getattr(manifest.preprocess, "roi_crop", True):
        return []
    wide = [b for b in borders if b > BORDER_SHARE]
    if not wide:
        return []
    return [
        f"{len(wide)} photo(s) have black borders around the camera field (on average "
        f"{100 * float(np.mean(wide)):.0f}% of the frame) and [preprocess] roi_crop = false "
        "keeps them: set roi_crop = true to crop each photo to its camera field"
    ]


def _counted(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {what}" for what, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def _aspects(size_counts: Mapping[str, int]) -> Counter[float]:
    """Photo shapes (width over height, 2 decimals) -> photos, from ``"HxW"`` size counts."""
    out: Counter[float] = Counter()
    for size, n in size_counts.items():
        parts = size.split("x")
        if len(parts) == 2 and all(p.isdigit() for p in parts) and int(parts[0]):
            out[round(int(parts[1]) / int(parts[0]), 2)] += n
    return out


def _aspect_text(aspects: Counter[float]) -> str:
    low, high = min(aspects), max(aspects)
    return f"{low:g}" if low == high else f"{low:g} to {high:g}"


def federation_photo_warnings(reports: Sequence[Any]) -> None:
    """Warn each fundus site whose file formats or photo shapes differ from the other sites':
    the format's artefacts and the square padding of a wide photo reveal the site."""
    sites = [r for r in reports if r.modality == "fundus" and not r.unusable and r.size_counts]
    if len(sites) < 2:
        return
    aspects = {r.site: _aspects(r.size_counts) for r in sites}
    for report in sites:
        others = [r for r in sites if r is not report]
        mine = set(report.formats)
        differ = [r for r in others if set(r.formats) != mine and r.formats]
        if mine and differ:
            theirs = "; ".join(f"{r.site}: {_counted(r.formats)}" for r in differ)
            report.warnings.append(
                printable(
                    f"file formats differ between sites (this site: {_counted(report.formats)}; "
                    f"{theirs}): compression artefacts then reveal the site, and a model can "
                    "route or classify by them; note it when reading cross-site figures"
                )
            )
        shape = aspects[report.site]
        apart = [r for r in others if shape and aspects[r.site] and _far(shape, aspects[r.site])]
        if apart:
            theirs = "; ".join(f"{r.site}: {_aspect_text(aspects[r.site])}" for r in apart)
            report.warnings.append(
                f"photo shape (width/height) {_aspect_text(shape)} differs from other sites' "
                f"({theirs}): the shape alone reveals the site, and where the camera-field crop "
                "leaves a photo wider than tall, the black bands that pad it to a square do too; "
                "note it when reading cross-site figures"
            )


def _far(one: Counter[float], other: Counter[float]) -> bool:
    """Whether two sites' most common photo shapes differ by more than ASPECT_TOLERANCE."""
    a, b = one.most_common(1)[0][0], other.most_common(1)[0][0]
    return abs(a - b) > ASPECT_TOLERANCE * max(a, b)
