"""Synthetic diabetic-retinopathy grading sites (ICDR grades 0-4) in the APTOS, EyePACS and
IDRiD layouts.

Lesions follow the grade (``medfed.data._phantoms.sample_retinopathy``): microaneurysms from
grade 1, haemorrhages and hard exudates from 2, cotton-wool spots from 3, new vessels at 4.
Sites differ as DR programmes do: screening sites see mostly grades 0-1, referral clinics
mostly 2-4 (label shift; a small site may never see some grades), and each has its own camera
(covariate shift). :class:`DRShift` sets the number of sites and how strong each shift is,
and may give one site another grading rule (concept shift).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from medfed.core.manifest import Modality
from medfed.data._phantoms import (
    Camera,
    Retinopathy,
    render_fundus,
    sample_fundus_anatomy,
    sample_retinopathy,
)
from medfed.data.grading import ICDR_GRADES, ICDR_LABELS, REFERABLE_FROM
from medfed.data.synth_common import (
    COVARIATE_STRENGTHS,
    MAX_SITES,
    NEUTRAL_CAMERA,
    SynthesisError,
    camera_with_strength,
    check_shift,
    csv_text,
    encode_image,
    jitter_camera,
    numbered,
    scaled_camera,
    seeded_rng,
    site_manifest,
    site_truth,
    stratified_parts,
    write_bytes,
)

MIN_N_PER_SITE = 20
LAYOUT_FOLDERS = {"aptos": "APTOS", "eyepacs": "EYEPACS", "idrid": "IDRID"}
LAYOUT_CYCLE = ("aptos", "eyepacs", "idrid")

# Grade mixes (grades 0-4) of the two kinds of DR programme. Screening is close to EyePACS's
# published mix; the referral clinic sees mostly referable eyes.
ROLE_MIXES = {
    "screening": (0.62, 0.22, 0.10, 0.035, 0.025),
    "referral": (0.06, 0.06, 0.38, 0.28, 0.22),
}
# The programme-wide mix that Dirichlet label shift draws each site's mix around (APTOS 2019's).
POOLED_MIX = (0.49, 0.10, 0.27, 0.05, 0.09)

# Each layout's camera (macula-centred 45-degree photos), a departure from the neutral one:
# Camera's fields in order, as NEUTRAL_CAMERA gives them.
_BASE_CAMERAS = {
    "aptos": Camera(224, 224, 1.0, 1.0, 0.40, (1.1, 0.94, 0.78), 0.9, 1.15, 0.003, 0.012),
    "eyepacs": Camera(176, 208, 1.08, 1.0, 0.40, (0.94, 1.02, 1.05), 1.25, 0.85, 0.008, 0.022),
    "idrid": Camera(160, 240, 0.94, 1.0, 0.45, (1.02, 0.88, 0.92), 1.05, 1.3, 0.001, 0.008),
}


@dataclass(frozen=True)
class DRShift:
    """How the sites of a synthetic DR federation differ.

    ``n_sites``: 3 to 32; sites cycle through the APTOS, EyePACS and IDRiD layouts, every
    third one a referral clinic, the others screening sites.
    ``covariate``: "low", "mid" or "high": how far each site's camera departs from a neutral
    one (colour cast, gamma, saturation, blur, noise, framing).
    ``label_alpha``: when set, each site's grade mix is drawn from Dirichlet(alpha * p) around
    the programme-wide mix p (Hsu et al. 2019): small alpha, strong label shift; else the
    screening / referral mixes.
    ``classes_per_site``: when set, each site sees only its this many most frequent grades.
    ``concept``: the second site grades by another rule: it calls an eye referable from grade
    3, so it records moderate (2) eyes as mild (1).
    """

    n_sites: int = 3
    covariate: str = "mid"
    label_alpha: float | None = None
    classes_per_site: int | None = None
    concept: bool = False

    def check(self) -> None:
        """Raise SynthesisError naming the setting that cannot be honoured."""
        check_shift(self.n_sites, self.covariate, self.label_alpha)
        k = self.classes_per_site
        if k is not None and (not isinstance(k, int) or not 2 <= k <= len(ICDR_GRADES)):
            raise SynthesisError(
                f"classes_per_site must be a whole number from 2 to {len(ICDR_GRADES)}, got {k!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        """The settings, for synth_meta.json."""
        return asdict(self)


@dataclass(frozen=True)
class DRSite:
    """A synthetic DR programme site: its layout, camera, grade mix and grading rule."""

    id: str
    folder: str
    layout: str
    role: str  # "screening", "referral", or "Dirichlet-mix" (label_alpha set)
    camera: Camera
    mix: tuple[float, ...]  # share of each grade 0-4
    referable_from: int  # the grade from which this site calls DR referable
    image_format: str
    jpeg_quality: int
    modality: ClassVar[Modality] = Modality.FUNDUS

    def write(self, out: Path, n: int, seed: int, scale: float) -> dict[str, Any]:
        """Write the site's images and grading table; return its ground truth."""
        return _write_site(out, self, n, seed, scale)

    def manifest(self, seed: int, scale: float) -> dict[str, Any]:
        """The site's manifest, as a table for ``sites/<id>.toml``."""
        return _manifest(self, seed, scale)


