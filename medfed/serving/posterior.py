"""The routing posterior's calibration, fitted when the federation is published.

Each site scores its own validation scans with every site's model (the scans never leave; only
their K density-ratio scores do, as the abstention scores do); the server fits one temperature
on the pooled scores by the NLL of the true site, and the review queue's low-margin line where
routing on validation falls below :data:`~medfed.metrics.MARGIN_TARGET`. Both are published with
the model (:class:`~medfed.serving.bundle.RoutingFit`), so ``medfed route``, the evaluation and
the dashboard read the same posterior.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from medfed.metrics import (
    MARGIN_TARGET,
    fit_temperature,
    margin_threshold,
    softmax_rows,
    top_margin,
)
from medfed.serving.bundle import RoutingFit, TrainedFederation
from medfed.serving.routers import DensityRatioRouter


def routing_scores(fed: TrainedFederation, raw: torch.Tensor) -> np.ndarray:
    """Uncalibrated density-ratio scores (n, K) of scans before normalization, each site
    reading them in its own view; (0, K) for a federation without a client head."""
    k = len(fed.sites)
    if not fed.routes or raw.shape[0] == 0:
        return np.zeros((0, k))
    views = [s.normalization.apply(raw) for s in fed.sites]
    return DensityRatioRouter().scores(fed, fed.outputs(views))


def fit_routing(
    fed: TrainedFederation, scores: Mapping[str, np.ndarray], target: float = MARGIN_TARGET
) -> RoutingFit | None:
    """The temperature and low-margin line from every site's validation scores (by site id);
    None when no site has validation scans (the model then routes at temperature 1)."""
    ids = [s.id for s in fed.sites]
    parts = [(ids.index(site), np.asarray(z)) for site, z in scores.items() if site in ids]
    parts = [(i, z) for i, z in parts if z.shape[0]]
    if not parts:
        return None
    z = np.concatenate([p for _, p in parts])
    y = np.concatenate([np.full(p.shape[0], i) for i, p in parts])
    temperature = fit_temperature(z, y)
    probs = softmax_rows(z, temperature)
    low = margin_threshold(top_margin(probs), probs.argmax(axis=1) == y, target)
    return RoutingFit(temperature, low, target, int(y.size))
