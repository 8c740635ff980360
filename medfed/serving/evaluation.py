"""Evaluate a trained federation: per-site figures with their 95% CIs, operating points and
calibration; the federation's pooled AUC and cross-site matrix; and every router on the pooled
test scans under both protocols (origin unknown, origin known), with CIs.

The work splits by site: :func:`site_evaluation` runs where a site's scans are and returns its
figures, counts and its per-scan test predictions (scan id, patient id, label, score, routing:
what ``predictions.csv`` holds, so every figure can be recomputed); :func:`combine_evaluation`
turns every site's part into the figures of the federation. In one process :func:`evaluate`
does both; on Flower each SuperNode does its part. Routing decides scan by scan, so counts
summed over sites equal the figures on the pooled scans.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from medfed.data.grading import REFERABLE_FROM, is_icdr_grading
from medfed.data.preprocess import Normalization, NormalizedView
from medfed.data.records import Split
from medfed.data.sitedata import SiteData
from medfed.metrics import (
    Calibration,
    ClassAUC,
    Interval,
    MulticlassFigure,
    OperatingPoint,
    RoutingCalibration,
    SiteMetrics,
    auc_interval,
    auc_variance,
    calibration,
    choose_threshold,
    federation_metrics,
    macro_auc,
    operating_point,
    per_class_auc,
    pooled_auc,
    quadratic_kappa,
    referable,
    roc_points,
    routing_calibration,
    site_metrics,
    softmax_rows,
    unreliable,
    wilson,
)
from medfed.metrics.latency import median_interval
from medfed.runs.schema import (
    ROUTER_RATES,
    CrossSiteCell,
    EndpointFigures,
    Evaluation,
    RocPoints,
    RouterFigures,
    SiteFigures,
)
from medfed.serving.bundle import SiteOutputs, TrainedFederation
from medfed.serving.routers import (
    DensityRatioRouter,
    Router,
    RouteResult,
    default_router,
    routers_for,
)

LATENCY_SCANS = 16  # per router, spread over the sites
Z95 = 1.959964  # the standard normal's 97.5% quantile


def views_of(sites: list[SiteData], origin: SiteData, split: Split) -> list[NormalizedView]:
    """``origin``'s scans of ``split`` as each site sees them (under its normalization)."""
    return [origin.as_seen_by(mine, split) for mine in sites]


def pooled_views(sites: list[SiteData], split: Split) -> list[NormalizedView]:
    """Every site's scans of ``split`` pooled (once, as stored), as each site sees them."""
    pooled = torch.cat([origin.raw[split] for origin in sites])
    return [mine.normalization.view(pooled) for mine in sites]


def _latency_ms(router: Router, fed: TrainedFederation, views: list[NormalizedView], n: int):
    """Milliseconds to route each of the first ``n`` scans on its own (batch of one)."""
    times = []
    for k in range(min(n, views[0].shape[0])):
        one = [v[k : k + 1] for v in views]
        start = time.perf_counter()
        router.route(fed, one)
        times.append((time.perf_counter() - start) * 1000)
    return times


def _roc(y: np.ndarray, probs: np.ndarray, split: Split) -> dict[str, Any]:
    if probs.shape[1] != 2:
        reason = f"{probs.shape[1]} classes: ROC curves are drawn for two-class tasks only"
        return {"fpr": None, "tpr": None, "thresholds": None, "reason": reason}
    return roc_points(y, probs, split=str(split))


PROTOCOLS = ("origin_unknown", "origin_known")
"""How a pooled test scan meets the federation: normalized by each candidate site as a scan of
unknown origin would be, or with its own site's statistics, as a member hospital's archive is."""


def scan_id(path: Path, root: Path) -> str:
    """A scan's id: its path under the site's root (its name when it lies elsewhere)."""
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.name


