"""FedProx: FedAvg plus a proximal term mu/2 * ||w - w_global||^2 in the local objective."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from medfed.algorithms.base import Algorithm, LocalTask, Params, proximal_loss
from medfed.models.fedmodel import FedModel


@dataclass(frozen=True)
class FedProxParams(Params):
    mu: float = 0.01
    non_negative = ("mu",)


class FedProx(Algorithm):
    name = "fedprox"
    summary = "FedAvg with a proximal term keeping local weights near the global model"
    dp_refusal = (
        "its proximal term pulls the weights toward the global model, a gradient no scan owns, "
        "which per-scan clipping would drop"
    )
    params_class = FedProxParams

    def loss(self, task: LocalTask, model: FedModel, x: torch.Tensor, y: torch.Tensor):
        return proximal_loss(model, x, y, task.global_state, self.params.mu)
