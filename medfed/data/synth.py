"""Synthetic federation: fundus and CT sites written in the same on-disk layouts as real data.

The embedded default data of the toolkit. Each site differs from the others the way hospitals
do: another camera or scanner (covariate shift) and another share of sick patients (label
shift). Output, under one folder::

    ACRIMA/  RIM-ONE_DL/  REFUGE/        fundus sites (layouts acrima, rimone, refuge)
    CT_DICOM/  CT_NIFTI/                 CT sites (layouts dicom, nifti)
    sites/<id>.toml                      one manifest per site, roots relative to it
    synth_meta.json                      per-image ground truth (cup-to-disc ratio, lesion, ...)

The same seed gives byte-identical files: every image draws from its own generator seeded by
(seed, site, image), and no file embeds a time stamp.
"""

from __future__ import annotations

import csv
import gzip
import json
import re
import shutil
import zipfile
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from io import BytesIO, StringIO
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import tomli_w
from PIL import Image

from medfed.config import Modality
from medfed.data._phantoms import (
    FAINT_CONTRAST_HU,
    FAINT_FRACTION,
    FAINT_RADIUS_MM,
    LESION_CONTRAST_HU,
    LESION_RADIUS_MM,
    BodyAnatomy,
    Camera,
    FundusAnatomy,
    Scanner,
    render_ct,
    render_fundus,
    sample_body,
    sample_fundus_anatomy,
)
from medfed.errors import MedfedError

GENERATOR = "medfed.data.synth"
# The CT sites' manifests read a liver window (width 200 HU, level 60): a lesion 60 HU below the
# liver spans almost a third of it, where the soft-tissue window [-160, 240] gives it a seventh.
CT_LIVER_WINDOW = (-40.0, 160.0)
FORMAT_VERSION = 1
META_FILE = "synth_meta.json"
MANIFEST_DIR = "sites"
ALL = "all"
MODALITIES = (*(str(m) for m in Modality), ALL)
DEFAULT_N_PER_SITE = {Modality.FUNDUS: 240, Modality.CT: 200}
MIN_N_PER_SITE = {Modality.FUNDUS: 12, Modality.CT: 4}
LICENCE = "synthetic, no restrictions"
ETHICS = "synthetic data, no patients"


class SynthesisError(MedfedError):
    """The synthetic federation cannot be written where or as asked."""

    exit_code = 2


@dataclass(frozen=True)
class FundusSite:
    """A synthetic fundus hospital: its camera, its glaucoma prevalence, its folder layout."""

    id: str
    folder: str
    layout: str
    camera: Camera
    cast_name: str
    glaucoma_ratio: float  # glaucoma : normal
    image_format: str  # "JPEG" or "PNG"
    jpeg_quality: int
    stand_in_for: str
    modality: ClassVar[Modality] = Modality.FUNDUS

    def write(self, out: Path, n: int, seed: int, scale: float) -> dict[str, Any]:
        """Write the site's images and label tables; return its ground truth."""
        return _write_fundus_site(out, self, n, seed, scale)

    def manifest(self, seed: int, scale: float) -> dict[str, Any]:
        """The site's manifest, as a table for ``sites/<id>.toml``."""
        return _fundus_manifest(self, seed, scale)


@dataclass(frozen=True)
class CTSite:
    """A synthetic CT hospital: its scanner protocol and its file format."""

    id: str
    folder: str
    layout: str
    scanner: Scanner
    slices: int  # typical number of slices; each patient varies by a few
    patient_prefix: str
    modality: ClassVar[Modality] = Modality.CT

    def write(self, out: Path, n: int, seed: int, scale: float) -> dict[str, Any]:
        """Write the site's volumes and labels.csv; ``scale`` sizes fundus cameras only."""
        return _write_ct_site(out, self, n, seed)

    def manifest(self, seed: int, scale: float) -> dict[str, Any]:
        """The site's manifest, as a table for ``sites/<id>.toml``."""
        return _ct_manifest(self, seed)


