"""Site manifests (``sites/<id>.toml``): what a site's data is, how it is laid out, what its
labels mean and how its scans are preprocessed, read from TOML and validated."""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from medfed.core.errors import ManifestError, MedfedError


class Modality(StrEnum):
    FUNDUS = "fundus"
    CT = "ct"


# The on-disk layouts each modality can be read from; each names a module of medfed.data.layouts.
LAYOUTS_BY_MODALITY: dict[Modality, tuple[str, ...]] = {
    Modality.FUNDUS: ("acrima", "rimone", "refuge", "imagefolder", "aptos", "eyepacs", "idrid"),
    Modality.CT: ("dicom", "nifti"),
}

# A site id names files and folders (cards, caches, run directories), so it stays file-safe,
# and short enough that a file name built from it stays within every file system's limit.
SITE_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
SITE_ID_MAX_LENGTH = 64


def valid_site_id(text: str) -> bool:
    """True for letters, digits, '_', '-' and '.', starting with a letter or digit."""
    return SITE_ID_PATTERN.fullmatch(text) is not None


def class_names(labels: Mapping[str, int]) -> dict[int, str]:
    """Class index -> name, by index; 'a/b' when a manifest maps several names to one index."""
    names: dict[int, list[str]] = {}
    for name, index in labels.items():
        names.setdefault(index, []).append(name)
    return {i: "/".join(sorted(names[i])) for i in sorted(names)}


