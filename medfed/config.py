"""Typed configuration: site manifests and training settings, loaded from TOML and validated.

This is the only place where dictionaries read from files become typed objects.
"""

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

from medfed.devices import DEVICES
from medfed.errors import ConfigError, ManifestError, MedfedError
from medfed.versions import check_version

# medfed.metrics (numpy, scipy, scikit-learn) is imported only where an operating rule is parsed,
# so that the command line, which imports this module, answers a mistyped option at once.
# The same text as medfed.metrics.DEFAULT_OPERATING_RULE (a test holds them equal).
DEFAULT_OPERATING_RULE = "specificity:0.90"


class Modality(StrEnum):
    FUNDUS = "fundus"
    CT = "ct"


# The on-disk layouts each modality can be read from; each names a module of medfed.data.layouts.
LAYOUTS_BY_MODALITY: dict[Modality, tuple[str, ...]] = {
    Modality.FUNDUS: ("acrima", "rimone", "refuge", "imagefolder"),
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


@dataclass(frozen=True)
class FundusPreprocess:
    """Fundus pipeline: crop to the camera field, resize, per-site normalization."""

    image_size: int = 64
    roi_crop: bool = True
    roi_threshold: float = 0.08  # fraction of max brightness that counts as inside the field
    normalize: bool = True  # per-channel mean/std from the site's own training split

    def __post_init__(self) -> None:
        if not 8 <= self.image_size <= 1024:
            raise ValueError("preprocess.image_size must be between 8 and 1024")
        if not 0.0 <= self.roi_threshold < 1.0:
            raise ValueError("preprocess.roi_threshold must be in [0, 1)")


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
    manifest_path: Path | None = None

    @property
    def n_classes(self) -> int:
        return len(set(self.labels.values()))

    def class_names(self) -> dict[int, str]:
        """Class index -> name, by index (see :func:`class_names`)."""
        return class_names(self.labels)

    def to_dict(self) -> dict[str, Any]:
        """A TOML/JSON-ready dictionary of the resolved manifest."""
        data = asdict(self)
        data["modality"] = str(self.modality)
        data["root"] = str(self.root)
        data["manifest_path"] = str(self.manifest_path) if self.manifest_path else ""
        return data


_TOP_KEYS = {
    "id", "modality", "layout", "root", "labels", "preprocess", "split", "layout_options",
    "description", "source", "acquisition", "known_shifts", "licence", "ethics",
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
    "description", "source", "acquisition", "known_shifts", "licence", "ethics",
)  # fmt: skip


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


def load_manifest(path: str | Path) -> SiteManifest:
    """Read and validate one site manifest (``sites/<id>.toml``)."""
    path = Path(path)
    if not path.is_file():
        raise ManifestError(f"{path}: manifest file not found")
    data = _read_toml(path, ManifestError, "the manifest")
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


FAULT_KINDS: tuple[str, ...] = ("raise", "nan", "shape", "timeout", "drop")
# How updates are encoded on the wire (medfed.federation.wire), with the line help shows.
WIRE_PRECISION_NOTES: dict[str, str] = {
    "float32": "exact; 4 bytes per weight",
    "float16": "half the bytes; relative error <= 2**-11",
    "int8": "a quarter of the bytes; one float32 scale per tensor",
    "int8-channel": "int8 with one scale per output channel, for rows of differing range",
}
WIRE_PRECISIONS: tuple[str, ...] = tuple(WIRE_PRECISION_NOTES)

AUGMENTATIONS: tuple[str, ...] = ("flip", "none")
"""Training-time augmentation: a random left-right flip (fundus only), or none."""

NORMALIZATIONS: tuple[str, ...] = ("site", "federation", "imagenet")
"""Each site's own training statistics, statistics pooled over the federation, or the fixed
ImageNet statistics that come with torchvision's pretrained weights (3-channel photos)."""


# How messages name a fault drill: the command-line option and the [train] setting.
_DRILL = "fault drill (--inject-fault / faults)"
_DRILLS = "fault drills (--inject-fault / faults)"


@dataclass(frozen=True)
class Fault:
    """An injected failure for resilience drills: ``ROUND:SITE:KIND``."""

    round: int
    site: str
    kind: str

    @classmethod
    def parse(cls, text: str) -> Fault:
        parts = str(text).split(":")
        ok = len(parts) == 3 and re.fullmatch(r"[0-9]+", parts[0]) is not None
        if not ok or not parts[1] or parts[2] not in FAULT_KINDS:
            raise ConfigError(
                f"{_DRILL} {text!r} must be ROUND:SITE:KIND with KIND one of "
                f"{list(FAULT_KINDS)}, e.g. 2:acrima:nan"
            )
        return cls(int(parts[0]), parts[1], parts[2])

    def __str__(self) -> str:
        return f"{self.round}:{self.site}:{self.kind}"


# Upper bounds of the training budget: far above any real run, low enough that a mistyped
# number is refused at once instead of running for years (or overflowing a counter).
DP_ACCOUNTANTS: tuple[str, ...] = ("rdp", "prv")
DP_DELTA_PER_SCAN = 0.1
"""delta defaults to this over the site's number of training scans (below 1/n)."""


@dataclass(frozen=True)
class DPSettings:
    """A run's privacy settings (``medfed train --dp-*``); ``enabled`` once a budget or a noise
    multiplier is given."""

    epsilon: float = 0.0  # the budget per site; 0: none (then noise must be given)
    delta: float = 0.0  # 0: DELTA_PER_SCAN / n at each site
    clip: float = 1.0  # per-scan gradient norm bound C
    noise: float = 0.0  # sigma; 0: the smallest that keeps the planned run within epsilon
    accountant: str = "rdp"

    @property
    def enabled(self) -> bool:
        return self.epsilon > 0 or self.noise > 0

    def delta_for(self, n_train: int) -> float:
        """The delta of a site with ``n_train`` training scans."""
        return self.delta or DP_DELTA_PER_SCAN / n_train

    def problems(self) -> list[str]:
        """What is wrong with these settings, in words (empty when they are usable)."""
        out = []
        if not 0 <= self.epsilon < math.inf:
            out.append(f"dp_epsilon (--dp-epsilon) must be a number > 0, got {self.epsilon}")
        if not 0 <= self.delta < 1:
            out.append(f"dp_delta (--dp-delta) must be in (0, 1), got {self.delta}")
        if not 0 < self.clip < math.inf:
            out.append(f"dp_clip (--dp-clip) must be a gradient norm > 0, got {self.clip}")
        if not 0 <= self.noise < math.inf:
            out.append(f"dp_noise (--dp-noise) must be a noise multiplier > 0, got {self.noise}")
        if self.accountant not in DP_ACCOUNTANTS:
            out.append(
                f"dp_accountant must be one of {list(DP_ACCOUNTANTS)}, got {self.accountant!r}"
            )
        if not self.enabled and (self.delta or self.accountant != "rdp" or self.clip != 1.0):
            out.append(
                "dp_delta, dp_clip and dp_accountant need --dp-epsilon or --dp-noise; without "
                "either, training is not differentially private"
            )
        return out


MAX_ROUNDS = 100_000
MAX_LOCAL_STEPS = 1_000_000
MAX_BATCH_SIZE = 65_536
MAX_CONCURRENCY = 256


@dataclass(frozen=True)
class TrainConfig:
    """Everything that decides a training run besides the sites themselves."""

    algorithm: str
    params: dict[str, Any] = field(default_factory=dict)
    rounds: int = 60
    local_steps: int = 3
    batch_size: int = 32
    # AdamW learns the small demo budgets far faster than SGD; "sgd" (momentum, as in the FedDRM
    # reference code) is there for long runs. Few local steps keep FedDRM's client head from
    # drifting toward "every scan is mine" between aggregations.
    optimizer: str = "adam"
    lr: float = 0.002
    momentum: float = 0.9
    weight_decay: float = 5e-4
    seed: int = 0
    backbone: str = "auto"  # GroupNorm cnn / monai3d (BatchNorm ones for FedBN, FedDRM)
    device: str = "auto"  # one of DEVICES
    # Sites of a round trained at once in one process (0: auto; see medfed.federation.lanes).
    # Results do not depend on it at equal threads per site.
    concurrency: int = 0
    client_fraction: float = 1.0
    min_sites: int = 1
    site_timeout_s: float = 0.0  # 0: no limit on one site's local work
    augment: str = "flip"  # one of AUGMENTATIONS; "flip" is used only where the modality allows
    # How every site normalizes its scans: with its own training statistics ("site"), or with
    # statistics pooled over the federation ("federation": per-channel counts, sums and sums of
    # squares travel, never images), so that a scan of unknown origin meets every model alike.
    normalization: str = "site"  # one of NORMALIZATIONS
    # Where each site's operating point sits, chosen on its validation split:
    # "specificity:0.90", "youden" or "threshold:0.5" (see medfed.metrics.OperatingRule).
    operating_point: str = DEFAULT_OPERATING_RULE
    wire_precision: str = "float32"  # one of WIRE_PRECISIONS
    wire_delta: bool = False  # send differences to the global state the site holds
    faults: tuple[str, ...] = ()
    keep_checkpoints: int = 2
    # Starting weights (--init): a finished run's folder, a safetensors or state-dict file, or
    # torchvision:resnet18 from the local hub cache; "" starts from seeded random weights.
    init: str = ""
    init_strict: bool = False  # refuse any backbone tensor the init does not provide
    # Sample-level differential privacy at every site (DP-SGD; see DPSettings): a budget
    # epsilon per site and/or a noise multiplier; 0 leaves training as it is.
    dp_epsilon: float = 0.0
    dp_delta: float = 0.0
    dp_clip: float = 1.0
    dp_noise: float = 0.0
    dp_accountant: str = "rdp"

    @property
    def dp(self) -> DPSettings:
        return DPSettings(
            self.dp_epsilon, self.dp_delta, self.dp_clip, self.dp_noise, self.dp_accountant
        )

    def __post_init__(self) -> None:
        # Comparisons are false for NaN, so a NaN fails each range check below.
        checks = [
            (
                1 <= self.rounds <= MAX_ROUNDS,
                f"rounds (--rounds) must be between 1 and {MAX_ROUNDS}, got {self.rounds}",
            ),
            (
                1 <= self.local_steps <= MAX_LOCAL_STEPS,
                f"local_steps (--local-steps) must be >= 1 and at most {MAX_LOCAL_STEPS}, "
                f"got {self.local_steps}",
            ),
            (
                1 <= self.batch_size <= MAX_BATCH_SIZE,
                f"batch_size (--batch-size) must be >= 1 and at most {MAX_BATCH_SIZE}, "
                f"got {self.batch_size}",
            ),
            (0 < self.lr < math.inf, f"lr (--lr) must be a number > 0, got {self.lr}"),
            (self.optimizer in ("sgd", "adam"), "optimizer (--optimizer) must be sgd or adam"),
            (0 <= self.momentum < 1, "momentum must be in [0, 1)"),
            (0 <= self.weight_decay < math.inf, "weight_decay must be a number >= 0"),
            (self.device in DEVICES, f"device (--device) must be one of {list(DEVICES)}"),
            (
                0 <= self.concurrency <= MAX_CONCURRENCY,
                f"concurrency (--concurrency) must be 0 (auto) or a number of sites from 1 to "
                f"{MAX_CONCURRENCY}, got {self.concurrency}",
            ),
            (
                0 < self.client_fraction <= 1,
                "client_fraction (--client-fraction) must be in (0, 1], "
                f"got {self.client_fraction}",
            ),
            (self.min_sites >= 1, "min_sites (--min-sites) must be >= 1"),
            (0 <= self.seed < 2**63, f"seed (--seed) must be an integer >= 0, got {self.seed}"),
            (
                0 <= self.site_timeout_s < math.inf,
                "site_timeout_s (--site-timeout) must be a number of seconds >= 0 (0: no limit)",
            ),
            (self.keep_checkpoints >= 1, "keep_checkpoints must be >= 1"),
            (
                self.wire_precision in WIRE_PRECISIONS,
                f"wire_precision must be one of {list(WIRE_PRECISIONS)} (--wire-precision)",
            ),
            (
                self.augment in AUGMENTATIONS,
                f"augment must be one of {list(AUGMENTATIONS)} (--augment)",
            ),
            (
                self.normalization in NORMALIZATIONS,
                f"normalization must be one of {list(NORMALIZATIONS)} (--normalization)",
            ),
        ]
        checks += [(False, problem) for problem in self.dp.problems()]
        for ok, message in checks:
            if not ok:
                raise ConfigError(f"training setting: {message}")
        if self.init_strict and not self.init:
            raise ConfigError(
                "training setting: init_strict (--init-strict) needs starting weights; "
                "pass --init SOURCE or drop --init-strict"
            )
        self._check_fault_rounds()
        if self.backbone != "auto":
            from medfed.models.backbones import BACKBONES

            if self.backbone not in BACKBONES:
                raise ConfigError(
                    f"training setting: backbone (--backbone) {self.backbone!r} is not one of "
                    f"{['auto', *BACKBONES]}"
                )
        from medfed.metrics import OperatingRule

        try:
            rule = OperatingRule.parse(self.operating_point)
        except ValueError as exc:
            raise ConfigError(
                f"training setting operating_point (--operating-point): {exc}"
            ) from None
        # One spelling per rule ("specificity:0.9" is recorded as "specificity:0.90").
        object.__setattr__(self, "operating_point", str(rule))

    def _check_fault_rounds(self) -> None:
        """Each drill parses, names a round of the run, and no two share a round and site."""
        seen: dict[tuple[int, str], str] = {}
        for text in self.faults:
            fault = Fault.parse(text)
            if not 1 <= fault.round <= self.rounds:
                raise ConfigError(
                    f"{_DRILL} {text!r} names round {fault.round}, outside "
                    f"1..{self.rounds} (--rounds); it would never fire"
                )
            key = (fault.round, fault.site)
            if key in seen:
                raise ConfigError(
                    f"{_DRILLS} {seen[key]!r} and {text!r} both name round "
                    f"{fault.round} of site {fault.site!r}; give one drill per site and round"
                )
            seen[key] = text
        if self.faults and self.client_fraction < 1:
            raise ConfigError(
                f"{_DRILLS} {list(self.faults)} may never fire with "
                f"client_fraction (--client-fraction) {self.client_fraction}: a site not "
                "sampled in a round is not drilled; use --client-fraction 1 for drills"
            )

    def check_faults(self, site_ids: list[str], *, communicates: bool = True) -> None:
        """Refuse a drill that could not fire in this federation: a site it does not hold, or
        a corrupted update ('nan', 'shape') where the algorithm sends no update."""
        for fault in map(Fault.parse, self.faults):
            if fault.site not in site_ids:
                raise ConfigError(
                    f"{_DRILL} '{fault}' names site {fault.site!r}, which is not "
                    f"in the federation (its sites: {list(site_ids)})"
                )
            if fault.kind in ("nan", "shape") and not communicates:
                raise ConfigError(
                    f"{_DRILL} '{fault}': algorithm {self.algorithm!r} sends no "
                    f"update, so a {fault.kind!r} drill cannot fire; use raise, timeout or drop"
                )

    @property
    def fault_plan(self) -> dict[tuple[int, str], str]:
        return {(f.round, f.site): f.kind for f in map(Fault.parse, self.faults)}

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["faults"] = list(self.faults)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str) -> TrainConfig:
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise ConfigError(
                f"{where}: unknown training setting(s) {sorted(unknown)}; known: {sorted(known)}"
            )
        if "algorithm" not in data:
            raise ConfigError(f'{where}: no algorithm; set algorithm = "NAME" (e.g. feddrm)')
        for name, value in data.items():
            if not (name == "augment" and isinstance(value, bool)):
                _check_setting_type(name, value, cls.__dataclass_fields__[name].type, where)
        values = dict(data)
        if isinstance(values.get("augment"), bool):  # written as true/false before "none"/"flip"
            values["augment"] = "flip" if values["augment"] else "none"
        if "faults" in values:
            values["faults"] = tuple(values["faults"])
        try:
            return cls(**values)
        except (ConfigError, TypeError) as exc:
            raise ConfigError(f"{where}: {exc}") from None


