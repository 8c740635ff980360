"""Local-only: each site trains alone; nothing leaves the site (the lower bar to beat)."""

from __future__ import annotations

from torch import nn

from medfed.algorithms.base import Algorithm


class LocalOnly(Algorithm):
    name = "local"
    summary = "each site trains on its own data only; no communication"
    communicates = False

    def private_keys(self, model: nn.Module) -> set[str]:
        return set(model.state_dict())
