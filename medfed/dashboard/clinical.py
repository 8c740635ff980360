"""The clinical evaluation of runs as tables (no Streamlit): every figure with its 95% CI and
its counts, flagged when it rests on too few positives or negatives.

Runs written before CIs, operating points, calibration, the cross-site matrix or the second
protocol existed have None or empty fields there; every table then says "n/a" (or is empty, and
the page says why) instead of failing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import pandas as pd

from medfed import reports
from medfed.metrics import Interval, Proportion, unreliable
from medfed.reports import NA, fmt
from medfed.reports.evaluation import AT_OPERATING, slope_text
from medfed.reports.routing import CALIBRATION_HEADER, posterior_rows
from medfed.runs.schema import ROUTER_RATES, RouterFigures, SiteFigures, Summary

WARNING = "\u26a0"
NO_CI = "CI n/a"
RELIABILITY = "reliability"

Summaries = Mapping[str, Summary]  # run label -> its summary.json


# ---------------------------------------------------------------------------- one figure
def unreliable_marker(reason: str | None) -> str:
    """``⚠ unreliable: fewer than 10 positives (4)``, or '' for a reliable figure."""
    return f"{WARNING} unreliable: {reason}" if reason else ""


def with_ci(interval: Interval | None, value: float | None = None, digits: int = 3) -> str:
    """``0.840 (0.780–0.900)``; the bare value with "CI n/a" when only the value is known."""
    return reports.ci_text(interval, value, digits, no_ci=NO_CI)


def rate_text(rate: Proportion | None, value: float | None = None) -> str:
    """``0.900 (0.700–0.970) 18/20``; the bare value with "CI n/a" when only it is known,
    else n/a."""
    return reports.rate_text(rate, value, no_ci=NO_CI)


def counts_text(figures: SiteFigures) -> str:
    """``24 (4 pos / 20 neg)``; the classes n/a for runs that did not count them."""
    if figures.n_pos is None or figures.n_neg is None:
        return f"{figures.n_test} (pos / neg {NA})"
    return f"{figures.n_test} ({figures.n_pos} pos / {figures.n_neg} neg)"


def site_auc_text(figures: SiteFigures | None) -> str:
    """A site's AUC with its CI, and the warning sign when it is unreliable."""
    if figures is None:
        return NA
    text = NA if figures.auc is None else with_ci(figures.auc_ci, figures.auc)
    return f"{text} {WARNING}" if figures.unreliable else text


def _agreed(values: dict[str, str]) -> str:
    """One text when every run says the same; else each run's, named."""
    distinct = set(values.values())
    if len(distinct) <= 1:
        return next(iter(distinct), "")
    return "; ".join(f"{label}: {text or '-'}" for label, text in values.items())


def _counted(present: dict[str, SiteFigures]) -> dict[str, SiteFigures]:
    """The runs that counted the site's classes, unless a run that did not has a test split of
    another size (then every run speaks for itself)."""
    counted = {k: f for k, f in present.items() if f.n_pos is not None}
    sizes = {f.n_test for f in counted.values()}
    if counted and all(f.n_test in sizes for f in present.values()):
        return counted
    return present


def _sites(summaries: Summaries) -> list[str]:
    sites: list[str] = []
    for summary in summaries.values():
        sites += [s for s in summary.sites if s not in sites]
    return sites


# ---------------------------------------------------------------------------- per-site AUC
N_COLUMN = "n test (pos / neg)"


def site_auc_table(summaries: Summaries) -> pd.DataFrame:
    """Per-site AUC of every run side by side, each with its 95% CI (rows: sites).

    Columns: the test split's size and classes, one column per run (``0.840 (0.780–0.900)``,
    ``⚠`` when unreliable), and the reliability marker. Counts and markers belong to the test
    split, shared by runs over the same data (a run written before classes were counted defers
    to those that counted them); runs that disagree are named one by one.
    """
    rows = []
    for site in _sites(summaries):
        present = {label: s.sites[site] for label, s in summaries.items() if site in s.sites}
        counted = _counted(present)
        row: dict[str, str] = {N_COLUMN: _agreed({k: counts_text(f) for k, f in counted.items()})}
        for label, summary in summaries.items():
            row[label] = site_auc_text(summary.sites.get(site))
        known = any(f.n_pos is not None for f in counted.values())
        markers = {k: unreliable_marker(f.unreliable) for k, f in counted.items()}
        row[RELIABILITY] = _agreed(markers) if known else NA  # classes not counted: unknown
        rows.append(row)
    columns = [N_COLUMN, *summaries, RELIABILITY]
    return pd.DataFrame(rows, columns=columns, index=pd.Index(_sites(summaries), name="site"))


