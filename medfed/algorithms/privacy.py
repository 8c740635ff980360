"""Sample-level differential privacy for a site's local training (DP-SGD through Opacus).

Each site trains on Poisson-sampled batches (every scan joins a step's batch with probability
q = batch_size / n), each scan's gradient clipped to norm C, Gaussian noise of standard
deviation sigma * C added to their sum. Opacus does all three (``UniformWithReplacementSampler``,
``GradSampleModule``, ``DPOptimizer``) and its accountants (RDP or PRV) turn (sigma, q, steps)
into the epsilon a site has spent at its delta. A site's steps are counted in its private state
(``extra``), so a resumed run goes on from the privacy loss it had reached.

What epsilon covers: every weight a site trains (those it shares and those it keeps); not the
figures it reports (validation and test AUCs) nor the feature statistics it publishes for
abstention (see the README's threat model).
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from medfed.config import DP_DELTA_PER_SCAN, DPSettings
from medfed.core.errors import ConfigError

STEPS_KEY = "dp.steps"
"""The key of a site's private state that counts its DP-SGD steps so far."""
BUDGET_SPENT = "its privacy budget is spent"
"""Words in the reason of every round a site sits out because its budget is spent."""
STOPPED_KEY = "dp.stopped"
"""The key of a site's private state that holds the round its budget stopped it in."""


@dataclass(frozen=True)
class SitePrivacy:
    """One site's DP-SGD: its noise, sampling rate, clip, delta and budget, and the epsilon a
    number of steps costs under them."""

    site: str
    noise: float
    sample_rate: float
    clip: float
    delta: float
    budget: float | None
    accountant: str
    planned_steps: int

    @classmethod
    def plan(
        cls, settings: DPSettings, site: str, n_train: int, batch_size: int, steps: int
    ) -> SitePrivacy:
        """The site's mechanism for a run of ``steps`` DP-SGD steps: with a budget and no noise
        given, the smallest noise that keeps the whole run within it (Opacus' search)."""
        if n_train < 2:
            raise ConfigError(
                f"site {site!r}: differential privacy needs at least 2 training scans, it has "
                f"{n_train}"
            )
        rate = min(1.0, batch_size / n_train)
        delta = settings.delta_for(n_train)
        if delta >= 1 / n_train:  # a delta of 1/n allows leaking one scan outright
            raise ConfigError(
                f"--dp-delta {delta:g} is not below 1/n for site {site!r} (n = {n_train} "
                f"training scans, 1/n = {1 / n_train:.2g}): such a delta allows releasing a "
                "scan outright; give a --dp-delta well below 1/n of the smallest site, or "
                f"leave it out for the default {DP_DELTA_PER_SCAN:g}/n at each site"
            )
        budget = settings.epsilon or None
        noise = settings.noise
        if not noise:
            accountant = settings.accountant
            try:
                noise = noise_for_budget(settings.epsilon, delta, rate, steps, accountant)
            except ValueError as exc:  # Opacus: "The privacy budget is too low."
                raise ConfigError(
                    f"site {site!r}: no noise multiplier keeps {steps} DP-SGD steps at sampling "
                    f"rate {rate:.3f} within epsilon {settings.epsilon:g} (delta {delta:.1e}): "
                    f"{exc} Raise --dp-epsilon, or train fewer rounds or local steps"
                ) from None
        return cls(site, noise, rate, settings.clip, delta, budget, settings.accountant, steps)

    def epsilon(self, steps: int) -> float:
        """The privacy loss after ``steps`` steps, by Opacus' accountant (0 before any)."""
        return spent_epsilon(self.noise, self.sample_rate, int(steps), self.delta, self.accountant)

    def affordable(self, steps: int) -> bool:
        """Whether ``steps`` steps in all stay within the budget."""
        return self.budget is None or self.epsilon(steps) <= self.budget

    def check_affordable(self, before: int, steps: int) -> None:
        """Refuse (:class:`BudgetSpent`) ``steps`` more steps after ``before`` that would take
        the site past its budget."""
        if not self.affordable(before + steps):
            raise BudgetSpent(
                f"site {self.site!r} stopped training, {BUDGET_SPENT}: {steps} more DP-SGD "
                "step(s) would take "
                f"its privacy loss to epsilon {self.epsilon(before + steps):.2f}, past its "
                f"budget {self.budget:g} (spent so far: {self.epsilon(before):.2f} in {before} "
                "step(s)); it keeps its model as it stands"
            )

    def to_dict(self, steps: int, stopped: int | None = None) -> dict[str, Any]:
        return {
            "stopped_round": stopped,
            "epsilon": self.epsilon(steps),
            "delta": self.delta,
            "budget": self.budget,
            "noise_multiplier": self.noise,
            "sample_rate": self.sample_rate,
            "clip": self.clip,
            "steps": int(steps),
            "planned_steps": self.planned_steps,
            "accountant": self.accountant,
        }


