"""Ditto: FedAvg for the global model plus a personal model per site, pulled toward the global
one by lambda/2 * ||v - w_global||^2. Sites answer with their personal model."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from medfed.algorithms.base import (
    LocalResult,
    LocalTask,
    Params,
    PersonalModel,
    proximal_loss,
    supervised_steps,
)
from medfed.models.fedmodel import FedModel


@dataclass(frozen=True)
class DittoParams(Params):
    lam: float = 0.1
    non_negative = ("lam",)


class Ditto(PersonalModel):
    name = "ditto"
    summary = "global FedAvg model plus a regularized personal model on each site"
    dp_refusal = (
        "its personal model's objective has a proximal term toward the global model, a gradient"
        " no scan owns, which per-scan clipping would drop"
    )
    params_class = DittoParams

    def local_train(self, task: LocalTask) -> LocalResult:
        personal = copy.deepcopy(task.model)
        personal.load_state_dict(task.extra)
        global_result = supervised_steps(task, task.model, task.model.parameters(), self.loss)
        personal_result = supervised_steps(
            task, personal, personal.parameters(), self._personal_loss
        )
        self.keep_personal(task, personal)
        return LocalResult(loss=personal_result.loss, metrics={"global_loss": global_result.loss})

    def _personal_loss(self, task: LocalTask, model: FedModel, x: torch.Tensor, y: torch.Tensor):
        return proximal_loss(model, x, y, task.global_state, self.params.lam)
