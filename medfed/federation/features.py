"""The frozen-encoder mode's data side: each site's scans through the frozen encoder, once.

A site's preprocessed photos (the image cache's tensors) are normalized with ImageNet's
statistics, as the pretrained weights expect, and passed through the encoder; the features
replace the photos in the site's data, under an identity normalization (the trunk's LayerNorm
scales them). The features of a split are cached as one stacked file keyed by the encoder (its
weights' hash and cut) and the split's bytes, and checked against their digest when read, like
the image cache.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from medfed.config import TrainConfig
from medfed.core.errors import ConfigError
from medfed.core.progress import bar
from medfed.data.cache import TensorCache, data_digest, default_cache_dir
from medfed.data.preprocess import Normalization
from medfed.data.records import Split
from medfed.data.sitedata import SiteData
from medfed.federation.pretrained import (
    TORCHVISION_FORMATS,
    read_init,
    resolve_init,
    state_sha256,
    torchvision_names,
)
from medfed.models.device import resolve_device
from medfed.models.encoder import ENCODE_BATCH, IMAGENET, EncoderError, FrozenEncoder
from medfed.models.fedmodel import ModelSpec


@dataclass(frozen=True)
class Encoder:
    """A frozen encoder with its weights loaded, and what identifies it."""

    module: FrozenEncoder
    source: str  # the --init text its weights came from
    sha256: str  # of the encoder's tensors (pretrained.state_sha256)

    @property
    def fingerprint(self) -> str:
        return f"{self.module.backbone}:{self.module.unfreeze}:{self.sha256}:imagenet"

    def info(self) -> dict[str, Any]:
        """What model.json records of the encoder (its weights are model/encoder.safetensors)."""
        return {
            "backbone": self.module.backbone,
            "unfreeze_blocks": self.module.unfreeze,
            "sha256": self.sha256,
            "source": self.source,
            "input_normalization": IMAGENET.to_dict(),
        }

    def encode(self, raw: torch.Tensor, *, progress: str | None = None) -> torch.Tensor:
        """Features of preprocessed, not yet normalized scans (N, 3, H, W), in float32."""
        starts = range(0, raw.shape[0], ENCODE_BATCH)
        shown = bar(starts, progress or "encoding", show=progress is not None, unit="batch")
        return self.module.encode(raw, shown)


def encoder_for(config: TrainConfig, backbone: str) -> Encoder:
    """The run's frozen encoder: ``backbone``'s first blocks with the weights of ``--init``."""
    return _encoder(config.init, backbone, config.unfreeze_blocks)


@lru_cache(maxsize=4)
def _encoder(init: str, backbone: str, unfreeze: int) -> Encoder:
    source = resolve_init(init)
    state, fmt = read_init(source)
    if fmt not in TORCHVISION_FORMATS:
        raise ConfigError(
            f"--frozen-encoder: --init {init} holds {fmt} weights; the frozen encoder starts "
            "from torchvision's ImageNet weights (e.g. --init torchvision:mobilenet_v2)"
        )
    try:
        module = FrozenEncoder(backbone, unfreeze)
        module.load_torchvision(torchvision_names(state, fmt))
    except EncoderError as exc:
        raise ConfigError(f"--frozen-encoder with --init {init}: {exc}") from None
    return Encoder(module, init, state_sha256(module.state_dict()))


def encoded_site(site: SiteData, encoder: Encoder, cache: TensorCache) -> SiteData:
    """``site`` with every split's scans replaced by their features (cached by content); a
    site that already holds the encoder's features (N, D) is returned as it is."""
    if site.raw[Split.TRAIN].dim() == 2:
        return site
    channels = int(site.raw[Split.TRAIN].shape[1])
    if channels != 3 or site.raw[Split.TRAIN].dim() != 4:
        raise ConfigError(
            f"site {site.id!r}: the frozen encoder takes three-channel photos (N, 3, H, W); "
            f"this site's scans are {tuple(site.raw[Split.TRAIN].shape[1:])}"
        )
    raw = {
        split: _encoded_split(site, split, tensor, encoder, cache)
        for split, tensor in site.raw.items()
    }
    width = int(raw[Split.TRAIN].shape[1])
    return replace(site, raw=raw, normalization=Normalization.identity(width))


def _encoded_split(
    site: SiteData, split: Split, tensor: torch.Tensor, encoder: Encoder, cache: TensorCache
) -> torch.Tensor:
    key = hashlib.sha256(
        f"features:{encoder.fingerprint}:{tuple(tensor.shape)}:{tensor.dtype}:"
        f"{data_digest(tensor.contiguous())}".encode()
    ).hexdigest()
    rows = int(tensor.shape[0])
    stored = cache.get_stack(key, rows, torch.float32) if rows else None
    if stored is not None:
        return stored
    features = encoder.encode(tensor, progress=f"{site.id} {split}: encoding" if rows else None)
    return cache.put_stack(key, features) if rows else features


def encoded_sites(
    sites: list[SiteData], config: TrainConfig, backbone: str, cache_dir: Path | None = None
) -> list[SiteData]:
    """The sites as the frozen-encoder mode trains on them (unchanged without it)."""
    if not config.frozen_encoder:
        return sites
    encoder = encoder_for(config, backbone)
    encoder.module.to(resolve_device(config.device).device)
    cache = TensorCache(cache_dir if cache_dir is not None else default_cache_dir())
    return [encoded_site(site, encoder, cache) for site in sites]


def frozen_encoder_of(config: TrainConfig, spec: ModelSpec) -> dict[str, Any]:
    """What a trained federation keeps of the run's frozen encoder (nothing without one)."""
    if not spec.frozen_encoder:
        return {}
    encoder = encoder_for(config, spec.backbone)
    return {"encoder": encoder.module, "encoder_info": encoder.info()}