def _router_counts(y: np.ndarray, result: RouteResult, index: int) -> dict[str, int]:
    correct = result.prediction == y
    answered = ~result.abstained
    pos, neg = answered & (y == 1), answered & (y == 0)
    return {
        "n": int(y.size),
        "correct": int(correct.sum()),
        "routed_home": int((result.routed == index).sum()),
        "abstained": int(result.abstained.sum()),
        "answered": int(answered.sum()),
        "answered_correct": int(correct[answered].sum()),
        "answered_pos": int(pos.sum()),
        "true_pos": int((result.prediction[pos] == 1).sum()),
        "answered_neg": int(neg.sum()),
        "true_neg": int((result.prediction[neg] == 0).sum()),
    }


def _graded_figures(
    fed: TrainedFederation,
    site: SiteData,
    index: int,
    y: np.ndarray,
    probs: np.ndarray,
    patients: list[str],
) -> dict[str, Any]:
    """Figures of a site model with more than two classes: each class against the rest, the
    macro AUC and the quadratic weighted kappa with CIs, and, for ICDR grades, referable DR."""
    names = dict(enumerate(fed.class_names()))
    k = probs.shape[1]
    figures: dict[str, Any] = {
        "class_auc": [c.to_dict() for c in per_class_auc(y, probs, patients, names)],
        "macro_auc": macro_auc(y, probs, patients).to_dict(),
        "kappa": quadratic_kappa(y, probs.argmax(axis=1), k, patients).to_dict(),
    }
    if is_icdr_grading(names):
        figures["referable"] = _referable_figures(fed, site, index, y, probs, patients)
    return figures


def _referable_figures(
    fed: TrainedFederation,
    site: SiteData,
    index: int,
    y: np.ndarray,
    probs: np.ndarray,
    patients: list[str],
) -> dict[str, Any]:
    """Referable DR (grade >= 2) as a binary endpoint: AUC with CI, and its operating point
    at the threshold the run's operating rule (``--operating-point``) picks on the site's
    validation split."""
    y_ref, score = referable(y, probs, REFERABLE_FROM)
    n_pos = int(y_ref.sum())
    n_neg = int(y_ref.size) - n_pos
    interval = auc_interval(y_ref, score, patients)
    y_val = site.y[Split.VAL].numpy()
    if y_val.size:
        val_probs, _ = fed.site_outputs(index, site.x[Split.VAL])
        threshold, note = choose_threshold(
            *referable(y_val, val_probs, REFERABLE_FROM), fed.operating_rule
        )
    else:
        threshold, note = 0.5, "no validation split: threshold 0.5 used"
    point = operating_point(y_ref, score, threshold, fed.operating_rule, note)
    reason = None
    if interval is None:
        reason = f"{n_pos} referable and {n_neg} non-referable test scans: too few for an AUC"
    return EndpointFigures(
        name="referable",
        from_class=REFERABLE_FROM,
        auc=None if interval is None else interval.estimate,
        auc_reason=reason,
        n_pos=n_pos,
        n_neg=n_neg,
        unreliable=unreliable(n_pos, n_neg),
        auc_ci=interval,
        operating_point=point,
    ).to_dict()


def _own_figures(
    fed: TrainedFederation, index: int, y: np.ndarray, probs: np.ndarray, patients: list[str]
) -> tuple[dict[str, Any], float | None]:
    """CIs, operating point and calibration of a two-class site model (empty otherwise), and
    the AUC's variance for pooling."""
    if probs.shape[1] != 2:
        return {}, None
    score = probs[:, 1]
    n_pos = int((y == 1).sum())
    n_neg = int(y.size) - n_pos
    figures: dict[str, Any] = {
        "n_pos": n_pos,
        "n_neg": n_neg,
        "unreliable": unreliable(n_pos, n_neg),
        "calibration": calibration(y, score).to_dict(),
    }
    choice = fed.sites[index].operating
    if choice is not None:
        point = operating_point(y, score, choice.threshold, choice.rule, choice.note)
        figures["operating_point"] = point.to_dict()
    interval = auc_interval(y, score, patients)
    if interval is None:  # fewer than 2 of a class: no interval, and left out of the pool
        return figures, None
    figures["auc_ci"] = interval.to_dict()
    if interval.method.startswith("DeLong"):
        return figures, auc_variance(y, score)[1]
    # The patient-clustered bootstrap: the variance its percentile interval implies.
    return figures, ((interval.high - interval.low) / (2 * Z95)) ** 2


