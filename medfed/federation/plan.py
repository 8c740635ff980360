"""Run planning, in one place: a run's settings and its sites -> the resolved run.

Every engine (the in-process one, the Flower ServerApp) and ``medfed deploy app`` plan a run
here, so that each fills the same defaults (the algorithm's parameters, the modality's learning
rate, the backbone ``auto`` picks) and refuses the same settings before anything trains.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from medfed.algorithms import dp_algorithms, make_algorithm
from medfed.algorithms.base import Algorithm
from medfed.algorithms.privacy import check_model as check_dp_model
from medfed.config import Modality, TrainConfig
from medfed.core.errors import ConfigError
from medfed.data.modality import modality_spec
from medfed.data.records import Split
from medfed.data.sitedata import SiteData
from medfed.federation.features import encoder_for
from medfed.federation.pretrained import (
    InitReport,
    apply_frozen_init,
    apply_init,
    frozen_backbone,
    resolve_init,
)
from medfed.federation.shared import derive_seed
from medfed.models.backbones import BACKBONES, spatial_dims
from medfed.models.device import DeviceSetup
from medfed.models.fedmodel import FedModel, ModelSpec, build_model


@dataclass(frozen=True)
class SiteInfo:
    """What the server may know of a site: no scans, only their shape and counts."""

    id: str
    modality: str
    labels: dict[str, int]
    input_shape: tuple[int, ...]
    n_train: int
    manifest: dict[str, Any]

    @classmethod
    def of(cls, site: SiteData) -> SiteInfo:
        return cls(
            id=site.id,
            modality=str(site.manifest.modality),
            labels=dict(site.manifest.labels),
            input_shape=tuple(int(d) for d in site.x[Split.TRAIN].shape[1:]),
            n_train=site.n(Split.TRAIN),
            manifest=site.manifest.to_dict(),
        )

    @property
    def n_classes(self) -> int:
        return len(set(self.labels.values()))


@dataclass(frozen=True)
class RunPlan:
    """A run as it will train: its settings with every default filled, its algorithm, its
    sites and their modality, and the model every site builds.

    ``config.backbone`` stays as given (``auto`` is what config.toml records, so that a resumed
    run compares equal); ``spec.backbone`` is the backbone that trains.
    """

    config: TrainConfig
    algorithm: Algorithm
    sites: tuple[SiteInfo, ...]
    modality: Modality
    spec: ModelSpec

    @property
    def site_ids(self) -> list[str]:
        return [s.id for s in self.sites]


def default_lr(modality: Modality | str) -> float:
    """The learning rate of a run on ``modality`` that chose none (CT and fundus differ)."""
    return modality_spec(modality).lr


def default_backbone(modality: Modality, algorithm: Algorithm) -> str:
    """GroupNorm backbones by default; BatchNorm ones for algorithms that keep normalization
    layers on each site (FedBN, and FedDRM unless ``private_norms=false``).

    Shared BatchNorm is a poor default here: every training batch holds one site's scans only,
    so batch statistics wipe out the very site differences, and averaged running statistics fit
    no site (the reference FedDRM code shares everything and uses GroupNorm).
    """
    return modality_spec(modality).default_backbone(algorithm.prefers_batch_norm())


def resolved_backbone(config: TrainConfig, modality: Modality, algorithm: Algorithm) -> str:
    """The run's backbone: ``config.backbone``, or the modality's default for ``auto``; refuses
    a backbone made for the other modality's scans before anything trains."""
    if config.backbone == "auto":
        if config.dp.enabled:
            return modality_spec(modality).default_backbone(False, private=True)
        return default_backbone(modality, algorithm)
    dims = modality_spec(modality).spatial_dims
    if spatial_dims(config.backbone) != dims:
        fits = [name for name in BACKBONES if spatial_dims(name) == dims]
        raise ConfigError(
            f"training setting: backbone (--backbone) {config.backbone!r} takes "
            f"{spatial_dims(config.backbone)}-D scans, but these sites hold {modality} scans "
            f"({dims}-D); choose auto or one of {', '.join(fits)}"
        )
    return config.backbone


def refuse_private(algorithm: Algorithm, config: TrainConfig) -> None:
    """Refuse, before anything trains, differential privacy for an algorithm that cannot have
    it."""
    if config.dp.enabled and algorithm.dp_refusal:
        raise ConfigError(
            f"{algorithm.run_name} cannot train under differential privacy (--dp-epsilon, "
            f"--dp-noise): {algorithm.dp_refusal}. Choose one of {dp_algorithms()}"
        )


