"""Model zoo: backbones, the federated model with its target and client heads."""

from medfed.models.backbones import (
    BACKBONES,
    BACKBONES_2D,
    BACKBONES_3D,
    ModelConfigError,
    build_backbone,
    spatial_dims,
)
from medfed.models.fedmodel import (
    NORM_TYPES,
    SUBMODULES,
    FedModel,
    ModelOutput,
    ModelSpec,
    build_model,
    keys_with_prefix,
    norm_state_keys,
)

__all__ = [
    "BACKBONES",
    "BACKBONES_2D",
    "BACKBONES_3D",
    "NORM_TYPES",
    "SUBMODULES",
    "FedModel",
    "ModelConfigError",
    "ModelOutput",
    "ModelSpec",
    "build_backbone",
    "build_model",
    "keys_with_prefix",
    "norm_state_keys",
    "spatial_dims",
]