def _cross_cell(y: np.ndarray, probs: np.ndarray, split: Split) -> dict[str, Any]:
    m = site_metrics(y, probs, split=str(split))
    return {"auc": m.auc, "auc_reason": m.auc_reason, "accuracy": m.accuracy, "n": m.n}


def site_evaluation(
    fed: TrainedFederation,
    site: SiteData,
    index: int,
    normalizations: list[Normalization],
    split: Split = Split.TEST,
) -> dict[str, Any]:
    """One site's part of the evaluation, computed where its scans are.

    Its own model on its own scans (figures, CIs, operating point, calibration, ROC points);
    every site's model on its scans (``normalizations[j]``: site j's; the cross-site row); every
    router's counts under both protocols; and one row per scan for ``predictions.csv``.
    """
    y = site.y[split].numpy()
    raw = site.raw[split]
    views = {  # normalized batch by batch as the models read them
        "origin_unknown": [norm.view(raw) for norm in normalizations],
        "origin_known": [site.x[split]] * len(normalizations),
    }
    outputs: dict[str, SiteOutputs] = {p: fed.outputs(v) for p, v in views.items()}
    probs = outputs["origin_unknown"].class_probs[index]  # its own model on its own view
    records = site.records[split]
    patients = [r.patient_id for r in records]
    figures, variance = _own_figures(fed, index, y, probs, patients)
    if probs.shape[1] > 2:
        figures = _graded_figures(fed, site, index, y, probs, patients)
        macro = figures["macro_auc"]["interval"]
        if macro is not None:  # the site's AUC is the macro AUC: its CI, and a variance to pool
            figures["auc_ci"] = macro
            variance = ((macro["high"] - macro["low"]) / (2 * Z95)) ** 2
    per_router_scans = math.ceil(LATENCY_SCANS / len(normalizations))
    routers: dict[str, dict[str, dict[str, Any]]] = {p: {} for p in PROTOCOLS}
    main: dict[str, RouteResult] = {}
    for router in routers_for(fed):
        for protocol in PROTOCOLS:
            result = router.answer(fed, outputs[protocol])
            routers[protocol][router.name] = _router_counts(y, result, index)
            if router.name == default_router(fed).name:
                main[protocol] = result
        # Routing one scan costs the same under either protocol: measured once.
        latency = _latency_ms(router, fed, views["origin_unknown"], per_router_scans)
        for protocol in PROTOCOLS:
            routers[protocol][router.name]["latency_ms"] = latency
    cross = outputs["origin_unknown"].class_probs
    part = {
        "id": site.id,
        "metrics": site_metrics(y, probs, split=str(split)).to_dict(),
        "figures": figures,
        "auc_variance": variance,
        "roc": _roc(y, probs, split),
        "n_train": site.n(Split.TRAIN),
        "n_val": site.n(Split.VAL),
        "cross_site": {s.id: _cross_cell(y, cross[j], split) for j, s in enumerate(fed.sites)},
        "routers": routers["origin_unknown"],
        "routers_origin_known": routers["origin_known"],
        "scans": _scan_rows(fed, site, index, y, probs, main, split),
    }
    if fed.routes:  # the uncalibrated scores: the posterior's calibration is judged on them
        scores = DensityRatioRouter().scores(fed, outputs["origin_unknown"])
        part["routing_scores"] = scores.tolist()
    return part