_ENV_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def expand_env(text: str, *, where: str) -> str:
    """Expand ``${VAR}`` / ``$VAR``; an unset variable is an error, never an empty string."""

    def repl(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in os.environ:
            raise ManifestError(
                f"{where}: environment variable {name} is not set; "
                f"export {name}=/path/to/your/data and try again"
            )
        return os.environ[name]

    return _ENV_VAR.sub(repl, text)


# The largest fundus training resolution: 512 px already resolves the optic disc's rim and the
# vessels a glaucoma or retinopathy grader reads; beyond it a 5,000-scan site's cache (and each
# batch's activations) grows fourfold for no finer structure a model of this size learns from.
FUNDUS_MAX_IMAGE_SIZE = 512


@dataclass(frozen=True)
class FundusPreprocess:
    """Fundus pipeline: crop to the camera field, resize, per-site normalization."""

    image_size: int = 64
    roi_crop: bool = True
    roi_threshold: float = 0.08  # fraction of max brightness that counts as inside the field
    normalize: bool = True  # per-channel mean/std from the site's own training split
    # An optic-disc-centred crop for glaucoma: a square of this share of the camera field's
    # short side around the disc (the photo's brightest spot), then resized; 0: the whole field.
    disc_crop: float = 0.0

    def __post_init__(self) -> None:
        if not 8 <= self.image_size <= FUNDUS_MAX_IMAGE_SIZE:
            raise ValueError(
                f"image_size = {self.image_size} is outside 8..{FUNDUS_MAX_IMAGE_SIZE} pixels; "
                f"choose a training resolution of at most {FUNDUS_MAX_IMAGE_SIZE} (224 for the "
                "torchvision backbones, 64-128 for the small ones)"
            )
        if not 0.0 <= self.roi_threshold < 1.0:
            raise ValueError("preprocess.roi_threshold must be in [0, 1)")
        if not (self.disc_crop == 0.0 or 0.1 <= self.disc_crop <= 1.0):
            raise ValueError(
                f"disc_crop = {self.disc_crop} must be 0 (no crop) or a share of the camera "
                "field between 0.1 and 1, e.g. disc_crop = 0.4 for a disc-centred crop"
            )


# Bounds of the CT [preprocess] settings: finite and sane, so that a mistyped value is refused
# here rather than turning every scan into NaN or an array too large for memory.
CT_HU_RANGE: tuple[float, float] = (-2000.0, 5000.0)  # air is -1000 HU, dense bone ~3000 HU
CT_SPACING_RANGE_MM: tuple[float, float] = (0.05, 50.0)
CT_SHAPE_RANGE: tuple[int, int] = (4, 1024)
CT_MAX_VOXELS = 2**26  # 64 Mi voxels, 256 MiB per scan as float32


@dataclass(frozen=True)
class CTPreprocess:
    """CT pipeline: HU window, resample to a target spacing, crop/pad to a fixed shape.

    Axes are (slice, row, column) throughout; spacing is in millimetres in that order.
    """

    hu_window: tuple[float, float] = (-160.0, 240.0)
    spacing: tuple[float, float, float] = (4.0, 4.0, 4.0)
    shape: tuple[int, int, int] = (16, 48, 48)
    normalize: bool = True

    def __post_init__(self) -> None:
        # Comparisons are false for NaN, so a NaN fails each range check below.
        lo_hu, hi_hu = CT_HU_RANGE
        window = f"{list(self.hu_window)}"
        if len(self.hu_window) != 2 or not all(lo_hu <= v <= hi_hu for v in self.hu_window):
            raise ValueError(
                f"hu_window {window} must be two finite HU values between {lo_hu:g} and "
                f"{hi_hu:g}, e.g. hu_window = [-160, 240]"
            )
        lo, hi = self.hu_window
        if not hi - lo >= 1:
            raise ValueError(
                f"hu_window {window} must be [low, high] with low below high by at least 1 HU, "
                "e.g. hu_window = [-160, 240]"
            )
        lo_mm, hi_mm = CT_SPACING_RANGE_MM
        if len(self.spacing) != 3 or not all(lo_mm <= s <= hi_mm for s in self.spacing):
            raise ValueError(
                f"spacing {list(self.spacing)} must be three finite numbers of millimetres "
                f"between {lo_mm:g} and {hi_mm:g} (slice, row, column), e.g. spacing = [4, 4, 4]"
            )
        lo_n, hi_n = CT_SHAPE_RANGE
        if len(self.shape) != 3 or not all(lo_n <= s <= hi_n for s in self.shape):
            raise ValueError(
                f"shape {list(self.shape)} must be three integers between {lo_n} and {hi_n} "
                "(slices, rows, columns), e.g. shape = [16, 48, 48]"
            )
        voxels = math.prod(self.shape)
        if voxels > CT_MAX_VOXELS:
            raise ValueError(
                f"shape {list(self.shape)} holds {voxels} voxels per scan, more than "
                f"{CT_MAX_VOXELS} (e.g. 256 x 512 x 512); choose a smaller shape or a "
                "coarser spacing"
            )


PreprocessOptions = FundusPreprocess | CTPreprocess

# Which [preprocess] table a manifest of each modality holds.
PREPROCESS_BY_MODALITY: dict[Modality, type[FundusPreprocess] | type[CTPreprocess]] = {
    Modality.FUNDUS: FundusPreprocess,
    Modality.CT: CTPreprocess,
}


@dataclass(frozen=True)
class SplitOptions:
    """Patient-level split. Layout-declared test sets are kept when ``use_layout_split``."""

    val_fraction: float = 0.15
    test_fraction: float = 0.25
    seed: int = 0
    use_layout_split: bool = True

    def __post_init__(self) -> None:
        if not (0 <= self.val_fraction < 1 and 0 <= self.test_fraction < 1):
            raise ValueError("split fractions must be in [0, 1)")
        if self.val_fraction + self.test_fraction >= 1:
            raise ValueError("split.val_fraction + split.test_fraction must be below 1")
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be an integer >= 0 (below 2**63), got {self.seed}")


@dataclass(frozen=True)
class SiteManifest:
    """A site: where its data is, how it is laid out, what the labels mean, how to preprocess."""

    id: str
    modality: Modality
    layout: str
    root: Path
    labels: dict[str, int]
    preprocess: PreprocessOptions
    split: SplitOptions = field(default_factory=SplitOptions)
    layout_options: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    source: str = ""
    acquisition: str = ""
    known_shifts: str = ""
    licence: str = ""
    ethics: str = ""
    provenance: str = ""
    # TRIPOD+AI items a site declares (its data card and the model card show them, "not
    # recorded" where a site gave none): how the label was decided, who was included and
    # excluded, when the scans were taken, who controls the data and how long it is kept.
    reference_standard: str = ""
    inclusion: str = ""
    exclusion: str = ""
    data_dates: str = ""
    data_controller: str = ""
    retention: str = ""
    # The classes of [labels] this site holds scans of, when it holds only some of the
    # federation's classes (a screening site with only 'dr', say); empty: all of them.
    classes_held: tuple[str, ...] = ()
    manifest_path: Path | None = None

    @property
    def n_classes(self) -> int:
        return len(set(self.labels.values()))

    def class_names(self) -> dict[int, str]:
        """Class index -> name, by index (see :func:`class_names`)."""
        return class_names(self.labels)

    def held_indices(self) -> set[int]:
        """The class indices this site holds scans of (``classes_held``, else every class)."""
        return {self.labels[name] for name in self.classes_held or self.labels}

    def to_dict(self) -> dict[str, Any]:
        """A TOML/JSON-ready dictionary of the resolved manifest."""
        data = asdict(self)
        data["modality"] = str(self.modality)
        data["root"] = str(self.root)
        data["manifest_path"] = str(self.manifest_path) if self.manifest_path else ""
        if self.classes_held:
            data["classes_held"] = list(self.classes_held)
        else:  # every class: the field is left out, as a manifest that holds them all leaves it
            del data["classes_held"]
        return data


_TOP_KEYS = {
    "id", "modality", "layout", "root", "labels", "preprocess", "split", "layout_options",
    "description", "source", "acquisition", "known_shifts", "licence", "ethics", "provenance",
    "classes_held", "reference_standard", "inclusion", "exclusion", "data_dates",
    "data_controller", "retention",
}  # fmt: skip


# How a missing required field is written, for the message that asks for it.
_FIELD_EXAMPLES = {
    "id": 'id = "my-hospital"',
    "modality": f"modality = one of {[m.value for m in Modality]}",
    "layout": f"layout = one of {sorted(set().union(*LAYOUTS_BY_MODALITY.values()))}",
    "root": 'root = "/path/to/the/scans" (may use $VARIABLES)',
    "labels": "a [labels] table mapping class names to 0..K-1, e.g. normal = 0, glaucoma = 1",
}


# How each table of a manifest is written, for the message that asks for a table.
_TABLE_EXAMPLES = {
    "labels": "[labels] / normal = 0 / glaucoma = 1",
    "preprocess": "[preprocess] / image_size = 64",
    "split": "[split] / seed = 0",
    "layout_options": '[layout_options] / labels_file = "labels.csv"',
}

# Free-text fields of a manifest (shown on site cards and in reports).
_TEXT_FIELDS: tuple[str, ...] = (
    "description", "source", "acquisition", "known_shifts", "licence", "ethics", "provenance",
    "reference_standard", "inclusion", "exclusion", "data_dates", "data_controller", "retention",
)  # fmt: skip
# The TRIPOD+AI items among them, with how cards name them.
TRIPOD_FIELDS: dict[str, str] = {
    "reference_standard": "reference standard (how the label was decided)",
    "inclusion": "inclusion criteria",
    "exclusion": "exclusion criteria",
    "data_dates": "data dates",
    "data_controller": "data controller",
    "retention": "retention",
}


def _require(data: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in data:
        example = _FIELD_EXAMPLES.get(key, "")
        raise ManifestError(
            f"{where}: missing required field '{key}'" + (f"; add {example}" if example else "")
        )
    if kind is dict:
        return _table(data, key, where)
    value = data[key]
    if not isinstance(value, kind):
        words = "a string (in quotes)" if kind is str else f"a {kind.__name__}"
        example = _FIELD_EXAMPLES.get(key, "")
        raise ManifestError(
            f"{where}: field '{key}' must be {words}, got {value!r}"
            + (f"; e.g. {example}" if example else "")
        )
    return value


def _table(data: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    """A table-valued field (``[key]``); absent is an empty table, anything else is refused."""
    value = data.get(key, {})
    if not isinstance(value, dict):
        shown = (
            "an array of tables [[...]]"
            if isinstance(value, list) and value and all(isinstance(v, dict) for v in value)
            else repr(value)
        )
        raise ManifestError(
            f"{where}: [{key}] must be a table, e.g. {_TABLE_EXAMPLES[key]} "
            f"(each on its own line), got {shown}"
        )
    return value


def _typed(cls: type, data: dict[str, Any], where: str, section: str) -> Any:
    known = set(cls.__dataclass_fields__)
    unknown = set(data) - known
    if unknown:
        raise ManifestError(
            f"{where}: unknown key(s) {sorted(unknown)} in [{section}]; known: {sorted(known)}"
        )
    for name, value in data.items():
        _check_field_type(name, value, cls.__dataclass_fields__[name].type, where, section)
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise ManifestError(f"{where}: [{section}] {exc}") from exc


# Manifest field annotations (strings under ``from __future__ import annotations``) -> what a
# value must be: (element kinds, element count or None for a scalar, words for the message).
_FIELD_TYPES: dict[str, tuple[tuple[type, ...], int | None, str]] = {
    "int": ((int,), None, "an integer"),
    "float": ((int, float), None, "a number"),
    "bool": ((bool,), None, "true or false (without quotes)"),
    "tuple[float, float]": ((int, float), 2, "a list of two numbers"),
    "tuple[float, float, float]": ((int, float), 3, "a list of three numbers"),
    "tuple[int, int, int]": ((int,), 3, "a list of three integers"),
}


def _check_field_type(name: str, value: Any, annotation: Any, where: str, section: str) -> None:
    """A value of the wrong type is named with the type expected, never taken as another."""
    if str(annotation) not in _FIELD_TYPES:
        return
    kinds, count, expected = _FIELD_TYPES[str(annotation)]

    def fits(v: Any) -> bool:
        return isinstance(v, kinds) and (bool in kinds or not isinstance(v, bool))

    if count is None:
        ok = fits(value)
    else:
        ok = isinstance(value, list | tuple) and len(value) == count and all(map(fits, value))
    if not ok:
        raise ManifestError(f"{where}: [{section}] {name} must be {expected}, got {value!r}")


def parse_manifest(
    data: dict[str, Any], *, where: str, base_dir: Path, expand: bool = False
) -> SiteManifest:
    """Validate a manifest dictionary and turn it into a :class:`SiteManifest`.

    ``expand``: read ``root`` as a site's own manifest file does, expanding ``$VAR``, ``${VAR}``
    and ``~`` from this process's environment. Only :func:`load_manifest` (a local TOML file)
    asks for it; a manifest stored in a run or received from another machine is taken as it is
    written, so that it can never read this machine's environment.
    """
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise ManifestError(
            f"{where}: unknown field(s) {sorted(unknown)}; known: {sorted(_TOP_KEYS)}"
        )
    site_id = _require(data, "id", str, where)
    if len(site_id) > SITE_ID_MAX_LENGTH:
        raise ManifestError(
            f"{where}: id {site_id[:24]!r}... is {len(site_id)} characters long; use at most "
            f"{SITE_ID_MAX_LENGTH} (it names files and folders)"
        )
    if not valid_site_id(site_id):
        raise ManifestError(
            f"{where}: id {site_id!r} must start with a letter or digit and hold only letters, "
            "digits, '_', '-' and '.' (it names files and folders)"
        )
    modality_text = _require(data, "modality", str, where)
    try:
        modality = Modality(modality_text)
    except ValueError:
        raise ManifestError(
            f"{where}: modality {modality_text!r} is not one of {[m.value for m in Modality]}"
        ) from None
    layout = _require(data, "layout", str, where)
    if layout not in LAYOUTS_BY_MODALITY[modality]:
        raise ManifestError(
            f"{where}: unknown layout {layout!r} for modality {modality}; "
            f"choose one of {list(LAYOUTS_BY_MODALITY[modality])}"
        )
    root_text = _require(data, "root", str, where)
    if expand:
        root = Path(expand_env(root_text, where=where)).expanduser()
        if not root.is_absolute():
            root = (base_dir / root).resolve()
    else:
        root = Path(root_text)
        if not root.is_absolute():
            root = base_dir / root
    labels = _require(data, "labels", dict, where)
    booleans = sorted(k for k, v in labels.items() if isinstance(v, bool))
    if booleans:
        raise ManifestError(
            f"{where}: [labels] {', '.join(booleans)} must be a class index (an integer), "
            f"not true/false; e.g. normal = 0, glaucoma = 1"
        )
    if len(labels) < 2 or not all(isinstance(v, int) and v >= 0 for v in labels.values()):
        raise ManifestError(
            f"{where}: [labels] must map at least two class names to integers >= 0, "
            f"e.g. normal = 0, glaucoma = 1; got {labels!r}"
        )
    indices = sorted(set(labels.values()))
    if len(indices) < 2:
        raise ManifestError(
            f"{where}: [labels] gives every class the same index {indices}; a site needs at "
            "least two distinct indices, e.g. normal = 0, glaucoma = 1"
        )
    if indices != list(range(len(indices))):
        raise ManifestError(f"{where}: [labels] indices must be 0..K-1 without gaps, got {indices}")
    preprocess = _typed(
        PREPROCESS_BY_MODALITY[modality], _table(data, "preprocess", where), where, "preprocess"
    )
    split = _typed(SplitOptions, _table(data, "split", where), where, "split")
    layout_options = _table(data, "layout_options", where)
    text_fields = {}
    for key in _TEXT_FIELDS:
        value = data.get(key, "")
        if not isinstance(value, str):
            raise ManifestError(
                f"{where}: field '{key}' must be a string (in quotes), got {value!r}; "
                f'e.g. {key} = "..."'
            )
        text_fields[key] = value
    return SiteManifest(
        classes_held=_classes_held(data, labels, where),
        id=site_id,
        modality=modality,
        layout=layout,
        root=root,
        labels=dict(labels),
        preprocess=preprocess,
        split=split,
        layout_options=dict(layout_options),
        **text_fields,
    )


def _classes_held(data: dict[str, Any], labels: dict[str, int], where: str) -> tuple[str, ...]:
    """``classes_held``: a non-empty list of distinct class names that [labels] declares."""
    value = data.get("classes_held", [])
    example = f"e.g. classes_held = [{', '.join(repr(n) for n in list(labels)[-1:])}]"
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ManifestError(
            f"{where}: field 'classes_held' must be a list of class names (strings), "
            f"{example}; got {value!r}"
        )
    if "classes_held" in data and not value:
        raise ManifestError(
            f"{where}: 'classes_held' is empty; list the classes of [labels] this site holds "
            f"scans of ({example}), or leave the field out when it holds all of them"
        )
    undeclared = [v for v in value if v not in labels]
    if undeclared:
        raise ManifestError(
            f"{where}: classes_held names {undeclared}, which [labels] does not declare "
            f"(declared: {list(labels)}); use the names of [labels]"
        )
    if len(set(value)) != len(value):
        raise ManifestError(f"{where}: classes_held lists a class twice ({value}); list each once")
    return tuple(value)


def load_manifest(path: str | Path) -> SiteManifest:
    """Read and validate one site manifest (``sites/<id>.toml``)."""
    path = Path(path)
    if not path.is_file():
        raise ManifestError(f"{path}: manifest file not found")
    data = read_toml(path, ManifestError, "the manifest")
    if not isinstance(data, dict) or not data:
        raise ManifestError(f"{path}: the manifest is empty; see sites/*.toml for an example")
    manifest = parse_manifest(data, where=str(path), base_dir=path.parent.resolve(), expand=True)
    return replace(manifest, manifest_path=path.resolve())


def load_manifests(paths: list[str | Path]) -> list[SiteManifest]:
    """Load several manifests; site ids must be unique and the modality shared."""
    manifests = [load_manifest(p) for p in paths]
    seen: dict[str, Path | None] = {}
    for m in manifests:
        if m.id in seen and seen[m.id] == m.manifest_path:
            raise ManifestError(f"{m.manifest_path} is given twice; list each site once")
        if m.id in seen:
            raise ManifestError(f"{m.manifest_path}: site id {m.id!r} also used by {seen[m.id]}")
        seen[m.id] = m.manifest_path
    return manifests


def read_toml(path: Path, error: type[MedfedError], what: str) -> dict[str, Any]:
    """A TOML file's tables; ``error`` (naming ``path``) when it is not UTF-8 or not TOML."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text ({exc}); save {what} as UTF-8") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{path}: not valid TOML ({exc})") from None
