"""Starting weights (``medfed train --init SOURCE``): read them, map them onto a fresh model, and
report what was loaded, what was skipped and why, and what keeps its seeded random start.

Sources (:func:`resolve_init`):

- a finished medfed run's folder: the shared (global) weights of its last checkpoint;
- a ``.safetensors`` file, or a PyTorch state-dict file (``.pt``, ``.pth``, ``.bin``) read with
  ``weights_only=True`` (a file holding other Python objects is refused, never unpickled);
- ``torchvision:resnet18`` (and resnet34, resnet50, densenet121, efficientnet_b0,
  mobilenet_v2): the ImageNet weights torchvision keeps in its local hub cache
  (``$TORCH_HOME/hub/checkpoints``), or the same file given by path; whether its bytes match
  the hash in its name is reported (a SuperNode's frozen encoder requires it); nothing is ever
  downloaded.

Formats, told apart by the tensor names (:func:`read_init`): ``medfed`` (medfed's own names),
``torchvision-resnet``, ``torchvision-densenet``, ``torchvision-efficientnet`` and
``torchvision-mobilenet`` (torchvision's
networks: into the torchvision-shaped ``tv-*`` backbones under their own names, tensor for
tensor; a ResNet-18 also into medfed's small ResNet-18, renamed), ``medicalnet`` (a
MONAI/MedicalNet 3-D ResNet, usually saved from ``DataParallel`` with a ``module.`` prefix) and
``backbone`` (the model's backbone names without the ``backbone.`` prefix). :func:`apply_init`
renames each tensor into medfed's names, refuses what does not fit (shape, BatchNorm meeting
GroupNorm, a head of another task) with a reason per tensor, and loads the rest with
``load_state_dict(strict=True)`` over the model's own state, so torch drops nothing silently.
LoRA adapters always start fresh unless the source is a medfed model with adapters of the same
names.
"""

from __future__ import annotations

import hashlib
import pickle
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from medfed.core.errors import ConfigError, RunDirError
from medfed.federation.init_report import (
    FEW,
    FORMAT_NAMES,
    KINDS,
    TORCHVISION_FORMATS,
    InitReport,
    is_adapter_key,
)
from medfed.models.fedmodel import NORM_TYPES, SUBMODULES, FedModel
from medfed.models.torchvision_nets import TV_BACKBONES, TV_NETS
from medfed.runs import RunDir
from medfed.runs.checkpoints import ROUND_DIR, CheckpointStore
from medfed.runs.rundir import sha256 as file_sha256
from medfed.runs.weights import check_finite

# torchvision:NAME -> (weights enum in torchvision.models, member); the file is the enum's url.
TORCHVISION_WEIGHTS = {net.constructor: net.weights for net in TV_NETS.values()}
# Which medfed backbones a foreign format can start.
FORMAT_BACKBONES = {
    # The 2.5-D ones hold the same ResNet-18 under the same names, applied to every CT slice.
    "torchvision-resnet": (
        "resnet18-bn",
        "resnet18-gn",
        "slices-resnet18-bn",
        "slices-resnet18-gn",
        *(n for n in TV_BACKBONES if n.startswith("tv-resnet")),
    ),
    "torchvision-densenet": tuple(n for n in TV_BACKBONES if n.startswith("tv-densenet")),
    "torchvision-efficientnet": tuple(n for n in TV_BACKBONES if n.startswith("tv-efficientnet")),
    "torchvision-mobilenet": tuple(n for n in TV_BACKBONES if n.startswith("tv-mobilenet")),
    "medicalnet": ("monai3d", "monai3d-gn"),
}
MEDFED_PREFIXES = tuple(f"{name}." for name in (*SUBMODULES, "vaes"))
STATE_DICT_ENTRIES = ("state_dict", "model")  # where checkpoints nest their weights
INIT_ACCEPTS = (
    "a finished medfed run's folder, a .safetensors file, a PyTorch state-dict file "
    f"(.pt, .pth, .bin) or {', '.join(f'torchvision:{n}' for n in TORCHVISION_WEIGHTS)}"
)
SAVE_HINT = (
    "save only the weights, e.g. torch.save(model.state_dict(), 'weights.pt') or "
    "safetensors.torch.save_file(model.state_dict(), 'weights.safetensors')"
)
STRICT_FLAG = "--init-strict"
STEM_KEY = "backbone.stem.0.weight"
STEM_HINT = (
    "; torchvision's stem is a 7x7 stride-2 conv for 224-pixel images, medfed's ResNet-18 stem "
    "a 3x3 stride-1 one for 32-128 pixel images"
)
BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)

