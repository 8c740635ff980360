"""Metrics: pure functions of labels and scores, and the uncertainty of what they report.

* ``medfed.metrics.point``: per-site and federation-level figures (AUC, accuracy, worst site,
  routing accuracy, majority vote, ROC points).
* ``medfed.metrics.intervals``: DeLong and bootstrap AUC intervals, Wilson rates, pooling of
  site AUCs, paired differences between methods.
* ``medfed.metrics.operating``: operating points (threshold rules, sensitivity, specificity,
  PPV, NPV) and calibration.
* ``medfed.metrics.multiclass``: tasks with more than two classes: per-class and macro
  one-vs-rest AUC with CIs, quadratic weighted kappa with a patient bootstrap CI, and a graded
  task's binary endpoint (referable DR).
* ``medfed.metrics.federated``: figures of the pooled test scans from the sums each site
  sends (confusion matrices with a federated Poisson bootstrap, calibration bin sums).
* ``medfed.metrics.routing``: the routing posterior's temperature, calibration (ECE, Brier,
  reliability curve) and the review queue's margin threshold.

Everything is importable from ``medfed.metrics``. Nothing here imports torch, and statsmodels
is imported only inside the functions that use it.
"""

from medfed.core.operating_rule import DEFAULT_OPERATING_RULE, OperatingRule
from medfed.core.reliability import RELIABLE_MIN, unreliable
from medfed.metrics.federated import (
    calibration_of_sums,
    confusion_counts,
    poisson_confusions,
    pooled_kappa,
    replicate_seed,
    routing_bin_sums,
    sum_bins,
)
from medfed.metrics.intervals import (
    Interval,
    Pooled,
    Proportion,
    auc_fast,
    auc_interval,
    auc_variance,
    bootstrap_auc_interval,
    cluster_weights,
    delong,
    delong_paired,
    paired_bootstrap,
    pooled_auc,
    verdict,
    weighted_auc,
    wilson,
)
from medfed.metrics.multiclass import (
    ClassAUC,
    MulticlassFigure,
    macro_auc,
    per_class_auc,
    quadratic_kappa,
    referable,
)
from medfed.metrics.operating import (
    Calibration,
    OperatingPoint,
    calibration,
    choose_threshold,
    operating_point,
)
from medfed.metrics.point import (
    ABSTAIN,
    FederationMetrics,
    SiteMetrics,
    abstain_rate,
    federation_metrics,
    gini,
    majority_vote,
    roc_points,
    routing_accuracy,
    site_metrics,
    system_accuracy,
)
from medfed.metrics.routing import (
    MARGIN_TARGET,
    RoutingCalibration,
    fit_temperature,
    margin_band,
    margin_threshold,
    routing_calibration,
    softmax_rows,
    top_margin,
)

__all__ = [
    "ABSTAIN",
    "DEFAULT_OPERATING_RULE",
    "MARGIN_TARGET",
    "RELIABLE_MIN",
    "Calibration",
    "ClassAUC",
    "FederationMetrics",
    "Interval",
    "MulticlassFigure",
    "OperatingPoint",
    "OperatingRule",
    "Pooled",
    "Proportion",
    "RoutingCalibration",
    "SiteMetrics",
    "abstain_rate",
    "auc_fast",
    "auc_interval",
    "auc_variance",
    "bootstrap_auc_interval",
    "cluster_weights",
    "calibration",
    "choose_threshold",
    "delong",
    "delong_paired",
    "federation_metrics",
    "fit_temperature",
    "gini",
    "macro_auc",
    "majority_vote",
    "margin_band",
    "margin_threshold",
    "operating_point",
    "paired_bootstrap",
    "per_class_auc",
    "pooled_auc",
    "quadratic_kappa",
    "referable",
    "roc_points",
    "routing_accuracy",
    "routing_calibration",
    "calibration_of_sums",
    "confusion_counts",
    "poisson_confusions",
    "pooled_kappa",
    "replicate_seed",
    "routing_bin_sums",
    "sum_bins",
    "site_metrics",
    "softmax_rows",
    "system_accuracy",
    "top_margin",
    "unreliable",
    "verdict",
    "weighted_auc",
    "wilson",
]