# Field annotations (strings under ``from __future__ import annotations``) -> accepted types.
_SETTING_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "int": ((int,), "an integer"),
    "float": ((int, float), "a number"),
    "str": ((str,), "a string"),
    "bool": ((bool,), "true or false"),
    "dict[str, Any]": ((dict,), "a table"),
    "tuple[str, ...]": ((list, tuple), "a list of strings"),
}


def _check_setting_type(name: str, value: Any, annotation: Any, where: str) -> None:
    """A file's value of the wrong type is named here, not as a comparison error later."""
    if str(annotation) not in _SETTING_TYPES:
        return
    kinds, expected = _SETTING_TYPES[str(annotation)]
    ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
    if ok and isinstance(value, list | tuple):
        ok = all(isinstance(v, str) for v in value)
    if not ok:
        raise ConfigError(f"{where}: training setting {name} must be {expected}, got {value!r}")


# Top-level keys of a run's config.toml (schema_version is the run directory's, see medfed.runs).
# ``init`` is the report of the starting weights (--init): what was loaded, skipped, left random.
RUN_CONFIG_KEYS: tuple[str, ...] = (
    "schema_version",
    "medfed_version",
    "train",
    "model",
    "sites",
    "init",
)


@dataclass(frozen=True)
class RunConfigFile:
    """What ``medfed train --config`` reads: a run's config.toml, or a TOML with a [train] table.

    ``train`` holds only the settings the file sets (options given on the command line override
    them, TrainConfig's defaults fill the rest); ``sites`` are the resolved manifests it lists.
    """

    path: Path
    train: dict[str, Any]
    sites: list[dict[str, Any]]
    medfed_version: str | None = None