State = dict[str, torch.Tensor]


# ----------------------------------------------------------------------------- sources
@dataclass(frozen=True)
class InitSource:
    """Where starting weights come from."""

    given: str  # the text the user gave
    kind: str  # one of KINDS
    path: Path  # the file read (for "run": the run directory)
    file: Path  # the weights file read (for "run": its last checkpoint's global.safetensors)


def resolve_init(text: str) -> InitSource:
    """Recognise ``text`` as a run folder, a weights file or ``torchvision:NAME``; check it is
    usable without reading the weights."""
    given = text
    text = text.strip()
    if not text:
        raise ConfigError(f"--init: no starting weights given; pass {INIT_ACCEPTS}")
    if text.lower().startswith("torchvision:"):
        file = _torchvision_file(text)
        return InitSource(given, "torchvision", file, file)
    path = Path(text).expanduser()
    if path.is_dir():
        return InitSource(given, "run", path, _check_finished_run(path) / "global.safetensors")
    if path.is_file():
        kind = "safetensors" if path.suffix.lower() == ".safetensors" else "state_dict"
        return InitSource(given, kind, path, path)
    if path.exists():
        raise ConfigError(f"--init {path}: not a regular file or folder; pass {INIT_ACCEPTS}")
    raise ConfigError(f"--init {path}: no such file or folder; pass {INIT_ACCEPTS}")


def starting_sha256(init: str) -> str:
    """The sha256 of the starting weights file ``init`` names ("" for a random start): what a
    deployed run's plan records and each site approves (:mod:`medfed.governance.plan`)."""
    if not init:
        return ""
    return file_sha256(resolve_init(init).file)


def torchvision_hub_file(name: str) -> Path:
    """Where torchvision keeps the weights file of ``torchvision:<name>`` (it may be absent)."""
    import torchvision.models

    enum_name, member = TORCHVISION_WEIGHTS[name]
    url = getattr(torchvision.models, enum_name)[member].url
    return Path(torch.hub.get_dir()) / "checkpoints" / url.rsplit("/", 1)[-1]


def _is_torchvision_file(source: InitSource) -> bool:
    """torchvision's ImageNet weights, from its cache or given by path under their own name."""
    if source.kind == "torchvision":
        return True
    if source.kind != "state_dict":
        return False
    return any(source.path.name == torchvision_hub_file(n).name for n in TORCHVISION_WEIGHTS)


# torchvision names its weight files NAME-HASH.pth, HASH the start of the file's SHA-256.
_HUB_HASH = re.compile(r"-([0-9a-f]{8,64})\.[A-Za-z]+$")
HASH_MATCHES = "SHA-256 matches the hash in the file name"


def torchvision_hash_check(path: Path) -> str:
    """Whether a torchvision weights file's bytes match the hash in its name, as torchvision's
    own check asks ("" for a file without one): a mismatch is a damaged copy or another file
    under torchvision's name. In words, for the init report."""
    match = _HUB_HASH.search(path.name)
    if match is None:
        return ""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    except OSError as exc:
        raise ConfigError(f"--init {path}: cannot read it ({exc.strerror or exc})") from None
    if digest.hexdigest().startswith(match.group(1)):
        return f"{HASH_MATCHES} ({match.group(1)}): torchvision's published file"
    return (
        f"SHA-256 {digest.hexdigest()[:12]}... does not start with the {match.group(1)} of its "
        "name: not torchvision's published file (a damaged copy, or other weights under its "
        "name)"
    )


