"""Evaluate a trained federation: per-site figures, federation figures, and every router on the
pooled test scans (system accuracy, routing accuracy, abstain rate, latency).

The work splits by site: :func:`site_evaluation` runs where a site's scans are and returns only
figures and counts; :func:`combine_evaluation` turns every site's part into the figures of the
federation. In one process :func:`evaluate` does both; on Flower each SuperNode does its part.
Routing decides scan by scan, so counts summed over sites equal the figures on the pooled scans.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch

from medfed.data.preprocess import Normalization
from medfed.data.records import Split
from medfed.data.sitedata import SiteData
from medfed.metrics import SiteMetrics, federation_metrics, roc_points, site_metrics
from medfed.runs.schema import Evaluation, RocPoints, RouterFigures, SiteFigures
from medfed.serving.bundle import TrainedFederation
from medfed.serving.routers import Router, default_router, routers_for

LATENCY_SCANS = 16  # per router, spread over the sites


def views_of(sites: list[SiteData], origin: SiteData, split: Split) -> list[torch.Tensor]:
    """``origin``'s scans of ``split`` as each site sees them (under its normalization)."""
    return [origin.as_seen_by(mine, split) for mine in sites]


def pooled_views(sites: list[SiteData], split: Split) -> list[torch.Tensor]:
    """Every site's scans of ``split`` pooled, as each site sees them."""
    return [torch.cat([origin.as_seen_by(mine, split) for origin in sites]) for mine in sites]


def _latency_ms(router: Router, fed: TrainedFederation, views: list[torch.Tensor], n: int):
    """Milliseconds to route each of the first ``n`` scans on its own (batch of one)."""
    times = []
    for k in range(min(n, views[0].shape[0])):
        start = time.perf_counter()
        router.route(fed, [v[k : k + 1] for v in views])
        times.append((time.perf_counter() - start) * 1000)
    return times


def _roc(y: np.ndarray, probs: np.ndarray, split: Split) -> dict[str, Any]:
    if probs.shape[1] != 2:
        reason = f"{probs.shape[1]} classes: ROC curves are drawn for two-class tasks only"
        return {"fpr": None, "tpr": None, "thresholds": None, "reason": reason}
    return roc_points(y, probs, split=str(split))


def site_evaluation(
    fed: TrainedFederation,
    site: SiteData,
    index: int,
    normalizations: list[Normalization],
    split: Split = Split.TEST,
) -> dict[str, Any]:
    """One site's part of the evaluation, computed where its scans are.

    Its own model on its own scans (figures and ROC points), and every router's counts on its
    scans as each site sees them (``normalizations[j]``: site j's). Nothing per scan leaves.
    """
    y = site.y[split].numpy()
    probs, _ = fed.site_outputs(index, site.x[split])
    raw = site.raw[split]
    views = [norm.apply(raw) for norm in normalizations]
    per_router_scans = math.ceil(LATENCY_SCANS / len(normalizations))
    routers = {}
    for router in routers_for(fed):
        result = router.route(fed, views)
        correct = result.prediction == y
        answered = ~result.abstained
        routers[router.name] = {
            "n": int(y.size),
            "correct": int(correct.sum()),
            "routed_home": int((result.routed == index).sum()),
            "abstained": int(result.abstained.sum()),
            "answered": int(answered.sum()),
            "answered_correct": int(correct[answered].sum()),
            "latency_ms": _latency_ms(router, fed, views, per_router_scans),
        }
    return {
        "id": site.id,
        "metrics": site_metrics(y, probs, split=str(split)).to_dict(),
        "roc": _roc(y, probs, split),
        "n_train": site.n(Split.TRAIN),
        "n_val": site.n(Split.VAL),
        "routers": routers,
    }


def _ratio(num: int, den: int) -> float | None:
    return num / den if den else None


def combine_evaluation(fed: TrainedFederation, parts: list[dict[str, Any]]) -> Evaluation:
    """The evaluation part of summary.json, from every site's :func:`site_evaluation`."""
    per_site = {p["id"]: SiteMetrics.from_dict(p["metrics"]) for p in parts}
    federation = federation_metrics(per_site)
    routers = {}
    for router in routers_for(fed):
        counts = [p["routers"][router.name] for p in parts]
        total = {k: sum(c[k] for c in counts) for k in counts[0] if k != "latency_ms"}
        latency = [t for c in counts for t in c["latency_ms"]]
        routers[router.name] = RouterFigures(
            system_accuracy=_ratio(total["correct"], total["n"]),
            routing_accuracy=None
            if router.name == "majority_vote"
            else _ratio(total["routed_home"], total["n"]),
            abstain_rate=_ratio(total["abstained"], total["n"]),
            answered_accuracy=_ratio(total["answered_correct"], total["answered"]),
            forward_passes=router.forward_passes(fed),
            latency_ms_per_scan=float(np.median(latency)) if latency else float("nan"),
            n_pooled=total["n"],
        )
    main = routers[default_router(fed).name]
    return Evaluation(
        sites={
            p["id"]: SiteFigures(
                auc=m.auc,
                auc_reason=m.auc_reason,
                accuracy=m.accuracy,
                balanced_accuracy=m.balanced_accuracy,
                n_test=m.n,
                n_train=p["n_train"],
                n_val=p["n_val"],
                roc=RocPoints.from_dict(p["roc"], f"evaluation of site {p['id']}"),
            )
            for p, m in zip(parts, per_site.values(), strict=True)
        },
        **federation.to_dict(),  # the figures over sites, field for field
        routing_method=default_router(fed).name,
        system_accuracy=main.system_accuracy,
        routing_accuracy=main.routing_accuracy,
        abstain_rate=main.abstain_rate,
        routers=routers,
    )


def evaluate(fed: TrainedFederation, sites: list[SiteData]) -> Evaluation:
    """The evaluation part of summary.json, with every site's scans at hand."""
    normalizations = [s.normalization for s in sites]
    return combine_evaluation(
        fed, [site_evaluation(fed, s, i, normalizations) for i, s in enumerate(sites)]
    )