FUNDUS_SITES: tuple[FundusSite, ...] = (
    FundusSite(
        id="acrima",
        folder="ACRIMA",
        layout="acrima",
        camera=Camera(
            height=224,
            width=224,
            field_scale=1.0,
            disc_scale=1.35,
            disc_offset=0.22,
            cast=(1.08, 0.95, 0.80),
            gamma=1.0,
            saturation=1.1,
            blur=0.0,
            noise=0.01,
        ),
        cast_name="warm colour cast",
        glaucoma_ratio=1.34,
        image_format="JPEG",
        jpeg_quality=92,
        stand_in_for="ACRIMA (disc-centred photographs, flat folder, '_g_' marks glaucoma)",
    ),
    FundusSite(
        id="rimone",
        folder="RIM-ONE_DL",
        layout="rimone",
        camera=Camera(
            height=192,
            width=192,
            field_scale=1.12,
            disc_scale=1.6,
            disc_offset=0.12,
            cast=(0.92, 1.04, 1.06),
            gamma=1.3,
            saturation=0.85,
            blur=0.008,
            noise=0.02,
        ),
        cast_name="cool, greenish colour cast",
        glaucoma_ratio=1.94,
        image_format="PNG",
        jpeg_quality=0,
        stand_in_for="RIM-ONE DL (disc-centred, partitioned by hospital and randomly)",
    ),
    FundusSite(
        id="refuge",
        folder="REFUGE",
        layout="refuge",
        camera=Camera(
            height=160,
            width=213,
            field_scale=0.95,
            disc_scale=1.1,
            disc_offset=0.42,
            cast=(1.0, 0.9, 0.95),
            gamma=0.85,
            saturation=1.25,
            blur=0.004,
            noise=0.015,
        ),
        cast_name="magenta-red colour cast",
        glaucoma_ratio=0.46,
        image_format="JPEG",
        jpeg_quality=88,
        stand_in_for="REFUGE (macula-centred, Training400 folders, label tables for val/test)",
    ),
)

CT_SITES: tuple[CTSite, ...] = (
    CTSite(
        id="ct_dicom",
        folder="CT_DICOM",
        layout="dicom",
        scanner=Scanner(
            matrix=64,
            pixel_spacing=2.8,
            slice_thickness=2.5,
            hu_offset=0.0,
            noise_hu=14.0,
            kernel_sigma=0.5,
            kernel_name="B45f",
        ),
        slices=24,
        patient_prefix="CTD",
    ),
    CTSite(
        id="ct_nifti",
        folder="CT_NIFTI",
        layout="nifti",
        scanner=Scanner(
            matrix=64,
            pixel_spacing=3.4,
            slice_thickness=5.0,
            hu_offset=15.0,
            noise_hu=8.0,
            kernel_sigma=1.2,
            kernel_name="B20f",
        ),
        slices=12,
        patient_prefix="CTN",
    ),
)

SITES: tuple[FundusSite | CTSite, ...] = (*FUNDUS_SITES, *CT_SITES)

_OWNED_NAMES = frozenset({META_FILE, MANIFEST_DIR, *(s.folder for s in SITES)})
# Fixed moment for formats that insist on one (xlsx document properties, zip entries, DICOM).
_FIXED_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
_FIXED_ISO_TIME = "2000-01-01T00:00:00Z"
_STUDY_DATE = "20000101"


# ------------------------------------------------------------------------------------ entry


def synthesize(
    out: str | Path,
    modality: str = "all",
    n_per_site: int | None = None,
    seed: int = 0,
    image_size: int | None = None,
) -> list[Path]:
    """Write a synthetic federation under ``out``; return the manifest paths written.

    ``n_per_site``: images per fundus site and patients per CT site (defaults 240 and 200).
    ``image_size``: native height in pixels of the largest fundus camera (default 224); the
    other cameras keep their relative sizes, so the resolution shift between sites remains.
    ``out`` must be new, empty, or a previous output of this function (then it is replaced).
    """
    out = Path(out)
    n_of, scale = _check_arguments(modality, n_per_site, seed, image_size)
    _prepare_folder(out)
    meta: dict[str, Any] = {
        "generator": GENERATOR,
        "format_version": FORMAT_VERSION,
        "complete": False,
        "seed": seed,
        "modality": modality,
        "n_per_site": {str(m): n_of.get(m, 0) for m in Modality},
        "image_size": round(224 * scale),
        "sites": {},
    }
    _write_meta(out, meta)  # marks the folder as ours even if this run is interrupted
    (out / MANIFEST_DIR).mkdir()
    manifests = []
    for site in (s for s in SITES if s.modality in n_of):
        meta["sites"][site.id] = site.write(out, n_of[site.modality], seed, scale)
        manifests.append(_write_manifest(out, site.id, site.manifest(seed, scale)))
    meta["complete"] = True
    _write_meta(out, meta)
    return manifests


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


