"""Synthetic glaucoma screening sites: fundus photographs in the ACRIMA, RIM-ONE DL and REFUGE
layouts, each site with its own camera and its own share of glaucoma.

By default the three hand-made sites of :data:`FUNDUS_SITES` (an eye's class is drawn first,
its cup-to-disc ratio from the class, so the classes overlap). :class:`GlaucomaShift` plans
another federation instead: any number of sites, how far their cameras differ (covariate
shift), Dirichlet-drawn glaucoma shares (label shift), and each site's own labelling rule: a
site records glaucoma when an eye's vertical cup-to-disc ratio reaches its threshold, 0.6
everywhere, or 0.7 at the second site under concept shift.
"""

from __future__ import annotations

import re
import zipfile
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from io import BytesIO
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from scipy.stats import truncnorm

from medfed.core.manifest import Modality
from medfed.data._phantoms import (
    CDR_RANGE,
    Camera,
    FundusAnatomy,
    render_fundus,
    sample_fundus_anatomy,
)
from medfed.data.synth_common import (
    COVARIATE_STRENGTHS,
    MAX_SITES,
    NEUTRAL_CAMERA,
    camera_with_strength,
    check_shift,
    class_sequence,
    csv_text,
    encode_image,
    jitter_camera,
    numbered,
    rounded,
    scaled_camera,
    seeded_rng,
    site_manifest,
    site_truth,
    stratified_parts,
    towards,
    write_bytes,
)

# Fixed moment for formats that insist on one (xlsx document properties, zip entries).
_FIXED_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
_FIXED_ISO_TIME = "2000-01-01T00:00:00Z"


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
    # The vertical cup-to-disc ratio from which the site records glaucoma; None: the eye's
    # class is drawn first and its ratio from the class (the default sites; classes overlap).
    cdr_rule: float | None = None
    modality: ClassVar[Modality] = Modality.FUNDUS

    def write(self, out: Path, n: int, seed: int, scale: float) -> dict[str, Any]:
        """Write the site's images and label tables; return its ground truth."""
        return _write_fundus_site(out, self, n, seed, scale)

    def manifest(self, seed: int, scale: float) -> dict[str, Any]:
        """The site's manifest, as a table for ``sites/<id>.toml``."""
        return _fundus_manifest(self, seed, scale)


# The hand-made sites' cameras: Camera's fields in order (height, width, field_scale,
# disc_scale, disc_offset, cast, gamma, saturation, blur, noise), as NEUTRAL_CAMERA gives them.
_CAMERAS = {
    "acrima": Camera(224, 224, 1.0, 1.35, 0.22, (1.08, 0.95, 0.80), 1.0, 1.1, 0.0, 0.01),
    "rimone": Camera(192, 192, 1.12, 1.6, 0.12, (0.92, 1.04, 1.06), 1.3, 0.85, 0.008, 0.02),
    "refuge": Camera(160, 213, 0.95, 1.1, 0.42, (1.0, 0.9, 0.95), 0.85, 1.25, 0.004, 0.015),
}
FUNDUS_SITES: tuple[FundusSite, ...] = (
    FundusSite(
        id="acrima",
        folder="ACRIMA",
        layout="acrima",
        camera=_CAMERAS["acrima"],
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
        camera=_CAMERAS["rimone"],
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
        camera=_CAMERAS["refuge"],
        cast_name="magenta-red colour cast",
        glaucoma_ratio=0.46,
        image_format="JPEG",
        jpeg_quality=88,
        stand_in_for="REFUGE (macula-centred, Training400 folders, label tables for val/test)",
    ),
)


# ------------------------------------------------------------------------- shift settings

# The threshold every planned site records glaucoma from, and the second site's under concept
# shift (vertical cup-to-disc ratio).
CDR_RULE = 0.6
CONCEPT_CDR_RULE = 0.7
# The eyes a planned site sees: one population of vertical cup-to-disc ratios (mean, sd),
# each eye drawn on the side of the site's threshold its recorded label puts it.
CDR_POPULATION = (0.5, 0.12)
# The glaucoma share Beta label shift draws each site's share around, and the shares kept.
POOLED_PREVALENCE = 0.5
PREVALENCE_RANGE = (0.1, 0.9)
# The camera every planned site's camera departs from: the neutral one with a larger optic disc,
# nearer the centre; covariate strength scales departures.
_NEUTRAL = replace(NEUTRAL_CAMERA, disc_scale=1.35, disc_offset=0.25)


