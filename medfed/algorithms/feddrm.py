"""FedDRM: shared backbone and client branch, private target head, density-ratio routing.

Local loss = lambda * CE(target label) + (1 - lambda) * CE(site index). Every key except the
target head is averaged with weights n_i / N. A new scan goes to argmax_i (client logit_i -
log pi_i), pi_i = n_i / N, and that site's target head answers (see medfed.routing).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from medfed.algorithms.base import Algorithm, LocalTask, Params, head_keys
from medfed.models.fedmodel import FedModel


@dataclass(frozen=True)
class FedDRMParams(Params):
    lam: float = 0.9

    def __post_init__(self) -> None:
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError("lam must be in [0, 1]")


def feddrm_loss(
    target_logits: torch.Tensor,
    client_logits: torch.Tensor,
    y: torch.Tensor,
    site_index: int,
    lam: float,
) -> torch.Tensor:
    """lambda * CE(target) + (1 - lambda) * CE(site index), on float32 logits."""
    sites = torch.full_like(y, site_index)
    target = F.cross_entropy(target_logits.float(), y)
    client = F.cross_entropy(client_logits.float(), sites)
    return lam * target + (1.0 - lam) * client


class FedDRM(Algorithm):
    name = "feddrm"
    summary = "shared backbone + client head, private target head; routes by density ratio"
    params_class = FedDRMParams
    needs_client_branch = True

    def private_keys(self, model: nn.Module) -> set[str]:
        return head_keys(model)

    def loss(self, task: LocalTask, model: FedModel, x: torch.Tensor, y: torch.Tensor):
        out = model(x)
        return feddrm_loss(
            out.target_logits, out.client_logits, y, task.site_index, self.params.lam
        )