def _check_arguments(
    modality: str, n_per_site: int | None, seed: int, image_size: int | None
) -> tuple[dict[Modality, int], float]:
    """The number of scans per site of each chosen modality, and the fundus camera scale."""
    if modality not in MODALITIES:
        raise SynthesisError(f"modality {modality!r} is not one of {list(MODALITIES)}")
    if not isinstance(seed, int) or seed < 0:
        raise SynthesisError(f"seed must be a non-negative integer, got {seed!r}")
    chosen = tuple(Modality) if modality == ALL else (Modality(modality),)
    low = max(MIN_N_PER_SITE[m] for m in chosen)
    if n_per_site is not None and n_per_site < low:
        raise SynthesisError(
            f"n_per_site = {n_per_site} is too small for modality {modality!r}: every split and "
            f"class of every site needs images; use at least {low}"
        )
    if image_size is not None and not 48 <= image_size <= 2048:
        raise SynthesisError(f"image_size must be between 48 and 2048 pixels, got {image_size}")
    n_of = {m: n_per_site or DEFAULT_N_PER_SITE[m] for m in chosen}
    return n_of, (image_size or 224) / 224


# --------------------------------------------------------------------------- output folder


def _prepare_folder(out: Path) -> None:
    """Create ``out``, or empty it when it holds only a previous synthetic federation."""
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
    foreign = [e.name for e in entries if e.name not in _OWNED_NAMES] + _foreign_manifests(out)
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


def _foreign_manifests(out: Path) -> list[str]:
    folder = out / MANIFEST_DIR
    if not folder.is_dir():
        return []
    ours = {f"{s.id}.toml" for s in SITES}
    return [f"{MANIFEST_DIR}/{p.name}" for p in sorted(folder.iterdir()) if p.name not in ours]


def _write_meta(out: Path, meta: dict[str, Any]) -> None:
    text = json.dumps(meta, indent=1, sort_keys=True, ensure_ascii=True)
    (out / META_FILE).write_text(text + "\n", encoding="utf-8")


# -------------------------------------------------------------------------- shared helpers


def _rng(seed: int, *keys: int | str) -> np.random.Generator:
    """A generator for one (seed, site, item) so items do not depend on each other's draws."""
    words = [seed] + [k if isinstance(k, int) else zlib.crc32(k.encode()) for k in keys]
    return np.random.default_rng(words)


def _class_sequence(n: int, positive_ratio: float, rng: np.random.Generator) -> list[bool]:
    """Exactly round(n * r / (1 + r)) positives (r = positive : negative), in random order."""
    n_pos = min(max(round(n * positive_ratio / (1.0 + positive_ratio)), 2), n - 2)
    labels = np.array([True] * n_pos + [False] * (n - n_pos))
    return [bool(v) for v in rng.permutation(labels)]


def _stratified_parts(
    labels: Sequence[bool], fractions: Sequence[float], rng: np.random.Generator
) -> list[int]:
    """Assign every item a part index so that each class is shared out by ``fractions``."""
    parts = [0] * len(labels)
    for cls in (True, False):
        members = [i for i, v in enumerate(labels) if v == cls]
        counts = _apportion(len(members), fractions)
        order = rng.permutation(members)
        start = 0
        for part, count in enumerate(counts):
            for i in order[start : start + count]:
                parts[int(i)] = part
            start += count
    return parts


def _apportion(n: int, fractions: Sequence[float]) -> list[int]:
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


def _write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _csv_text(rows: Sequence[Sequence[object]]) -> str:
    buffer = StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    return buffer.getvalue()


def _r(value: float) -> float:
    return round(float(value), 4)


# ---------------------------------------------------------------------------------- fundus


@dataclass(frozen=True)
class _Drawn:
    number: int  # 1-based, in drawing order
    glaucoma: bool
    anatomy: FundusAnatomy
    pixels: np.ndarray


def _scaled_camera(camera: Camera, scale: float) -> Camera:
    return replace(camera, height=round(camera.height * scale), width=round(camera.width * scale))