@dataclass(frozen=True)
class GlaucomaShift:
    """How the sites of a planned synthetic glaucoma federation differ.

    ``n_sites``: 3 to 32; sites cycle through the ACRIMA, RIM-ONE DL and REFUGE sites' layouts
    and cameras (a further site of a layout gets another camera of its kind).
    ``covariate``: "low", "mid" or "high": how far each camera departs from a neutral one
    (colour cast, gamma, saturation, blur, noise, field, disc size and position; "mid" keeps
    the hand-made cameras).
    ``label_alpha``: when set, each site's glaucoma share is drawn from
    Beta(alpha * p, alpha * (1 - p)) around p = 0.5 (the two-class Dirichlet) and kept within
    0.1-0.9: small alpha, strong label shift; else each layout's hand-made share.
    ``concept``: the second site records glaucoma from a vertical cup-to-disc ratio of 0.7,
    the others from 0.6 (without it every site uses 0.6).
    """

    n_sites: int = 3
    covariate: str = "mid"
    label_alpha: float | None = None
    concept: bool = False

    def check(self) -> None:
        """Raise SynthesisError naming the setting that cannot be honoured."""
        check_shift(self.n_sites, self.covariate, self.label_alpha)

    def to_dict(self) -> dict[str, Any]:
        """The settings, for synth_meta.json."""
        return asdict(self)


def plan_sites(shift: GlaucomaShift, seed: int) -> list[FundusSite]:
    """The sites ``shift`` asks for, each with its camera, glaucoma share and CDR rule."""
    strength = COVARIATE_STRENGTHS[shift.covariate]
    cycle = len(FUNDUS_SITES)
    sites = []
    for k in range(shift.n_sites):
        base = FUNDUS_SITES[k % cycle]
        camera = base.camera
        if k >= cycle:  # a further site of a layout: another camera of its kind
            camera = jitter_camera(camera, seeded_rng(seed, "glaucoma-camera", k))
        ratio = base.glaucoma_ratio
        if shift.label_alpha is not None:
            share = _drawn_share(shift.label_alpha, seeded_rng(seed, "glaucoma-share", k))
            ratio = round(share / (1.0 - share), 4)
        site = replace(
            base,
            id=numbered(base.id, k, cycle),
            folder=numbered(base.folder, k, cycle),
            camera=_framed(camera_with_strength(camera, _NEUTRAL, strength), strength),
            glaucoma_ratio=ratio,
            cdr_rule=CONCEPT_CDR_RULE if shift.concept and k == 1 else CDR_RULE,
        )
        sites.append(site)
    return sites


def _drawn_share(alpha: float, rng: np.random.Generator) -> float:
    share = rng.beta(alpha * POOLED_PREVALENCE, alpha * (1.0 - POOLED_PREVALENCE))
    return float(np.clip(share, *PREVALENCE_RANGE))


def _framed(camera: Camera, strength: float) -> Camera:
    """The disc's size and position departures from the neutral camera's scaled too."""
    n = _NEUTRAL
    return replace(
        camera,
        disc_scale=towards(camera.disc_scale, n.disc_scale, 0.8, strength),
        disc_offset=towards(camera.disc_offset, n.disc_offset, 0.0, strength),
    )


FOLDERS = tuple(numbered(FUNDUS_SITES[k % 3].folder, k, 3) for k in range(MAX_SITES))


def manifest_names() -> list[str]:
    """Every manifest file name a planned glaucoma federation may hold."""
    return [f"{numbered(FUNDUS_SITES[k % 3].id, k, 3)}.toml" for k in range(MAX_SITES)]


# ---------------------------------------------------------------------------------- fundus


@dataclass(frozen=True)
class _Drawn:
    number: int  # 1-based, in drawing order
    glaucoma: bool
    anatomy: FundusAnatomy
    pixels: np.ndarray


