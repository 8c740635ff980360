"""LoRA personalization (PEFT): a trained, frozen base and named low-rank adapters.

LoRA is for adapting a base that already works: with ``base = "frozen"`` (the default) the run
must start from trained weights (``--init``: a finished FedAvg run, torchvision's ResNet-18, a
state dict), or build that base itself first (``warmup_rounds = N``: N rounds of FedAvg, then
frozen). The frozen weights never change and never leave a site.

Modes:
- ``private``: one adapter per site, named by its site id, never leaves the site (pure
  personalization);
- ``shared``: one adapter, averaged across sites.
Each site keeps its target head in both. ``freeze_a = true`` is FFA-LoRA: every A matrix stays
at its seeded random initialization (the same on every site) and only B is trained and shared,
which makes averaging a shared adapter exact (the mean of B A is the mean of B times A).

Routing. The client head reads the base's features with every adapter off
(:meth:`medfed.models.fedmodel.FedModel.client_features`): a site's own adapter must not tell
it "this scan is mine". It is not trained by gradient but set in closed form by the server
(Fisher's linear discriminant from each site's feature statistics,
:mod:`medfed.algorithms.discriminant`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from medfed.algorithms.base import (
    HEAD_PREFIX,
    Algorithm,
    LocalResult,
    LocalTask,
    Params,
    Update,
    supervised_steps,
    weighted_average,
)
from medfed.algorithms.discriminant import CLIENT_HEAD, ClosedFormClientHead
from medfed.core.errors import ConfigError
from medfed.models.fedmodel import FedModel, ModelSpec

SHARED_ADAPTER = "shared"
# The widest layer of the backbones here has 512 channels; an adapter of rank r holds r * (in +
# out) numbers per layer, so beyond this a "low-rank" adapter outgrows the layer it adapts.
MAX_RANK = 256


@dataclass(frozen=True)
class LoRAParams(Params):
    rank: int = 4
    alpha: float = 8.0
    mode: str = "private"  # private adapters, or one shared adapter
    base: str = "frozen"  # frozen, or federated (trained and averaged like FedAvg)
    targets: str = "conv,linear"  # layer kinds that get adapters
    freeze_a: bool = False  # FFA-LoRA: A stays at its random init, only B is trained and shared
    warmup_rounds: int = 0  # FedAvg rounds that build the base before it is frozen (no --init)
    shrinkage: float = 0.1  # of the pooled feature covariance toward its mean variance

    def __post_init__(self) -> None:
        if not 1 <= self.rank <= MAX_RANK:
            raise ValueError(
                f"rank must be between 1 and {MAX_RANK} (got {self.rank}): a higher rank is "
                "more than a full update of any layer here, and its adapters can exhaust memory"
            )
        if not self.alpha > 0:
            raise ValueError(
                f"alpha must be > 0 (got {self.alpha:g}): the adapters' scale alpha / rank would "
                "switch them off or reverse them"
            )
        if self.mode not in ("private", "shared"):
            raise ValueError("mode must be private or shared")
        if self.base not in ("frozen", "federated"):
            raise ValueError("base must be frozen or federated")
        if not set(self.target_kinds) <= {"conv", "linear"} or not self.target_kinds:
            raise ValueError("targets must be conv, linear or conv,linear")
        if self.warmup_rounds < 0:
            raise ValueError("warmup_rounds must be >= 0")
        if not 0.0 < self.shrinkage <= 1.0:
            raise ValueError("shrinkage must be in (0, 1]")

    @property
    def target_kinds(self) -> tuple[str, ...]:
        return tuple(t.strip() for t in self.targets.split(",") if t.strip())


def is_adapter_key(key: str) -> bool:
    return ".lora_A." in key or ".lora_B." in key


class LoRA(ClosedFormClientHead, Algorithm):
    name = "lora"
    summary = "PEFT LoRA adapters per site (or one shared) on a trained frozen base; routes"
    dp_refusal = (
        "its sites send their training scans' feature means and covariances in the clear for "
        "routing, which DP-SGD does not cover"
    )
    params_class = LoRAParams
    needs_client_branch = True

    def adapt_spec(self, spec: ModelSpec, site_ids: list[str]) -> ModelSpec:
        if self.params.mode == "shared" and SHARED_ADAPTER in site_ids:
            raise ConfigError(
                f"lora with mode=shared names its adapter {SHARED_ADAPTER!r}, which is also a "
                "site id; rename that site (its manifest's id) or use mode=private"
            )
        adapters = tuple(site_ids) if self.params.mode == "private" else (SHARED_ADAPTER,)
        return replace(
            spec,
            lora_rank=self.params.rank,
            lora_alpha=self.params.alpha,
            lora_adapters=adapters,
            lora_targets=self.params.target_kinds,
            client_kind="linear",
        )

    def check_start(self, init: bool) -> None:
        if init or self.params.base == "federated":
            return
        if self.params.warmup_rounds:
            raise ConfigError(
                "lora: warmup_rounds builds the base in one process (medfed train); in a "
                "deployment, train a fedavg run first and pass it as --init"
            )
        raise ConfigError(
            "lora freezes its base and trains only small adapters on top: on random weights "
            "that base is noise, and the adapters cannot make up for it. Start from trained "
            "weights with --init (a finished fedavg run's folder, torchvision:resnet18, or a "
            "state-dict file), or let medfed build the base first with --param "
            "warmup_rounds=N (N rounds of FedAvg, then frozen); --param base=federated "
            "trains the base too"
        )

    def _trainable(self, key: str) -> bool:
        """Keys the local objective updates (the rest is the frozen base, FFA-LoRA's A, and the
        client head, which the server sets)."""
        if key.startswith(CLIENT_HEAD) or (self.params.freeze_a and ".lora_A." in key):
            return False
        return self.params.base == "federated" or is_adapter_key(key) or key.startswith(HEAD_PREFIX)

    def private_keys(self, model: nn.Module) -> set[str]:
        keys = set(model.state_dict())
        # A frozen base (and frozen A) never changes, is the same on every site, never travels;
        # the client head comes from the server.
        private = {k for k in keys if not self._trainable(k) and not k.startswith(CLIENT_HEAD)}
        private |= {k for k in keys if k.startswith(HEAD_PREFIX)}
        if self.params.mode == "private":
            private |= {k for k in keys if is_adapter_key(k)}
        return private

    # --- site-side --------------------------------------------------------------------------
    def local_train(self, task: LocalTask) -> LocalResult:
        model = task.model
        own = f".{model.adapter_for(task.site_id)}."
        model.select_adapter(model.adapter_for(task.site_id))
        params = []
        for name, p in model.named_parameters():
            active = self._trainable(name) and (not is_adapter_key(name) or own in name)
            p.requires_grad_(active)
            if active:
                params.append(p)
        try:
            result = supervised_steps(task, model, params, self.loss)
        finally:
            for p in model.parameters():
                p.requires_grad_(True)
        # A frozen base gives the same features every round: its statistics travel once.
        self.report_moments(task, result, every_round=self.params.base == "federated")
        return result

    def loss(self, task: LocalTask, model: FedModel, x: torch.Tensor, y: torch.Tensor):
        """The target label only (the client head is not trained by gradient)."""
        logits = model.target_head(model.target_branch(model.features(x)))
        return F.cross_entropy(logits.float(), y)

    # --- server-side ------------------------------------------------------------------------
    def aggregate(self, updates: list[Update]) -> dict[str, torch.Tensor]:
        out = weighted_average(updates)
        self.set_client_head(out, updates)
        return out