def _draw_fundus(
    site: FundusSite, labels: Sequence[bool], seed: int, scale: float
) -> Iterator[_Drawn]:
    camera = _scaled_camera(site.camera, scale)
    for i, glaucoma in enumerate(labels):
        rng = _rng(seed, "fundus", site.id, i)
        anatomy = sample_fundus_anatomy(rng, glaucoma, camera)
        yield _Drawn(i + 1, glaucoma, anatomy, render_fundus(rng, anatomy, camera))


def _encode(site: FundusSite, pixels: np.ndarray) -> bytes:
    buffer = BytesIO()
    image = Image.fromarray(pixels)
    if site.image_format == "PNG":
        image.save(buffer, format="PNG", compress_level=6)
    else:
        image.save(buffer, format="JPEG", quality=site.jpeg_quality)
    return buffer.getvalue()


def _class_name(glaucoma: bool) -> str:
    return "glaucoma" if glaucoma else "normal"


def _fundus_item(drawn: _Drawn, patient_id: str, files: list[str], **extra: Any) -> dict:
    a = drawn.anatomy
    return {
        "patient_id": patient_id,
        "label": _class_name(drawn.glaucoma),
        "files": files,
        "cdr": _r(a.cdr),
        "disc_radius": _r(a.disc_radius),
        "disc_center": [_r(a.disc_center[0]), _r(a.disc_center[1])],
        "cup_contrast": _r(a.cup_contrast),
        "eye": a.eye,
        **extra,
    }


def _write_fundus_site(
    out: Path, site: FundusSite, n: int, seed: int, scale: float
) -> dict[str, Any]:
    root = out / site.folder
    labels = _class_sequence(n, site.glaucoma_ratio, _rng(seed, "labels", site.id))
    writer = {"acrima": _write_acrima, "rimone": _write_rimone, "refuge": _write_refuge}
    drawn = _draw_fundus(site, labels, seed, scale)
    items = writer[site.layout](root, site, labels, drawn, _rng(seed, "splits", site.id))
    camera = _scaled_camera(site.camera, scale)
    return {
        "folder": site.folder,
        "manifest": f"{MANIFEST_DIR}/{site.id}.toml",
        "layout": site.layout,
        "class_counts": {"glaucoma": sum(labels), "normal": len(labels) - sum(labels)},
        "camera": asdict(camera),
        "items": items,
    }


def _write_acrima(
    root: Path,
    site: FundusSite,
    labels: Sequence[bool],
    drawn: Iterator[_Drawn],
    rng: np.random.Generator,
) -> list[dict]:
    root.mkdir(parents=True)
    items = []
    for d in drawn:
        name = f"Im{d.number:03d}{'_g' if d.glaucoma else ''}_ACRIMA.jpg"
        _write_bytes(root / name, _encode(site, d.pixels))
        items.append(_fundus_item(d, Path(name).stem, [name]))
    return items


def _write_rimone(
    root: Path,
    site: FundusSite,
    labels: Sequence[bool],
    drawn: Iterator[_Drawn],
    rng: np.random.Generator,
) -> list[dict]:
    """Both RIM-ONE DL partitions: the same images, split by hospital and split at random."""
    # Hospitals r1 and r2 form the training set of the hospital partition, r3 its test set.
    hospital_part = _stratified_parts(labels, (0.45, 0.25, 0.30), rng)
    random_part = _stratified_parts(labels, (0.70, 0.30), rng)
    split_folder = ("training_set", "test_set")
    items = []
    for d in drawn:
        i = d.number - 1
        hospital = hospital_part[i] + 1
        name = f"r{hospital}_Im{d.number:03d}.png"
        data = _encode(site, d.pixels)
        by_hospital = split_folder[int(hospital == 3)]
        by_random = split_folder[random_part[i]]
        files = [
            f"partitioned_by_hospital/{by_hospital}/{_class_name(d.glaucoma)}/{name}",
            f"partitioned_randomly/{by_random}/{_class_name(d.glaucoma)}/{name}",
        ]
        for rel in files:
            _write_bytes(root / rel, data)
        extra = {
            "hospital": f"r{hospital}",
            "split_by_hospital": by_hospital,
            "split_randomly": by_random,
        }
        items.append(_fundus_item(d, Path(name).stem, files, **extra))
    return items


@dataclass(frozen=True)
class _RefugeSet:
    folder: str
    fraction: float
    label_file: str | None  # None: labels are the class folders
    split: str


