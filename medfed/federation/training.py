"""One call from site manifests to a finished run directory (used by the CLI, demo and bench)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from medfed.config import TrainConfig, load_manifests
from medfed.core.errors import ConfigError
from medfed.data.cache import TensorCache, default_cache_dir
from medfed.data.overview import write_site_overview
from medfed.data.records import Split
from medfed.data.sitedata import SiteData, load_site
from medfed.federation.engine import Engine
from medfed.federation.features import encoded_sites
from medfed.federation.plan import RunPlan, SiteInfo, plan_run
from medfed.federation.pretrained import frozen_backbone
from medfed.models.device import keep_freed_memory
from medfed.routing.evaluation import latency_scans
from medfed.runs import RunDir, Summary

WARMUP_DIR = "warmup"
"""Where a run that builds its own base (``warmup_rounds``) keeps that FedAvg run."""


def load_sites(
    manifest_paths: list[str | Path], cache_dir: Path | None = None, *, progress: bool = False
) -> list[SiteData]:
    """Load and preprocess every site (through the on-disk cache), for training: the
    allocator settings training wants are made first, before any thread has its own arena."""
    keep_freed_memory()
    cache = TensorCache(cache_dir if cache_dir is not None else default_cache_dir())
    return [load_site(m, cache, progress=progress) for m in load_manifests(manifest_paths)]


def train(
    sites: list[SiteData],
    config: TrainConfig,
    out: str | Path,
    *,
    resume: bool = False,
    progress: bool = False,
    echo: Callable[[str], Any] | None = None,
    say: Callable[[str], Any] | None = None,
    cache_dir: Path | None = None,
) -> Summary:
    """Train ``config.algorithm`` over ``sites`` and write the run directory ``out``.

    An algorithm with ``warmup_rounds = N`` (LoRA) first trains FedAvg for N rounds into
    ``out/warmup`` and starts from its weights; ``echo`` hears what the starting weights were.
    A learning rate left unset is the sites' modality's. ``say`` hears the rounds line by line
    (where no progress bar shows). With ``frozen_encoder`` the sites' photos are encoded first
    (cached under ``cache_dir``, by default the image cache's).
    """
    # Planned before anything trains, a warm-up base included; a bad setting of the final
    # evaluation is refused now, not after the rounds.
    latency_scans()
    read = frozen_features(sites, config, cache_dir)
    plan = plan_run(config, [SiteInfo.of(s) for s in read])
    base = warmup_base(read, plan, Path(out), resume, progress, echo, say=say, shown=sites)
    engine = Engine(
        read, plan, RunDir(out), progress=progress, init=base, say=say, describe=_cards(sites)
    )
    report = engine.server.init_report
    if echo is not None and report is not None:
        for line in report.lines():
            echo(line)
    return engine.train(resume=resume)


def _cards(sites: list[SiteData]) -> Callable[[Path], Any] | None:
    """Writes the sites' data cards and overview (the dashboard's Sites page, read by the model
    card) into a run directory; None when ``sites`` hold the encoder's features, not photos."""
    if not all(s.raw[Split.TRAIN].dim() > 2 for s in sites):
        return None
    return lambda run: write_site_overview(run, sites)


def frozen_features(
    sites: list[SiteData], config: TrainConfig, cache_dir: Path | None = None
) -> list[SiteData]:
    """The sites as training reads them: their photos' features under the frozen encoder
    (``frozen_encoder``), or as they are."""
    if not config.frozen_encoder:
        return sites
    backbone = frozen_backbone(config.init, config.backbone)
    return encoded_sites(sites, config, backbone, cache_dir)


def warmup_base(
    sites: list[SiteData],
    plan: RunPlan,
    out: Path,
    resume: bool,
    progress: bool,
    echo: Callable[[str], Any] | None,
    say: Callable[[str], Any] | None = None,
    shown: list[SiteData] | None = None,
) -> str | None:
    """The run's warm-up base, trained first (or resumed, or reused when finished), when the
    algorithm asks for one (``warmup_rounds``); None otherwise. config.toml keeps the setting
    (``init`` stays empty, but for the frozen encoder's file), its [init] table the base it
    started from. ``shown``: the sites as the run's Sites page shows them (their photos, where
    ``sites`` hold the encoder's features)."""
    config = plan.config
    rounds = int(getattr(plan.algorithm.params, "warmup_rounds", 0) or 0)
    if not rounds or not sites:
        return None
    base = (out / WARMUP_DIR).resolve()
    if config.init and not config.frozen_encoder:  # the frozen encoder's file stays
        raise ConfigError(
            f"{config.algorithm}: --init {config.init} and --param warmup_rounds={rounds} both "
            "give the starting weights; pass one of them"
        )
    warmup = dataclasses.replace(
        config,
        algorithm="fedavg",
        params={},
        rounds=rounds,
        backbone=plan.spec.backbone,
        faults=(),
        init=config.init if config.frozen_encoder else "",
        init_strict=False,
    )
    run = RunDir(base)
    if run.summary_path.is_file() and run.failed() is None:
        if echo is not None:
            echo(f"warm-up base: {base} (finished, {rounds} fedavg rounds)")
    else:
        if echo is not None:
            echo(f"warm-up: {rounds} rounds of fedavg into {base}, then {config.algorithm}")
        warmup_plan = plan_run(warmup, plan.sites)
        engine = Engine(
            sites, warmup_plan, run, progress=progress, say=say, describe=_cards(shown or sites)
        )
        engine.train(resume=resume and run.config_path.is_file())
    return str(base)
