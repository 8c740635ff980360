"""What the synthetic generators share: the output folder, the ground-truth file, seeding and
small writing helpers (``medfed.data.synth`` is the entry; ``synth_fundus``, ``synth_ct`` and
``synth_dr`` write the sites)."""

from __future__ import annotations

import csv
import json
import shutil
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import replace
from io import BytesIO, StringIO
from pathlib import Path
from typing import Any

import numpy as np
import tomli_w
from PIL import Image

from medfed.core.errors import MedfedError
from medfed.data._phantoms import Camera

# The generator's name, written into synth_meta.json, every manifest and the DICOM UIDs' seed.
GENERATOR = "medfed.data.synth"
FORMAT_VERSION = 1
META_FILE = "synth_meta.json"
MANIFEST_DIR = "sites"
LICENCE = "synthetic, no restrictions"
ETHICS = "synthetic data, no patients"
# The TRIPOD+AI items every synthetic site declares (its manifest, data card and model card).
SYNTHETIC_ITEMS = {
    "reference_standard": "the generator's own label: the class it drew each scan from",
    "inclusion": "every scan the generator drew for the site",
    "exclusion": "none",
    "data_dates": "generated on demand; no acquisition dates",
    "data_controller": "none: synthetic data, no patients",
    "retention": "none needed: synthetic data, regenerated from its seed",
}


class SynthesisError(MedfedError):
    """The synthetic federation cannot be written where or as asked."""

    exit_code = 2


def load_synth_meta(out: str | Path) -> dict[str, Any]:
    """The ground truth written next to a synthetic federation (``synth_meta.json``)."""
    path = Path(out) / META_FILE
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SynthesisError(f"{path}: not found; {out} is not a synthetic federation") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SynthesisError(f"{path}: not valid JSON ({exc}); regenerate the data") from exc
    if not isinstance(meta, dict) or meta.get("generator") != GENERATOR:
        raise SynthesisError(f"{path}: not written by {GENERATOR}")
    return meta


# --------------------------------------------------------------------------- output folder


def prepare_folder(out: Path, folders: Iterable[str], manifests: Iterable[str]) -> None:
    """Create ``out``, or empty it when it holds only a previous synthetic federation.

    ``folders``: the site folders any generator may write; ``manifests``: the manifest file
    names any generator may write under ``sites/``.
    """
    if out.exists() and not out.is_dir():
        raise SynthesisError(f"{out} is a file; give a folder for the synthetic federation")
    out.mkdir(parents=True, exist_ok=True)
    entries = sorted(out.iterdir())
    if not entries:
        return
    if not _is_previous_output(out):
        raise SynthesisError(
            f"{out} is not empty and is not a previous synthetic federation (no {META_FILE} "
            f"written by {GENERATOR}); refusing to write into it. Choose a new or empty folder."
        )
    owned = {META_FILE, MANIFEST_DIR, *folders}
    foreign = [e.name for e in entries if e.name not in owned] + _foreign_manifests(
        out, set(manifests)
    )
    if foreign:
        raise SynthesisError(
            f"{out} holds a previous synthetic federation and also {sorted(foreign)}, which it "
            "did not write; move those away or choose another folder"
        )
    for entry in entries:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _is_previous_output(out: Path) -> bool:
    try:
        load_synth_meta(out)
    except SynthesisError:
        return False
    return True


def _foreign_manifests(out: Path, ours: set[str]) -> list[str]:
    folder = out / MANIFEST_DIR
    if not folder.is_dir():
        return []
    return [f"{MANIFEST_DIR}/{p.name}" for p in sorted(folder.iterdir()) if p.name not in ours]


def write_meta(out: Path, meta: dict[str, Any]) -> None:
    """Write ``synth_meta.json`` (sorted keys, so the same run gives the same bytes)."""
    text = json.dumps(meta, indent=1, sort_keys=True, ensure_ascii=True)
    (out / META_FILE).write_text(text + "\n", encoding="utf-8")


