"""Evaluate a trained federation: per-site figures, federation figures, and every router on the
pooled test scans (system accuracy, routing accuracy, abstain rate, latency)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from medfed.data.records import Split
from medfed.data.sitedata import SiteData
from medfed.inference import TrainedFederation
from medfed.metrics import (
    SiteMetrics,
    abstain_rate,
    federation_metrics,
    routing_accuracy,
    site_metrics,
    system_accuracy,
)
from medfed.routing import Router, default_router, routers_for

LATENCY_SCANS = 16


def views_of(sites: list[SiteData], origin: SiteData, split: Split) -> list[torch.Tensor]:
    """``origin``'s scans of ``split`` as each site sees them (under its normalization)."""
    return [origin.as_seen_by(mine, split) for mine in sites]


def pooled_views(sites: list[SiteData], split: Split) -> list[torch.Tensor]:
    """Every site's scans of ``split`` pooled, as each site sees them."""
    return [torch.cat([origin.as_seen_by(mine, split) for origin in sites]) for mine in sites]


def per_site_figures(fed: TrainedFederation, sites: list[SiteData], split: Split = Split.TEST):
    """Each site's model on its own scans of ``split``."""
    per_site: dict[str, SiteMetrics] = {}
    for i, site in enumerate(sites):
        probs, _ = fed.site_outputs(i, site.x[split])
        per_site[site.id] = site_metrics(site.y[split].numpy(), probs, split=str(split))
    return per_site, federation_metrics(per_site)


def _latency_ms(router: Router, fed: TrainedFederation, views: list[torch.Tensor]) -> float:
    """Median milliseconds to route one scan (batch of one), over a few scans."""
    n = min(LATENCY_SCANS, views[0].shape[0])
    times = []
    for k in range(n):
        start = time.perf_counter()
        router.route(fed, [v[k : k + 1] for v in views])
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1000) if times else float("nan")


def router_figures(
    fed: TrainedFederation, sites: list[SiteData], split: Split = Split.TEST
) -> dict[str, dict[str, Any]]:
    """Every applicable router on the pooled scans of ``split``."""
    views = pooled_views(sites, split)
    y = torch.cat([s.y[split] for s in sites]).numpy()
    true_site = np.concatenate([np.full(s.n(split), i) for i, s in enumerate(sites)])
    figures = {}
    for router in routers_for(fed):
        result = router.route(fed, views)
        answered = ~result.abstained
        figures[router.name] = {
            "system_accuracy": system_accuracy(y, result.prediction),
            "routing_accuracy": None
            if router.name == "majority_vote"
            else routing_accuracy(true_site, result.routed),
            "abstain_rate": abstain_rate(result.chosen),
            "answered_accuracy": system_accuracy(y[answered], result.prediction[answered])
            if answered.any()
            else None,
            "forward_passes": router.forward_passes(fed),
            "latency_ms_per_scan": _latency_ms(router, fed, views),
            "n_pooled": int(len(y)),
        }
    return figures


def evaluate(fed: TrainedFederation, sites: list[SiteData]) -> dict[str, Any]:
    """The evaluation part of summary.json."""
    per_site, federation = per_site_figures(fed, sites)
    routers = router_figures(fed, sites)
    main = default_router(fed).name
    return {
        "sites": {
            site.id: {
                "auc": m.auc,
                "auc_reason": m.auc_reason,
                "accuracy": m.accuracy,
                "balanced_accuracy": m.balanced_accuracy,
                "n_test": m.n,
                "n_train": site.n(Split.TRAIN),
                "n_val": site.n(Split.VAL),
            }
            for site, m in zip(sites, per_site.values(), strict=True)
        },
        **federation.to_dict(),
        "routing_method": main,
        "system_accuracy": routers[main]["system_accuracy"],
        "routing_accuracy": routers[main]["routing_accuracy"],
        "abstain_rate": routers[main]["abstain_rate"],
        "routers": routers,
    }