# Opacus' accountants are exact but slow (a second or more per call on a small CPU, most of it
# in the RDP of fractional orders); a run asks the same questions many times, so the answers
# are kept for the life of the process.
@functools.lru_cache(maxsize=64)
def noise_for_budget(
    epsilon: float, delta: float, rate: float, steps: int, accountant: str
) -> float:
    """The smallest noise multiplier (to Opacus' tolerance) that keeps ``steps`` steps within
    ``epsilon``: Opacus' own search, once per question in a process."""
    from opacus.accountants.utils import get_noise_multiplier

    with _quiet():
        return float(
            get_noise_multiplier(
                target_epsilon=epsilon,
                target_delta=delta,
                sample_rate=rate,
                steps=steps,
                accountant=accountant,
            )
        )


@functools.lru_cache(maxsize=64)
def _rdp_per_step(noise: float, rate: float) -> tuple[float, ...]:
    """The Renyi DP of one step at each of the RDP accountant's orders (RDP adds up over
    steps: ``steps`` steps cost ``steps`` times this, as Opacus' accountant computes it)."""
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis.rdp import compute_rdp

    orders = RDPAccountant.DEFAULT_ALPHAS
    return tuple(compute_rdp(q=rate, noise_multiplier=noise, steps=1, orders=orders))


@functools.lru_cache(maxsize=1024)
def spent_epsilon(noise: float, rate: float, steps: int, delta: float, accountant: str) -> float:
    """Epsilon after ``steps`` steps of noise ``noise`` at sampling rate ``rate`` (0 before any):
    the RDP accountant's conversion of its orders, or Opacus' PRV accountant."""
    if steps <= 0:
        return 0.0
    if accountant == "rdp":
        from opacus.accountants import RDPAccountant
        from opacus.accountants.analysis.rdp import get_privacy_spent

        rdp = np.asarray(_rdp_per_step(noise, rate)) * steps
        orders = RDPAccountant.DEFAULT_ALPHAS
        with _quiet():
            eps = float(get_privacy_spent(orders=orders, rdp=rdp, delta=delta)[0])
        # The conversion's bound dips below 0 under overwhelming noise; epsilon is then 0.
        return max(0.0, eps)
    from opacus.accountants import create_accountant

    found = create_accountant(accountant)
    found.history = [(noise, rate, steps)]
    with _quiet():
        return float(found.get_epsilon(delta=delta))


def steps_taken(extra: dict[str, torch.Tensor]) -> int:
    value = extra.get(STEPS_KEY)
    return int(value.item()) if value is not None else 0


def count_steps(extra: dict[str, torch.Tensor], steps: int) -> None:
    extra[STEPS_KEY] = torch.tensor(int(steps), dtype=torch.int64)


def stopped_round(extra: dict[str, torch.Tensor]) -> int | None:
    """The round in which the site's budget stopped its training (None: it has not)."""
    value = extra.get(STOPPED_KEY)
    return int(value.item()) if value is not None else None


def mark_stopped(extra: dict[str, torch.Tensor], round_: int) -> None:
    if STOPPED_KEY not in extra:
        extra[STOPPED_KEY] = torch.tensor(int(round_), dtype=torch.int64)


class BudgetSpent(ConfigError):
    """A site's next steps would take it past its privacy budget."""