def site_truth(site: Any, **truth: Any) -> dict[str, Any]:
    """A site's entry in ``synth_meta.json``: its folder, manifest and layout, then ``truth``."""
    return {
        "folder": site.folder,
        "manifest": f"{MANIFEST_DIR}/{site.id}.toml",
        "layout": site.layout,
        **truth,
    }


def site_manifest(
    site: Any,
    seed: int,
    *,
    description: str,
    scans: str,
    acquisition: str,
    known_shifts: str,
    labels: dict[str, int],
    preprocess: dict[str, Any],
) -> dict[str, Any]:
    """A synthetic site's manifest, as a table for ``sites/<id>.toml`` (``scans``: what the
    source says it has no real ones of, "images" or "scans")."""
    return {
        "id": site.id,
        "modality": str(site.modality),
        "layout": site.layout,
        "root": f"../{site.folder}",
        "description": description,
        "source": f"generated by {GENERATOR} (seed {seed}); no real {scans}",
        "acquisition": acquisition,
        "known_shifts": known_shifts,
        "licence": LICENCE,
        "ethics": ETHICS,
        **SYNTHETIC_ITEMS,
        "labels": labels,
        "preprocess": preprocess,
        "split": {"seed": seed},
    }


def write_manifest(out: Path, site_id: str, data: dict[str, Any]) -> Path:
    """Write ``sites/<id>.toml``; return its path."""
    path = out / MANIFEST_DIR / f"{site_id}.toml"
    header = f"# Synthetic site written by {GENERATOR}; regenerate it rather than edit it.\n"
    path.write_text(header + tomli_w.dumps(data), encoding="utf-8")
    return path


# -------------------------------------------------------------------------- shared helpers


def seeded_rng(seed: int, *keys: int | str) -> np.random.Generator:
    """A generator for one (seed, site, item) so items do not depend on each other's draws."""
    words = [seed] + [k if isinstance(k, int) else zlib.crc32(k.encode()) for k in keys]
    return np.random.default_rng(words)


def class_sequence(n: int, positive_ratio: float, gen: np.random.Generator) -> list[bool]:
    """Exactly round(n * r / (1 + r)) positives (r = positive : negative), in random order."""
    n_pos = min(max(round(n * positive_ratio / (1.0 + positive_ratio)), 2), n - 2)
    labels = np.array([True] * n_pos + [False] * (n - n_pos))
    return [bool(v) for v in gen.permutation(labels)]


def stratified_parts(
    labels: Sequence[object], fractions: Sequence[float], gen: np.random.Generator
) -> list[int]:
    """Assign every item a part index so that each class is shared out by ``fractions``."""
    parts = [0] * len(labels)
    for cls in sorted(set(labels), key=lambda c: (not c, c) if isinstance(c, bool) else (0, c)):
        members = [i for i, v in enumerate(labels) if v == cls]
        counts = apportion(len(members), fractions)
        order = gen.permutation(members)
        start = 0
        for part, count in enumerate(counts):
            for i in order[start : start + count]:
                parts[int(i)] = part
            start += count
    return parts


def apportion(n: int, fractions: Sequence[float]) -> list[int]:
    """Integer counts summing to n by largest remainder; no part is left empty if n allows."""
    exact = [n * f / sum(fractions) for f in fractions]
    counts = [int(e) for e in exact]
    for k in sorted(range(len(exact)), key=lambda k: counts[k] - exact[k])[: n - sum(counts)]:
        counts[k] += 1
    for k in range(len(counts)):
        if counts[k] == 0 and n >= len(counts):
            counts[counts.index(max(counts))] -= 1
            counts[k] += 1
    return counts


def write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path``, creating its folders."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def csv_text(rows: Sequence[Sequence[object]]) -> str:
    """Rows as CSV text with '\\n' line ends."""
    buffer = StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    return buffer.getvalue()


def rounded(value: float) -> float:
    """A float rounded to 4 decimals, for the ground-truth file."""
    return round(float(value), 4)


def scaled_camera(camera: Camera, scale: float) -> Camera:
    """``camera`` with its image size scaled by ``scale``."""
    return replace(camera, height=round(camera.height * scale), width=round(camera.width * scale))