def auc_points(summaries: Summaries) -> pd.DataFrame:
    """One row per run and site: AUC, its CI bounds (NaN when unknown), counts, marker."""
    rows = []
    for label, summary in summaries.items():
        for site, f in summary.sites.items():
            ci = f.auc_ci
            rows.append(
                {
                    "method": label,
                    "site": site,
                    "AUC": math.nan if f.auc is None else f.auc,
                    "low": math.nan if ci is None else ci.low,
                    "high": math.nan if ci is None else ci.high,
                    "n": f.n_test,
                    "positives": f.n_pos,
                    "negatives": f.n_neg,
                    "unreliable": f.unreliable or "",
                }
            )
    columns = ["method", "site", "AUC", "low", "high", "n", "positives", "negatives", "unreliable"]
    return pd.DataFrame(rows, columns=columns)


def worst_site_text(summary: Summary) -> str:
    """``AUC 0.700 (0.550–0.850)`` of the worst site, ``⚠`` when it is unreliable."""
    text = f"AUC {with_ci(summary.worst_site_auc_ci, summary.federation.worst_site_auc)}"
    worst = summary.sites.get(summary.federation.worst_site or "")
    return f"{text} {WARNING}" if worst is not None and worst.unreliable else text


def worst_site_warning(summary: Summary) -> str:
    """``rimone: ⚠ unreliable: fewer than 10 positives (4)`` when the worst site's figure is
    unreliable, else ''."""
    worst = summary.sites.get(summary.federation.worst_site or "")
    if worst is None or not worst.unreliable:
        return ""
    return f"{summary.federation.worst_site}: {unreliable_marker(worst.unreliable)}"


def pooled_text(summary: Summary) -> str:
    """``0.840 (0.780–0.900), I² 35% over 5 sites``, or n/a (fewer than two sites with a CI,
    or a run written before pooling)."""
    return reports.pooled_text(summary.pooled_auc, sites=True)


def router_rate(router: RouterFigures | None, rate: str) -> str:
    """One router rate with its CI and counts (the bare value for older runs)."""
    if router is None:
        return NA
    return rate_text(router.rates.get(rate), getattr(router, rate, None))


def default_router_rate(summary: Summary, rate: str) -> str:
    return router_rate(summary.routers.get(summary.routing_method), rate)


# ---------------------------------------------------------------------------- operating points
OPERATING_COLUMNS = [
    "rule",
    "threshold",
    "sensitivity",
    "specificity",
    "PPV",
    "NPV",
    "TP / FP / TN / FN",
    "note",
    RELIABILITY,
]


def _per_site_table(
    summary: Summary, figure: str, columns: list[str], row: Callable[[Any], dict[str, str]]
) -> pd.DataFrame:
    """One row per site from its ``figure`` (an attribute of SiteFigures) through ``row``,
    with the site's reliability; n/a for a site without it, and no rows when no site has it
    (a run written before these figures, or more than two classes)."""
    index = pd.Index([], name="site")
    if not any(getattr(f, figure) is not None for f in summary.sites.values()):
        return pd.DataFrame(columns=columns, index=index)
    rows = []
    for f in summary.sites.values():
        value = getattr(f, figure)
        if value is None:
            rows.append({c: NA for c in columns} | {"note": "", RELIABILITY: ""})
        else:
            rows.append(row(value) | {RELIABILITY: unreliable_marker(f.unreliable)})
    return pd.DataFrame(rows, columns=columns, index=pd.Index(list(summary.sites), name="site"))


def operating_table(summary: Summary) -> pd.DataFrame:
    """Each site's operating point on its test scans: the rule and threshold chosen on its
    validation split, and sensitivity, specificity, PPV and NPV with CIs and counts."""
    return _per_site_table(
        summary,
        "operating_point",
        OPERATING_COLUMNS,
        lambda point: {
            "rule": point.rule,
            "threshold": f"{point.threshold:.3f}",
            "sensitivity": rate_text(point.sensitivity),
            "specificity": rate_text(point.specificity),
            "PPV": rate_text(point.ppv),
            "NPV": rate_text(point.npv),
            "TP / FP / TN / FN": f"{point.tp} / {point.fp} / {point.tn} / {point.fn}",
            "note": point.note or "",
        },
    )


def operating_points(summary: Summary) -> pd.DataFrame:
    """Where each site's operating point sits on its ROC curve (1 - specificity, sensitivity)."""
    rows = []
    for site, f in summary.sites.items():
        point = f.operating_point
        if point is None or point.sensitivity.value is None or point.specificity.value is None:
            continue
        rows.append(
            {
                "site": site,
                "fpr": 1.0 - point.specificity.value,
                "tpr": point.sensitivity.value,
                "threshold": point.threshold,
                "rule": point.rule,
            }
        )
    return pd.DataFrame(rows, columns=["site", "fpr", "tpr", "threshold", "rule"])