def site_id(k: int) -> str:
    """The id of the k-th site (0-based): aptos, eyepacs, idrid, aptos_2, eyepacs_2, ..."""
    return numbered(LAYOUT_CYCLE[k % len(LAYOUT_CYCLE)], k, len(LAYOUT_CYCLE))


def _folder(k: int) -> str:
    return numbered(LAYOUT_FOLDERS[LAYOUT_CYCLE[k % len(LAYOUT_CYCLE)]], k, len(LAYOUT_CYCLE))


FOLDERS = tuple(_folder(k) for k in range(MAX_SITES))


def manifest_names() -> list[str]:
    """Every manifest file name a DR federation may hold."""
    return [f"{site_id(k)}.toml" for k in range(MAX_SITES)]


def plan_sites(shift: DRShift, seed: int) -> list[DRSite]:
    """The sites ``shift`` asks for, each with its camera, grade mix and grading rule."""
    strength = COVARIATE_STRENGTHS[shift.covariate]
    sites = []
    for k in range(shift.n_sites):
        layout = LAYOUT_CYCLE[k % len(LAYOUT_CYCLE)]
        role = "referral" if k % 3 == 2 else "screening"
        if shift.label_alpha is not None:
            role = "Dirichlet-mix"  # its grade mix is drawn, whatever kind of site it is
        camera = _BASE_CAMERAS[layout]
        if k >= len(LAYOUT_CYCLE):  # a further site of a layout: another camera of its kind
            camera = jitter_camera(camera, seeded_rng(seed, "dr-camera", k))
        mix = _grade_mix(shift, role, seeded_rng(seed, "dr-mix", k))
        sites.append(
            DRSite(
                id=site_id(k),
                folder=_folder(k),
                layout=layout,
                role=role,
                camera=camera_with_strength(camera, NEUTRAL_CAMERA, strength),
                mix=mix,
                referable_from=REFERABLE_FROM + 1 if shift.concept and k == 1 else REFERABLE_FROM,
                image_format="PNG" if layout == "aptos" else "JPEG",
                jpeg_quality=0 if layout == "aptos" else (90 if layout == "eyepacs" else 95),
            )
        )
    return sites


def _grade_mix(shift: DRShift, role: str, rng: np.random.Generator) -> tuple[float, ...]:
    if shift.label_alpha is not None:
        mix = rng.dirichlet(shift.label_alpha * np.asarray(POOLED_MIX))
    else:
        mix = np.asarray(ROLE_MIXES[role], dtype=np.float64)
    if shift.classes_per_site is not None:
        keep = np.argsort(-mix, kind="stable")[: shift.classes_per_site]
        mix = np.where(np.isin(np.arange(mix.size), keep), mix, 0.0)
        mix = np.maximum(mix, np.where(mix > 0, 1e-3, 0.0))  # a kept grade keeps a share
    return tuple(round(float(v), 4) for v in mix / mix.sum())


# ----------------------------------------------------------------------------- the images


