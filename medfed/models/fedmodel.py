"""The federated model: a backbone, a target branch and head, and an optional client branch.

Algorithms choose which state-dict keys leave a site by these submodule names, so they are a
contract: ``backbone``, ``target_branch``, ``target_head``, ``client_branch``, ``client_head``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import torch
from torch import nn

from medfed.core.errors import ConfigError
from medfed.models.backbones import (
    BACKBONES,
    BACKBONES_2D,
    BACKBONES_3D,
    ModelConfigError,
    build_backbone,
    kaiming_init,
    spatial_dims,
)
from medfed.models.encoder import EncoderError, EncoderView, encoded_backbone
from medfed.models.mixture import PREDICT_RULES, MixtureBranch, MixtureHead, VAEBank

NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.SyncBatchNorm,
    nn.GroupNorm,
    nn.LayerNorm,
    nn.InstanceNorm1d,
    nn.InstanceNorm2d,
    nn.InstanceNorm3d,
    *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()),  # torch >= 2.4
)
"""Normalization module types. MONAI's norm factory hands out these same torch classes."""

LORA_KINDS: dict[str, tuple[type[nn.Module], ...]] = {
    "conv": (nn.Conv1d, nn.Conv2d, nn.Conv3d),
    "linear": (nn.Linear,),
}

