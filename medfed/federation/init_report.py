"""What starting weights did to a model (:class:`InitReport`), in the run's config.toml and in
words; the names of the sources and formats it speaks of."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

from medfed.core.errors import ConfigError
from medfed.core.normalization import IMAGENET_MEAN, IMAGENET_STD

KINDS = ("run", "safetensors", "state_dict", "torchvision")
TORCHVISION_FORMATS = (
    "torchvision-resnet",
    "torchvision-densenet",
    "torchvision-efficientnet",
    "torchvision-mobilenet",
)
FORMATS = ("medfed", *TORCHVISION_FORMATS, "medicalnet", "backbone")
FORMAT_NAMES = {
    "medfed": "medfed weights",
    "torchvision-resnet": "torchvision ResNet",
    "torchvision-densenet": "torchvision DenseNet",
    "torchvision-efficientnet": "torchvision EfficientNet",
    "torchvision-mobilenet": "torchvision MobileNetV2",
    "medicalnet": "MedicalNet 3-D ResNet",
    "backbone": "backbone weights",
}
FEW = 3  # names shown per list in messages and summaries

State = dict[str, torch.Tensor]


def is_adapter_key(key: str) -> bool:
    """A LoRA adapter tensor (PEFT names them ``<layer>.lora_A.<adapter>.weight`` and alike)."""
    return any(part.startswith("lora_") for part in key.split("."))


# ----------------------------------------------------------------------------- the report
@dataclass
class InitReport:
    """What starting weights did to a model. Plain data: the loaded tensors themselves stay in
    the model (:meth:`loaded_state` reads them back), so the report goes into a run's config."""

    source: str  # what the user gave
    kind: str  # one of KINDS
    file: str  # the weights file read
    format: str  # one of FORMATS
    sha256: str  # state_sha256 of the loaded tensors, under the model's names
    loaded: list[str]  # model keys that got a tensor
    skipped: list[dict[str, str]]  # {"key": source key, "reason": why}
    random: list[str]  # model keys left at their seeded init (LoRA adapters excepted)
    # LoRA adapter keys of the model, never in ``random``: they start fresh unless a medfed
    # source holds adapters of the same names (those are in ``loaded``)
    adapters: int
    weights_normalization: str  # "imagenet" when the weights expect ImageNet mean/std inputs
    # tensors of the file that went into the frozen encoder (--frozen-encoder), not the model
    encoder: int = 0
    # a torchvision file's bytes against the hash in its name (torchvision_hash_check)
    hash_check: str = ""

    def loaded_state(self, model: nn.Module) -> State:
        """The model's tensors under the loaded keys: what was loaded, until training changes
        them (``state_sha256(report.loaded_state(model)) == report.sha256`` right after)."""
        state = model.state_dict()
        return {k: state[k] for k in self.loaded}

    def to_dict(self) -> dict[str, Any]:
        """TOML-safe: strings, an integer, lists of strings and of string tables."""
        skipped = [{"key": s["key"], "reason": s["reason"]} for s in self.skipped]
        return asdict(self) | {"skipped": skipped}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "init report") -> InitReport:
        """Inverse of :meth:`to_dict`; every field must be present with its type."""
        names = {f.name for f in fields(cls)}
        # runs written before the frozen-encoder mode record no "encoder" count
        unknown, missing = set(data) - names, names - set(data) - {"encoder", "hash_check"}
        if unknown or missing:
            raise ConfigError(
                f"{where}: unknown field(s) {sorted(unknown)}, missing field(s) {sorted(missing)}"
            )
        for name in ("source", "kind", "file", "format", "sha256", "weights_normalization"):
            _expect(where, name, data[name], isinstance(data[name], str), "a string")
        check = data.get("hash_check", "")
        _expect(where, "hash_check", check, isinstance(check, str), "a string")
        _expect(where, "kind", data["kind"], data["kind"] in KINDS, f"one of {list(KINDS)}")
        _expect(where, "format", data["format"], data["format"] in FORMATS, f"one of {FORMATS}")
        for name in ("loaded", "random"):
            value = data[name]
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
            _expect(where, name, value, ok, "a list of strings")
        skipped = data["skipped"]
        ok = isinstance(skipped, list) and all(
            isinstance(s, Mapping)
            and set(s) == {"key", "reason"}
            and all(isinstance(v, str) for v in s.values())
            for s in skipped
        )
        _expect(where, "skipped", skipped, ok, 'a list of {key = "...", reason = "..."} tables')
        for name in ("adapters", "encoder"):
            count = data.get(name, 0)
            ok = isinstance(count, int) and not isinstance(count, bool) and count >= 0
            _expect(where, name, count, ok, "a whole number >= 0")
        return cls(**{**data, "skipped": [dict(s) for s in skipped]})

    def lines(self) -> list[str]:
        """A short human summary: counts and the first few names of each list."""
        what = FORMAT_NAMES.get(self.format, self.format)
        if self.kind == "run":
            what = f"the global weights of medfed run {self.source}"
        into = " into the trained part" if self.encoder else ""
        out = [f"loaded {len(self.loaded)} tensors{into} from {self.file} ({what})"]
        if self.skipped:
            out.append(f"skipped {len(self.skipped)}: {_by_reason(self.skipped)}")
        if self.random:
            groups = _count_by_module(self.random)
            out.append(
                f"left random: {len(self.random)} ({groups}): "
                f"{', '.join(self.random[:FEW])}{_more(self.random)}"
            )
        else:
            out.append("left random: 0")
        if self.adapters:
            fresh = self.adapters - sum(1 for k in self.loaded if is_adapter_key(k))
            out.append(f"LoRA adapters: {fresh} of {self.adapters} tensors start fresh")
        if self.hash_check:
            out.append(f"{Path(self.file).name}: {self.hash_check}")
        if self.encoder:
            out.append(
                f"frozen encoder: {self.encoder} tensors of the file (its features are computed "
                "once per scan and cached; they do not train)"
            )
        if self.weights_normalization == "imagenet":
            out.append(
                "these weights expect inputs normalized with ImageNet's mean and std "
                f"(mean {list(IMAGENET_MEAN)}, std {list(IMAGENET_STD)})"
            )
        return out


def _expect(where: str, name: str, value: Any, ok: bool, expected: str) -> None:
    if not ok:
        raise ConfigError(f"{where}: {name} must be {expected}, got {value!r}")


def _more(items: list[Any]) -> str:
    return f", ... (+{len(items) - FEW} more)" if len(items) > FEW else ""


def _by_reason(skipped: list[dict[str, str]]) -> str:
    """The first few reasons, each with the first few keys it applies to."""
    groups: dict[str, list[str]] = {}
    for entry in skipped:
        groups.setdefault(entry["reason"], []).append(entry["key"])
    parts = [f"{', '.join(keys[:FEW])}{_more(keys)} ({reason})" for reason, keys in groups.items()]
    rest = len(parts) - FEW
    return "; ".join(parts[:FEW]) + (f"; and {rest} more reason(s)" if rest > 0 else "")


def _count_by_module(keys: Iterable[str]) -> str:
    counts: dict[str, int] = {}
    for key in keys:
        top = key.split(".", 1)[0]
        counts[top] = counts.get(top, 0) + 1
    return ", ".join(f"{name} {n}" for name, n in counts.items())