def grade_counts(n: int, mix: Sequence[float]) -> list[int]:
    """Eyes per grade: n shared out by ``mix`` (largest remainder); a grade of share 0 gets none."""
    exact = [n * f for f in mix]
    counts = [int(e) for e in exact]
    order = sorted(range(len(exact)), key=lambda k: counts[k] - exact[k])
    for k in order[: n - sum(counts)]:
        counts[k] += 1
    return counts


def _grade_sequence(site: DRSite, n: int, seed: int) -> list[int]:
    counts = grade_counts(n, site.mix)
    grades = np.repeat(np.arange(len(counts)), counts)
    return [int(g) for g in seeded_rng(seed, "dr-labels", site.id).permutation(grades)]


def recorded_grade(site: DRSite, grade: int) -> int:
    """The grade the site writes down: a site that calls DR referable only from grade 3
    records moderate eyes (2) as mild (1)."""
    if site.referable_from > REFERABLE_FROM and REFERABLE_FROM <= grade < site.referable_from:
        return REFERABLE_FROM - 1
    return grade


@dataclass(frozen=True)
class _Eye:
    number: int  # 0-based, in drawing order
    grade: int  # the eye's true grade (its lesions)
    label: int  # the grade the site recorded
    retinopathy: Retinopathy
    eye: str
    pixels: np.ndarray


def _draw(site: DRSite, grades: Sequence[int], seed: int, scale: float) -> list[_Eye]:
    camera = scaled_camera(site.camera, scale)
    eyes = []
    for i, grade in enumerate(grades):
        rng = seeded_rng(seed, "dr", site.id, i)
        anatomy = sample_fundus_anatomy(rng, False, camera)
        lesions = sample_retinopathy(rng, grade, anatomy)
        pixels = render_fundus(rng, anatomy, camera, lesions)
        label = recorded_grade(site, grade)
        eyes.append(_Eye(i, grade, label, lesions, anatomy.eye, pixels))
    return eyes


def _encode(site: DRSite, pixels: np.ndarray) -> bytes:
    return encode_image(pixels, site.image_format, site.jpeg_quality)


def _item(eye: _Eye, patient_id: str, files: list[str], **extra: Any) -> dict[str, Any]:
    return {
        "patient_id": patient_id,
        "grade": eye.grade,
        "label": ICDR_GRADES[eye.label],
        "files": files,
        "lesions": eye.retinopathy.counts(),
        "eye": eye.eye,
        **extra,
    }


def _write_site(out: Path, site: DRSite, n: int, seed: int, scale: float) -> dict[str, Any]:
    grades = _grade_sequence(site, n, seed)
    eyes = _draw(site, grades, seed, scale)
    writer = {"aptos": _write_aptos, "eyepacs": _write_eyepacs, "idrid": _write_idrid}
    items = writer[site.layout](out / site.folder, site, eyes, seed)
    recorded = [e.label for e in eyes]
    return site_truth(
        site,
        role=site.role,
        grade_mix=list(site.mix),
        referable_from=site.referable_from,
        class_counts={name: recorded.count(g) for g, name in enumerate(ICDR_GRADES)},
        true_grade_counts={name: grades.count(g) for g, name in enumerate(ICDR_GRADES)},
        camera=asdict(scaled_camera(site.camera, scale)),
        items=items,
    )


def _write_aptos(root: Path, site: DRSite, eyes: list[_Eye], seed: int) -> list[dict]:
    """``train_images/<id_code>.png`` and ``train.csv`` (id_code, diagnosis)."""
    rows: list[list[object]] = [["id_code", "diagnosis"]]
    items = []
    for eye in eyes:
        code = seeded_rng(seed, "aptos-id", site.id, eye.number).bytes(6).hex()
        write_bytes(root / "train_images" / f"{code}.png", _encode(site, eye.pixels))
        rows.append([code, eye.label])
        items.append(_item(eye, code, [f"train_images/{code}.png"]))
    write_bytes(root / "train.csv", csv_text(rows).encode())
    return items