# ---------------------------------------------------------------------------- calibration
CALIBRATION_COLUMNS = ["n", "Brier", "ECE", "intercept", "slope", "note", RELIABILITY]


def calibration_table(summary: Summary) -> pd.DataFrame:
    """Brier score, ECE, calibration intercept and slope per site."""
    return _per_site_table(
        summary,
        "calibration",
        CALIBRATION_COLUMNS,
        lambda c: {
            "n": str(c.n),
            "Brier": fmt(c.brier),
            "ECE": fmt(c.ece),
            "intercept": fmt(c.intercept),
            "slope": slope_text(c),
            "note": c.reason or "",
        },
    )


def _bin(item: Any, key: str) -> Any:
    return item.get(key) if isinstance(item, Mapping) else getattr(item, key, None)


def reliability_frame(summary: Summary) -> pd.DataFrame:
    """The reliability diagram's points: each site's bins (mean predicted probability against
    the fraction of positives, and the bin's scans), low to high."""
    rows = []
    for site, f in summary.sites.items():
        if f.calibration is None:
            continue
        flag = f" {WARNING}" if f.unreliable else ""
        for item in f.calibration.bins:
            predicted, observed = _bin(item, "mean_predicted"), _bin(item, "fraction_positive")
            if predicted is None or observed is None:
                continue
            rows.append(
                {
                    "site": site,
                    "curve": f"{site}{flag}",
                    "mean_predicted": float(predicted),
                    "fraction_positive": float(observed),
                    "n": int(_bin(item, "n") or 0),
                }
            )
    return pd.DataFrame(rows, columns=["site", "curve", "mean_predicted", "fraction_positive", "n"])


# ---------------------------------------------------------------------------- cross-site
def cross_site_matrix(summary: Summary) -> dict[str, Any]:
    """The cross-site AUC matrix (rows: the model's site, columns: the data's site), with the
    accuracy, scan count and undefined-AUC reason of every cell; None for a run without it."""
    if not summary.cross_site:
        return {}
    models = list(summary.cross_site)
    data: list[str] = []
    for row in summary.cross_site.values():
        data += [d for d in row if d not in data]
    flags = {s: bool(f.unreliable) for s, f in summary.sites.items()}

    def cell(model: str, site: str, key: str) -> Any:
        c = summary.cross_site[model].get(site)
        return None if c is None else getattr(c, key)

    return {
        "models": models,
        "data": data,
        "data_labels": [f"{d} {WARNING}" if flags.get(d) else d for d in data],
        "auc": [[cell(m, d, "auc") for d in data] for m in models],
        "accuracy": [[cell(m, d, "accuracy") for d in data] for m in models],
        "n": [[cell(m, d, "n") for d in data] for m in models],
        "reason": [[cell(m, d, "auc_reason") or "" for d in data] for m in models],
    }


# ---------------------------------------------------------------------------- both protocols
PROTOCOLS = {
    "origin unknown": "routers",
    "origin known": "routers_origin_known",
}
RATE_NAMES = {
    "system_accuracy": f"system accuracy {AT_OPERATING}",
    "routing_accuracy": "routing accuracy",
    "abstain_rate": "abstain rate",
    "answered_accuracy": f"accuracy when answered {AT_OPERATING}",
    "sensitivity": "sensitivity",
    "specificity": "specificity",
}


def protocol_table(summary: Summary) -> pd.DataFrame:
    """Every router's system figures under both protocols, with CIs and counts (rows:
    protocol and router; the default router marked)."""
    rows, index = [], []
    for protocol, attribute in PROTOCOLS.items():
        for name, router in getattr(summary, attribute).items():
            shown = f"{name} (default)" if name == summary.routing_method else name
            index.append((protocol, shown))
            rows.append({RATE_NAMES[r]: router_rate(router, r) for r in ROUTER_RATES})
    names = [RATE_NAMES[r] for r in ROUTER_RATES]
    return (
        pd.DataFrame(
            rows,
            columns=names,
            index=pd.MultiIndex.from_tuples(index, names=["protocol", "router"]),
        )
        if rows
        else pd.DataFrame(columns=names)
    )