def _torchvision_file(text: str) -> Path:
    name = text.split(":", 1)[1].strip().lower()
    if name not in TORCHVISION_WEIGHTS:
        supported = ", ".join(f"torchvision:{n}" for n in TORCHVISION_WEIGHTS)
        raise ConfigError(
            f"--init {text}: unknown torchvision weights {name!r}; supported: {supported}"
        )
    path = torchvision_hub_file(name)
    if not path.is_file():
        enum_name, member = TORCHVISION_WEIGHTS[name]
        raise ConfigError(
            f"--init {text}: the weights file is not in torchvision's local cache; looked for "
            f"{path}. medfed never downloads. On a machine with internet run "
            f"python -c \"import torchvision; torchvision.models.{name}(weights='{member}')\" "
            f"(it saves {path.name} under $TORCH_HOME/hub/checkpoints, by default "
            f"~/.cache/torch/hub/checkpoints), then copy that file to {path.parent}/ here, or "
            "set TORCH_HOME to the folder that holds hub/checkpoints/"
            f"{path.name}; or pass the file itself: --init /path/to/{path.name}"
        )
    return path


def _check_finished_run(path: Path) -> Path:
    """The newest checkpoint folder of a finished run at ``path``; refuses anything else."""
    run = RunDir(path).require()
    pick = "pick another run"
    reason = run.failed()
    if reason is not None:
        raise RunDirError(
            f"--init {path}: training of this run failed ({reason}); it has no weights to "
            f"start from; {pick}"
        )
    if not run.summary_path.is_file():
        raise RunDirError(
            f"--init {path}: not a finished medfed run: no summary.json; finish it "
            f"(medfed train ... --resume) or {pick}"
        )
    train = run.read_config().get("train")
    rounds = train.get("rounds") if isinstance(train, dict) else None
    if not isinstance(rounds, int) or isinstance(rounds, bool):
        raise RunDirError(
            f"--init {run.config_path}: [train] rounds is {rounds!r}, not a number of rounds; "
            f"the file is damaged; {pick}"
        )
    latest = CheckpointStore(run.checkpoints, keep=1).latest()
    if latest is None:
        raise RunDirError(
            f"--init {run.checkpoints}: no checkpoint; the run's final weights are kept in its "
            f"last round's checkpoint; {pick}"
        )
    match = ROUND_DIR.match(latest.name)
    done = int(match.group(1)) if match else -1
    if done != rounds:
        raise RunDirError(
            f"--init {latest}: the newest checkpoint is round {done}, but the run has {rounds} "
            f"rounds; its last round's checkpoint is missing; {pick}"
        )
    return latest


def frozen_backbone(init: str, backbone: str) -> str:
    """The torchvision-shaped backbone the frozen encoder is cut from: ``backbone`` as given,
    or for ``auto`` the network the ``init`` file was saved from."""
    if backbone != "auto":
        return backbone
    source = resolve_init(init)
    names = {torchvision_hub_file(n).name: n for n in TORCHVISION_WEIGHTS}
    constructor = None
    if source.kind == "torchvision":
        constructor = source.given.split(":", 1)[1].strip().lower()
    elif source.path.name in names:
        constructor = names[source.path.name]
    if constructor is None:
        state, fmt = read_init(source)
        fits = [n for n in FORMAT_BACKBONES.get(fmt, ()) if n.startswith("tv-")]
        fits = [n for n in fits if not n.endswith("-gn")]
        if len(fits) == 1:
            return fits[0]
        raise ConfigError(
            f"--frozen-encoder: cannot tell which torchvision network --init {init} was saved "
            f"from ({FORMAT_NAMES.get(fmt, fmt)}); name it with --backbone "
            f"({', '.join(fits) or ', '.join(n for n in TV_BACKBONES if not n.endswith('-gn'))})"
        )
    return next(n for n, net in TV_NETS.items() if net.constructor == constructor)


# ----------------------------------------------------------------------------- reading
def read_init(source: InitSource) -> tuple[State, str]:
    """The source's tensors (on the CPU, under the names the file gives them) and its format."""
    if source.kind == "run":
        return _read_run(source), "medfed"
    if source.kind == "safetensors":
        state = _read_safetensors(source.path)
    elif source.kind in ("state_dict", "torchvision"):
        state = _read_torch(source.path)
    else:
        raise ValueError(f"unknown init source kind {source.kind!r}; one of {KINDS}")
    if not state:
        raise ConfigError(f"--init {source.path}: holds no tensors; {SAVE_HINT}")
    fix = "these weights cannot start training; pick another file"
    check_finite(f"--init {source.path}", state, fix, ConfigError)
    return state, detect_format(state)


