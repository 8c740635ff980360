"""What the coordinator and the site worker both use: derived seeds, the learning-rate
schedule over rounds, and copies of a model's state."""

from __future__ import annotations

import math

import numpy as np
import torch

State = dict[str, torch.Tensor]


def derive_seed(*parts: int) -> int:
    """One seed from several (the run's seed, a round, a site): the same parts, the same seed."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


def cosine_lr(base: float, round_: int, rounds: int) -> float:
    """Cosine decay over rounds, from ``base`` in round 1 toward 0 (as the reference FedDRM)."""
    return 0.5 * base * (1 + math.cos(math.pi * (round_ - 1) / rounds))


def clone_state(state: State) -> State:
    """A copy of ``state``'s tensors, detached from any graph."""
    return {k: v.detach().clone() for k, v in state.items()}