def _routing_calibrations(
    fed: TrainedFederation, parts: list[dict[str, Any]]
) -> tuple[RoutingCalibration | None, RoutingCalibration | None]:
    """The routing posterior on the pooled test scans (origin unknown), as routed (at the
    published temperature) and at temperature 1; None for a federation that does not route."""
    ids = [s.id for s in fed.sites]
    scored = [(ids.index(p["id"]), p["routing_scores"]) for p in parts if p.get("routing_scores")]
    if not fed.routes or not scored:
        return None, None
    z = np.concatenate([np.asarray(s, dtype=np.float64) for _, s in scored])
    y = np.concatenate([np.full(len(s), i) for i, s in scored])
    temperature = fed.routing_temperature
    low = None if fed.routing is None else fed.routing.low_margin
    routed = routing_calibration(
        softmax_rows(z, temperature), y, temperature=temperature, low_margin=low
    )
    return routed, routing_calibration(softmax_rows(z), y)


def _scan_rows(
    fed: TrainedFederation,
    site: SiteData,
    index: int,
    y: np.ndarray,
    probs: np.ndarray,
    main: dict[str, RouteResult],
    split: Split,
) -> list[dict[str, Any]]:
    ids = [s.id for s in fed.sites]
    binary = probs.shape[1] == 2
    choice = fed.sites[index].operating
    if binary and choice is not None:
        own = (probs[:, 1] >= choice.threshold).astype(np.int64)
    else:
        own = probs.argmax(axis=1)
    unknown, known = main["origin_unknown"], main["origin_known"]
    return [
        {
            "site": site.id,
            "scan_id": scan_id(record.path, site.manifest.root),
            "patient_id": record.patient_id,
            "label": int(y[k]),
            "score": float(probs[k, 1]) if binary else None,
            "prediction": int(own[k]),
            "routed_site": ids[int(unknown.routed[k])],
            "abstained": bool(unknown.abstained[k]),
            "system_prediction": int(unknown.prediction[k]),
            "routed_site_origin_known": ids[int(known.routed[k])],
            "system_prediction_origin_known": int(known.prediction[k]),
        }
        for k, record in enumerate(site.records[split])
    ]


def _rates(total: dict[str, int], routes: bool) -> dict[str, Any]:
    rates = {
        "system_accuracy": wilson(total["correct"], total["n"]),
        "routing_accuracy": wilson(total["routed_home"], total["n"]) if routes else None,
        "abstain_rate": wilson(total["abstained"], total["n"]),
        "answered_accuracy": wilson(total["answered_correct"], total["answered"]),
        "sensitivity": wilson(total["true_pos"], total["answered_pos"]),
        "specificity": wilson(total["true_neg"], total["answered_neg"]),
    }
    return {k: rates[k] for k in ROUTER_RATES if rates[k] is not None}


def _router_figures(
    fed: TrainedFederation, parts: list[dict[str, Any]], key: str
) -> dict[str, RouterFigures]:
    figures = {}
    for router in routers_for(fed):
        counts = [p[key][router.name] for p in parts]
        total = {k: sum(c[k] for c in counts) for k in counts[0] if k != "latency_ms"}
        latency = [t for c in counts for t in c.get("latency_ms", [])]
        routes = router.name != "majority_vote"
        rates = _rates(total, routes)
        if len(fed.class_names()) != 2:
            rates.pop("sensitivity"), rates.pop("specificity")
        timing = median_interval(latency)
        figures[router.name] = RouterFigures(
            system_accuracy=rates["system_accuracy"].value,
            routing_accuracy=rates["routing_accuracy"].value if routes else None,
            abstain_rate=rates["abstain_rate"].value,
            answered_accuracy=rates["answered_accuracy"].value,
            forward_passes=router.forward_passes(fed),
            latency_ms_per_scan=float(np.median(latency)) if latency else float("nan"),
            n_pooled=total["n"],
            latency_ms_low=None if timing is None else timing[1],
            latency_ms_high=None if timing is None else timing[2],
            rates=rates,
        )
    return figures