def _read_run(source: InitSource) -> State:
    path, folder = source.path, source.file.parent
    states, _ = CheckpointStore(folder.parent, keep=1).load(folder)
    state = states.get("global")
    if state is None:
        raise RunDirError(
            f"--init {folder}: no global.safetensors; the checkpoint is incomplete; "
            "pick another run"
        )
    if not state:
        raise ConfigError(
            f"--init {path}: this run shares no weights between sites (its algorithm keeps "
            "every weight on its own site), so it has no global model to start from; pick a run "
            "of a federated algorithm"
        )
    return {k: v.to("cpu") for k, v in state.items()}


def _read_safetensors(path: Path) -> State:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise ConfigError(
            f"--init {path}: cannot read it as safetensors ({exc}); check the file, or {SAVE_HINT}"
        ) from exc


def _read_torch(path: Path) -> State:
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "weights only" not in str(exc).lower():
            raise ConfigError(f"--init {path}: not a PyTorch weights file ({exc})") from None
        found = re.search(r"GLOBAL (\S+)", str(exc))
        what = f" (such as {found.group(1)})" if found else ""
        raise ConfigError(
            f"--init {path}: holds Python objects beyond tensors{what}; medfed never unpickles "
            f"those, since unpickling can run any code; {SAVE_HINT}"
        ) from None
    except OSError as exc:
        raise ConfigError(f"--init {path}: cannot read it ({exc.strerror or exc})") from None
    except Exception as exc:  # torch.load raises many kinds for a file it cannot parse
        raise ConfigError(
            f"--init {path}: not a PyTorch weights file ({type(exc).__name__}: {exc}); {SAVE_HINT}"
        ) from None
    return _tensor_dict(path, data)


def _tensor_dict(path: Path, data: Any) -> State:
    """A dict of named tensors, or the one nested under "state_dict" / "model"."""
    if isinstance(data, Mapping):
        for entry in STATE_DICT_ENTRIES:
            if isinstance(data.get(entry), Mapping):
                data = data[entry]
                break
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"--init {path}: holds a {type(data).__name__}, not a dict of named tensors; "
            f"{SAVE_HINT}"
        )
    for key, value in data.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise ConfigError(
                f"--init {path}: entry {key!r} is a {type(value).__name__}, not a tensor; a "
                "weights file holds only named tensors (or nests them under 'state_dict'); "
                f"{SAVE_HINT}"
            )
    return dict(data)


def detect_format(state: Mapping[str, torch.Tensor]) -> str:
    """Which naming the tensors follow (one of FORMATS), from their names and shapes."""
    if any(k.startswith(MEDFED_PREFIXES) for k in state):
        return "medfed"
    names = {_strip_module(k): v for k, v in state.items()}
    if any(k.startswith(("features.conv0.", "features.denseblock")) for k in names):
        return "torchvision-densenet"
    if "features.0.0.weight" in names and any(k.startswith("features.1.0.block.") for k in names):
        return "torchvision-efficientnet"
    if "features.0.0.weight" in names and any(k.startswith("features.1.conv.") for k in names):
        return "torchvision-mobilenet"
    conv1 = names.get("conv1.weight")
    if conv1 is not None and any(k.startswith("layer1.") for k in names):
        three_d = conv1.dim() == 5 or any(k.startswith("conv_seg.") for k in names)
        return "medicalnet" if three_d else "torchvision-resnet"
    return "backbone"


def _strip_module(key: str) -> str:
    return key.removeprefix("module.")


