"""Typed configuration: training settings and run configuration files, loaded from TOML and
validated; site manifests come from :mod:`medfed.core.manifest` and are named here too.

This is the only place where dictionaries read from files become typed objects.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from medfed.core.devices import DEVICES, PRECISIONS
from medfed.core.errors import ConfigError
from medfed.core.manifest import (  # noqa: F401  (medfed.config names the manifests too)
    CT_HU_RANGE,
    CT_MAX_VOXELS,
    CT_SHAPE_RANGE,
    CT_SPACING_RANGE_MM,
    LAYOUTS_BY_MODALITY,
    PREPROCESS_BY_MODALITY,
    SITE_ID_MAX_LENGTH,
    SITE_ID_PATTERN,
    CTPreprocess,
    FundusPreprocess,
    Modality,
    PreprocessOptions,
    SiteManifest,
    SplitOptions,
    class_names,
    expand_env,
    load_manifest,
    load_manifests,
    parse_manifest,
    read_toml,
    valid_site_id,
)
from medfed.core.operating_rule import DEFAULT_OPERATING_RULE, OperatingRule
from medfed.core.versions import check_version

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


# Opacus finds the noise for a budget to within 0.01 of epsilon: a smaller budget is not held.
DP_MIN_EPSILON = 0.01
# Settings whose 0 means "none" or "the default": given on the command line, a 0 (or a number
# so small that it reads as 0) would quietly mean no privacy, or another delta than the one given.
DP_ZERO_MEANS = {
    "dp_epsilon": "no privacy budget",
    "dp_delta": "the default delta (0.1 / each site's n train)",
    "dp_noise": "no noise multiplier",
}


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
        elif 0 < self.epsilon < DP_MIN_EPSILON:
            out.append(
                f"dp_epsilon (--dp-epsilon) {self.epsilon:g} is below {DP_MIN_EPSILON}, the "
                "precision the noise is searched to: the run could spend several times the "
                f"budget given; give an epsilon of at least {DP_MIN_EPSILON}"
            )
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
MAX_UNFREEZE_BLOCKS = 32  # more than any torchvision backbone has; each backbone checks its own


# Bounds a setting may declare, and the test its value must pass; comparisons are false for NaN,
# so a NaN fails each range check.
SETTING_BOUNDS: dict[str, Callable[[Any, Any], bool]] = {
    "min": lambda value, bound: bound <= value,
    "above": lambda value, bound: bound < value,
    "max": lambda value, bound: value <= bound,
    "below": lambda value, bound: value < bound,
    "choices": lambda value, bound: value in bound,
}


def setting(
    default: Any = MISSING,
    *,
    help: str,
    option: str | None,
    factory: Callable[[], Any] | None = None,
    problem: str = "",
    **bounds: Any,
) -> Any:
    """A training setting, declared once: its default; its help, where ``{default}`` marks the
    place help shows the default and ``{config}`` the option naming a settings file; the
    command-line option that sets it (None: a settings file only); the bounds its value keeps
    (min, max inclusive; above, below exclusive; choices) and the ``problem`` that refuses a
    value outside them, with ``{setting}``, ``{value}`` and the bounds' names as placeholders."""
    unknown = set(bounds) - set(SETTING_BOUNDS)
    if unknown or bool(bounds) != bool(problem):
        raise TypeError(
            f"setting: bounds {sorted(bounds)} need a problem text; known bounds: "
            f"{list(SETTING_BOUNDS)}"
        )
    metadata = {"help": help, "option": option, "problem": problem, "bounds": bounds}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def setting_problems(config: Any) -> list[str]:
    """What each of a settings dataclass's values breaks of its declared bounds, in words."""
    out = []
    for spec in fields(config):
        bounds = spec.metadata.get("bounds", {})
        value = getattr(config, spec.name)
        if value is None and spec.default is None:  # left for the run's plan to decide
            continue
        if all([SETTING_BOUNDS[kind](value, bound) for kind, bound in bounds.items()]):
            continue
        option = spec.metadata["option"]
        words = {"setting": f"{spec.name} ({option})" if option else spec.name, "value": value}
        words |= {k: list(b) if k == "choices" else b for k, b in bounds.items()}
        out.append(spec.metadata["problem"].format_map(words))
    return out