def _read_toml(path: Path, error: type[MedfedError], what: str) -> dict[str, Any]:
    """A TOML file's tables; ``error`` (naming ``path``) when it is not UTF-8 or not TOML."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text ({exc}); save {what} as UTF-8") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{path}: not valid TOML ({exc})") from None


def load_run_config(path: str | Path) -> RunConfigFile:
    """Read and check a run configuration file; every problem names the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"{path}: no such file; give a run directory's config.toml or a TOML file "
            "with a [train] table"
        )
    data = _read_toml(path, ConfigError, "it")
    check_version(data, str(path))
    unknown = set(data) - set(RUN_CONFIG_KEYS)
    if unknown:
        raise ConfigError(
            f"{path}: unknown top-level key(s) {sorted(unknown)}; training settings go in a "
            f"[train] table (a run's config.toml holds {list(RUN_CONFIG_KEYS)})"
        )
    train = data.get("train")
    if not isinstance(train, dict):
        raise ConfigError(
            f"{path}: no [train] table; write the training settings under [train], "
            "as in a run directory's config.toml"
        )
    known = set(TrainConfig.__dataclass_fields__)
    unknown = set(train) - known
    if unknown:
        raise ConfigError(
            f"{path}: unknown setting(s) {sorted(unknown)} in [train]; known: {sorted(known)}"
        )
    sites = data.get("sites", [])
    if not isinstance(sites, list) or not all(isinstance(s, dict) for s in sites):
        raise ConfigError(f"{path}: 'sites' must be [[sites]] tables (resolved site manifests)")
    version = data.get("medfed_version")
    return RunConfigFile(path, dict(train), list(sites), str(version) if version else None)


def merge_train_settings(
    stored: dict[str, Any], given: dict[str, Any], *, where: str | None = None
) -> TrainConfig:
    """Stored settings (a file's [train] table) overridden by those ``given`` (command-line
    options); TrainConfig's defaults fill what neither sets.

    Given ``params`` merge over the stored ones; when the algorithm changes, the stored params
    are dropped, since they were another algorithm's.
    """
    values = dict(stored)
    extra = dict(given)
    params = extra.pop("params", None) or {}
    changed = (
        "algorithm" in extra
        and str(extra["algorithm"]).lower() != str(values.get("algorithm", "")).lower()
    )
    if changed:
        values.pop("params", None)
    values |= extra
    values["params"] = {**(values.get("params") or {}), **params}
    if "algorithm" not in values:
        raise ConfigError(
            f"{where or 'medfed train'}: no algorithm; pass --algorithm NAME"
            + (" or set algorithm in the file's [train] table" if where else "")
        )
    if where is None:
        return TrainConfig(**values)
    return TrainConfig.from_dict(values, where=where)