def _draw_fundus(
    site: FundusSite, labels: Sequence[bool], seed: int, scale: float
) -> Iterator[_Drawn]:
    camera = scaled_camera(site.camera, scale)
    for i, glaucoma in enumerate(labels):
        rng = seeded_rng(seed, "fundus", site.id, i)
        anatomy = sample_fundus_anatomy(rng, glaucoma, camera)
        if site.cdr_rule is not None:
            anatomy = replace(anatomy, cdr=_ruled_cdr(rng, glaucoma, site.cdr_rule))
        yield _Drawn(i + 1, glaucoma, anatomy, render_fundus(rng, anatomy, camera))


def _ruled_cdr(rng: np.random.Generator, glaucoma: bool, rule: float) -> float:
    """A population eye's vertical cup-to-disc ratio on the side of ``rule`` its label puts it
    (at or above for glaucoma), rounded as the ground-truth file writes it."""
    mean, sd = CDR_POPULATION
    low, high = (rule, CDR_RANGE[1]) if glaucoma else (CDR_RANGE[0], rule)
    a, b = (low - mean) / sd, (high - mean) / sd
    cdr = round(float(truncnorm.rvs(a, b, loc=mean, scale=sd, random_state=rng)), 4)
    return cdr if glaucoma else min(cdr, round(rule - 1e-4, 4))


def _encode(site: FundusSite, pixels: np.ndarray) -> bytes:
    return encode_image(pixels, site.image_format, site.jpeg_quality)


def _class_name(glaucoma: bool) -> str:
    return "glaucoma" if glaucoma else "normal"


def _fundus_item(drawn: _Drawn, patient_id: str, files: list[str], **extra: Any) -> dict:
    a = drawn.anatomy
    return {
        "patient_id": patient_id,
        "label": _class_name(drawn.glaucoma),
        "files": files,
        "cdr": rounded(a.cdr),
        "disc_radius": rounded(a.disc_radius),
        "disc_center": [rounded(a.disc_center[0]), rounded(a.disc_center[1])],
        "cup_contrast": rounded(a.cup_contrast),
        "eye": a.eye,
        **extra,
    }


def _write_fundus_site(
    out: Path, site: FundusSite, n: int, seed: int, scale: float
) -> dict[str, Any]:
    root = out / site.folder
    labels = class_sequence(n, site.glaucoma_ratio, seeded_rng(seed, "labels", site.id))
    writer = {"acrima": _write_acrima, "rimone": _write_rimone, "refuge": _write_refuge}
    drawn = _draw_fundus(site, labels, seed, scale)
    items = writer[site.layout](root, site, labels, drawn, seeded_rng(seed, "splits", site.id))
    camera = scaled_camera(site.camera, scale)
    return site_truth(
        site,
        class_counts={"glaucoma": sum(labels), "normal": len(labels) - sum(labels)},
        camera=asdict(camera),
        items=items,
    ) | ({} if site.cdr_rule is None else {"cdr_rule": site.cdr_rule})


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
        write_bytes(root / name, _encode(site, d.pixels))
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
    hospital_part = stratified_parts(labels, (0.45, 0.25, 0.30), rng)
    random_part = stratified_parts(labels, (0.70, 0.30), rng)
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
            write_bytes(root / rel, data)
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
# REFUGE ships a disc/cup mask per photo; here a disc mask per photo, under this folder with the
# photo's own folder below it (the layout finds each by the photo's stem).
DISC_MASKS = "Disc_Cup_Masks"


def _write_refuge(
    root: Path,
    site: FundusSite,
    labels: Sequence[bool],
    drawn: Iterator[_Drawn],
    rng: np.random.Generator,
) -> list[dict]:
    """Training400 class folders; Validation400 labelled by an xlsx table, Test400 by a csv."""
    parts = stratified_parts(labels, [s.fraction for s in _REFUGE_SETS], rng)
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
        write_bytes(root / rel / name, _encode(site, d.pixels))
        mask = _disc_mask(d.anatomy, site.camera, d.pixels.shape)
        write_bytes(
            root / DISC_MASKS / rel / f"{Path(name).stem}.png", encode_image(mask, "PNG", 0)
        )
        fovea = _fovea_pixels(d.anatomy, site.camera, d.pixels.shape)
        tables[part.folder].append([name, *fovea, int(d.glaucoma)])
        items.append(_fundus_item(d, Path(name).stem, [f"{rel}/{name}"], set=part.folder))
    for part in _REFUGE_SETS:
        if part.label_file is not None:
            rows = tables[part.folder]
            table = _xlsx(rows) if part.label_file.endswith(".xlsx") else csv_text(rows).encode()
            write_bytes(root / part.label_file, table)
    return items


