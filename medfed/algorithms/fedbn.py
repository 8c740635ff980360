"""FedBN: normalization layers (weights and running statistics) stay on each site."""

from __future__ import annotations

from torch import nn

from medfed.algorithms.base import Algorithm
from medfed.core.errors import ConfigError
from medfed.models.fedmodel import norm_state_keys


class FedBN(Algorithm):
    name = "fedbn"
    summary = "FedAvg except normalization layers, which stay local (found by module type)"

    def prefers_batch_norm(self) -> bool:
        return True

    def private_keys(self, model: nn.Module) -> set[str]:
        keys = norm_state_keys(model)
        if not keys:
            raise ConfigError(
                "fedbn keeps normalization layers local, but this model has none; "
                "choose a backbone with BatchNorm (cnn, resnet18-bn, monai3d, slices-cnn, "
                "slices-resnet18-bn)"
            )
        return keys
