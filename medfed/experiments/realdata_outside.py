"""Photos from outside the federation (``medfed real-study``): each real source left out in
turn, FedDRM trained on the others, then the left-out source's photos (a camera and case mix no
site has seen) and the sites' own test photos sent to it. For each abstention rule medfed
offers, the share of outside photos flagged against the share of the sites' own photos flagged
(false flags), with Wilson intervals; and a real photo from scikit-image."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from medfed.clinic.route import views_for
from medfed.config import Modality
from medfed.core.fileio import fresh_folder
from medfed.core.progress import lines_instead
from medfed.data.records import Split
from medfed.data.sitedata import SiteData
from medfed.experiments.realdata import REFERENCE, StudyPlan
from medfed.federation.training import train
from medfed.metrics.intervals import wilson
from medfed.routing.bundle import TrainedFederation
from medfed.routing.routers import DensityRatioRouter, RouteResult
from medfed.routing.scans import Scan

MAX_PROBABILITY = 0.9  # the routing posterior's max-probability threshold measured beside
RULES = {
    "distance": "feature distance to the closest site above its calibrated threshold "
    "(medfed's abstention)",
    "max-probability": f"routing posterior's highest site probability below {MAX_PROBABILITY}",
    "either": "either rule",
}


def _flags(result: RouteResult) -> dict[str, np.ndarray]:
    distance = np.asarray(result.abstained, dtype=bool)
    low = np.asarray(result.site_probs).max(axis=1) < MAX_PROBABILITY
    return {"distance": distance, "max-probability": low, "either": distance | low}


def _route(fed: TrainedFederation, features: torch.Tensor) -> RouteResult:
    views = [s.normalization.apply(features) for s in fed.sites]
    return DensityRatioRouter().route(fed, views)


def _all_splits(site: SiteData) -> torch.Tensor:
    return torch.cat([site.raw[s] for s in Split])


def _rate(k: int, n: int) -> dict[str, float]:
    rate = wilson(k, n).to_dict()
    return {"rate": rate["value"], "low": rate["low"], "high": rate["high"], "k": k, "n": n}


def leave_one_out(
    plan: StudyPlan, encoded: Sequence[SiteData], out: Path, cache: Path
) -> dict[str, Any]:
    """Flag rates on each left-out source against false-flag rates on the sites' own photos."""
    results: dict[str, Any] = {"rules": RULES, "held_out": {}}
    seed = plan.seeds[0]
    for held in encoded:
        kept = [s for s in encoded if s.id != held.id]
        folder = fresh_folder(out / "outside" / f"without-{held.id}")
        config = dataclasses.replace(plan.config(REFERENCE, seed))
        train(list(kept), config, folder, cache_dir=cache, say=lines_instead())
        fed = TrainedFederation.load(folder, device="cpu")
        outside = _flags(_route(fed, _all_splits(held)))
        own = [_flags(_route(fed, s.raw[Split.TEST])) for s in kept]
        entry = {}
        for rule in RULES:
            flagged = np.concatenate([o[rule] for o in own])
            entry[rule] = {
                "outside": _rate(int(outside[rule].sum()), int(outside[rule].size)),
                "own": _rate(int(flagged.sum()), int(flagged.size)),
            }
        entry["retina"] = retina_flags(fed)
        results["held_out"][held.id] = entry
    return results


def retina_flags(fed: TrainedFederation) -> dict[str, bool]:
    """Whether each rule flags scikit-image's real fundus photo (a camera no site has)."""
    from skimage import data

    scan = Scan(Path("skimage.data.retina()"), Modality.FUNDUS, data.retina(), ())
    result = DensityRatioRouter().route(fed, views_for(fed, scan))
    return {rule: bool(flags[0]) for rule, flags in _flags(result).items()}


def outside_markdown(results: dict[str, Any]) -> str:
    """The outside-photos table: one row per left-out source and rule."""
    from medfed.reports.markdown import markdown_table

    rows = []
    for held, entry in results["held_out"].items():
        for rule in RULES:
            outside, own = entry[rule]["outside"], entry[rule]["own"]
            rows.append(
                [
                    held,
                    rule,
                    f"{outside['rate']:.3f} ({outside['low']:.3f}–{outside['high']:.3f}) "
                    f"{outside['k']}/{outside['n']}",
                    f"{own['rate']:.3f} ({own['low']:.3f}–{own['high']:.3f}) {own['k']}/{own['n']}",
                    "flagged" if entry["retina"][rule] else "routed",
                ]
            )
    header = [
        "source left out",
        "rule",
        "its photos flagged (95% Wilson CI)",
        "the sites' own test photos flagged",
        "skimage retina photo",
    ]
    rules = "; ".join(f"**{k}**: {v}" for k, v in RULES.items())
    return f"{markdown_table(header, rows)}\n\nRules: {rules}."
