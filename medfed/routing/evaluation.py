"""Evaluate a trained federation: per-site figures with their 95% CIs, operating points and
calibration; the federation's pooled AUC and cross-site matrix; and every router on the pooled
test scans under both protocols (origin unknown, origin known), with CIs.

The work splits by site: :func:`site_evaluation` runs where a site's scans are and returns its
figures, counts and sums, and (under ``scans``) its per-scan test predictions (scan id, patient
id, label, score, routing: what ``predictions.csv`` holds, so every figure can be recomputed);
:func:`combine_evaluation` turns every site's part into the figures of the federation from the
aggregates alone, never from ``scans``: a deployed site keeps its per-scan rows in its own state
folder unless the run asks for them and its policy lets them out. Routing decides scan by scan,
so counts summed over sites equal the figures on the pooled scans; the routed system's kappa
comes from summed confusion matrices (its interval from a federated Poisson bootstrap), the
routing posterior's calibration from summed bin sums (:mod:`medfed.metrics.federated`).

:func:`suppress_small` applies a site policy's ``min_count`` to a part before it leaves the
site: a count cell on fewer scans (and the figures read off it) is replaced by None and named
under ``suppressed``; :func:`combine_evaluation` leaves such cells out of the pooled figures and
names them in the evaluation's ``suppressed``.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from medfed.config import count_from_env
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
    calibration_of_sums,
    choose_threshold,
    confusion_counts,
    federation_metrics,
    macro_auc,
    operating_point,
    per_class_auc,
    poisson_confusions,
    pooled_auc,
    pooled_kappa,
    quadratic_kappa,
    referable,
    replicate_seed,
    roc_points,
    routing_bin_sums,
    site_metrics,
    softmax_rows,
    sum_bins,
    unreliable,
    wilson,
)
from medfed.metrics.latency import median_interval
from medfed.routing.bundle import SiteOutputs, TrainedFederation
from medfed.routing.routers import (
    DensityRatioRouter,
    Router,
    RouteResult,
    default_router,
    routers_for,
)
from medfed.runs.schema import (
    ROUTER_RATES,
    CrossSiteCell,
    EndpointFigures,
    Evaluation,
    RocPoints,
    RouterFigures,
    SiteFigures,
)

LATENCY_SCANS = 16  # per router, spread over the sites (MEDFED_LATENCY_SCANS sets it)
LATENCY_ENV = "MEDFED_LATENCY_SCANS"
Z95 = 1.959964  # the standard normal's 97.5% quantile


def views_of(sites: list[SiteData], origin: SiteData, split: Split) -> list[NormalizedView]:
    """``origin``'s scans of ``split`` as each site sees them (under its normalization)."""
    return [origin.as_seen_by(mine, split) for mine in sites]


def pooled_views(sites: list[SiteData], split: Split) -> list[NormalizedView]:
    """Every site's scans of ``split`` pooled (once, as stored), as each site sees them."""
    pooled = torch.cat([origin.raw[split] for origin in sites])
    return [mine.normalization.view(pooled) for mine in sites]