@dataclass(frozen=True)
class TrainConfig:
    """Everything that decides a training run besides the sites themselves."""

    algorithm: str = setting(
        help="Algorithm (listed below); required without {config}.", option="--algorithm"
    )
    params: dict[str, Any] = setting(
        factory=dict,
        help="Algorithm parameter NAME=VALUE (repeatable; merged over {config}'s params).",
        option="--param",
    )
    rounds: int = setting(
        60,
        help="Communication rounds {default}.",
        option="--rounds",
        min=1,
        max=MAX_ROUNDS,
        problem="{setting} must be between 1 and {max}, got {value}",
    )
    local_steps: int = setting(
        3,
        help="Local optimizer steps per round {default}.",
        option="--local-steps",
        min=1,
        max=MAX_LOCAL_STEPS,
        problem="{setting} must be >= 1 and at most {max}, got {value}",
    )
    batch_size: int = setting(
        32,
        help="Local minibatch size {default}.",
        option="--batch-size",
        min=1,
        max=MAX_BATCH_SIZE,
        problem="{setting} must be >= 1 and at most {max}, got {value}",
    )
    # AdamW learns the small demo budgets far faster than SGD; "sgd" (momentum, as in the FedDRM
    # reference code) is there for long runs. Few local steps keep FedDRM's client head from
    # drifting toward "every scan is mine" between aggregations.
    optimizer: str = setting(
        "adam",
        help="adam (AdamW) or sgd (momentum 0.9) {default}.",
        option="--optimizer",
        choices=("sgd", "adam"),
        problem="{setting} must be sgd or adam",
    )
    # None: the sites' modality decides it when the run is planned (medfed.federation.plan); a
    # settings file or plan without ``lr`` means the same.
    lr: float | None = setting(
        None,
        help="Initial learning rate, cosine decay (default: the modality's, 0.002 for fundus, "
        "0.0003 for CT).",
        option="--lr",
        above=0,
        below=math.inf,
        problem="{setting} must be a number > 0, got {value}",
    )
    momentum: float = setting(
        0.9,
        help="SGD's momentum {default}.",
        option=None,
        min=0,
        below=1,
        problem="{setting} must be in [0, 1)",
    )
    weight_decay: float = setting(
        5e-4,
        help="The optimizer's weight decay {default}.",
        option=None,
        min=0,
        below=math.inf,
        problem="{setting} must be a number >= 0",
    )
    seed: int = setting(
        0,
        help="Random seed {default}.",
        option="--seed",
        min=0,
        below=2**63,
        problem="{setting} must be an integer >= 0, got {value}",
    )
    # GroupNorm cnn / monai3d (BatchNorm ones for FedBN, FedDRM)
    backbone: str = setting("auto", help="Backbone (listed below) {default}.", option="--backbone")
    device: str = setting(
        "auto",
        help=f"{', '.join(DEVICES)} {{default}}.",
        option="--device",
        choices=DEVICES,
        problem="{setting} must be one of {choices}",
    )
    precision: str = setting(
        "auto",
        help="Local training's number format: auto (bf16 where the device has it, fp16 with a "
        "gradient scaler on a CUDA device without bf16, float32 on the CPU), bf16, fp16 or "
        "fp32 {default}.",
        option="--precision",
        choices=PRECISIONS,
        problem="{setting} must be one of {choices}, got {value!r}",
    )
    compile: bool = setting(
        False,
        help="Compile the model for local training with torch.compile (eager, with the reason "
        "logged, where it cannot) {default}.",
        option="--compile",
    )
    # Results do not depend on it at equal threads per site (see medfed.federation.lanes).
    concurrency: int = setting(
        0,
        help="Sites trained at once in this process, the cores divided between them (CPU) or "
        "on their own CUDA streams; 0: auto (every site of the round at once for 2-D scans on a "
        "CPU of 2+ cores; one by one for CT volumes and on a GPU); 1: one by one.",
        option="--concurrency",
        min=0,
        max=MAX_CONCURRENCY,
        problem="{setting} must be 0 (auto) or a number of sites from 1 to {max}, got {value}",
    )
    client_fraction: float = setting(
        1.0,
        help="Share of sites per round {default}.",
        option="--client-fraction",
        above=0,
        max=1,
        problem="{setting} must be in (0, 1], got {value}",
    )
    min_sites: int = setting(
        1,
        help="Fewest usable updates to aggregate {default}.",
        option="--min-sites",
        min=1,
        problem="{setting} must be >= 1",
    )
    site_timeout_s: float = setting(
        0.0,
        help="Seconds per site per round, 0: none {default}.",
        option="--site-timeout",
        min=0,
        below=math.inf,
        problem="{setting} must be a number of seconds >= 0 (0: no limit)",
    )
    # "flip" is used only where the modality allows.
    augment: str = setting(
        "flip",
        help="Training augmentation: flip (left-right, fundus only) or none {default}.",
        option="--augment",
        choices=AUGMENTATIONS,
        problem="augment must be one of {choices} (--augment)",
    )
    # Pooled statistics ("federation": per-channel counts, sums and sums of squares travel,
    # never images) let a scan of unknown origin meet every model alike.
    normalization: str = setting(
        "site",
        help="site (each site's own training statistics), federation (statistics pooled over "
        "the sites: counts and sums travel, never scans) or imagenet (fixed, for ImageNet "
        "weights) {default}.",
        option="--normalization",
        choices=NORMALIZATIONS,
        problem="normalization must be one of {choices} (--normalization)",
    )
    # Parsed by medfed.metrics.OperatingRule.
    operating_point: str = setting(
        DEFAULT_OPERATING_RULE,
        help="Each site's threshold, chosen on its validation split: specificity:0.90, youden "
        "or threshold:0.5 {default}.",
        option="--operating-point",
    )
    wire_precision: str = setting(
        "float32",
        help="Update encoding (listed below) {default}.",
        option="--wire-precision",
        choices=WIRE_PRECISIONS,
        problem="wire_precision must be one of {choices} (--wire-precision)",
    )
    wire_delta: bool = setting(
        False,
        help="Send differences to the global state each site holds {default}.",
        option="--wire-delta",
    )
    faults: tuple[str, ...] = setting(
        (),
        help=f"Resilience drill ROUND:SITE:KIND, KIND one of {', '.join(FAULT_KINDS)} "
        "(repeatable).",
        option="--inject-fault",
    )
    keep_checkpoints: int = setting(
        2,
        help="Round checkpoints kept in the run directory, the newest {default}.",
        option=None,
        min=1,
        problem="{setting} must be >= 1",
    )
    # "" starts from seeded random weights.
    init: str = setting(
        "",
        help="Starting weights: a finished run's folder (its global weights), a .safetensors or "
        "state-dict file (.pt/.pth, tensors only), or torchvision:resnet18 from the local torch "
        "hub cache (never downloaded); default: seeded random.",
        option="--init",
    )
    init_strict: bool = setting(
        False,
        help="Refuse to start when --init leaves any backbone tensor unloaded.",
        option="--init-strict",
    )
    # The frozen-encoder mode (medfed.models.encoder): the pretrained backbone runs once per
    # scan, its features are cached, and only what sits on them trains.
    frozen_encoder: bool = setting(
        False,
        help="Freeze the pretrained backbone given by --init (a torchvision ImageNet file): its "
        "features are computed once per scan and cached, and only the trunk and heads on them "
        "train (a CPU can afford it).",
        option="--frozen-encoder",
    )
    unfreeze_blocks: int = setting(
        0,
        help="With --frozen-encoder: the backbone's last N blocks train too (the features are "
        "then cached before them) {default}.",
        option="--unfreeze-blocks",
        min=0,
        max=MAX_UNFREEZE_BLOCKS,
        problem="{setting} must be a number of blocks from 0 to {max}, got {value}",
    )
    # Sample-level differential privacy at every site (DP-SGD); DPSettings checks the values.
    dp_epsilon: float = setting(
        0.0,
        help="Differential privacy: each site's budget epsilon (DP-SGD through Opacus; the noise "
        "is set to spend it over the planned run, and a site stops before it would overspend).",
        option="--dp-epsilon",
    )
    dp_delta: float = setting(
        0.0,
        help="Differential privacy: delta (default: 0.1 / each site's n train).",
        option="--dp-delta",
    )
    dp_clip: float = setting(
        1.0,
        help="Differential privacy: per-scan gradient norm bound {default}.",
        option="--dp-clip",
    )
    dp_noise: float = setting(
        0.0,
        help="Differential privacy: noise multiplier sigma (default: from --dp-epsilon); with "
        "--dp-epsilon too, sites stop once their budget is spent.",
        option="--dp-noise",
    )
    dp_accountant: str = setting(
        "rdp",
        help="Differential privacy: rdp or prv {default}.",
        option="--dp-accountant",
    )

    @property
    def dp(self) -> DPSettings:
        return DPSettings(
            self.dp_epsilon, self.dp_delta, self.dp_clip, self.dp_noise, self.dp_accountant
        )

    def __post_init__(self) -> None:
        problems = [*setting_problems(self), *self.dp.problems()]
        if problems:
            raise ConfigError(f"training setting: {problems[0]}")
        if self.unfreeze_blocks and not self.frozen_encoder:
            raise ConfigError(
                "training setting: unfreeze_blocks (--unfreeze-blocks) is for the frozen "
                "encoder; add --frozen-encoder or drop --unfreeze-blocks"
            )
        if self.frozen_encoder and not self.init:
            raise ConfigError(
                "training setting: frozen_encoder (--frozen-encoder) freezes pretrained "
                "weights; pass them with --init (e.g. --init torchvision:mobilenet_v2)"
            )
        if self.init_strict and not self.init:
            raise ConfigError(
                "training setting: init_strict (--init-strict) needs starting weights; "
                "pass --init SOURCE or drop --init-strict"
            )
        self._check_fault_rounds()
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
        """The settings as a file holds them; one left for the plan (None) is left out."""
        data = {k: v for k, v in asdict(self).items() if v is not None}
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
    "float | None": ((int, float), "a number"),
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
    "tracking",  # where the run is logged (medfed.tracking): uri, experiment, register
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


def load_run_config(path: str | Path) -> RunConfigFile:
    """Read and check a run configuration file; every problem names the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"{path}: no such file; give a run directory's config.toml or a TOML file "
            "with a [train] table"
        )
    data = read_toml(path, ConfigError, "it")
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
    for name, meaning in DP_ZERO_MEANS.items():
        value = given.get(name)
        if value is not None and not value > 0:
            option = "--" + name.replace("_", "-")
            raise ConfigError(
                f"{option} {value!r}: {name} must be a number > 0 ({value!r} would mean "
                f"{meaning}); leave {option} out for that"
            )
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


def count_from_env(name: str, what: str, hint: str = "") -> int | None:
    """The whole number, 1 or more, that environment variable ``name`` sets (None when it is
    unset or blank); anything else is a ConfigError naming the variable and ``what`` it counts."""
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"{name}={text!r}: give a whole number of {what}, 1 or more{hint}")
    return int(text)
