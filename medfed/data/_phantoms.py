"""Pixels of the synthetic federation: fundus photographs and CT body phantoms.

Nothing here touches the disk; ``medfed.data.synth`` decides names, layouts and sites.
Every function takes its randomness from the generator it is given, so a caller that seeds one
generator per image gets the same pixels whatever order the images are drawn in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw
from scipy.ndimage import gaussian_filter

# Vertical cup-to-disc ratio by class: the classes overlap on purpose, so that a model has to
# look closely at the cup and still cannot be perfect.
CDR_NORMAL = (0.40, 0.10)
CDR_GLAUCOMA = (0.58, 0.10)
CDR_RANGE = (0.15, 0.9)

_RETINA_RGB = np.array([0.80, 0.36, 0.15], dtype=np.float32)
_DISC_RGB = np.array([0.96, 0.58, 0.32], dtype=np.float32)
_CUP_RGB = np.array([1.0, 0.9, 0.66], dtype=np.float32)
_VESSEL_DARKENING = np.array([0.35, 0.62, 0.55], dtype=np.float32)  # per RGB channel


# ----------------------------------------------------------------------------------- fundus


@dataclass(frozen=True)
class Camera:
    """A fundus camera: framing, resolution and colour response (the site's covariate shift)."""

    height: int
    width: int
    field_scale: float  # field radius / half the shorter image side; above 1 the edges are cut
    disc_scale: float  # optic-disc size relative to a macula-centred 45-degree photograph
    disc_offset: float  # horizontal disc position from the image centre, in field radii
    cast: tuple[float, float, float]  # RGB gains
    gamma: float
    saturation: float
    blur: float  # Gaussian sigma as a fraction of the shorter image side
    noise: float  # sensor noise standard deviation, in [0, 1] intensity units


@dataclass(frozen=True)
class FundusAnatomy:
    """Ground truth of one synthetic fundus photograph, in field-radius units (right-eye view)."""

    glaucoma: bool
    cdr: float  # vertical cup-to-disc ratio
    disc_radius: float
    disc_elongation: float  # vertical / horizontal disc axis
    disc_center: tuple[float, float]  # (u, v): u to the right, v down, field centre = (0, 0)
    macula_center: tuple[float, float]
    cup_offset: tuple[float, float]  # cup centre relative to the disc centre, in disc radii
    cup_contrast: float  # how strongly the cup stands out from the rim, in [0, 1]
    eye: str  # "OD" (right) or "OS" (left, drawn mirrored)
    brightness: float
    vignette: float


def sample_fundus_anatomy(
    rng: np.random.Generator, glaucoma: bool, camera: Camera
) -> FundusAnatomy:
    """Draw one eye: cup-to-disc ratio from the class, everything else as nuisance."""
    mean, sd = CDR_GLAUCOMA if glaucoma else CDR_NORMAL
    cdr = float(np.clip(rng.normal(mean, sd), *CDR_RANGE))
    radius = float(camera.disc_scale * np.clip(rng.normal(0.11, 0.012), 0.08, 0.14))
    disc = (
        camera.disc_offset + float(rng.normal(0.0, 0.04)),
        float(rng.normal(-0.02, 0.04)),
    )
    # The fovea lies about 2.5 disc diameters temporal of the disc and slightly below it.
    macula = (disc[0] - 5.0 * radius * float(rng.uniform(0.92, 1.08)), disc[1] + 0.6 * radius)
    return FundusAnatomy(
        glaucoma=glaucoma,
        cdr=cdr,
        disc_radius=radius,
        disc_elongation=float(rng.uniform(1.0, 1.15)),
        disc_center=disc,
        macula_center=macula,
        # Cups often sit a little temporal in the disc, and their pallor varies between eyes.
        cup_offset=(-float(rng.uniform(0.0, 0.15)), float(rng.normal(0.0, 0.04))),
        cup_contrast=float(rng.uniform(0.55, 0.95)),
        eye="OD" if rng.random() < 0.5 else "OS",
        brightness=float(rng.uniform(0.85, 1.1)),
        vignette=float(rng.uniform(0.25, 0.45)),
    )


def _field_coordinates(camera: Camera) -> tuple[np.ndarray, np.ndarray, float]:
    """Pixel-centre coordinates in field radii, and the field radius in pixels."""
    radius_px = camera.field_scale * min(camera.height, camera.width) / 2.0
    v = (np.arange(camera.height, dtype=np.float32) + 0.5 - camera.height / 2.0) / radius_px
    u = (np.arange(camera.width, dtype=np.float32) + 0.5 - camera.width / 2.0) / radius_px
    return u[None, :], v[:, None], radius_px


def _smoothstep_inside(dist: np.ndarray, edge: float, softness: float) -> np.ndarray:
    """1 well inside ``edge``, 0 well outside, a smooth ramp of half-width ``softness``."""
    t = np.clip((edge + softness - dist) / (2.0 * softness), 0.0, 1.0)
    return t * t * (3.0 - 2.0 * t)


def _smooth_noise(rng: np.random.Generator, shape: tuple[int, int], cells: int) -> np.ndarray:
    """Low-frequency noise in about [-1, 1]: a coarse random grid upsampled smoothly."""
    coarse = rng.normal(0.0, 1.0, size=(cells, cells)).astype(np.float32)
    fine = Image.fromarray(coarse).resize((shape[1], shape[0]), Image.Resampling.BICUBIC)
    return np.clip(np.asarray(fine), -2.5, 2.5) / 2.5


def _retina(
    rng: np.random.Generator,
    anatomy: FundusAnatomy,
    u: np.ndarray,
    v: np.ndarray,
    shape: tuple[int, int],
) -> np.ndarray:
    """Background retina: orange-red, vignetted, unevenly lit, with choroidal texture."""
    pigment = _RETINA_RGB * rng.normal(1.0, 0.05, size=3).astype(np.float32)
    r2 = u * u + v * v
    gradient = 1.0 + rng.normal(0.0, 0.07) * u + rng.normal(0.0, 0.07) * v
    light = anatomy.brightness * (1.0 - anatomy.vignette * r2) * gradient
    texture = 1.0 + 0.06 * _smooth_noise(rng, shape, 9) + 0.03 * _smooth_noise(rng, shape, 31)
    mu, mv = anatomy.macula_center
    d2 = ((u - mu) ** 2 + (v - mv) ** 2) / anatomy.disc_radius**2
    macula = 1.0 - 0.32 * np.exp(-d2 / 2.9) - 0.18 * np.exp(-d2 / 0.09)
    return (light * texture * macula)[..., None] * pigment


def _optic_disc(
    img: np.ndarray, anatomy: FundusAnatomy, u: np.ndarray, v: np.ndarray
) -> np.ndarray:
    """Blend the yellowish disc and its brighter cup into the retina."""
    du, dv = anatomy.disc_center
    r = anatomy.disc_radius
    rho = np.sqrt(((u - du) / r) ** 2 + ((v - dv) / (r * anatomy.disc_elongation)) ** 2)
    disc = _smoothstep_inside(rho, 1.0, 0.12)[..., None]
    # The rim is paler on the temporal side; the cup is the brightest part of the eye.
    pallor = 1.0 + 0.08 * np.clip(-(u - du) / r, -1.0, 1.0)[..., None]
    img = img * (1.0 - disc) + _DISC_RGB * pallor * disc * anatomy.brightness
    cu = du + anatomy.cup_offset[0] * r
    cv = dv + anatomy.cup_offset[1] * r
    rho_cup = np.sqrt(((u - cu) / r) ** 2 + ((v - cv) / (r * anatomy.disc_elongation)) ** 2)
    cup = anatomy.cup_contrast * _smoothstep_inside(rho_cup, anatomy.cdr, 0.1 + 0.12 * anatomy.cdr)
    cup = cup[..., None]
    return img * (1.0 - cup) + _CUP_RGB * cup


def _vessel_paths(rng: np.random.Generator, anatomy: FundusAnatomy) -> list[tuple[list, float]]:
    """Curved, branching polylines that leave the disc; each with a starting width."""
    du, dv = anatomy.disc_center
    # Two temporal arcades bend around the macula; two nasal trunks and a few small twigs.
    trunks = [(-95, -170, 0.024), (95, 170, 0.024), (-65, -20, 0.018), (65, 20, 0.018)]
    trunks += [(float(rng.uniform(-180, 180)), None, 0.011) for _ in range(int(rng.integers(1, 4)))]
    paths: list[tuple[list, float]] = []
    for start, target, width in trunks:
        angle = np.deg2rad(start + rng.normal(0.0, 8.0))
        goal = None if target is None else np.deg2rad(target + rng.normal(0.0, 10.0))
        _grow(rng, (du, dv), angle, goal, width, 0, paths)
    return paths


def _grow(
    rng: np.random.Generator,
    origin: tuple[float, float],
    angle: float,
    goal: float | None,
    width: float,
    depth: int,
    paths: list[tuple[list, float]],
) -> None:
    """Walk one vessel outwards, bending towards ``goal``, spawning thinner branches."""
    point = origin
    points = [point]
    step = 0.03
    for _ in range(int(rng.integers(22, 40)) if depth == 0 else int(rng.integers(6, 18))):
        if goal is not None:
            angle += 0.09 * (goal - angle)
        angle += rng.normal(0.0, 0.12)
        point = (point[0] + step * np.cos(angle), point[1] + step * np.sin(angle))
        points.append(point)
        if point[0] ** 2 + point[1] ** 2 > 1.1:
            break
        if depth < 2 and len(points) > 3 and rng.random() < 0.08:
            side = 1.0 if rng.random() < 0.5 else -1.0
            branch = angle + side * np.deg2rad(rng.uniform(25, 60))
            _grow(rng, point, branch, None, width * 0.65, depth + 1, paths)
    paths.append((points, width))


def _vessel_mask(rng: np.random.Generator, anatomy: FundusAnatomy, camera: Camera) -> np.ndarray:
    """Vessel darkness in [0, 1], drawn at twice the resolution for anti-aliased edges."""
    ss = 2
    _, _, radius_px = _field_coordinates(camera)
    canvas = Image.new("L", (camera.width * ss, camera.height * ss), 0)
    draw = ImageDraw.Draw(canvas)
    cx, cy = camera.width * ss / 2.0, camera.height * ss / 2.0
    scale = radius_px * ss
    for points, width in _vessel_paths(rng, anatomy):
        shade = int(255 * rng.uniform(0.7, 1.0))
        xy = [(cx + p[0] * scale, cy + p[1] * scale) for p in points]
        for k in range(len(xy) - 1):
            # Vessels taper as they run out; keep at least a hairline.
            w = max(1.0, width * scale * (1.0 - 0.5 * k / len(xy)))
            draw.line([xy[k], xy[k + 1]], fill=shade, width=round(w))
            (x, y), h = xy[k + 1], w / 2.0
            draw.ellipse([x - h, y - h, x + h, y + h], fill=shade)  # rounds the joint
    small = canvas.resize((camera.width, camera.height), Image.Resampling.BOX)
    return np.asarray(small, dtype=np.float32) / 255.0


def _apply_camera(img: np.ndarray, camera: Camera, rng: np.random.Generator) -> np.ndarray:
    """The site's optics and sensor: colour cast, saturation, gamma, blur, noise."""
    img = img * np.asarray(camera.cast, dtype=np.float32)
    gray = img.mean(axis=2, keepdims=True)
    img = np.clip(gray + camera.saturation * (img - gray), 0.0, 1.0) ** camera.gamma
    sigma = camera.blur * min(camera.height, camera.width)
    if sigma > 0:
        img = gaussian_filter(img, sigma=(sigma, sigma, 0), mode="nearest")
    return img + rng.normal(0.0, camera.noise, size=img.shape).astype(np.float32)


def render_fundus(
    rng: np.random.Generator,
    anatomy: FundusAnatomy,
    camera: Camera,
    retinopathy: Retinopathy | None = None,
) -> np.ndarray:
    """A uint8 RGB (H, W, 3) fundus photograph of ``anatomy`` as seen by ``camera``, with the
    lesions of ``retinopathy`` when given (they draw nothing from ``rng``)."""
    u, v, radius_px = _field_coordinates(camera)
    shape = (camera.height, camera.width)
    img = _retina(rng, anatomy, u, v, shape)
    img = _optic_disc(img, anatomy, u, v)
    vessels = _vessel_mask(rng, anatomy, camera)[..., None]
    img = img * (1.0 - _VESSEL_DARKENING * vessels)
    if retinopathy is not None:
        img = _paint_retinopathy(img, retinopathy, u, v, camera)
    img = _apply_camera(img, camera, rng)
    field = _smoothstep_inside(np.sqrt(u * u + v * v), 1.0, 1.2 / radius_px)[..., None]
    # Outside the field the sensor still sees a little dark noise, never a clean zero.
    dark = np.abs(rng.normal(0.0, 0.008, size=img.shape)).astype(np.float32)
    img = img * field + dark * (1.0 - field)
    out = np.clip(img * 255.0 + 0.5, 0, 255).astype(np.uint8)
    return out[:, ::-1].copy() if anatomy.eye == "OS" else out


# ----------------------------------------------------------------- diabetic retinopathy

# The lesions of each ICDR grade (0 none, 1 mild, 2 moderate, 3 severe, 4 proliferative), as
# (low, high) counts per eye. Mild is microaneurysms only; moderate adds haemorrhages and hard
# exudates; severe has many haemorrhages in every quadrant and cotton-wool spots; proliferative
# adds new vessels at the disc. Counts overlap between neighbouring grades, as graders' do.
DR_LESION_COUNTS: dict[int, dict[str, tuple[int, int]]] = {
    0: {},
    1: {"microaneurysm": (2, 6)},
    2: {"microaneurysm": (4, 10), "haemorrhage": (2, 6), "hard_exudate": (3, 10)},
    3: {
        "microaneurysm": (8, 16),
        "haemorrhage": (10, 20),
        "hard_exudate": (4, 12),
        "cotton_wool": (2, 5),
    },
    4: {
        "microaneurysm": (6, 14),
        "haemorrhage": (6, 14),
        "hard_exudate": (3, 10),
        "cotton_wool": (1, 4),
    },
}
# Radius range of each kind, in field radii (drawn larger than life so that they survive the
# small input sizes the toolkit trains at), and its colour and opacity.
_SPOT_RADIUS = {
    "microaneurysm": (0.012, 0.018),
    "haemorrhage": (0.025, 0.055),
    "hard_exudate": (0.012, 0.03),
    "cotton_wool": (0.035, 0.065),
}
_SPOT_RGB = {
    "microaneurysm": (0.42, 0.05, 0.04),
    "haemorrhage": (0.38, 0.04, 0.03),
    "hard_exudate": (0.98, 0.86, 0.36),
    "cotton_wool": (0.94, 0.86, 0.78),
}
_SPOT_OPACITY = {"microaneurysm": 0.9, "haemorrhage": 0.85, "hard_exudate": 0.9, "cotton_wool": 0.6}
_NEW_VESSEL_RGB = np.array([0.45, 0.06, 0.05], dtype=np.float32)


@dataclass(frozen=True)
class Spot:
    """One round lesion: its kind, centre (field radii, right-eye view) and radius."""

    kind: str
    center: tuple[float, float]
    radius: float


@dataclass(frozen=True)
class Retinopathy:
    """The lesions of one eye: its ICDR grade, round lesions and new-vessel polylines."""

    grade: int
    spots: tuple[Spot, ...]
    new_vessels: tuple[tuple[tuple[float, float], ...], ...]

    def counts(self) -> dict[str, int]:
        """Lesions by kind ("new_vessels" counts the tangles)."""
        out: dict[str, int] = {}
        for spot in self.spots:
            out[spot.kind] = out.get(spot.kind, 0) + 1
        if self.new_vessels:
            out["new_vessels"] = len(self.new_vessels)
        return out


def sample_retinopathy(rng: np.random.Generator, grade: int, anatomy: FundusAnatomy) -> Retinopathy:
    """Draw the lesions of an eye of ``grade`` (0-4) around ``anatomy``'s disc and macula."""
    if grade not in DR_LESION_COUNTS:
        raise ValueError(f"ICDR grade must be 0-4, got {grade}")
    spots = []
    for kind, (low, high) in DR_LESION_COUNTS[grade].items():
        for _ in range(int(rng.integers(low, high + 1))):
            spots.append(Spot(kind, _lesion_place(rng, kind, anatomy), _spot_radius(rng, kind)))
    new_vessels: list[tuple[tuple[float, float], ...]] = []
    if grade == 4:
        for _ in range(int(rng.integers(1, 3))):
            new_vessels.append(_new_vessel_tangle(rng, anatomy))
        if rng.random() < 0.5:  # a pre-retinal haemorrhage near the new vessels
            du, dv = anatomy.disc_center
            place = (du + float(rng.normal(0, 0.12)), dv + float(rng.normal(0.1, 0.08)))
            spots.append(Spot("haemorrhage", place, float(rng.uniform(0.07, 0.11))))
    return Retinopathy(grade, tuple(spots), tuple(new_vessels))


def _spot_radius(rng: np.random.Generator, kind: str) -> float:
    return float(rng.uniform(*_SPOT_RADIUS[kind]))


def _lesion_place(
    rng: np.random.Generator, kind: str, anatomy: FundusAnatomy
) -> tuple[float, float]:
    """Where a lesion sits: exudates gather around the macula, the rest anywhere off the disc."""
    du, dv = anatomy.disc_center
    for _ in range(50):
        if kind == "hard_exudate":
            mu, mv = anatomy.macula_center
            u, v = mu + float(rng.normal(0, 0.16)), mv + float(rng.normal(0, 0.12))
        else:
            angle, radius = rng.uniform(0, 2 * np.pi), 0.85 * np.sqrt(rng.uniform(0, 1))
            u, v = float(radius * np.cos(angle)), float(radius * np.sin(angle))
        off_disc = (u - du) ** 2 + (v - dv) ** 2 > (1.4 * anatomy.disc_radius) ** 2
        if off_disc and u * u + v * v < 0.9:
            return u, v
    return u, v


def _new_vessel_tangle(
    rng: np.random.Generator, anatomy: FundusAnatomy
) -> tuple[tuple[float, float], ...]:
    """A short, tortuous polyline on or next to the disc."""
    du, dv = anatomy.disc_center
    angle = rng.uniform(0, 2 * np.pi)
    point = (
        du + 0.8 * anatomy.disc_radius * np.cos(angle),
        dv + 0.8 * anatomy.disc_radius * np.sin(angle),
    )
    points = [(float(point[0]), float(point[1]))]
    heading = rng.uniform(0, 2 * np.pi)
    for _ in range(int(rng.integers(10, 18))):
        heading += rng.normal(0.0, 0.9)
        point = (point[0] + 0.018 * np.cos(heading), point[1] + 0.018 * np.sin(heading))
        points.append((float(point[0]), float(point[1])))
    return tuple(points)


def _paint_retinopathy(
    img: np.ndarray, retinopathy: Retinopathy, u: np.ndarray, v: np.ndarray, camera: Camera
) -> np.ndarray:
    """Blend the lesions into the retina (before the camera's optics, like every structure)."""
    for spot in retinopathy.spots:
        dist = np.sqrt((u - spot.center[0]) ** 2 + (v - spot.center[1]) ** 2)
        softness = spot.radius * (0.6 if spot.kind == "cotton_wool" else 0.3)
        alpha = _SPOT_OPACITY[spot.kind] * _smoothstep_inside(dist, spot.radius, softness)
        colour = np.asarray(_SPOT_RGB[spot.kind], dtype=np.float32)
        img = img * (1.0 - alpha[..., None]) + colour * alpha[..., None]
    if retinopathy.new_vessels:
        mask = _polyline_mask(retinopathy.new_vessels, camera, width=0.008)[..., None]
        img = img * (1.0 - 0.8 * mask) + _NEW_VESSEL_RGB * 0.8 * mask
    return img


def _polyline_mask(
    lines: tuple[tuple[tuple[float, float], ...], ...], camera: Camera, width: float
) -> np.ndarray:
    """Anti-aliased coverage in [0, 1] of polylines given in field radii."""
    ss = 2
    _, _, radius_px = _field_coordinates(camera)
    canvas = Image.new("L", (camera.width * ss, camera.height * ss), 0)
    draw = ImageDraw.Draw(canvas)
    cx, cy, scale = camera.width * ss / 2.0, camera.height * ss / 2.0, radius_px * ss
    for points in lines:
        xy = [(cx + p[0] * scale, cy + p[1] * scale) for p in points]
        draw.line(xy, fill=255, width=max(1, round(width * scale)), joint="curve")
    small = canvas.resize((camera.width, camera.height), Image.Resampling.BOX)
    return np.asarray(small, dtype=np.float32) / 255.0


# --------------------------------------------------------------------------------------- CT


@dataclass(frozen=True)
class Scanner:
    """A CT scanner and protocol: geometry, calibration, noise and reconstruction kernel."""

    matrix: int  # rows = columns
    pixel_spacing: float  # mm
    slice_thickness: float  # mm, also the slice increment
    hu_offset: float  # calibration error added to every voxel
    noise_hu: float  # noise standard deviation per voxel
    kernel_sigma: float  # in-plane Gaussian blur in pixels (soft kernel = larger)
    kernel_name: str


@dataclass(frozen=True)
class Lesion:
    """A low-contrast sphere inside the liver, in patient millimetres."""

    center: tuple[float, float, float]  # (z, y, x)
    radius: float
    contrast_hu: float  # negative: darker than the liver


@dataclass(frozen=True)
class BodyAnatomy:
    """One patient's upper abdomen, in millimetres: x to the patient's left, y posterior, z up."""

    body_axes: tuple[float, float]  # (x, y) semi-axes
    fat_thickness: float
    soft_tissue_hu: float
    liver_hu: float
    liver_center: tuple[float, float]  # (x, y)
    liver_axes: tuple[float, float]
    dome_z: float  # top of the right hemidiaphragm
    spine_center: tuple[float, float]
    extent_z: float  # scanned length
    lesion: Lesion | None


def sample_body(rng: np.random.Generator, lesion: bool, extent_z: float) -> BodyAnatomy:
    """Draw one patient; ``lesion`` adds a low-contrast sphere inside the liver."""
    liver_center = (float(rng.normal(-38.0, 3.0)), float(rng.normal(-2.0, 3.0)))
    liver_axes = (float(rng.uniform(30.0, 36.0)), float(rng.uniform(32.0, 40.0)))
    dome_z = float(extent_z * rng.uniform(0.62, 0.75))
    found = _sample_lesion(rng, liver_center, liver_axes, dome_z, extent_z) if lesion else None
    return BodyAnatomy(
        body_axes=(float(rng.uniform(74.0, 82.0)), float(rng.uniform(55.0, 61.0))),
        fat_thickness=float(rng.uniform(5.0, 10.0)),
        soft_tissue_hu=float(rng.normal(40.0, 4.0)),
        liver_hu=float(rng.normal(60.0, 5.0)),
        liver_center=liver_center,
        liver_axes=liver_axes,
        dome_z=dome_z,
        spine_center=(float(rng.normal(0.0, 2.0)), float(rng.uniform(36.0, 40.0))),
        extent_z=extent_z,
        lesion=found,
    )


# Hypodense liver lesions as portal-venous CT shows metastases: most 18-32 mm across and 60-100 HU
# below the liver; about one in ten is small and faint (6-10 mm, 20-35 HU), which a 4 mm grid
# mostly misses, so the classes overlap and no model finds every lesion.
LESION_RADIUS_MM = (9.0, 16.0)
LESION_CONTRAST_HU = (60.0, 100.0)
FAINT_FRACTION = 0.1
FAINT_RADIUS_MM = (3.0, 5.0)
FAINT_CONTRAST_HU = (20.0, 35.0)


def _sample_lesion(
    rng: np.random.Generator,
    liver_center: tuple[float, float],
    liver_axes: tuple[float, float],
    dome_z: float,
    extent_z: float,
) -> Lesion:
    """A sphere well inside the liver; about one in ten is small, faint and easy to miss."""
    faint = rng.random() < FAINT_FRACTION
    radius = float(rng.uniform(*(FAINT_RADIUS_MM if faint else LESION_RADIUS_MM)))
    contrast = float(rng.uniform(*(FAINT_CONTRAST_HU if faint else LESION_CONTRAST_HU)))
    angle = rng.uniform(0, 2 * np.pi)
    reach = rng.uniform(0.0, 0.45)
    x = liver_center[0] + reach * liver_axes[0] * np.cos(angle)
    y = liver_center[1] + reach * liver_axes[1] * np.sin(angle)
    z = rng.uniform(min(radius + 4.0, 0.3 * extent_z), max(dome_z - radius - 10.0, 0.35 * extent_z))
    return Lesion(center=(float(z), float(y), float(x)), radius=radius, contrast_hu=-contrast)


def _inside_ellipse(
    x: np.ndarray,
    y: np.ndarray,
    center: tuple[float, float],
    axes: tuple[float, float],
    soft: float,
) -> np.ndarray:
    rho = np.sqrt(((x - center[0]) / axes[0]) ** 2 + ((y - center[1]) / axes[1]) ** 2)
    return _smoothstep_inside(rho, 1.0, soft)


def _axial_slab(body: BodyAnatomy, z: float, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """HU of one infinitely thin axial plane at height ``z``."""
    ax, ay = body.body_axes
    hu = np.full(np.broadcast_shapes(x.shape, y.shape), -1000.0, dtype=np.float32)
    outer = _inside_ellipse(x, y, (0.0, 0.0), (ax, ay), 0.02)
    fat = body.fat_thickness
    inner = _inside_ellipse(x, y, (0.0, 0.0), (ax - fat, ay - fat), 0.02)
    hu = hu * (1 - outer) + (-100.0) * outer
    hu = hu * (1 - inner) + body.soft_tissue_hu * inner
    # Both hemidiaphragms are domes; lungs lie above them, the liver below the right one.
    for side, lift in ((-1.0, 0.0), (1.0, -8.0)):
        cx = side * 40.0
        dome = body.dome_z + lift - ((x - cx) ** 2 + (y + 4.0) ** 2) / 160.0
        lung = _inside_ellipse(x, y, (cx * 1.05, 12.0), (22.0, 30.0), 0.05) * (z > dome + 3.0)
        hu = hu * (1 - lung) + (-850.0) * lung
        if side < 0:
            liver = _inside_ellipse(x, y, body.liver_center, body.liver_axes, 0.05) * (z < dome)
            hu = hu * (1 - liver) + body.liver_hu * liver
            if body.lesion is not None:
                hu = _add_lesion(hu, body.lesion, z, x, y) * liver + hu * (1 - liver)
    sx, sy = body.spine_center
    hu = np.where((x - sx) ** 2 + (y - sy) ** 2 < 12.0**2, 600.0, hu)
    hu = np.where((x - sx) ** 2 + (y - sy - 16.0) ** 2 < 5.0**2, 20.0, hu)
    return hu


def _add_lesion(
    hu: np.ndarray, lesion: Lesion, z: float, x: np.ndarray, y: np.ndarray
) -> np.ndarray:
    lz, ly, lx = lesion.center
    dist = np.sqrt((x - lx) ** 2 + (y - ly) ** 2 + (z - lz) ** 2)
    return hu + lesion.contrast_hu * _smoothstep_inside(dist, lesion.radius, 1.0)


def render_ct(
    rng: np.random.Generator, body: BodyAnatomy, scanner: Scanner, n_slices: int
) -> np.ndarray:
    """A float32 HU volume (slice, row, column); slice 0 is the lowest (most inferior)."""
    coords = np.arange(scanner.matrix, dtype=np.float32) - (scanner.matrix - 1) / 2.0
    coords = coords * scanner.pixel_spacing
    x, y = coords[None, :], coords[:, None]
    volume = np.empty((n_slices, scanner.matrix, scanner.matrix), dtype=np.float32)
    # A thick slice averages the anatomy across its thickness (partial-volume effect).
    offsets = (np.arange(4) + 0.5) / 4.0 - 0.5
    for k in range(n_slices):
        zc = (k + 0.5) * scanner.slice_thickness
        planes = [_axial_slab(body, zc + o * scanner.slice_thickness, x, y) for o in offsets]
        volume[k] = np.mean(planes, axis=0)
    volume = gaussian_filter(volume, sigma=(0, scanner.kernel_sigma, scanner.kernel_sigma))
    noise = gaussian_filter(rng.normal(size=volume.shape).astype(np.float32), sigma=(0, 0.6, 0.6))
    noise *= scanner.noise_hu / max(float(noise.std()), 1e-6)
    return volume + noise + scanner.hu_offset