def latency_scans() -> int:
    """Scans per router whose routing, one scan at a time, is timed when a run is evaluated:
    ``MEDFED_LATENCY_SCANS``, else 16. Each costs a forward pass of every site's model, which
    on a small federation's test split is much of the evaluation; its 95% CI (the median's)
    needs at least 6."""
    given = count_from_env(LATENCY_ENV, "scans", f" (default {LATENCY_SCANS}), or unset it")
    return LATENCY_SCANS if given is None else given


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
    names: dict[int, str], y: np.ndarray, probs: np.ndarray, patients: list[str]
) -> dict[str, Any]:
    """Figures of a site model with more than two classes (``names``: by class index): each
    class against the rest, the macro AUC and the quadratic weighted kappa with CIs."""
    k = probs.shape[1]
    return {
        "class_auc": [c.to_dict() for c in per_class_auc(y, probs, patients, names)],
        "macro_auc": macro_auc(y, probs, patients).to_dict(),
        "kappa": quadratic_kappa(y, probs.argmax(axis=1), k, patients).to_dict(),
    }


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
    seed: int = 0,
) -> dict[str, Any]:
    """One site's part of the evaluation, computed where its scans are.

    Its own model on its own scans (figures, CIs, operating point, calibration, ROC points);
    every site's model on its scans (``normalizations[j]``: site j's; the cross-site row); every
    router's counts under both protocols; the routed system's confusion matrix with its Poisson
    bootstrap replicates (``seed``: of the replicates' weights, with the site's id); the
    routing posterior's bin sums; and one row per scan for ``predictions.csv`` (``scans``).
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
        names = dict(enumerate(fed.class_names()))
        figures = _graded_figures(names, y, probs, patients)
        if is_icdr_grading(names):
            figures["referable"] = _referable_figures(fed, site, index, y, probs, patients)
        macro = figures["macro_auc"]["interval"]
        if macro is not None:  # the site's AUC is the macro AUC: its CI, and a variance to pool
            figures["auc_ci"] = macro
            variance = ((macro["high"] - macro["low"]) / (2 * Z95)) ** 2
    per_router_scans = math.ceil(latency_scans() / len(normalizations))
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
    k = probs.shape[1]
    if k > 2:  # the routed system's grades (origin unknown): the kappa's sums
        system = main["origin_unknown"].prediction
        rng = np.random.default_rng(replicate_seed(seed, site.id))
        part["system_confusion"] = {
            "counts": confusion_counts(y, system, k).tolist(),
            "replicates": poisson_confusions(y, system, k, patients, rng).tolist(),
        }
    if fed.routes:  # the posterior's calibration, as routed and at temperature 1
        scores = DensityRatioRouter().scores(fed, outputs["origin_unknown"])
        truth = np.full(len(y), index)
        part["routing_bins"] = {
            "routed": routing_bin_sums(softmax_rows(scores, fed.routing_temperature), truth),
            "uncalibrated": routing_bin_sums(softmax_rows(scores), truth),
        }
    return part


def _routing_calibrations(
    fed: TrainedFederation, parts: list[dict[str, Any]]
) -> tuple[RoutingCalibration | None, RoutingCalibration | None]:
    """The routing posterior on the pooled test scans (origin unknown), as routed (at the
    published temperature) and at temperature 1, from the sites' bin sums (a bin a site
    suppressed is left out); None for a federation that does not route."""
    sent = [p["routing_bins"] for p in parts if p.get("routing_bins")]
    if not fed.routes or not sent:
        return None, None
    low = None if fed.routing is None else fed.routing.low_margin
    routed = sum_bins(b["routed"] for b in sent)
    uncalibrated = sum_bins(b["uncalibrated"] for b in sent)
    return (
        None
        if routed is None
        else calibration_of_sums(routed, temperature=fed.routing_temperature, low_margin=low),
        None if uncalibrated is None else calibration_of_sums(uncalibrated),
    )


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


RATE_CELLS = {
    "system_accuracy": ("correct", "n"),
    "routing_accuracy": ("routed_home", "n"),
    "abstain_rate": ("abstained", "n"),
    "answered_accuracy": ("answered_correct", "answered"),
    "sensitivity": ("true_pos", "answered_pos"),
    "specificity": ("true_neg", "answered_neg"),
}
"""Each router rate's count cells (numerator, denominator)."""


def _pair_sum(counts: list[dict[str, Any]], num: str, den: str) -> tuple[int, int]:
    """A rate's cells summed over the sites that released both (a suppressed cell is None)."""
    kept = [c for c in counts if c.get(num) is not None and c.get(den) is not None]
    return sum(c[num] for c in kept), sum(c[den] for c in kept)


def _rates(counts: list[dict[str, Any]], routes: bool) -> dict[str, Any]:
    rates = {k: wilson(*_pair_sum(counts, *cells)) for k, cells in RATE_CELLS.items()}
    if not routes:
        rates["routing_accuracy"] = None
    return {k: rates[k] for k in ROUTER_RATES if rates[k] is not None}


