"""What a run directory tells about its sites: data cards, class counts, sample images, the
shift between sites and a 2-D map of their scans (read by the dashboard's Sites page).

    RUN/site_overview/overview.json        counts, class ratios, distances, embedding
    RUN/site_overview/cards/<id>.md        each site's data card as of this run
    RUN/site_overview/samples/<id>/N.png   a few preprocessed scans per site (optional)

Written once training has finished, from the sites' preprocessed scans. Every part is optional
for a reader: a federation deployed across machines may publish only card statistics (no
images, no per-scan embedding), and the page says what is missing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from medfed.config import Modality
from medfed.core.errors import RunDirError
from medfed.core.fileio import atomic_write
from medfed.core.versions import unversioned, versioned
from medfed.data.cards import render_card
from medfed.data.checks import SiteReport, split_warnings
from medfed.data.distances import SiteFeatures, distance_matrix, scan_features, site_distances
from medfed.data.modality import modality_spec
from medfed.data.records import Split
from medfed.data.sitedata import SiteData

OVERVIEW_DIR = "site_overview"
OVERVIEW_FILE = "overview.json"
FORMAT_VERSION = 1
MAX_EMBEDDED_PER_SITE = 200


def overview_dir(run_dir: str | os.PathLike[str]) -> Path:
    """``RUN/site_overview`` of the run directory ``run_dir``."""
    return Path(run_dir) / OVERVIEW_DIR


def split_counts(site: SiteData) -> dict[str, dict[str, int]]:
    """split -> class name -> number of scans; classes in the order the manifest declares them
    (as ``medfed sites check`` lists them)."""
    names = site.manifest.class_names()
    order = [(i, names[i]) for i in dict.fromkeys(site.manifest.labels.values())]
    counts = {}
    for split in Split:
        per = site.class_counts(split)
        counts[str(split)] = {name: per.get(i, 0) for i, name in order}
    return counts


def class_ratio(counts: dict[str, dict[str, int]]) -> dict[str, float]:
    """Share of each class over all splits (0 for every class of an empty site)."""
    totals: dict[str, int] = {}
    for per in counts.values():
        for name, n in per.items():
            totals[name] = totals.get(name, 0) + n
    total = sum(totals.values())
    return {name: (n / total if total else 0.0) for name, n in totals.items()}


def _labels(site: SiteData) -> torch.Tensor:
    """The label of every scan of the site, split after split."""
    return torch.cat([site.y[s] for s in Split])


def _features(site: SiteData) -> np.ndarray | None:
    """Appearance features of every scan of the site (see medfed.data.distances), read scan
    by scan from the stored splits (no copy of the site is made)."""
    feats = [scan_features(t) for s in Split for t in site.raw[s]]
    return np.stack(feats) if feats else None


def _card_report(site: SiteData, distances: dict[str, float]) -> SiteReport:
    """What the run knows of a site, in the form its data card is rendered from."""
    n = sum(site.n(s) for s in Split)
    counts = split_counts(site)
    return SiteReport(
        manifest=str(site.manifest.manifest_path or site.id),
        site=site.id,
        modality=str(site.manifest.modality),
        layout=site.manifest.layout,
        root=str(site.manifest.root),
        n_records=n,
        n_readable=n,
        counts=counts,
        sizes={"after preprocessing": list(site.raw[Split.TRAIN].shape[1:])} if n else {},
        distances=distances,
        warnings=split_warnings(counts, site.manifest.class_names()),
    )


def embedding(sites: list[SiteData], features: list[np.ndarray | None]) -> dict[str, Any] | None:
    """First two principal components of the standardized scan features, per scan."""
    rng = np.random.default_rng(0)
    rows, site_of, label_of = [], [], []
    for site, feats in zip(sites, features, strict=True):
        if feats is None:
            continue
        y = _labels(site)
        keep = np.arange(len(feats))
        if keep.size > MAX_EMBEDDED_PER_SITE:
            keep = np.sort(rng.choice(keep, MAX_EMBEDDED_PER_SITE, replace=False))
        names = site.manifest.class_names()
        rows.append(feats[keep])
        site_of += [site.id] * keep.size
        label_of += [names.get(int(y[i]), str(int(y[i]))) for i in keep]
    if not rows or sum(len(r) for r in rows) < 3:
        return None
    feats = np.concatenate(rows)
    scaled = (feats - feats.mean(0)) / (feats.std(0) + 1e-8)
    _, singular, vt = np.linalg.svd(scaled, full_matrices=False)
    xy = scaled @ vt[:2].T
    if xy.shape[1] < 2:
        return None
    share = singular**2 / max(float((singular**2).sum()), 1e-12)
    return {
        "method": "PCA of standardized appearance features",
        "explained_variance": [round(float(v), 4) for v in share[:2]],
        "site": site_of,
        "label": label_of,
        "x": [round(float(v), 4) for v in xy[:, 0]],
        "y": [round(float(v), 4) for v in xy[:, 1]],
    }


def to_picture(tensor: torch.Tensor, modality: Modality | str) -> np.ndarray:
    """A preprocessed scan as an 8-bit picture: RGB for a photo, the middle slice of a volume."""
    x = tensor.detach().float().cpu()
    if modality_spec(modality).spatial_dims == 3:
        x = x[0, x.shape[1] // 2]  # (1, D, H, W) -> middle (H, W) slice
    else:
        x = x.permute(1, 2, 0) if x.shape[0] in (1, 3) else x
        x = x[..., 0] if x.shape[-1] == 1 else x
    low, high = float(x.min()), float(x.max())
    if low < 0 or high > 1:  # not in the pipeline's [0, 1] range: stretch for display
        x = (x - low) / (high - low) if high > low else torch.zeros_like(x)
    return (x.clamp(0, 1) * 255).round().to(torch.uint8).numpy()


def _write_samples(site: SiteData, folder: Path, per_site: int) -> list[dict[str, Any]]:
    """A few training scans of each class, as PNG files under ``folder``."""
    names = site.manifest.class_names()
    x, y = site.raw[Split.TRAIN], site.y[Split.TRAIN]
    per_class = max(1, per_site // max(1, len(names)))
    chosen = []
    for index in names:
        chosen += torch.nonzero(y == index).flatten().tolist()[:per_class]
    folder.mkdir(parents=True, exist_ok=True)
    samples = []
    for k, i in enumerate(sorted(chosen)[:per_site]):
        path = folder / f"{k}.png"
        Image.fromarray(to_picture(x[i], site.manifest.modality)).save(path)
        relative = path.relative_to(folder.parent.parent).as_posix()
        samples.append({"file": relative, "label": names[int(y[i])], "split": str(Split.TRAIN)})
    return samples


def write_site_overview(
    run_dir: str | os.PathLike[str],
    sites: list[SiteData],
    *,
    samples_per_site: int = 4,
    embed: bool = True,
) -> Path:
    """Write ``RUN/site_overview/`` under the run directory ``run_dir``.

    ``samples_per_site=0`` and ``embed=False`` publish only card statistics and site distances
    (no image, no per-scan point).
    """
    out = overview_dir(run_dir)
    features = [_features(site) for site in sites]
    # The same measure as 'medfed sites check', so the card and onboarding agree.
    distances = site_distances(
        [
            SiteFeatures(site.id, str(site.manifest.modality), feats)
            for site, feats in zip(sites, features, strict=True)
        ]
    )
    overview: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "modality": str(sites[0].manifest.modality) if sites else None,
        "images": samples_per_site > 0,
        "sites": {},
        "distances": distance_matrix([site.id for site in sites], distances),
        "embedding": embedding(sites, features) if embed else None,
    }
    for site, site_distance in zip(sites, distances, strict=True):
        report = _card_report(site, site_distance)
        card = out / "cards" / f"{site.id}.md"
        atomic_write(card, render_card(site.manifest, report))
        samples = []
        if samples_per_site > 0:
            samples = _write_samples(site, out / "samples" / site.id, samples_per_site)
        overview["sites"][site.id] = {
            "modality": str(site.manifest.modality),
            "counts": report.counts,
            "class_ratio": class_ratio(report.counts),
            "n_scans": report.n_records,
            "input_shape": list(site.raw[Split.TRAIN].shape[1:]),
            "card": card.relative_to(out).as_posix(),
            "samples": samples,
        }
    text = json.dumps(versioned(overview), indent=2, sort_keys=True) + "\n"
    atomic_write(out / OVERVIEW_FILE, text)
    return out


def read_site_overview(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The overview, or None when the run directory has none; RunDirError when damaged."""
    path = overview_dir(run_dir) / OVERVIEW_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise RunDirError(f"{path}: not valid JSON ({exc}); rewrite it by retraining") from exc
    data = unversioned(data, str(path))
    if not isinstance(data.get("sites"), dict):
        raise RunDirError(f"{path}: no 'sites' table; the file is damaged")
    return data