def check_federation(sites: Sequence[SiteInfo], config: TrainConfig) -> Modality:
    """Refuse a federation that could not train together; returns its modality."""
    if not sites:
        raise ConfigError("no sites to train on")
    ids = [s.id for s in sites]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"site ids must be unique, got {ids}")
    modalities = {s.modality for s in sites}
    if len(modalities) > 1:
        raise ConfigError(f"all sites must share one modality, got {sorted(modalities)}")
    if config.min_sites > len(sites):
        raise ConfigError(
            f"min_sites={config.min_sites} but only {len(sites)} site(s) were given: "
            "no round could ever aggregate; lower --min-sites"
        )
    label_maps = {s.id: s.labels for s in sites}
    if len({tuple(sorted(m.items())) for m in label_maps.values()}) > 1:
        raise ConfigError(
            f"sites declare different [labels] {label_maps}; a federation needs one label "
            "map (same class names and indices) at every site"
        )
    shapes = {s.id: s.input_shape for s in sites}
    if len(set(shapes.values())) > 1:
        raise ConfigError(
            f"sites preprocess to different input shapes {shapes}; give every site the "
            "same preprocess image_size (fundus) or shape (CT)"
        )
    return Modality(modalities.pop())


def _check_backbone(config: TrainConfig, where: str | None = None) -> None:
    if config.backbone != "auto" and config.backbone not in BACKBONES:
        problem = (
            f"training setting: backbone (--backbone) {config.backbone!r} is not one of "
            f"{['auto', *BACKBONES]}"
        )
        raise ConfigError(f"{where}: {problem}" if where else problem)


def _settled(config: TrainConfig, where: str | None) -> tuple[TrainConfig, Algorithm]:
    """``config`` with every algorithm parameter spelled out, and its algorithm."""
    _check_backbone(config, where)
    algorithm = make_algorithm(config.algorithm, config.params)
    return dataclasses.replace(config, params=dict(algorithm.resolved_params())), algorithm


def resolved_settings(config: TrainConfig, *, where: str | None = None) -> TrainConfig:
    """``config`` with every algorithm parameter spelled out, defaults included, so that the
    run's config.toml re-runs the same training even after a default changes; refuses an
    unknown backbone. ``where``: the file the settings came from (named in the error)."""
    return _settled(config, where)[0]


def settled_algorithm(config: TrainConfig) -> Algorithm:
    """The run's algorithm made from the plan's settings and settled for the run's start, as
    :func:`settle` makes it; what a SuperNode builds from the settings the plan sent it
    (``RunSettings.config``), so that no engine decides any part of it on its own."""
    algorithm = make_algorithm(config.algorithm, config.params)
    algorithm.settle(config.frozen_encoder)
    return algorithm


@dataclass(frozen=True)
class Settled:
    """A run before its sites' data is seen: its settings with every algorithm parameter
    spelled out, and its algorithm, built once, settled and past every refusal that needs no
    scans (for ``site_ids``). :func:`plan_run` finishes it once the sites are known."""

    config: TrainConfig
    algorithm: Algorithm
    site_ids: tuple[str, ...]


def settle(config: TrainConfig, site_ids: Sequence[str], *, where: str | None = None) -> Settled:
    """The run ``config`` asks of ``site_ids``, once the settings it cannot run with are
    refused: an unknown backbone, differential privacy the algorithm cannot have, fault drills
    that could not fire at these sites. ``where``: the file the settings came from."""
    config, algorithm = _settled(config, where)
    algorithm.settle(config.frozen_encoder)
    _refuse(algorithm, config, site_ids)
    return Settled(config, algorithm, tuple(site_ids))


