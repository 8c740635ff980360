"""FedALS: aggregate the head every round (every H local steps) and the representation only
every alpha rounds (every alpha*H steps), around any base algorithm.

The representation is the set of state keys under the given module prefixes (the backbone by
default); every other shared key is "head" and follows the every-round schedule, so with FedDRM
the client branch and head travel every round while FedDRM's private target head never does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from medfed.algorithms.base import Algorithm, LocalResult, LocalTask, Params, State
from medfed.errors import ConfigError
from medfed.models.fedmodel import FedModel, keys_with_prefix


@dataclass(frozen=True)
class FedALSParams(Params):
    base: str = "fedavg"
    alpha: int = 5
    representation: str = "backbone"  # comma-separated module prefixes

    def __post_init__(self) -> None:
        if self.alpha < 1:
            raise ValueError("alpha must be >= 1")
        if self.base == "fedals":
            raise ValueError("base cannot be fedals itself")
        if not self.prefixes:
            raise ValueError("representation must name at least one module prefix")

    @property
    def prefixes(self) -> tuple[str, ...]:
        return tuple(
            p.strip().rstrip(".") + "." for p in self.representation.split(",") if p.strip()
        )


class FedALS(Algorithm):
    name = "fedals"
    summary = "head aggregated every round, representation every alpha rounds (base algorithm)"
    params_class = FedALSParams

    def __init__(self, params: Params | None = None) -> None:
        super().__init__(params)
        from medfed.algorithms import make_algorithm

        self.base = make_algorithm(self.params.base)
        if not self.base.communicates:
            raise ConfigError(f"fedals needs a base that communicates, not {self.params.base!r}")
        # The base decides the model and the objective; FedALS only decides when keys travel.
        self.needs_client_branch = self.base.needs_client_branch
        self.uses_batch_norm = self.base.uses_batch_norm

    def private_keys(self, model: nn.Module) -> set[str]:
        return self.base.private_keys(model)

    def round_keys(self, model: nn.Module, round_: int, rounds: int) -> list[str]:
        shared = self.shared_keys(model)
        if round_ % self.params.alpha == 0 or round_ == rounds:
            return shared
        representation = keys_with_prefix(shared, self.params.prefixes)
        head = [k for k in shared if k not in representation]
        if len(head) == len(shared):
            raise ConfigError(
                f"fedals: no shared key starts with {list(self.params.prefixes)}; "
                "set representation to module prefixes of the model (e.g. backbone)"
            )
        return head

    def init_extra(self, model: FedModel) -> State:
        return self.base.init_extra(model)

    def local_train(self, task: LocalTask) -> LocalResult:
        return self.base.local_train(task)

    def loss(self, task: LocalTask, model: FedModel, x: torch.Tensor, y: torch.Tensor):
        return self.base.loss(task, model, x, y)

    def finetune_steps(self, local_steps: int) -> int:
        return self.base.finetune_steps(local_steps)

    def eval_state(self, site_state: State, extra: State) -> State:
        return self.base.eval_state(site_state, extra)

    def aggregate(self, updates: list[tuple[State, float]]) -> State:
        return self.base.aggregate(updates)