def _write_eyepacs(root: Path, site: DRSite, eyes: list[_Eye], seed: int) -> list[dict]:
    """``train/<patient>_<left|right>.jpeg`` and ``trainLabels.csv`` (image, level).

    Two eyes per patient, paired by grade so that a patient's eyes are alike, as they are.
    """
    order = sorted(eyes, key=lambda e: (e.grade, e.number))
    patients = seeded_rng(seed, "eyepacs-patients", site.id).permutation((len(order) + 1) // 2)
    rows: list[list[object]] = [["image", "level"]]
    items = []
    for k, eye in enumerate(order):
        patient = str(10 + 3 * int(patients[k // 2]))
        name = f"{patient}_{'left' if k % 2 == 0 else 'right'}"
        write_bytes(root / "train" / f"{name}.jpeg", _encode(site, eye.pixels))
        rows.append([name, eye.label])
        items.append(_item(eye, patient, [f"train/{name}.jpeg"]))
    header, body = rows[0], sorted(rows[1:], key=lambda r: (int(str(r[0]).split("_")[0]), r[0]))
    write_bytes(root / "trainLabels.csv", csv_text([header, *body]).encode())
    return items


_IDRID_BASE = "B. Disease Grading"
_IDRID_SETS = (
    ("a. Training Set", "a. IDRiD_Disease Grading_Training Labels.csv"),
    ("b. Testing Set", "b. IDRiD_Disease Grading_Testing Labels.csv"),
)


def _write_idrid(root: Path, site: DRSite, eyes: list[_Eye], seed: int) -> list[dict]:
    """IDRiD's grading part: training and testing images, one ground-truth CSV for each."""
    parts = stratified_parts(
        [e.label for e in eyes], (0.8, 0.2), seeded_rng(seed, "idrid", site.id)
    )
    tables: list[list[list[object]]] = [
        [["Image name", "Retinopathy grade", "Risk of macular edema "]] for _ in _IDRID_SETS
    ]
    counters = [0, 0]
    items = []
    for eye in eyes:
        part = parts[eye.number]
        counters[part] += 1
        name = f"IDRiD_{counters[part]:03d}"
        rel = f"{_IDRID_BASE}/1. Original Images/{_IDRID_SETS[part][0]}/{name}.jpg"
        write_bytes(root / rel, _encode(site, eye.pixels))
        tables[part].append([name, eye.label, _edema_risk(eye.retinopathy)])
        items.append(_item(eye, f"{'ab'[part]}-{name}", [rel], set=_IDRID_SETS[part][0]))
    for (_, table), rows in zip(_IDRID_SETS, tables, strict=True):
        write_bytes(root / _IDRID_BASE / "2. Groundtruths" / table, csv_text(rows).encode())
    return items


def _edema_risk(retinopathy: Retinopathy) -> int:
    """IDRiD's macular-oedema risk (0-2) from the hard exudates drawn."""
    exudates = retinopathy.counts().get("hard_exudate", 0)
    return 0 if exudates == 0 else (1 if exudates < 6 else 2)


# ------------------------------------------------------------------------------ manifests


def _manifest(site: DRSite, seed: int, scale: float) -> dict[str, Any]:
    camera = scaled_camera(site.camera, scale)
    mix = ", ".join(f"{g}: {100 * share:.0f}%" for g, share in enumerate(site.mix))
    rule = (
        "grades referable DR from grade 2 (ICDR)"
        if site.referable_from == REFERABLE_FROM
        else f"grades referable DR from grade {site.referable_from}: moderate eyes recorded as mild"
    )
    gains = "/".join(f"{g:.2f}" for g in camera.cast)
    return site_manifest(
        site,
        seed,
        description=(
            f"Synthetic diabetic-retinopathy {site.role} site (ICDR grades 0-4) in the "
            f"{site.layout} layout; lesions follow the grade."
        ),
        scans="images",
        acquisition=(
            f"simulated macula-centred fundus camera: {camera.width}x{camera.height} px "
            f"{'PNG' if site.image_format == 'PNG' else f'JPEG quality {site.jpeg_quality}'}"
        ),
        known_shifts=(
            f"simulated camera: RGB gains {gains}, gamma {camera.gamma:.2f}, saturation "
            f"{camera.saturation:.2f}, blur {100 * camera.blur:.1f}%, noise "
            f"{100 * camera.noise:.1f}%; label shift ({site.role}): grade mix {mix}; {rule}"
        ),
        labels=dict(ICDR_LABELS),
        preprocess={"image_size": 64},
    )