SUBMODULES = ("backbone", "target_branch", "target_head", "client_branch", "client_head")
HEAD_PREFIX = "target_head."  # the per-site target head (FedDRM, FedRep keep it private)


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to rebuild the same model architecture on any site."""

    backbone: str = "cnn"
    in_channels: int = 3
    n_classes: int = 2
    n_sites: int = 1
    client_branch: bool = False  # FedDRM's site classifier (client_branch + client_head)
    branch_dim: int = 128
    # The client branch: "mlp" (a hidden layer, trained by gradient as in FedDRM) or "linear"
    # (the head reads the features directly: LoRA sets it in closed form, see algorithms.lora)
    # or "encoder" (the head reads the frozen encoder's output itself, power-normalized: FedDRM
    # sets it in closed form in the frozen-encoder mode, see algorithms.discriminant).
    client_kind: str = "mlp"
    # LoRA: rank 0 means none; otherwise one named adapter per entry of lora_adapters on every
    # conv and linear layer of the backbone and the target branch.
    lora_rank: int = 0
    lora_alpha: float = 8.0
    lora_adapters: tuple[str, ...] = ()
    lora_targets: tuple[str, ...] = ("conv", "linear")  # layer kinds that get adapters
    # FedGMI: 0 means none; otherwise M VAEs over a coarse view of the scan and M expert heads
    # mixed by the site's coefficients (see medfed.models.mixture).
    mixture_components: int = 0
    mixture_latent: int = 2
    mixture_resolution: int = 8  # pooled view size per axis (half of it for 3D volumes)
    mixture_predict: str = "posterior"  # or "coefficients"
    # The frozen-encoder mode (medfed.models.encoder): the backbone's first blocks run once per
    # scan outside the model, which takes their output (``in_channels`` wide) and trains the
    # last ``unfreeze_blocks`` blocks and a trunk on it.
    frozen_encoder: bool = False
    unfreeze_blocks: int = 0

    def __post_init__(self) -> None:
        checks = [
            (self.backbone in BACKBONES, f"backbone must be one of {list(BACKBONES)}"),
            (self.in_channels >= 1, "in_channels must be >= 1"),
            (self.n_classes >= 2, "n_classes must be >= 2 (binary tasks use 2 logits)"),
            (self.n_sites >= 1, "n_sites must be >= 1"),
            (self.branch_dim >= 1, "branch_dim must be >= 1"),
            (
                self.client_kind in ("mlp", "linear", "encoder"),
                "client_kind must be mlp, linear or encoder",
            ),
            (
                self.client_kind != "encoder" or self.frozen_encoder,
                "client_kind encoder reads a frozen encoder's output: it needs the frozen encoder",
            ),
            (self.lora_rank >= 0, "lora_rank must be >= 0"),
            (not self.lora_rank or self.lora_adapters, "LoRA needs at least one adapter name"),
            (
                set(self.lora_targets) <= set(LORA_KINDS) and bool(self.lora_targets),
                f"lora_targets must be a non-empty subset of {sorted(LORA_KINDS)}",
            ),
            (self.mixture_components >= 0, "mixture_components must be >= 0"),
            (
                not (self.mixture_components and self.client_branch),
                "a mixture model has no client branch",
            ),
            (self.mixture_latent >= 1, "mixture_latent must be >= 1"),
            (self.mixture_resolution >= 2, "mixture_resolution must be >= 2"),
            (
                self.mixture_predict in PREDICT_RULES,
                f"mixture_predict must be one of {list(PREDICT_RULES)}",
            ),
            (self.unfreeze_blocks >= 0, "unfreeze_blocks must be >= 0"),
            (
                self.frozen_encoder or not self.unfreeze_blocks,
                "unfreeze_blocks needs the frozen encoder",
            ),
            (
                not (self.frozen_encoder and self.mixture_components),
                "a mixture model (FedGMI) reads the scan itself, not a frozen encoder's features",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ModelConfigError(f"model spec: {message}; got {self}")

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for model.json."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelSpec:
        """Inverse of :meth:`to_dict`; rejects unknown fields instead of ignoring them."""
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ModelConfigError(f"model spec: unknown field(s) {sorted(unknown)}")
        values = dict(data)
        values["lora_adapters"] = tuple(values.get("lora_adapters", ()))
        values["lora_targets"] = tuple(values.get("lora_targets", ("conv", "linear")))
        return cls(**values)


class ModelOutput(NamedTuple):
    """Logits of one forward pass; ``client_logits`` is None without a client branch."""

    target_logits: torch.Tensor
    client_logits: torch.Tensor | None


def _branch(feat_dim: int, branch_dim: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(feat_dim, branch_dim), nn.LayerNorm(branch_dim), nn.ReLU())


class FedModel(nn.Module):
    """Backbone -> target branch -> per-site target head, plus the optional site classifier."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        if spec.frozen_encoder:
            try:
                self.backbone, self.feat_dim = encoded_backbone(
                    spec.backbone, spec.unfreeze_blocks, spec.in_channels
                )
            except EncoderError as exc:
                raise ModelConfigError(f"model spec: {exc}") from None
            # pooled features (N, D), or the feature maps before the unfrozen blocks
            self.spatial_dims = 2 if spec.unfreeze_blocks else 0
        else:
            self.backbone, self.feat_dim = build_backbone(spec.backbone, spec.in_channels)
            self.spatial_dims = spatial_dims(spec.backbone)
        self.target_branch = _branch(self.feat_dim, spec.branch_dim)
        self.target_head: nn.Module = nn.Linear(spec.branch_dim, spec.n_classes)
        self.vaes: VAEBank | None = None
        if spec.mixture_components:
            self._build_mixture(spec)
        self.client_branch: nn.Module | None = None
        self.client_head: nn.Module | None = None
        if spec.client_branch and spec.client_kind == "encoder":
            self.client_branch = EncoderView()
            self.client_head = nn.Linear(spec.in_channels, spec.n_sites)
        elif spec.client_branch and spec.client_kind == "linear":
            self.client_branch = nn.Identity()
            self.client_head = nn.Linear(self.feat_dim, spec.n_sites)
        elif spec.client_branch:
            self.client_branch = _branch(self.feat_dim, spec.branch_dim)
            self.client_head = nn.Linear(spec.branch_dim, spec.n_sites)
        for module in (self.target_branch, self.target_head, self.client_branch, self.client_head):
            if module is not None:
                kaiming_init(module)

    def _build_mixture(self, spec: ModelSpec) -> None:
        m = spec.mixture_components
        self.vaes = VAEBank(
            m, spec.in_channels, self.spatial_dims, spec.mixture_resolution, spec.mixture_latent
        )
        self.target_branch = MixtureBranch(self.feat_dim, spec.branch_dim, m)
        self.target_head = MixtureHead(
            spec.branch_dim, spec.n_classes, m, self.vaes.dim, spec.mixture_predict
        )

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Backbone features (N, feat_dim), to be shared by several heads.

        A mixture model (FedGMI) appends the M per-dimension VAE log-likelihoods of the scan.
        """
        if x.dim() != self.spatial_dims + 2:
            raise ModelConfigError(self._wrong_rank_message(x))
        features = self.backbone(x)
        if self.vaes is not None:
            features = torch.cat([features.float(), self.vaes.affinity(x)], dim=1)
        return features

    def _wrong_rank_message(self, x: torch.Tensor) -> str:
        dims = self.spatial_dims
        other_dims, others = (3, BACKBONES_3D) if dims == 2 else (2, BACKBONES_2D)
        hint = (
            f"for this data use one of {', '.join(others)}"
            if x.dim() == other_dims + 2
            else "check that the batch axis and the channel axis are both present"
        )
        return (
            f"backbone {self.spec.backbone!r} takes {dims}D images, batches of {dims + 2} axes "
            f"(N, C, ...), but got shape {tuple(x.shape)}; {hint}"
        )

    def heads(self, features: torch.Tensor, client_features: torch.Tensor | None = None):
        """Target (and client) logits from backbone features; the client branch reads
        ``client_features`` when given (see :meth:`client_features`)."""
        target = self.target_head(self.target_branch(features))
        client = None
        if self.client_branch is not None and self.client_head is not None:
            seen = features if client_features is None else client_features
            client = self.client_head(self.client_branch(seen))
        return ModelOutput(target, client)

    def client_features(self, x: torch.Tensor, features: torch.Tensor | None = None):
        """What the client branch ("which site is this scan from?") reads.

        With LoRA adapters: the base's features, every adapter off. A site's own adapter must
        not be visible to it: trained on its own scans only, each site's model would learn "my
        adapter is on, so the scan is mine", every model would claim every scan, and routing
        would fall to the data shares. With ``client_kind`` encoder: the scan as it came, the
        frozen encoder's output. Otherwise: ``features`` themselves.
        """
        if self.spec.client_kind == "encoder":
            return x
        if not self.spec.lora_rank or self.client_branch is None:
            return self.features(x) if features is None else features
        with self.adapters_off():
            return self.features(x)

    @contextmanager
    def adapters_off(self) -> Iterator[None]:
        """Inside the block the model is its bare base: every LoRA adapter off."""
        # The flag PEFT's forward reads; its enable_adapters() would also reset requires_grad,
        # which the training step sets itself (FFA-LoRA keeps A frozen).
        layers = [m for m in self.modules() if isinstance(m, _tuner_layer())]
        previous = [m._disable_adapters for m in layers]
        for layer in layers:
            layer._disable_adapters = True
        try:
            yield
        finally:
            for layer, disabled in zip(layers, previous, strict=True):
                layer._disable_adapters = disabled

    def forward(self, x: torch.Tensor) -> ModelOutput:
        features = self.features(x)
        return self.heads(features, self.client_features(x, features))

    def select_adapter(self, name: str) -> None:
        """Make the LoRA adapter ``name`` the active one (no-op for a model without LoRA)."""
        if not self.spec.lora_rank:
            return
        for module in self.modules():
            if isinstance(module, _tuner_layer()):
                module.set_adapter(name)

    def adapter_for(self, site: str) -> str | None:
        """The adapter a site answers with: its own, or the one shared adapter."""
        adapters = self.spec.lora_adapters
        if not adapters:
            return None
        return site if site in adapters else adapters[0]


def lora_targets(model: nn.Module, kinds: tuple[str, ...] = ("conv", "linear")) -> list[str]:
    """Layers of the given kinds in the backbone and the target branch (the heads stay plain).

    Grouped convolutions (MobileNet's and EfficientNet's depthwise ones) get no adapter: a
    low-rank update of a per-channel filter is no smaller than the filter, and PEFT refuses a
    rank the groups do not divide."""
    types = tuple(t for kind in kinds for t in LORA_KINDS[kind])
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, types)
        and name.startswith(("backbone.", "target_branch."))
        and getattr(module, "groups", 1) == 1
    ]


def _peft() -> Any:
    """PEFT, imported only when a model has LoRA adapters: the core install goes without it."""
    try:
        import peft
        import peft.tuners.tuners_utils  # noqa: F401  (select_adapter reads BaseTunerLayer)
    except ImportError as exc:
        raise ConfigError(
            f"LoRA adapters need the 'peft' package ({exc}); install it with "
            "pip install 'medfed[lora]'"
        ) from exc
    return peft


def _tuner_layer() -> type:
    """PEFT's base class of every layer that carries adapters."""
    return _peft().tuners.tuners_utils.BaseTunerLayer