# ---------------------------------------------------------------------------- ROC of several runs
def roc_overlay_frame(summaries: Summaries, site: str) -> tuple[pd.DataFrame, dict[str, str]]:
    """Every run's test ROC curve at one site (method, curve label, fpr, tpr) and, per run
    without one, the reason."""
    rows, missing = [], {}
    for label, summary in summaries.items():
        f = summary.sites.get(site)
        if f is None:
            missing[label] = f"the run has no site {site}"
            continue
        roc = f.roc
        if roc is None:
            missing[label] = "summary.json holds no ROC points (written before they were stored)"
            continue
        if not roc.drawable:
            missing[label] = roc.reason or "no ROC points"
            continue
        curve = f"{label}: AUC {site_auc_text(f)}"
        rows += [
            {"method": label, "curve": curve, "fpr": x, "tpr": y}
            for x, y in zip(roc.fpr or [], roc.tpr or [], strict=True)
        ]
    return pd.DataFrame(rows, columns=["method", "curve", "fpr", "tpr"]), missing


def sites_of(summaries: Summaries) -> list[str]:
    """Every site of the runs, in the order the runs list them."""
    return _sites(summaries)


# ---------------------------------------------------------------------------- prospective review
REVIEW_FIGURES = {
    "sensitivity": "sensitivity",
    "specificity": "specificity",
    "agreement": "agreement with the reader",
    "kappa": "Cohen's kappa (two readers)",
    "ungradable_rate": "ungradable rate",
    "abstain_rate": "abstain rate",
}
"""The Review page's figures (keys as :data:`medfed.clinic.review.FIGURE_NAMES`) as headed."""
SCANS_READ = "scans read"
_NOT_SHOWN = {
    "sensitivity": "two-class runs only",
    "specificity": "two-class runs only",
    "abstain_rate": "system only: an abstained scan has no site",
}


def kappa_text(kappa: Any) -> str:
    """``0.600 (0.200–1.000) n=12``; ``1.000 (CI n/a: why) n=3`` without a standard error;
    ``n/a (why; n=3)`` when kappa is undefined."""
    if kappa.interval is not None:
        return f"{with_ci(kappa.interval)} n={kappa.n}"
    why = kappa.reason or "undefined"
    if kappa.value is None and why.startswith("too few double reads"):
        return why  # not a number: it says how many double reads there are
    if kappa.value is None:
        return f"{NA} ({why}; n={kappa.n})"
    return f"{kappa.value:.3f} ({NO_CI}: {why}) n={kappa.n}"


def prospective_table(figures: Any) -> pd.DataFrame:
    """The prospective figures of a review (``medfed.clinic.review.Prospective``): one row per
    site and one for the system, each figure with its 95% CI and counts, and the reliability
    marker of sensitivity and specificity (fewer than 10 positive or negative reads)."""
    columns = [SCANS_READ, *REVIEW_FIGURES.values(), RELIABILITY]
    rows, index = [], []
    for scope in figures.scopes:
        rates = scope.rates()
        row = {SCANS_READ: str(scope.ungradable.n)}
        for name, label in REVIEW_FIGURES.items():
            rate = rates.get(name)
            if name == "kappa":
                row[label] = kappa_text(rate)
            elif rate is None:
                row[label] = f"{NA} ({_NOT_SHOWN.get(name, 'not measured')})"
            else:
                row[label] = rate_text(rate)
        op = scope.operating
        counted = op is not None and op.tp + op.fn + op.tn + op.fp > 0
        row[RELIABILITY] = (
            unreliable_marker(unreliable(op.tp + op.fn, op.tn + op.fp)) if counted else ""
        )
        rows.append(row)
        index.append(scope.scope)
    return pd.DataFrame(rows, columns=columns, index=pd.Index(index, name="scope"))


def routing_posterior_frame(summary: Summary) -> pd.DataFrame:
    """The routing posterior's calibration on the pooled test scans, one row per posterior
    (as routed, and at temperature 1), its figures as text; empty for a run without them."""
    rows = [
        [cell if isinstance(cell, str) else fmt(cell) for cell in row]
        for row in posterior_rows(summary)
    ]
    return pd.DataFrame(rows, columns=CALIBRATION_HEADER)


def routing_reliability_frame(summary: Summary) -> pd.DataFrame:
    """The reliability curve of the posterior as routed, in the columns
    :func:`~medfed.dashboard.charts.reliability_diagram` draws (empty without one)."""
    calibration = summary.routing_calibration
    columns = ["site", "curve", "mean_predicted", "fraction_positive", "n"]
    if calibration is None:
        return pd.DataFrame(columns=columns)
    curve = "P(chosen site), as routed"
    rows = [
        [curve, curve, b["mean_predicted"], b["fraction_correct"], b["n"]] for b in calibration.bins
    ]
    return pd.DataFrame(rows, columns=columns)