def checked_deployment(config: TrainConfig, site_ids: Sequence[str]) -> Algorithm:
    """The run's algorithm, once every setting :func:`plan_run` and :func:`starting_model`
    would refuse is refused, as far as it can be known without the sites' scans (``medfed
    deploy app`` writes a run that trains elsewhere, later): what :func:`settle` refuses, a
    start the algorithm is not for (LoRA without trained weights), and a backbone
    differential privacy cannot train (BatchNorm, slices as one batch)."""
    algorithm = settle(config, site_ids).algorithm
    algorithm.check_start(bool(config.init))
    if config.dp.enabled and config.backbone != "auto":  # auto picks a private backbone
        spec = ModelSpec(
            backbone=config.backbone,
            # fundus photos are RGB, CT volumes one channel: the norm layers are the same
            in_channels=3 if spatial_dims(config.backbone) == 2 else 1,
            n_sites=len(site_ids),
            client_branch=algorithm.needs_client_branch,
        )
        spec = algorithm.adapt_spec(spec, list(site_ids))
        check_dp_model(build_model(spec), config.backbone)
    return algorithm


def _refuse(algorithm: Algorithm, config: TrainConfig, site_ids: Sequence[str]) -> None:
    refuse_private(algorithm, config)
    config.check_faults(list(site_ids), communicates=algorithm.communicates)


def plan_run(run: TrainConfig | Settled, sites: Sequence[SiteInfo]) -> RunPlan:
    """The run ``run`` makes of ``sites``, or the reason it cannot train: settled here from its
    settings, or already :func:`settle`d (the Flower server settles before it waits for the
    sites). A learning rate left unset (None) is the sites' modality's (CT and fundus differ).
    """
    ids = [s.id for s in sites]
    # Refused in this order: an unknown backbone, a federation that cannot train together, then
    # what the algorithm cannot run with at these sites.
    given = run.config if isinstance(run, Settled) else run
    _check_backbone(given)
    modality = check_federation(sites, given)
    settled = run if isinstance(run, Settled) else settle(run, ids)
    config, algorithm = settled.config, settled.algorithm
    if list(settled.site_ids) != ids:  # sites that refused the run are gone: refuse again
        _refuse(algorithm, config, ids)
    if config.lr is None:
        config = dataclasses.replace(config, lr=default_lr(modality))
    first = sites[0]
    in_channels = int(first.input_shape[0])
    if config.frozen_encoder:
        backbone = frozen_backbone(config.init, config.backbone)
        if len(first.input_shape) == 3:  # photos (a SuperNode's): the encoder's output width
            encoder = encoder_for(config, backbone).module
            in_channels = encoder.output_shape(first.input_shape[1:])[0]
    else:
        backbone = resolved_backbone(config, modality, algorithm)
    spec = ModelSpec(
        backbone=backbone,
        in_channels=in_channels,
        n_classes=first.n_classes,
        n_sites=len(sites),
        client_branch=algorithm.needs_client_branch,
        frozen_encoder=config.frozen_encoder,
        unfreeze_blocks=config.unfreeze_blocks,
    )
    spec = algorithm.adapt_spec(spec, ids)
    return RunPlan(config, algorithm, tuple(sites), modality, spec)


def initial_model(spec: ModelSpec, algorithm: Algorithm, seed: int, setup: DeviceSetup) -> FedModel:
    """The model every site starts from: the same weights wherever it is built."""
    torch.manual_seed(derive_seed(seed, 0))
    model = build_model(spec).to(setup.device)
    algorithm.initialize(model, seed)
    if setup.channels_last and spatial_dims(spec.backbone) == 2:
        model = model.to(memory_format=torch.channels_last)
    return model


def starting_model(
    plan: RunPlan, setup: DeviceSetup, init: str | None = None
) -> tuple[FedModel, InitReport | None]:
    """The model the run starts from, checked before anything trains: seeded random weights,
    with the starting weights (``config.init``, or ``init`` in its place: a run's own warm-up
    base) loaded over them; and the record of what was loaded."""
    config, algorithm = plan.config, plan.algorithm
    source = init or config.init
    # The frozen encoder's file starts the encoder; the trained part then starts from it only
    # where blocks are unfrozen (a trunk alone starts random).
    encoder_only = plan.spec.frozen_encoder and source == config.init
    algorithm.check_start(bool(source) and not (encoder_only and not plan.spec.unfreeze_blocks))
    model = initial_model(plan.spec, algorithm, config.seed, setup)
    algorithm.check(model)
    if config.dp.enabled:
        check_dp_model(model, plan.spec.backbone)
    if not source:
        return model, None
    if encoder_only:
        keys = set(encoder_for(config, plan.spec.backbone).module.state_dict())
        return model, apply_frozen_init(model, resolve_init(source), keys)
    return model, apply_init(model, resolve_init(source), strict=config.init_strict)