_REFUGE_SETS = (
    _RefugeSet("Training400", 0.6, None, "train"),
    _RefugeSet("Validation400", 0.2, "Validation400-GT/labels.xlsx", "val"),
    _RefugeSet("Test400", 0.2, "Test400-GT/labels.csv", "test"),
)
_REFUGE_COLUMNS = ("ImgName", "Fovea_X", "Fovea_Y", "Glaucoma Label")


def _write_refuge(
    root: Path,
    site: FundusSite,
    labels: Sequence[bool],
    drawn: Iterator[_Drawn],
    rng: np.random.Generator,
) -> list[dict]:
    """Training400 class folders; Validation400 labelled by an xlsx table, Test400 by a csv."""
    parts = _stratified_parts(labels, [s.fraction for s in _REFUGE_SETS], rng)
    counters: Counter[str] = Counter()
    tables: dict[str, list[list[object]]] = {
        s.folder: [list(_REFUGE_COLUMNS)] for s in _REFUGE_SETS
    }
    items = []
    for d in drawn:
        part = _REFUGE_SETS[parts[d.number - 1]]
        if part.label_file is None:
            prefix = "g" if d.glaucoma else "n"
            rel = f"{part.folder}/{'Glaucoma' if d.glaucoma else 'Non-Glaucoma'}"
        else:
            prefix, rel = part.folder[0], part.folder
        counters[prefix] += 1
        name = f"{prefix}{counters[prefix]:04d}.jpg"
        _write_bytes(root / rel / name, _encode(site, d.pixels))
        fovea = _fovea_pixels(d.anatomy, site.camera, d.pixels.shape)
        tables[part.folder].append([name, *fovea, int(d.glaucoma)])
        items.append(_fundus_item(d, Path(name).stem, [f"{rel}/{name}"], set=part.folder))
    for part in _REFUGE_SETS:
        if part.label_file is not None:
            rows = tables[part.folder]
            table = _xlsx(rows) if part.label_file.endswith(".xlsx") else _csv_text(rows).encode()
            _write_bytes(root / part.label_file, table)
    return items


def _fovea_pixels(anatomy: FundusAnatomy, camera: Camera, shape: tuple[int, ...]) -> list[float]:
    """Fovea position in image pixels (x, y), as the real label tables give it."""
    height, width = shape[0], shape[1]
    radius_px = camera.field_scale * min(height, width) / 2.0
    u, v = anatomy.macula_center
    x = width / 2.0 + u * radius_px
    if anatomy.eye == "OS":
        x = width - x
    return [round(x, 2), round(height / 2.0 + v * radius_px, 2)]