# ----------------------------------------------------------------------------- hashing
def state_sha256(state: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over the named tensors, sorted by name: each name, dtype, shape and bytes."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().to("cpu").contiguous()
        raw = tensor.reshape(-1).view(torch.uint8).numpy().tobytes()
        head = f"{name}\0{str(tensor.dtype).removeprefix('torch.')}\0{list(tensor.shape)}\0"
        digest.update(f"{len(head)}:".encode())
        digest.update(head.encode())
        digest.update(f"{len(raw)}:".encode())
        digest.update(raw)
    return digest.hexdigest()


# ----------------------------------------------------------------------------- mapping
def _plain(key: str) -> str:
    """A layer's key without PEFT's ``base_layer`` step (the name the layer has without LoRA)."""
    return key.replace(".base_layer.", ".")


def _torchvision_name(key: str) -> str | None:
    """torchvision ResNet name -> medfed ResNet18 name (under ``backbone.``); None: no match."""
    key = _strip_module(key)
    stem = {"conv1.": "stem.0.", "bn1.": "stem.1."}
    for old, new in stem.items():
        if key.startswith(old):
            return "backbone." + new + key.removeprefix(old)
    match = re.fullmatch(r"layer(\d+)\.(\d+)\.(.+)", key)
    if not match:
        return None
    stage, block, rest = int(match.group(1)) - 1, match.group(2), match.group(3)
    for old, new in {"bn1.": "norm1.", "bn2.": "norm2.", "downsample.": "shortcut."}.items():
        if rest.startswith(old):
            rest = new + rest.removeprefix(old)
            break
    return f"backbone.stages.{stage}.{block}.{rest}"


def _head_reason(fmt: str, key: str) -> str | None:
    """Why a classifier or segmentation head of the source never starts a medfed head."""
    name = _strip_module(key)
    if fmt == "torchvision-resnet" and name.startswith("fc."):
        return "ImageNet classifier (1000 classes); medfed's heads start fresh"
    if fmt in TORCHVISION_FORMATS and name.startswith("classifier."):
        return "ImageNet classifier (1000 classes); medfed's heads start fresh"
    if fmt == "medicalnet" and name.startswith("conv_seg."):
        return "MedicalNet segmentation head; medfed's heads start fresh"
    if fmt == "medicalnet" and name.startswith("fc."):
        return "classifier head of another task; medfed's heads start fresh"
    return None


# torchvision's DenseNet files name a dense layer's norm and conv ``norm.1`` / ``conv.2``, its
# modules ``norm1`` / ``conv2`` (torchvision renames them the same way when it loads them).
_OLD_DENSENET = re.compile(
    r"^(.*denselayer\d+\.(?:norm|relu|conv))\."
    r"((?:[12])\.(?:weight|bias|running_mean|running_var|num_batches_tracked))$"
)


def _model_name(fmt: str, key: str, backbone: str = "") -> str | None:
    """The source key under medfed's names (before LoRA renaming); None: no counterpart.

    torchvision's networks keep their own names in a torchvision-shaped backbone."""
    if fmt in TORCHVISION_FORMATS and backbone in TV_BACKBONES:
        name = _strip_module(key)
        if fmt == "torchvision-densenet":
            name = _OLD_DENSENET.sub(r"\1\2", name)
        return f"backbone.{name}"
    if fmt == "medfed":
        return key
    if fmt == "backbone":
        return f"backbone.{key}"
    if fmt == "medicalnet":
        return f"backbone.{_strip_module(key)}"
    return _torchvision_name(key)


def torchvision_names(state: Mapping[str, torch.Tensor], fmt: str) -> State:
    """A torchvision file's tensors under the names a torchvision-shaped backbone gives them
    (without ``backbone.``), its ImageNet classifier left out."""
    some_backbone = FORMAT_BACKBONES[fmt][0]
    return {
        _model_name(fmt, key, some_backbone).removeprefix("backbone."): tensor
        for key, tensor in state.items()
        if _head_reason(fmt, key) is None
    }


class _Target:
    """What a model offers to load into: its keys by plain name, norm layers by path."""

    def __init__(self, model: nn.Module) -> None:
        self.state = model.state_dict()
        self.modules = dict(model.named_modules())
        self.adapters = {k for k in self.state if is_adapter_key(k)}
        self.by_plain = {_plain(k): k for k in self.state if k not in self.adapters}
        spec = getattr(model, "spec", None)
        self.backbone = getattr(spec, "backbone", "")

    def key_for(self, name: str) -> str | None:
        if is_adapter_key(name):
            return name if name in self.adapters else None
        return self.by_plain.get(_plain(name))

    def module_at(self, name: str) -> nn.Module | None:
        return self.modules.get(_plain(name).rpartition(".")[0])


def _norm_reason(source: Mapping[str, torch.Tensor], key: str, module: nn.Module | None):
    """Why a norm tensor must not load: BatchNorm meeting another norm, either way round."""
    if not isinstance(module, NORM_TYPES):
        return None
    prefix = key.rpartition(".")[0]
    file_bn = f"{prefix}.running_mean" in source or f"{prefix}.running_var" in source
    model_bn = isinstance(module, BATCH_NORMS)
    model_kind = type(module).__name__
    if file_bn and not model_bn:
        return f"BatchNorm in the file, {model_kind} in the model; it never loads into {model_kind}"
    if model_bn and not file_bn:
        return (
            "a norm layer without running statistics in the file (not a BatchNorm), "
            "BatchNorm in the model"
        )
    return None


@dataclass
class _Plan:
    loaded: dict[str, torch.Tensor] = field(default_factory=dict)  # model key -> cast tensor
    origin: dict[str, str] = field(default_factory=dict)  # model key -> its source key
    skipped: list[dict[str, str]] = field(default_factory=list)
    why: dict[str, str] = field(default_factory=dict)  # model key -> why it did not load
    shape_problems: dict[str, str] = field(default_factory=dict)  # model key -> both shapes

    def skip(
        self, key: str, reason: str, model_key: str | None = None, why: str | None = None
    ) -> None:
        self.skipped.append({"key": key, "reason": reason})
        if model_key is not None:
            self.why.setdefault(model_key, why or reason)


def _plan(model: nn.Module, source: Mapping[str, torch.Tensor], fmt: str) -> _Plan:
    target = _Target(model)
    plan = _Plan()
    fits = FORMAT_BACKBONES.get(fmt)
    for key in source:
        head = _head_reason(fmt, key)
        if head is not None:
            plan.skip(key, head)
        elif fits is not None and target.backbone not in fits:
            plan.skip(
                key,
                f"{FORMAT_NAMES[fmt]} weights fit only the {' and '.join(fits)} backbones; "
                f"this model's backbone is {target.backbone!r}",
            )
        else:
            _plan_one(plan, target, source, key, fmt)
    return plan


def _plan_one(
    plan: _Plan, target: _Target, source: Mapping[str, torch.Tensor], key: str, fmt: str
) -> None:
    """Load the source tensor ``key`` into its counterpart in the model, or say why not."""
    tensor, name = source[key], _model_name(fmt, key, target.backbone)
    module = target.module_at(name) if name is not None else None
    model_key = target.key_for(name) if name is not None else None
    norm = _norm_reason(source, key, module)
    if norm is not None:
        plan.skip(key, norm, model_key)
    elif model_key is None:
        if name is not None and is_adapter_key(name):
            plan.skip(key, "LoRA adapter that this model does not have; its adapters start fresh")
        else:
            plan.skip(key, "no such layer in this model")
    elif model_key in plan.origin:
        plan.skip(key, f"{model_key} is already loaded from {plan.origin[model_key]}")
    elif tensor.shape != target.state[model_key].shape:
        want = target.state[model_key]
        shapes = f"file has {tuple(tensor.shape)}, model has {tuple(want.shape)}"
        hint = STEM_HINT if (fmt, model_key) == ("torchvision-resnet", STEM_KEY) else ""
        plan.skip(key, f"{model_key}: {shapes}{hint}", model_key, why=shapes)
        plan.shape_problems[model_key] = shapes
    elif tensor.is_floating_point() != target.state[model_key].is_floating_point():
        want = target.state[model_key]
        plan.skip(key, f"{model_key}: file has {tensor.dtype}, model has {want.dtype}", model_key)
    else:
        want = target.state[model_key]
        plan.loaded[model_key] = tensor.detach().to(device="cpu", dtype=want.dtype)
        plan.origin[model_key] = key


def _check_strict(file: Path, target_state: Mapping[str, torch.Tensor], plan: _Plan) -> None:
    missing = [
        k
        for k in target_state
        if k.startswith("backbone.") and not is_adapter_key(k) and k not in plan.loaded
    ]
    if not missing and not plan.shape_problems:
        return
    problems = [f"{k} ({plan.why.get(k, 'the file has no tensor for it')})" for k in missing]
    problems += [f"{k} ({s})" for k, s in plan.shape_problems.items() if k not in missing]
    shown = "; ".join(problems[:FEW]) + (
        f"; ... (+{len(problems) - FEW} more)" if len(problems) > FEW else ""
    )
    raise ConfigError(
        f"--init {file} with {STRICT_FLAG}: {len(missing)} backbone tensor(s) of the model not "
        f"loaded and {len(plan.shape_problems)} shape mismatch(es): {shown}; drop {STRICT_FLAG} "
        "to start them randomly"
    )


def _refuse_nothing_loaded(file: Path, n_tensors: int, plan: _Plan) -> None:
    """Starting weights of which no tensor fits the model would leave every weight at its
    random start: the run would train as if no --init were given, while its config.toml says
    it started from them."""
    reasons = list(dict.fromkeys(s["reason"] for s in plan.skipped))
    more = f"; ... (+{len(reasons) - FEW} more)" if len(reasons) > FEW else ""
    shown = "; ".join(reasons[:FEW]) + more
    raise ConfigError(
        f"--init {file}: none of its {n_tensors} tensor(s) fits this model, so the run would "
        f"start from random weights ({shown or 'no tensor name matches the model'}); give "
        "weights saved from this backbone, choose the backbone they were saved from "
        "(--backbone), or leave --init out to start from random weights"
    )


def apply_init(model: FedModel, source: InitSource, *, strict: bool = False) -> InitReport:
    """Load ``source``'s weights into ``model`` in place and report what happened.

    ``strict``: refuse (ConfigError) unless every backbone tensor of the model is loaded and no
    tensor of the source has the wrong shape. Nothing changes in the model when it refuses.
    """
    state, fmt = read_init(source)
    file = source.file
    plan = _plan(model, state, fmt)
    own = model.state_dict()
    if strict:
        _check_strict(file, own, plan)
    if not plan.loaded:
        _refuse_nothing_loaded(file, len(state), plan)
    return _loaded(model, source, fmt, plan)


def apply_frozen_init(model: FedModel, source: InitSource, encoder_keys: set[str]) -> InitReport:
    """The frozen-encoder mode's start: the file's ``encoder_keys`` (torchvision-shaped names)
    are the frozen encoder's, and the rest of its backbone (the unfrozen blocks) loads into
    ``model``; the trunk and heads keep their seeded start."""
    state, fmt = read_init(source)
    if fmt not in TORCHVISION_FORMATS:
        raise ConfigError(
            f"--frozen-encoder: --init {source.file} holds {FORMAT_NAMES.get(fmt, fmt)} "
            "weights; the frozen encoder starts from torchvision's ImageNet weights (e.g. --init "
            "torchvision:mobilenet_v2)"
        )
    backbone = getattr(model.spec, "backbone", "")
    rest = {
        key: tensor
        for key, tensor in state.items()
        if _model_name(fmt, key, backbone).removeprefix("backbone.") not in encoder_keys
    }
    plan = _plan(model, rest, fmt)
    report = _loaded(model, source, fmt, plan)
    report.encoder = len(state) - len(rest)
    return report


def _loaded(model: FedModel, source: InitSource, fmt: str, plan: _Plan) -> InitReport:
    """Load ``plan``'s tensors into ``model`` (strictly, over its own state) and report it."""
    own = model.state_dict()
    merged = dict(own)
    merged.update(plan.loaded)
    model.load_state_dict(merged, strict=True)
    loaded = [k for k in own if k in plan.loaded]
    return InitReport(
        source=source.given,
        kind=source.kind,
        file=str(source.file),
        format=fmt,
        sha256=state_sha256(plan.loaded),
        loaded=loaded,
        skipped=plan.skipped,
        random=[k for k in own if k not in plan.loaded and not is_adapter_key(k)],
        adapters=sum(1 for k in own if is_adapter_key(k)),
        weights_normalization="imagenet" if _is_torchvision_file(source) else "",
        hash_check=torchvision_hash_check(source.file) if _is_torchvision_file(source) else "",
    )