def _router_figures(
    fed: TrainedFederation, parts: list[dict[str, Any]], key: str
) -> dict[str, RouterFigures]:
    figures = {}
    for router in routers_for(fed):
        counts = [p[key][router.name] for p in parts]
        latency = [t for c in counts for t in c.get("latency_ms", [])]
        routes = router.name != "majority_vote"
        rates = _rates(counts, routes)
        if len(fed.class_names()) != 2:
            rates.pop("sensitivity", None), rates.pop("specificity", None)
        timing = median_interval(latency)
        figures[router.name] = RouterFigures(
            system_accuracy=rates["system_accuracy"].value,
            routing_accuracy=rates["routing_accuracy"].value
            if routes and "routing_accuracy" in rates
            else None,
            abstain_rate=rates["abstain_rate"].value,
            answered_accuracy=rates["answered_accuracy"].value
            if "answered_accuracy" in rates
            else None,
            forward_passes=router.forward_passes(fed),
            latency_ms_per_scan=float(np.median(latency)) if latency else float("nan"),
            n_pooled=sum(c["n"] for c in counts if c.get("n") is not None),
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
    """The evaluation part of summary.json, from every site's :func:`site_evaluation` (as
    :func:`suppress_small` left it): aggregates only, never a part's per-scan ``scans``."""
    suppressed = {
        f"{p['id']}: {what}": why for p in parts for what, why in p.get("suppressed", {}).items()
    }
    parts = [p for p in parts if WITHHELD not in p.get("suppressed", {})]
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
                p["id"]: wilson(*_pair_sum([p[key][main_name]], "correct", "n")) for p in parts
            }
            for protocol, key in (
                ("origin_unknown", "routers"),
                ("origin_known", "routers_origin_known"),
            )
        },
        suppressed=suppressed or None,
        predictions="run" if all("scans" in p for p in parts) else "sites",
    )


def _system_kappa(fed: TrainedFederation, parts: list[dict[str, Any]]) -> MulticlassFigure | None:
    """Quadratic weighted kappa of the routed system's grades on the pooled test scans (origin
    unknown), from the sites' summed confusion matrices, with the percentile interval of their
    summed Poisson bootstrap replicates (patients resampled at each site); None for a two-class
    task. A site that suppressed its matrix is left out (and named in ``suppressed``)."""
    k = len(fed.class_names())
    sent = [p["system_confusion"] for p in parts if p.get("system_confusion")]
    if k <= 2 or not sent:
        return None
    counts = np.sum([np.asarray(c["counts"], dtype=np.float64) for c in sent], axis=0)
    replicates = np.sum([np.asarray(c["replicates"], dtype=np.float64) for c in sent], axis=0)
    return pooled_kappa(counts, replicates)


