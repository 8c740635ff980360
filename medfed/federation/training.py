"""One call from site manifests to a finished run directory (used by the CLI, demo and bench)."""

from __future__ import annotations

from pathlib import Path

from medfed.algorithms import make_algorithm
from medfed.config import TrainConfig, load_manifests
from medfed.data.cache import TensorCache, default_cache_dir
from medfed.data.overview import write_site_overview
from medfed.data.sitedata import SiteData, load_site
from medfed.federation.engine import Engine
from medfed.runs import RunDir, Summary


def load_sites(
    manifest_paths: list[str | Path], cache_dir: Path | None = None, *, progress: bool = False
) -> list[SiteData]:
    """Load and preprocess every site (through the on-disk cache)."""
    cache = TensorCache(cache_dir if cache_dir is not None else default_cache_dir())
    return [load_site(m, cache, progress=progress) for m in load_manifests(manifest_paths)]


def train(
    sites: list[SiteData],
    config: TrainConfig,
    out: str | Path,
    *,
    resume: bool = False,
    progress: bool = False,
) -> Summary:
    """Train ``config.algorithm`` over ``sites`` and write the run directory ``out``."""
    algorithm = make_algorithm(config.algorithm, config.params)
    engine = Engine(sites, algorithm, config, RunDir(out), progress=progress)
    summary = engine.train(resume=resume)
    write_site_overview(out, sites)  # the dashboard's Sites page
    return summary