def encode_image(pixels: np.ndarray, image_format: str, jpeg_quality: int) -> bytes:
    """RGB pixels as PNG or JPEG bytes."""
    buffer = BytesIO()
    image = Image.fromarray(pixels)
    if image_format == "PNG":
        image.save(buffer, format="PNG", compress_level=6)
    else:
        image.save(buffer, format="JPEG", quality=jpeg_quality)
    return buffer.getvalue()


# ------------------------------------------------------------------ heterogeneity settings

# How far a site's camera departs from a neutral one, per covariate-shift level (a factor on
# the departures of each site's own camera; 1: the hand-made cameras as they are).
COVARIATE_STRENGTHS = {"low": 0.3, "mid": 1.0, "high": 1.8}
# The camera every planned site's camera departs from (a macula-centred 45-degree photograph);
# the covariate-shift strength scales the departures. The generators' camera tables give
# Camera's fields in order: height, width, field_scale, disc_scale, disc_offset, cast (RGB
# gains), gamma, saturation, blur, noise.
NEUTRAL_CAMERA = Camera(192, 192, 1.0, 1.0, 0.40, (1.0, 1.0, 1.0), 1.0, 1.0, 0.003, 0.012)
MIN_SITES, MAX_SITES = 3, 32


def check_shift(n_sites: object, covariate: object, label_alpha: object) -> None:
    """Raise SynthesisError naming the shift setting that cannot be honoured."""
    if not isinstance(n_sites, int) or not MIN_SITES <= n_sites <= MAX_SITES:
        raise SynthesisError(
            f"n_sites must be a whole number from {MIN_SITES} to {MAX_SITES}, got {n_sites!r}"
        )
    if covariate not in COVARIATE_STRENGTHS:
        raise SynthesisError(
            f"covariate shift {covariate!r} is not one of {list(COVARIATE_STRENGTHS)}"
        )
    if label_alpha is not None and not (
        isinstance(label_alpha, int | float) and np.isfinite(label_alpha) and label_alpha > 0
    ):
        raise SynthesisError(
            f"label_alpha must be a positive number (e.g. 0.5: strong label shift, "
            f"100: almost none), got {label_alpha!r}"
        )


def numbered(base: str, k: int, cycle: int) -> str:
    """The k-th (0-based) name of a cycle of ``cycle`` layouts: ``base`` on the first round,
    then ``base_2``, ``base_3``, ... (ids and folders of further sites of a layout)."""
    round_ = k // cycle + 1
    return base if round_ == 1 else f"{base}_{round_}"


def jitter_camera(camera: Camera, rng: np.random.Generator) -> Camera:
    """Another camera of the same kind: small random changes to colour, optics and framing."""
    return replace(
        camera,
        cast=tuple(float(c * rng.uniform(0.92, 1.08)) for c in camera.cast),  # type: ignore[arg-type]
        gamma=float(camera.gamma * rng.uniform(0.85, 1.15)),
        saturation=float(camera.saturation * rng.uniform(0.85, 1.15)),
        blur=float(camera.blur * rng.uniform(0.5, 1.5)),
        noise=float(camera.noise * rng.uniform(0.7, 1.3)),
        field_scale=float(camera.field_scale * rng.uniform(0.96, 1.04)),
    )


def towards(value: float, neutral: float, low: float, strength: float) -> float:
    """``value``'s departure from ``neutral`` scaled by ``strength`` (at least ``low``)."""
    return round(max(low, neutral + strength * (value - neutral)), 4)


def camera_with_strength(camera: Camera, neutral: Camera, strength: float) -> Camera:
    """``camera``'s colour, optics and field departures from ``neutral`` scaled by ``strength``."""
    return replace(
        camera,
        field_scale=towards(camera.field_scale, neutral.field_scale, 0.8, strength),
        cast=tuple(towards(c, 1.0, 0.3, strength) for c in camera.cast),  # type: ignore[arg-type]
        gamma=towards(camera.gamma, neutral.gamma, 0.4, strength),
        saturation=towards(camera.saturation, neutral.saturation, 0.3, strength),
        blur=towards(camera.blur, neutral.blur, 0.0, strength),
        noise=towards(camera.noise, neutral.noise, 0.002, strength),
    )