def prediction_rows(parts: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """Every site's per-scan rows, in site order (what ``predictions.csv`` holds); None when a
    site kept its rows (a deployed run's default: they stay in the site's state folder)."""
    if any("scans" not in part for part in parts):
        return None
    return [row for part in parts for row in part["scans"]]


WITHHELD = "all figures"
"""The ``suppressed`` entry of a site whose test split is smaller than ``min_count``."""


def suppress_small(part: dict[str, Any], min_count: int) -> dict[str, Any]:
    """``part`` as it may leave a site whose policy sets ``min_count``: every count cell on
    fewer scans than ``min_count`` (but none) is withheld with the figures read off it, and
    named under ``suppressed``. A cell whose complement is small (``n - k``) counts as small.

    Withheld: everything but the site's id and split sizes when its test split is smaller;
    its AUCs (own, interval, cross-site), calibration and class counts when a class has fewer
    scans; an operating point with a small cell; a calibration bin; a router count; the
    routed system's confusion matrix with a small cell; a routing calibration bin; and the
    ROC curve (each of its steps is one scan) whenever ``min_count`` is above 0."""
    if min_count <= 0:
        return part
    rule = f"fewer than {min_count} scans (the site's policy, outputs.min_count)"
    notes: dict[str, str] = {}
    n = part["metrics"]["n"]
    if n < min_count:
        notes[WITHHELD] = f"{rule}: the site's test split is smaller"
        keep = ("id", "n_train", "n_val")
        return {**{k: part[k] for k in keep}, "suppressed": notes}
    out = dict(part)
    roc = part["roc"]
    if roc.get("fpr") is not None:
        out["roc"] = {"fpr": None, "tpr": None, "thresholds": None, "reason": f"suppressed: {rule}"}
        notes["roc"] = f"{rule}: each step of the curve is one scan"
    _suppress_site_figures(out, min_count, rule, notes)
    for key in ("routers", "routers_origin_known"):
        out[key] = {
            name: _suppress_counts(counts, min_count, f"{key}.{name}", rule, notes)
            for name, counts in part[key].items()
        }
    confusion = part.get("system_confusion")
    if confusion is not None and any(_small(c, min_count) for c in np.ravel(confusion["counts"])):
        out.pop("system_confusion")
        notes["system_confusion"] = f"{rule}: a cell of the routed system's confusion matrix"
    if part.get("routing_bins"):
        out["routing_bins"] = {
            which: [_kept_bin(b, min_count, f"routing_bins.{which}", rule, notes) for b in bins]
            for which, bins in part["routing_bins"].items()
        }
    out["suppressed"] = notes
    return out


def _small(count: int | None, min_count: int) -> bool:
    return count is not None and 0 < count < min_count


def _suppress_site_figures(out: dict[str, Any], m: int, rule: str, notes: dict[str, str]) -> None:
    metrics, figures = dict(out["metrics"]), dict(out["figures"])
    n = metrics["n"]
    classes = metrics["n_per_class"].values()
    if any(_small(c, m) or _small(n - c, m) for c in classes):
        notes["class_counts"] = f"{rule}: a class of the test split"
        metrics["n_per_class"] = {}
        if metrics["auc"] is not None:
            metrics["auc"], metrics["auc_reason"] = None, f"suppressed: {rule} in a class"
        for key in ("n_pos", "n_neg", "unreliable", "auc_ci", "calibration", "class_auc"):
            figures.pop(key, None)
        out["auc_variance"] = None
        out["cross_site"] = {
            model: {**cell, "auc": None, "auc_reason": f"suppressed: {rule} in a class"}
            for model, cell in out["cross_site"].items()
        }
    point = figures.get("operating_point")
    if point is not None and any(_small(point[c], m) for c in ("tp", "fp", "tn", "fn")):
        figures.pop("operating_point")
        notes["operating_point"] = f"{rule}: a cell of the operating point's 2x2 table"
    referable = figures.get("referable")
    if referable is not None and (_small(referable["n_pos"], m) or _small(referable["n_neg"], m)):
        figures.pop("referable")
        notes["referable"] = f"{rule}: referable or non-referable scans"
    calib = figures.get("calibration")
    if calib is not None and any(_small(b["n"], m) for b in calib["bins"]):
        figures["calibration"] = {**calib, "bins": []}
        notes["calibration.bins"] = f"{rule}: a bin of the reliability curve"
    out["metrics"], out["figures"] = metrics, figures


def _suppress_counts(
    counts: dict[str, Any], m: int, where: str, rule: str, notes: dict[str, str]
) -> dict[str, Any]:
    """A router's counts, each small cell (or one whose complement is small) None."""
    n = counts["n"]
    out = dict(counts)
    for key, value in counts.items():
        if key in ("n", "latency_ms"):
            continue
        den = next(d for num, d in RATE_CELLS.values() if num == key) if key in _NUMS else n
        total = counts[den] if key in _NUMS else n
        if _small(value, m) or _small(total - value, m):
            out[key] = None
            notes[f"{where}.{key}"] = rule
    return out


_NUMS = {num for num, _ in RATE_CELLS.values()}


def _kept_bin(
    sums: dict[str, Any] | None, m: int, where: str, rule: str, notes: dict[str, str]
) -> dict[str, Any] | None:
    """A routing calibration bin, or None when it holds a small cell."""
    if sums is None:
        return None
    n, correct = int(sums["n"]), int(sums["correct"])
    if _small(n, m) or _small(correct, m) or _small(n - correct, m):
        notes[f"{where}.bins"] = f"{rule}: a bin of the reliability curve"
        return None
    return sums


def evaluate(fed: TrainedFederation, sites: list[SiteData]) -> Evaluation:
    """The evaluation part of summary.json, with every site's scans at hand."""
    normalizations = [s.normalization for s in sites]
    return combine_evaluation(
        fed, [site_evaluation(fed, s, i, normalizations) for i, s in enumerate(sites)]
    )
