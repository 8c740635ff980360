"""What ``medfed sites heterogeneity`` gathers before the report is made: each site's class
counts and the MMD² between sites (from the sites' scans, or from a run's site overview), and a
trained run's cross-site matrix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from medfed.core.errors import ManifestError, RunDirError
from medfed.reports.heterogeneity import cross_figures, task_of, test_sizes


def manifests_in(sites_dir: Path) -> list[Path]:
    """The manifests of a federation folder: ``DIR/sites/*.toml``, else ``DIR/*.toml``."""
    if not sites_dir.is_dir():
        raise ManifestError(f"--sites-dir {sites_dir}: not a folder; give a federation's folder")
    found = sorted((sites_dir / "sites").glob("*.toml")) or sorted(sites_dir.glob("*.toml"))
    if not found:
        raise ManifestError(
            f"--sites-dir {sites_dir}: no site manifests (*.toml) in it or in its sites/ folder"
        )
    return found


def site_figures(
    sites_dir: Path | None, run: Path | None, modality: str | None, cache_dir: Path | None
) -> tuple[dict[str, Any], dict[str, Any] | None, str]:
    """Each site's counts (split -> class -> n), the MMD² matrix, and the task the covariate
    bands are taken for ("glaucoma", "dr" or the modality)."""
    if sites_dir is None:
        return _from_overview(run, modality)
    from medfed.data.cache import TensorCache, default_cache_dir
    from medfed.data.checks import check_manifests
    from medfed.data.distances import distance_matrix

    reports = check_manifests(
        manifests_in(sites_dir), TensorCache(cache_dir or default_cache_dir())
    )
    unusable = [f"{r.manifest}: {r.unusable}" for r in reports if r.unusable]
    if unusable:
        raise ManifestError("unusable site(s); fix them first:\n  " + "\n  ".join(unusable))
    chosen = _one_modality([r.modality for r in reports], modality, f"--sites-dir {sites_dir}")
    reports = [r for r in reports if r.modality == chosen]
    counts = {r.site: r.counts for r in reports}
    ids = list(counts)
    distances = distance_matrix(
        ids, [{k: v for k, v in r.distances.items() if k in ids} for r in reports]
    )
    return counts, distances, task_of(chosen, counts)


def _from_overview(run: Path | None, modality: str | None) -> tuple[dict, dict | None, str]:
    from medfed.data.overview import read_site_overview

    overview = read_site_overview(run)
    if overview is None:
        raise RunDirError(
            f"{run}: no site overview (site_overview/overview.json); give the sites with "
            "--sites-dir DIR"
        )
    sites = overview["sites"]
    chosen = _one_modality([i.get("modality") for i in sites.values()], modality, str(run))
    counts = {s: i.get("counts", {}) for s, i in sites.items() if i.get("modality") == chosen}
    return counts, overview.get("distances"), task_of(chosen, counts)


def _one_modality(found: list[str | None], wanted: str | None, where: str) -> str:
    kinds = list(dict.fromkeys(m for m in found if m))
    if wanted is not None:
        if wanted not in kinds:
            raise ManifestError(f"{where}: no {wanted} sites (it has: {', '.join(kinds)})")
        return wanted
    if len(kinds) != 1:
        raise ManifestError(
            f"{where} holds {', '.join(kinds) or 'no'} sites; choose one with --modality"
        )
    return kinds[0]


def run_figures(run: Path, sites: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The run's cross-site matrix per figure (``{figure: {model: {data: value}}}``) and its
    sites' test split counts."""
    from medfed.runs import RunDir

    summary = RunDir(run).require().read_summary()
    cross = summary.cross_site
    other = sorted(set(cross) - set(sites))
    if other:
        raise RunDirError(
            f"{run}: its sites {', '.join(other)} are not among the sites given "
            f"({', '.join(sites)}); give the run of these sites"
        )
    return cross_figures(cross), test_sizes(summary.sites)
