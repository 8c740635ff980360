"""LoRA personalization (PEFT): a frozen (or federated) base and named low-rank adapters.

Modes:
- ``private``: one adapter per site, named by its site id, never leaves the site (pure
  personalization); the target head and FedDRM's client branch are federated;
- ``shared``: one adapter, averaged across sites, while each site keeps its target head.

With ``base = "frozen"`` the original weights never change and never travel: only adapter (and
head) tensors do. The local objective is FedDRM's, so the client head routes a new scan to the
site whose adapter should answer it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from medfed.algorithms.base import (
    HEAD_PREFIX,
    Algorithm,
    LocalResult,
    LocalTask,
    Params,
    supervised_steps,
)
from medfed.algorithms.feddrm import feddrm_loss
from medfed.models.fedmodel import FedModel, ModelSpec

SHARED_ADAPTER = "shared"
CLIENT_PREFIXES = ("client_branch.", "client_head.")


@dataclass(frozen=True)
class LoRAParams(Params):
    rank: int = 4
    alpha: float = 8.0
    mode: str = "private"  # private adapters, or one shared adapter
    base: str = "frozen"  # frozen, or federated (trained and averaged like FedAvg)
    lam: float = 0.9  # FedDRM's weight of the label loss
    targets: str = "conv,linear"  # layer kinds that get adapters

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError("rank must be >= 1")
        if self.mode not in ("private", "shared"):
            raise ValueError("mode must be private or shared")
        if self.base not in ("frozen", "federated"):
            raise ValueError("base must be frozen or federated")
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError("lam must be in [0, 1]")
        if not set(self.target_kinds) <= {"conv", "linear"} or not self.target_kinds:
            raise ValueError("targets must be conv, linear or conv,linear")

    @property
    def target_kinds(self) -> tuple[str, ...]:
        return tuple(t.strip() for t in self.targets.split(",") if t.strip())


def is_adapter_key(key: str) -> bool:
    return ".lora_A." in key or ".lora_B." in key


class LoRA(Algorithm):
    name = "lora"
    summary = "PEFT LoRA adapters per site (or one shared) on a frozen base; FedDRM routing"
    params_class = LoRAParams
    needs_client_branch = True

    def adapt_spec(self, spec: ModelSpec, site_ids: list[str]) -> ModelSpec:
        adapters = tuple(site_ids) if self.params.mode == "private" else (SHARED_ADAPTER,)
        return replace(
            spec,
            lora_rank=self.params.rank,
            lora_alpha=self.params.alpha,
            lora_adapters=adapters,
            lora_targets=self.params.target_kinds,
        )

    def _trainable(self, key: str) -> bool:
        """Keys the local objective updates (the rest is the frozen base)."""
        if self.params.base == "federated":
            return True
        return is_adapter_key(key) or key.startswith((HEAD_PREFIX, *CLIENT_PREFIXES))

    def private_keys(self, model: nn.Module) -> set[str]:
        keys = set(model.state_dict())
        private = {k for k in keys if not self._trainable(k)}  # a frozen base never travels
        if self.params.mode == "private":
            private |= {k for k in keys if is_adapter_key(k)}
        else:
            private |= {k for k in keys if k.startswith(HEAD_PREFIX)}
        return private

    def local_train(self, task: LocalTask) -> LocalResult:
        model = task.model
        model.select_adapter(model.adapter_for(task.site_id))
        params = []
        for name, p in model.named_parameters():
            active = self._trainable(name) and (
                not is_adapter_key(name) or f".{model.adapter_for(task.site_id)}." in name
            )
            p.requires_grad_(active)
            if active:
                params.append(p)
        try:
            return supervised_steps(task, model, params, self.loss)
        finally:
            for p in model.parameters():
                p.requires_grad_(True)

    def loss(self, task: LocalTask, model: FedModel, x: torch.Tensor, y: torch.Tensor):
        out = model(x)
        return feddrm_loss(
            out.target_logits, out.client_logits, y, task.site_index, self.params.lam
        )
