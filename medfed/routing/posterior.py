"""The routing posterior's calibration, fitted when the federation is published.

Each site scores its own validation scans with every site's model (the scans never leave; only
their K density-ratio scores do, as the abstention scores do); the server fits one temperature
on the pooled scores by the NLL of the true site, and the review queue's low-margin line where
routing on validation falls below :data:`~medfed.metrics.MARGIN_TARGET`. Both are published with
the model (:class:`~medfed.routing.bundle.RoutingFit`), so ``medfed route``, the evaluation and
the dashboard read the same posterior.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import torch

from medfed.metrics import (
    MARGIN_TARGET,
    fit_temperature,
    margin_band,
    margin_threshold,
    softmax_rows,
    top_margin,
)
from medfed.metrics.routing import nll
from medfed.routing.bundle import RoutingFit, TrainedFederation
from medfed.routing.routers import DensityRatioRouter, density_ratio_scores, log_softmax


def routing_scores(fed: TrainedFederation, raw: torch.Tensor) -> np.ndarray:
    """Uncalibrated density-ratio scores of scans before normalization, each site reading them
    in its own view: (1 + K, n, K), the pooled scores of every site model first (what
    ``density_ratio`` routes by), then each site model's own (what ``one_pass`` may route by);
    (1 + K, 0, K) for a federation without a client head."""
    k = len(fed.sites)
    if not fed.routes or raw.shape[0] == 0:
        return np.zeros((1 + k, 0, k))
    views = [s.normalization.apply(raw) for s in fed.sites]
    out = fed.outputs(views)
    own = [density_ratio_scores(log_softmax(c), fed.priors) for c in out.client_logits]
    return np.stack([DensityRatioRouter().scores(fed, out), *own])


def fit_routing(
    fed: TrainedFederation, scores: Mapping[str, np.ndarray], target: float = MARGIN_TARGET
) -> RoutingFit | None:
    """The temperature and low-margin line from every site's validation scores (by site id,
    as :func:`routing_scores` gives them), and the one-pass router's site and temperature;
    None when no site has validation scans (the model then routes at temperature 1)."""
    ids = [s.id for s in fed.sites]
    parts = [(ids.index(site), np.asarray(z)) for site, z in scores.items() if site in ids]
    parts = [(i, z) for i, z in parts if z.shape[1]]
    if not parts:
        return None
    z = np.concatenate([p for _, p in parts], axis=1)  # (1 + K, n, K)
    y = np.concatenate([np.full(p.shape[1], i) for i, p in parts])
    temperature = fit_temperature(z[0], y)
    probs = softmax_rows(z[0], temperature)
    margins, right = top_margin(probs), probs.argmax(axis=1) == y
    low = margin_threshold(margins, right, target)
    fit = RoutingFit(temperature, low, target, int(y.size), band=margin_band(margins, right, low))
    if fed.shared_body or z.shape[0] == 1:
        return fit
    one_pass = [
        (nll(own, y, t), j, t) for j, own in enumerate(z[1:]) for t in [fit_temperature(own, y)]
    ]
    _, site, one_t = min(one_pass)
    return replace(fit, one_pass_site=site, one_pass_temperature=one_t)