def check_model(model: nn.Module, backbone: str) -> None:
    """Refuse a model DP-SGD cannot train per scan, naming what to use instead."""
    from opacus.validators import ModuleValidator

    from medfed.models.backbones import SLICE_BACKBONES

    if backbone in SLICE_BACKBONES:
        raise ConfigError(
            f"differential privacy needs each scan's own gradient; backbone {backbone!r} runs "
            "a volume's slices as one batch, so a gradient would be a slice's, not a scan's. "
            "Use --backbone monai3d-gn for CT under DP"
        )
    errors = ModuleValidator.validate(model, strict=False)
    if errors:
        from medfed.models.backbones import group_norm_twin

        twin = group_norm_twin(backbone)
        fix = f"use --backbone {twin}" if twin else "use a GroupNorm backbone"
        first = str(errors[0]).split(".")[0]
        raise ConfigError(
            f"differential privacy cannot train backbone {backbone!r}: {first} (BatchNorm mixes "
            f"the scans of a batch, so no scan has a gradient of its own); {fix}"
        )


# catch_warnings swaps the process-wide filter list: sites training side by side (see
# medfed.federation.lanes) take turns through it, or one could restore a list the other changed.
_QUIET = threading.Lock()
# Opacus' hooks fire on module outputs while the scans themselves need no gradient; PyTorch
# says so at every backward. Set once, for that message only (a filter set around each
# training call would race with other sites' calls).
warnings.filterwarnings("ignore", message="Full backward hook is firing")


@contextmanager
def _quiet() -> Iterator[None]:
    # Opacus warns about secure RNG and about optimal alphas at the edge of its grid; the
    # figures are recorded with their settings, the warnings would only clutter the console.
    with _QUIET, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@contextmanager
def per_sample_gradients(model: nn.Module) -> Iterator[None]:
    """Opacus' per-scan gradient hooks on ``model`` for the duration (the model is shared
    scratch space: hooks, per-scan gradients and in-place activations are undone after)."""
    from opacus import GradSampleModule

    # An in-place activation would overwrite the output Opacus' hooks keep for the backward.
    inplace = [m for m in model.modules() if getattr(m, "inplace", False) is True]
    for module in inplace:
        module.inplace = False
    with _quiet():
        wrapped = GradSampleModule(model, batch_first=True, loss_reduction="mean")
    try:
        yield
    finally:
        wrapped._close()
        for p in model.parameters():
            p.grad_sample = None
            if hasattr(p, "grad_sample"):
                del p.grad_sample
        for module in inplace:
            module.inplace = True


def dp_optimizer(
    optimizer: torch.optim.Optimizer,
    privacy: SitePrivacy,
    n_train: int,
    generator: torch.Generator,
) -> torch.optim.Optimizer:
    """``optimizer`` behind Opacus' DP-SGD: per-scan clipping, then Gaussian noise drawn from
    ``generator`` (seeded: the same seed gives the same noise)."""
    from opacus.optimizers import DPOptimizer

    with _quiet():
        return DPOptimizer(
            optimizer,
            noise_multiplier=privacy.noise,
            max_grad_norm=privacy.clip,
            expected_batch_size=max(1, round(privacy.sample_rate * n_train)),
            loss_reduction="mean",
            generator=generator,
        )


def poisson_batches(
    privacy: SitePrivacy, n_train: int, steps: int, generator: torch.Generator
) -> Iterator[torch.Tensor]:
    """``steps`` Poisson-sampled index batches (each scan in with probability q; a batch may
    be empty), by Opacus' sampler."""
    from opacus.utils.uniform_sampler import UniformWithReplacementSampler

    sampler = UniformWithReplacementSampler(
        num_samples=n_train, sample_rate=privacy.sample_rate, generator=generator, steps=steps
    )
    for index in sampler:
        yield torch.as_tensor(index, dtype=torch.long)


def noise_only(params: list[nn.Parameter]) -> None:
    """Prepare a step on an empty Poisson batch: no scan's gradient, so the optimizer adds
    the noise alone (the step is still counted, as the accountant assumes)."""
    for p in params:
        p.grad_sample = torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device)
