"""summary.json as medfed wrote it before confidence intervals and the clinical figures: what
every reader must still show (as n/a where a figure is missing)."""

from __future__ import annotations

from typing import Any

CLINICAL_KEYS = (
    "average_accuracy_by_train",
    "pooled_auc",
    "worst_site_auc_ci",
    "cross_site",
    "routers_origin_known",
    "system_by_site",
    "normalization",
    "augment",
    "operating_rule",
    "average_accuracy_operating",
    "average_accuracy_operating_by_train",
)
CLINICAL_SITE_KEYS = ("n_pos", "n_neg", "auc_ci", "unreliable", "operating_point", "calibration")


def before_intervals(data: dict[str, Any], *, roc: bool = True) -> dict[str, Any]:
    """A copy of summary.json ``data`` without the keys added with the clinical figures (and
    without ROC points when ``roc`` is false, as still older runs were written)."""
    site_keys = CLINICAL_SITE_KEYS if roc else (*CLINICAL_SITE_KEYS, "roc")
    old = {k: v for k, v in data.items() if k not in CLINICAL_KEYS}
    old["sites"] = {
        site: {k: v for k, v in figures.items() if k not in site_keys}
        for site, figures in data["sites"].items()
    }
    old["routers"] = {
        name: {k: v for k, v in r.items() if k != "rates"} for name, r in data["routers"].items()
    }
    return old