def _disc_pixels(anatomy: FundusAnatomy, camera: Camera, shape: tuple[int, ...]) -> list[float]:
    """Optic disc centre in image pixels (x, y), where the drawn disc lies."""
    return _field_pixels(anatomy.disc_center, anatomy.eye, camera, shape)


def _disc_mask(anatomy: FundusAnatomy, camera: Camera, shape: tuple[int, ...]) -> np.ndarray:
    """A REFUGE-style disc mask of the photo: 255 outside the disc, 128 on it (a circle of the
    disc's radius around its centre), one grey byte per pixel."""
    height, width = shape[0], shape[1]
    x, y = _disc_pixels(anatomy, camera, shape)
    radius = anatomy.disc_radius * camera.field_scale * min(height, width) / 2.0
    rows, cols = np.ogrid[:height, :width]
    inside = (cols + 0.5 - x) ** 2 + (rows + 0.5 - y) ** 2 <= max(radius, 1.0) ** 2
    return np.where(inside, 128, 255).astype(np.uint8)


def _field_pixels(
    uv: tuple[float, float], eye: str, camera: Camera, shape: tuple[int, ...]
) -> list[float]:
    """A point of the camera field (u, v, field radii from its centre) in image pixels."""
    height, width = shape[0], shape[1]
    radius_px = camera.field_scale * min(height, width) / 2.0
    u, v = uv
    x = width / 2.0 + u * radius_px
    if eye == "OS":
        x = width - x
    return [round(x, 2), round(height / 2.0 + v * radius_px, 2)]


def _fovea_pixels(anatomy: FundusAnatomy, camera: Camera, shape: tuple[int, ...]) -> list[float]:
    """Fovea position in image pixels (x, y), as the real label tables give it."""
    return _field_pixels(anatomy.macula_center, anatomy.eye, camera, shape)


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


# ------------------------------------------------------------------------------- manifests


def _fundus_manifest(site: FundusSite, seed: int, scale: float) -> dict[str, Any]:
    camera = scaled_camera(site.camera, scale)
    fmt = "PNG" if site.image_format == "PNG" else f"JPEG quality {site.jpeg_quality}"
    data = site_manifest(
        site,
        seed,
        description=f"Synthetic glaucoma screening site, a stand-in for {site.stand_in_for}.",
        scans="images",
        acquisition=(
            f"simulated fundus camera: {camera.width}x{camera.height} px {fmt}; camera field "
            f"radius {camera.field_scale:.2f} of the half short side; optic disc "
            f"{site.camera.disc_offset:.2f} field radii from the centre"
        ),
        known_shifts=_fundus_shifts(site, camera),
        labels={"normal": 0, "glaucoma": 1},
        preprocess={"image_size": 64},
    )
    if site.layout == "rimone":
        data["layout_options"] = {"partition": "partitioned_by_hospital"}
    if site.layout == "refuge":
        data["layout_options"] = {"label_files": _refuge_label_files(), "disc_masks": DISC_MASKS}
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
        f"label shift: glaucoma:normal about {site.glaucoma_ratio:.2f}; " + _rule_text(site)
    )


def _rule_text(site: FundusSite) -> str:
    if site.cdr_rule is None:
        return "glaucoma differs from normal only by a larger cup-to-disc ratio (classes overlap)"
    return (
        f"label rule: this site records glaucoma when the vertical cup-to-disc ratio is at "
        f"least {site.cdr_rule:.2f}"
        + ("" if site.cdr_rule == CDR_RULE else f" (other sites: {CDR_RULE:.2f}; concept shift)")
    )