def _xlsx(rows: Sequence[Sequence[object]]) -> bytes:
    """An .xlsx workbook with one sheet, free of the save time openpyxl stamps into it."""
    from openpyxl import Workbook

    workbook = Workbook()
    sheet = workbook.active
    sheet.title = "Sheet1"
    for row in rows:
        sheet.append(list(row))
    raw = BytesIO()
    workbook.save(raw)
    fixed = BytesIO()
    with zipfile.ZipFile(raw) as src, zipfile.ZipFile(fixed, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename == "docProps/core.xml":
                data = _fix_core_times(data)
            entry = zipfile.ZipInfo(info.filename, date_time=_FIXED_ZIP_TIME)
            entry.compress_type = zipfile.ZIP_DEFLATED
            dst.writestr(entry, data)
    return fixed.getvalue()


def _fix_core_times(xml: bytes) -> bytes:
    pattern = rb"(<dcterms:(?:created|modified)[^>]*>)[^<]*(</dcterms:(?:created|modified)>)"
    return re.sub(pattern, rb"\g<1>" + _FIXED_ISO_TIME.encode() + rb"\g<2>", xml)


# -------------------------------------------------------------------------------------- CT


@dataclass(frozen=True)
class _Patient:
    patient_id: str
    lesion: bool
    body: BodyAnatomy
    hu: np.ndarray  # (slice, row, column), slice 0 lowest


def _draw_ct_patient(site: CTSite, i: int, lesion: bool, seed: int) -> _Patient:
    """One patient of one CT site; depends only on (seed, site, i), never on other patients."""
    rng = _rng(seed, "ct", site.id, i)
    n_slices = site.slices + int(rng.integers(-site.slices // 12, site.slices // 12 + 1))
    body = sample_body(rng, lesion, n_slices * site.scanner.slice_thickness)
    hu = render_ct(rng, body, site.scanner, n_slices)
    return _Patient(f"{site.patient_prefix}{i + 1:04d}", lesion, body, hu)


def _ct_labels(site: CTSite, n: int, seed: int) -> list[bool]:
    return _class_sequence(n, 1.0, _rng(seed, "labels", site.id))


def _write_ct_site(out: Path, site: CTSite, n: int, seed: int) -> dict[str, Any]:
    root = out / site.folder
    root.mkdir(parents=True)
    rows: list[list[object]] = [["patient_id", "label"]]
    items = []
    labels = _ct_labels(site, n, seed)
    n_lesion = sum(labels)
    for i, lesion in enumerate(labels):
        patient = _draw_ct_patient(site, i, lesion, seed)
        if site.layout == "dicom":
            files = _write_dicom_series(root, site, patient, seed, _rng(seed, "order", site.id, i))
        else:
            files = [_write_nifti(root, site, patient)]
        rows.append([patient.patient_id, "lesion" if lesion else "normal"])
        items.append(_ct_item(patient, site, files))
    _write_bytes(root / "labels.csv", _csv_text(rows).encode())
    return {
        "folder": site.folder,
        "manifest": f"{MANIFEST_DIR}/{site.id}.toml",
        "layout": site.layout,
        "class_counts": {"lesion": n_lesion, "normal": n - n_lesion},
        "scanner": asdict(site.scanner),
        "items": items,
    }


def _ct_item(patient: _Patient, site: CTSite, files: list[str]) -> dict[str, Any]:
    s = site.scanner
    lesion = patient.body.lesion
    return {
        "patient_id": patient.patient_id,
        "label": "lesion" if patient.lesion else "normal",
        "files": files,
        "shape": list(patient.hu.shape),
        "spacing": [s.slice_thickness, s.pixel_spacing, s.pixel_spacing],
        "liver_hu": _r(patient.body.liver_hu + s.hu_offset),
        "lesion": None
        if lesion is None
        else {
            "center_mm_zyx": [_r(c) for c in lesion.center],
            "radius_mm": _r(lesion.radius),
            "contrast_hu": _r(lesion.contrast_hu),
        },
    }


# DICOM patient coordinates are LPS+ (x to the patient's left, y to the back), NIfTI's RAS+:
# the change negates x and y (and is its own inverse).
_RAS_FROM_LPS = np.diag([-1.0, -1.0, 1.0, 1.0])
_TABLE_Z = -200.0  # table position (mm) of the bottom of every scan


def _phantom_lps_affine(s: Scanner) -> np.ndarray:
    """Where a drawn volume's voxels (column, row, slice) lie in LPS+ patient millimetres.

    ``render_ct`` draws columns towards the patient's left, rows towards the back and slice 0
    lowest, centred in-plane. Both CT writers take their geometry from here, so a patient's
    DICOM series and NIfTI file hold one anatomy and read back in one orientation.
    """
    half = (s.matrix - 1) / 2.0 * s.pixel_spacing
    return np.array(
        [
            [s.pixel_spacing, 0.0, 0.0, -half],
            [0.0, s.pixel_spacing, 0.0, -half],
            [0.0, 0.0, s.slice_thickness, 0.5 * s.slice_thickness + _TABLE_Z],
            [0.0, 0.0, 0.0, 1.0],
        ]
    )


def _stored_int16(hu: np.ndarray, intercept: float) -> np.ndarray:
    # Round in HU first, so that decoding gives back the rounded HU whatever the intercept.
    return np.clip(np.round(hu) - intercept, -32768, 32767).astype(np.int16)


def _write_dicom_series(
    root: Path, site: CTSite, patient: _Patient, seed: int, rng: np.random.Generator
) -> list[str]:
    """One CT series; file numbers are shuffled so that only positions give the slice order."""
    from pydicom.uid import generate_uid

    def uid(*parts: object) -> str:
        return generate_uid(entropy_srcs=[GENERATOR, str(seed), site.id, *map(str, parts)])

    series = {
        "study": uid(patient.patient_id, "study"),
        "series": uid(patient.patient_id, "series"),
        "frame": uid(patient.patient_id, "frame"),
    }
    folder = root / patient.patient_id / "series-1"
    folder.mkdir(parents=True)
    stored = _stored_int16(patient.hu, -1024.0)
    files = []
    for file_no, k in enumerate(rng.permutation(len(stored)).tolist(), start=1):
        name = f"IM_{file_no:04d}.dcm"
        uids = {**series, "sop": uid(patient.patient_id, "slice", k)}
        ds = _ct_slice(site.scanner, patient.patient_id, stored[k], k, file_no, uids)
        ds.save_as(folder / name, enforce_file_format=True)
        files.append(f"{patient.patient_id}/series-1/{name}")
    return sorted(files)


def _ct_slice(
    s: Scanner, patient_id: str, pixels: np.ndarray, k: int, instance: int, uids: dict[str, str]
) -> Any:
    """A CT Image Storage dataset for slice ``k`` (0 = lowest) of a series."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = CTImageStorage
    meta.MediaStorageSOPInstanceUID = uids["sop"]
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID, ds.SOPInstanceUID = CTImageStorage, uids["sop"]
    ds.StudyInstanceUID, ds.SeriesInstanceUID = uids["study"], uids["series"]
    ds.FrameOfReferenceUID = uids["frame"]
    ds.Modality, ds.Manufacturer = "CT", "medfed synthetic"
    ds.PatientID, ds.PatientName = patient_id, f"Synthetic^{patient_id}"
    ds.StudyDate = ds.SeriesDate = ds.ContentDate = _STUDY_DATE
    ds.StudyID, ds.SeriesNumber, ds.InstanceNumber = "1", 1, instance
    ds.ImageType = ["ORIGINAL", "PRIMARY", "AXIAL"]
    ds.ConvolutionKernel, ds.KVP = s.kernel_name, 120
    # The first pixel's centre in LPS+; rows run along +x and columns along +y, as the
    # phantom's affine says (its first two columns are +x and +y times the pixel spacing).
    position = _phantom_lps_affine(s) @ np.array([0.0, 0.0, k, 1.0])
    ds.ImagePositionPatient = [_r(v) for v in position[:3]]
    ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
    ds.SliceLocation = _r(position[2])
    ds.PixelSpacing = [s.pixel_spacing, s.pixel_spacing]
    ds.SliceThickness = s.slice_thickness
    ds.Rows, ds.Columns = pixels.shape
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 1
    ds.RescaleIntercept, ds.RescaleSlope, ds.RescaleType = -1024, 1, "HU"
    ds.WindowCenter, ds.WindowWidth = 40, 400
    ds.PixelData = np.ascontiguousarray(pixels, dtype="<i2").tobytes()
    return ds


def _write_nifti(root: Path, site: CTSite, patient: _Patient) -> str:
    """A gzipped NIfTI-1 file whose affine maps voxels to RAS millimetres.

    The affine is the one a DICOM-to-NIfTI conversion gives the same patient's DICOM series:
    voxels stored as drawn, LPS (columns to the patient's left, rows to the back).
    """
    import nibabel as nib

    affine = _RAS_FROM_LPS @ _phantom_lps_affine(site.scanner)
    data = _stored_int16(patient.hu, 0.0).transpose(2, 1, 0)  # NIfTI voxels: (i, j, k)
    image = nib.Nifti1Image(data, affine)
    image.header.set_xyzt_units("mm")
    image.header["descrip"] = b"medfed synthetic CT"
    image.set_qform(affine, code=1)
    image.set_sform(affine, code=1)
    name = f"{patient.patient_id}.nii.gz"
    # gzip.compress with mtime=0 keeps the bytes identical from run to run.
    _write_bytes(root / name, gzip.compress(image.to_bytes(), compresslevel=6, mtime=0))
    return name


# ------------------------------------------------------------------------------- manifests


def _fundus_manifest(site: FundusSite, seed: int, scale: float) -> dict[str, Any]:
    camera = _scaled_camera(site.camera, scale)
    fmt = "PNG" if site.image_format == "PNG" else f"JPEG quality {site.jpeg_quality}"
    data: dict[str, Any] = {
        "id": site.id,
        "modality": str(site.modality),
        "layout": site.layout,
        "root": f"../{site.folder}",
        "description": f"Synthetic glaucoma screening site, a stand-in for {site.stand_in_for}.",
        "source": f"generated by {GENERATOR} (seed {seed}); no real images",
        "acquisition": (
            f"simulated fundus camera: {camera.width}x{camera.height} px {fmt}; camera field "
            f"radius {camera.field_scale:.2f} of the half short side; optic disc "
            f"{site.camera.disc_offset:.2f} field radii from the centre"
        ),
        "known_shifts": _fundus_shifts(site, camera),
        "licence": LICENCE,
        "ethics": ETHICS,
        "labels": {"normal": 0, "glaucoma": 1},
        "preprocess": {"image_size": 64},
        "split": {"seed": seed},
    }
    if site.layout == "rimone":
        data["layout_options"] = {"partition": "partitioned_by_hospital"}
    if site.layout == "refuge":
        data["layout_options"] = {"label_files": _refuge_label_files()}
    return data


def _refuge_label_files() -> list[dict[str, str]]:
    return [
        {
            "images": s.folder,
            "file": s.label_file,
            "image_column": _REFUGE_COLUMNS[0],
            "label_column": _REFUGE_COLUMNS[-1],
            "split": s.split,
        }
        for s in _REFUGE_SETS
        if s.label_file is not None
    ]


def _fundus_shifts(site: FundusSite, camera: Camera) -> str:
    gains = "/".join(f"{g:.2f}" for g in camera.cast)
    blur = f"{100 * camera.blur:.1f}% blur" if camera.blur > 0 else "no blur"
    return (
        f"simulated camera: {site.cast_name} (RGB gains {gains}), gamma {camera.gamma:.2f}, "
        f"saturation {camera.saturation:.2f}, {blur}, sensor noise {100 * camera.noise:.1f}%, "
        f"{camera.width}x{camera.height} px, optic disc scale {camera.disc_scale:.2f}; "
        f"label shift: glaucoma:normal about {site.glaucoma_ratio:.2f}; "
        "glaucoma differs from normal only by a larger cup-to-disc ratio (classes overlap)"
    )


def _ct_manifest(site: CTSite, seed: int) -> dict[str, Any]:
    s = site.scanner
    files = "one DICOM series per patient" if site.layout == "dicom" else "one .nii.gz per patient"
    return {
        "id": site.id,
        "modality": str(site.modality),
        "layout": site.layout,
        "root": f"../{site.folder}",
        "description": (
            "Synthetic abdominal CT phantoms: body, fat, lungs, spine and liver; 'lesion' "
            f"patients have a hypodense sphere in the liver. {files}, labels in labels.csv."
        ),
        "source": f"generated by {GENERATOR} (seed {seed}); no real scans",
        "acquisition": (
            f"simulated scanner: {s.matrix}x{s.matrix} matrix, {s.pixel_spacing} mm pixels, "
            f"{s.slice_thickness} mm slices (about {site.slices}), kernel {s.kernel_name}"
        ),
        "known_shifts": (
            f"simulated scanner: HU offset {s.hu_offset:+.0f}, noise {s.noise_hu:.0f} HU, "
            f"slice thickness {s.slice_thickness} mm, pixel spacing {s.pixel_spacing} mm, "
            f"kernel blur sigma {s.kernel_sigma} px; {_lesions_text()}"
        ),
        "licence": LICENCE,
        "ethics": ETHICS,
        "labels": {"normal": 0, "lesion": 1},
        "preprocess": {
            "hu_window": list(CT_LIVER_WINDOW),
            "spacing": [4.0, 4.0, 4.0],
            "shape": [16, 48, 48],
        },
        "split": {"seed": seed},
    }


def _lesions_text() -> str:
    def span(pair: tuple[float, float], scale: float = 1.0) -> str:
        return f"{pair[0] * scale:g}-{pair[1] * scale:g}"

    return (
        f"lesions {span(LESION_CONTRAST_HU)} HU below the liver, {span(LESION_RADIUS_MM, 2)} mm "
        f"across; {FAINT_FRACTION:.0%} small and faint ({span(FAINT_CONTRAST_HU)} HU, "
        f"{span(FAINT_RADIUS_MM, 2)} mm), mostly missed on a 4 mm grid"
    )


def _write_manifest(out: Path, site_id: str, data: dict[str, Any]) -> Path:
    path = out / MANIFEST_DIR / f"{site_id}.toml"
    header = f"# Synthetic site written by {GENERATOR}; regenerate it rather than edit it.\n"
    path.write_text(header + tomli_w.dumps(data), encoding="utf-8")
    return path