def build_model(spec: ModelSpec) -> FedModel:
    """A fresh model for ``spec``; seed torch first for identical weights on every site."""
    model = FedModel(spec)
    if spec.lora_rank:
        import warnings

        peft = _peft()
        config = peft.LoraConfig(
            r=spec.lora_rank,
            lora_alpha=spec.lora_alpha,
            target_modules=lora_targets(model, spec.lora_targets),
            lora_dropout=0.0,
        )
        with warnings.catch_warnings():
            # PEFT warns on every adapter after the first; several named adapters are the point.
            warnings.simplefilter("ignore", UserWarning)
            for name in spec.lora_adapters:
                model = peft.inject_adapter_in_model(config, model, adapter_name=name)
        model.select_adapter(spec.lora_adapters[0])
    return model


def norm_state_keys(model: nn.Module) -> set[str]:
    """State-dict keys of every normalization module, found by module type, never by name."""
    keys: set[str] = set()
    # remove_duplicate=False: a module registered under two names has state keys under both.
    for name, module in model.named_modules(remove_duplicate=False):
        if isinstance(module, NORM_TYPES):
            prefix = f"{name}." if name else ""
            keys.update(prefix + key for key in module.state_dict())
    return keys


def keys_with_prefix(state_keys: Iterable[str], prefixes: Iterable[str]) -> set[str]:
    """Keys inside any of the module paths ``prefixes`` ("target_head" or "target_head.")."""
    paths = tuple(p.rstrip(".") for p in prefixes)
    if any(not p for p in paths):
        raise ValueError("keys_with_prefix: empty prefix; name a module path such as 'backbone'")
    # Match whole path components: "stages.1" must not select "stages.10".
    dotted = tuple(p + "." for p in paths)
    return {k for k in state_keys if k in paths or k.startswith(dotted)} if paths else set()
