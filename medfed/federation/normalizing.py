"""A run's normalization policy, the same for both engines (the in-process engine and each
SuperNode): the sites' own statistics, the federation's pooled ones, or ImageNet's."""

from __future__ import annotations

from medfed.config import TrainConfig
from medfed.core.errors import ConfigError
from medfed.core.normalization import IMAGENET_MEAN, IMAGENET_STD, Normalization
from medfed.data.records import Split
from medfed.data.sitedata import SiteData


def federation_normalized(sites: list[SiteData]) -> list[SiteData]:
    """Every site normalized with the federation's pooled statistics: each site contributes
    the per-channel count, sum and sum of squares of its training scans, never the scans."""
    if any(not s.manifest.preprocess.normalize for s in sites):
        off = [s.id for s in sites if not s.manifest.preprocess.normalize]
        raise ConfigError(
            f"normalization = 'federation' needs every site to normalize; {off} set "
            "preprocess.normalize = false in their manifests"
        )
    pooled = Normalization.pooled([Normalization.moments(s.raw[Split.TRAIN]) for s in sites])
    return [s.renormalized(pooled) for s in sites]


def imagenet_normalized(sites: list[SiteData]) -> list[SiteData]:
    """Every site normalized with the ImageNet statistics that come with torchvision's
    pretrained weights (photos scaled to [0, 1], three channels)."""
    wrong = {s.id: int(s.raw[Split.TRAIN].shape[1]) for s in sites}
    wrong = {site: channels for site, channels in wrong.items() if channels != len(IMAGENET_MEAN)}
    if wrong:
        raise ConfigError(
            f"normalization = 'imagenet' (--init-normalization) is for three-channel photos; "
            f"site(s) {wrong} have other channel counts: use --init-normalization site"
        )
    norm = Normalization(mean=tuple(IMAGENET_MEAN), std=tuple(IMAGENET_STD))
    return [s.renormalized(norm) for s in sites]


def normalized(sites: list[SiteData], config: TrainConfig) -> list[SiteData]:
    """The sites as ``config.normalization`` asks (their own statistics are the default).
    The frozen encoder's features keep their identity normalization: the photos met ImageNet's
    statistics before the encoder."""
    if config.frozen_encoder:
        return sites
    if config.normalization == "federation":
        return federation_normalized(sites)
    if config.normalization == "imagenet":
        return imagenet_normalized(sites)
    return sites
