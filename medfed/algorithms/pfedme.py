"""pFedMe (Dinh et al., 2020): personalization with Moreau envelopes.

Each site keeps a personalized model theta and works on the global model w in two levels. For
every local step, on one minibatch:

- inner: ``inner_steps`` optimizer steps on f_i(theta) + lam/2 * ||theta - w_i||^2, from where
  theta stands (it starts the round at the received w), an approximate solution of the
  Moreau-envelope problem;
- outer: the site's copy of the global model moves toward it, w_i <- w_i - eta*lam*(w_i - theta)
  (by default eta = 0.5 / lam: halfway).

The server mixes: w <- (1 - beta) * w + beta * mean_i(w_i), weights n_i / N. Every site received
the same w, so this equals the plain weighted mean of w + beta*(w_i - w): the site sends that,
and the server aggregates like FedAvg (also in the Flower apps, with no server state to keep).
Sites answer with their personalized theta, which never leaves them.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from medfed.algorithms.base import (
    LocalResult,
    LocalTask,
    Params,
    PersonalModel,
    State,
    optimizer_step,
    proximal_term,
)


@dataclass(frozen=True)
class PFedMeParams(Params):
    # Defaults measured on the synthetic fundus federation with AdamW: the paper's lam = 15 (for
    # plain SGD on small models) holds theta so close to w that nothing is personalized.
    lam: float = 0.1  # strength of the pull of theta toward w (lambda)
    inner_steps: int = 5  # K optimizer steps on the inner problem per minibatch
    eta: float = 0.0  # local step of w toward theta; 0: 0.5 / lam (halfway per step)
    beta: float = 1.0  # server mixing; 1 is the plain average of the sites' w_i

    def __post_init__(self) -> None:
        if self.lam <= 0:
            raise ValueError("lam must be > 0")
        if self.inner_steps < 1:
            raise ValueError("inner_steps must be >= 1")
        if self.eta < 0:
            raise ValueError("eta must be >= 0 (0: 0.5 / lam)")
        if self.eta * self.lam > 1:
            raise ValueError(
                f"eta * lam = {self.eta * self.lam:g} must be <= 1: the local update "
                f"w - eta*lam*(w - theta) would step past the personalized model; choose "
                f"eta <= {1 / self.lam:g}, or 0 for 0.5 / lam"
            )
        if not 0 < self.beta <= 2:
            raise ValueError("beta must be in (0, 2]")

    @property
    def step_toward(self) -> float:
        """eta * lam: the share of the way from w_i to theta one local update goes."""
        return self.eta * self.lam if self.eta else 0.5


class PFedMe(PersonalModel):
    name = "pfedme"
    summary = "bi-level: personalized models on a Moreau envelope of the global model (pFedMe)"
    dp_refusal = (
        "its personalized models solve a Moreau-envelope problem around the global model, whose"
        " gradient no scan owns"
    )
    params_class = PFedMeParams

    def local_train(self, task: LocalTask) -> LocalResult:
        local = task.model  # w_i: starts as the received global model
        personal = copy.deepcopy(local)  # theta: starts the round at w
        optimizer = task.optim.make(personal.parameters())
        step_toward = self.params.step_toward
        local.train()
        personal.train()
        total_ce = 0.0
        for _ in range(task.steps):
            task.check_deadline()
            x, y = task.batches.next()
            anchor = {n: p.detach() for n, p in local.named_parameters()}
            for _ in range(self.params.inner_steps):
                with task.autocast():
                    ce = self.loss(task, personal, x, y)
                loss = ce + 0.5 * self.params.lam * proximal_term(personal, anchor)
                optimizer.zero_grad(set_to_none=True)
                optimizer_step(task, loss, optimizer)
            total_ce += float(ce.detach())
            with torch.no_grad():
                for w, theta in zip(local.parameters(), personal.parameters(), strict=True):
                    w.sub_(step_toward * (w - theta))
        with torch.no_grad():
            pairs = zip(local.parameters(), personal.parameters(), strict=True)
            gap = float(sum((w - t).pow(2).sum() for w, t in pairs).sqrt())  # ||w_i - theta||
        self._send(local, personal, task.global_state)
        self.keep_personal(task, personal)
        return LocalResult(loss=total_ce / max(1, task.steps), metrics={"personal_gap": gap})

    def _send(self, local: nn.Module, personal: nn.Module, received: State) -> None:
        """Leave w + beta * (w_i - w) in the model (what travels), and theta's buffers."""
        with torch.no_grad():
            for name, w in local.named_parameters():
                if self.params.beta != 1.0 and name in received:
                    start = received[name].to(w.dtype)
                    w.copy_(start + self.params.beta * (w - start))
            # Normalization statistics (BatchNorm) are only updated by the forward passes of theta.
            own = dict(personal.named_buffers())
            for name, buffer in local.named_buffers():
                buffer.copy_(own[name])
