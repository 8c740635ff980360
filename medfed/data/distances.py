"""How different sites' scans look: appearance features and the MMD between sites.

One measure for onboarding (``medfed sites check``, the data cards) and for the dashboard's
site overview, so that both report the same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

METHOD = "MMD² (RBF kernel) on channel moments and a coarse thumbnail"
MAX_PER_SITE = 200  # scans drawn per site: the kernel matrix grows with the square of the count
DECIMALS = 4


class SiteFeatures(NamedTuple):
    """One site's scan features (one row per scan), or None when it has no readable scan."""

    site: str
    modality: str
    features: np.ndarray | None


def scan_features(tensor: torch.Tensor) -> np.ndarray:
    """Simple appearance features of a preprocessed scan: channel moments + a coarse thumbnail."""
    x = tensor.float()[None]
    pooled = F.adaptive_avg_pool2d(x, 4) if x.dim() == 4 else F.adaptive_avg_pool3d(x, 2)
    dims = tuple(range(2, x.dim()))
    moments = torch.cat([x.mean(dim=dims), x.std(dim=dims)], dim=1)
    return torch.cat([moments.flatten(), pooled.flatten()]).numpy().astype(np.float64)


def mmd_rbf(a: np.ndarray, b: np.ndarray) -> float:
    """Squared maximum mean discrepancy with an RBF kernel (median-distance bandwidth)."""
    both = np.concatenate([a, b])
    sq = ((both[:, None, :] - both[None, :, :]) ** 2).sum(-1)
    positive = sq[sq > 0]
    bandwidth = np.median(positive) if positive.size else 1.0
    k = np.exp(-sq / bandwidth)
    n = len(a)
    kaa, kbb, kab = k[:n, :n], k[n:, n:], k[:n, n:]
    value = float(kaa.mean() + kbb.mean() - 2 * kab.mean())
    # NaN features give NaN, never a distance of 0 (max would have turned NaN into 0)
    return value if not np.isfinite(value) else max(0.0, value)


def site_distances(
    sites: Sequence[SiteFeatures], *, max_per_site: int = MAX_PER_SITE
) -> list[dict[str, float]]:
    """MMD² from each site to every other site of its modality (features differ across them).

    One ``{other site: distance}`` per given site, in order (the others in the order given);
    empty for a site with fewer than two scans, or without another such site of its modality.
    A pair's figure depends on the two sites' scans only, never on which other sites are
    passed: features are scaled on the pair's scans and the kernel bandwidth comes from them.
    """
    distances: list[dict[str, float]] = [{} for _ in sites]
    usable = [i for i, s in enumerate(sites) if s.features is not None and len(s.features) > 1]
    drawn = {i: _subsample(sites[i].features, max_per_site) for i in usable}
    for i in usable:
        for j in usable:
            if i < j and sites[i].modality == sites[j].modality:
                d = round(pair_distance(drawn[i], drawn[j]), DECIMALS)
                if np.isfinite(d):  # a pair without a finite figure stays unmeasured
                    distances[i][sites[j].site] = distances[j][sites[i].site] = d
    for i in usable:  # the others in the order given
        distances[i] = {s.site: distances[i][s.site] for s in sites if s.site in distances[i]}
    return distances


def pair_distance(a: np.ndarray, b: np.ndarray) -> float:
    """MMD² between two sites' feature rows, each feature scaled on the two sites' rows."""
    pooled = np.concatenate([a, b])
    mean, std = pooled.mean(0), pooled.std(0) + 1e-8
    return mmd_rbf((a - mean) / std, (b - mean) / std)


def _subsample(features: np.ndarray, max_per_site: int) -> np.ndarray:
    """At most ``max_per_site`` rows, drawn reproducibly from the set of rows (not their order)."""
    feats = np.asarray(features, dtype=np.float64)
    if len(feats) <= max_per_site:
        return feats
    feats = feats[np.lexsort(feats.T[::-1])]
    rng = np.random.default_rng(0)
    return feats[np.sort(rng.choice(len(feats), max_per_site, replace=False))]


def distance_matrix(
    ids: Sequence[str], distances: Sequence[dict[str, float]]
) -> dict[str, Any] | None:
    """Symmetric site-by-site table (0 on the diagonal), or None unless every pair is measured.

    ``distances`` holds one ``{other site: distance}`` per id, as :func:`site_distances` gives.
    """
    ids = list(ids)
    by_site = dict(zip(ids, distances, strict=True))
    if len(ids) < 2 or not all(set(by_site[a]) == set(ids) - {a} for a in ids):
        return None
    matrix = [[0.0 if a == b else float(by_site[a][b]) for b in ids] for a in ids]
    return {"method": METHOD, "sites": ids, "matrix": matrix}