def _site_figures(part: dict[str, Any], metrics: SiteMetrics) -> SiteFigures:
    extra = part.get("figures", {})
    typed = {
        "auc_ci": Interval,
        "operating_point": OperatingPoint,
        "calibration": Calibration,
        "macro_auc": MulticlassFigure,
        "kappa": MulticlassFigure,
    }
    where = f"evaluation of site {part['id']}"
    graded = {
        "class_auc": None
        if extra.get("class_auc") is None
        else [ClassAUC.from_dict(c) for c in extra["class_auc"]],
        "referable": None
        if extra.get("referable") is None
        else EndpointFigures.from_dict(extra["referable"], where),
    }
    return SiteFigures(
        auc=metrics.auc,
        auc_reason=metrics.auc_reason,
        accuracy=metrics.accuracy,
        balanced_accuracy=metrics.balanced_accuracy,
        n_test=metrics.n,
        n_train=part["n_train"],
        n_val=part["n_val"],
        roc=RocPoints.from_dict(part["roc"], where),
        n_pos=extra.get("n_pos"),
        n_neg=extra.get("n_neg"),
        unreliable=extra.get("unreliable"),
        **{k: None if extra.get(k) is None else c.from_dict(extra[k]) for k, c in typed.items()},
        **graded,
    )


def combine_evaluation(fed: TrainedFederation, parts: list[dict[str, Any]]) -> Evaluation:
    """The evaluation part of summary.json, from every site's :func:`site_evaluation`."""
    per_site = {p["id"]: SiteMetrics.from_dict(p["metrics"]) for p in parts}
    federation = federation_metrics(per_site, {p["id"]: p["n_train"] for p in parts})
    sites = {p["id"]: _site_figures(p, per_site[p["id"]]) for p in parts}
    pooled_ids = [p["id"] for p in parts if p.get("auc_variance") is not None]
    pooled = pooled_auc(
        [per_site[s].auc for s in pooled_ids],
        [p["auc_variance"] for p in parts if p.get("auc_variance") is not None],
    )
    routers = _router_figures(fed, parts, "routers")
    main_name = default_router(fed).name
    main = routers[main_name]
    worst = federation.worst_site
    calibrated, uncalibrated = _routing_calibrations(fed, parts)
    return Evaluation(
        sites=sites,
        federation=federation,
        routing_method=default_router(fed).name,
        system_accuracy=main.system_accuracy,
        routing_accuracy=main.routing_accuracy,
        abstain_rate=main.abstain_rate,
        routers=routers,
        pooled_auc=pooled,
        worst_site_auc_ci=None if worst is None else sites[worst].auc_ci,
        cross_site={
            model.id: {
                p["id"]: CrossSiteCell.from_dict(p["cross_site"][model.id], "cross-site")
                for p in parts
            }
            for model in fed.sites
        },
        routers_origin_known=_router_figures(fed, parts, "routers_origin_known"),
        routing_calibration=calibrated,
        routing_calibration_uncalibrated=uncalibrated,
        system_kappa=_system_kappa(fed, parts),
        system_by_site={
            protocol: {
                p["id"]: wilson(p[key][main_name]["correct"], p[key][main_name]["n"]) for p in parts
            }
            for protocol, key in (
                ("origin_unknown", "routers"),
                ("origin_known", "routers_origin_known"),
            )
        },
    )


def _system_kappa(fed: TrainedFederation, parts: list[dict[str, Any]]) -> MulticlassFigure | None:
    """Quadratic weighted kappa of the routed system's grades on the pooled test scans (origin
    unknown), patients resampled; None for a two-class task."""
    k = len(fed.class_names())
    rows = prediction_rows(parts)
    if k <= 2 or not rows:
        return None
    y = [r["label"] for r in rows]
    pred = [r["system_prediction"] for r in rows]
    patients = [f"{r['site']}/{r['patient_id']}" for r in rows]
    return quadratic_kappa(y, pred, k, patients)


def prediction_rows(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every site's per-scan rows, in site order (what ``predictions.csv`` holds)."""
    return [row for part in parts for row in part["scans"]]


def evaluate(fed: TrainedFederation, sites: list[SiteData]) -> Evaluation:
    """The evaluation part of summary.json, with every site's scans at hand."""
    normalizations = [s.normalization for s in sites]
    return combine_evaluation(
        fed, [site_evaluation(fed, s, i, normalizations) for i, s in enumerate(sites)]
    )
