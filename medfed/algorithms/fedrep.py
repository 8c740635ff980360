"""FedRep: a shared body and a local head; each round trains the head first, then the body."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from medfed.algorithms.base import (
    HEAD_PREFIX,
    Algorithm,
    LocalResult,
    LocalTask,
    Params,
    head_keys,
    supervised_steps,
)


@dataclass(frozen=True)
class FedRepParams(Params):
    head_fraction: float = 0.5  # share of the local steps spent on the head

    def __post_init__(self) -> None:
        if not 0 < self.head_fraction < 1:
            raise ValueError("head_fraction must be in (0, 1)")


class FedRep(Algorithm):
    name = "fedrep"
    summary = "shared representation, private head; head steps then body steps each round"
    params_class = FedRepParams

    def private_keys(self, model: nn.Module) -> set[str]:
        return head_keys(model)

    def split_steps(self, local_steps: int) -> tuple[int, int]:
        """Head steps, then body steps, of one round."""
        head_steps = max(1, int(round(local_steps * self.params.head_fraction)))
        return head_steps, max(1, local_steps - head_steps)

    def steps_per_round(self, local_steps: int) -> int:
        return sum(self.split_steps(local_steps))

    def local_train(self, task: LocalTask) -> LocalResult:
        model = task.model
        head = [p for n, p in model.named_parameters() if n.startswith(HEAD_PREFIX)]
        body = [p for n, p in model.named_parameters() if not n.startswith(HEAD_PREFIX)]
        head_steps, body_steps = self.split_steps(task.steps)
        # Frozen parts skip their gradients; always thawed again, since the model object is shared
        # by every site and a failure here must not leave the next site half frozen.
        try:
            _freeze(body)
            first = supervised_steps(task, model, head, self.loss, head_steps)
            _unfreeze(body)
            _freeze(head)
            second = supervised_steps(task, model, body, self.loss, body_steps)
        finally:
            _unfreeze(body)
            _unfreeze(head)
        loss = (first.loss * head_steps + second.loss * body_steps) / (head_steps + body_steps)
        return LocalResult(loss=loss, metrics={"head_loss": first.loss, "body_loss": second.loss})


def _freeze(params: list[nn.Parameter]) -> None:
    for p in params:
        p.requires_grad_(False)


def _unfreeze(params: list[nn.Parameter]) -> None:
    for p in params:
        p.requires_grad_(True)
