"""The report's sections: their anchors and titles, in order, and the introduction each opens
with (report.html, :mod:`medfed.reports.study`)."""

from __future__ import annotations

from medfed.reports.evaluation import rules_note
from medfed.reports.model_card import MODEL_CARD_INTRO
from medfed.reports.prospective import PROSPECTIVE_LEGEND
from medfed.reports.text import UNRELIABLE_MARK

SECTIONS = (
    ("glance", "At a glance"),
    ("methods", "The methods"),
    ("sites", "The sites and their data"),
    ("discrimination", "Discrimination: AUC per site"),
    ("operating", "Operating points"),
    ("calibration", "Calibration"),
    ("cross-site", "Cross-site matrix"),
    ("routing", "Routing a new patient's scan"),
    ("network", "What each method sent over the network"),
)

INTRO = {
    "glance": (
        "One line per method. The pooled AUC combines the sites' AUCs (random effects); I\u00b2 "
        "is the share of their spread not explained by chance. System accuracy is the whole "
        "federation answering every site's test scans, each sent to a site by the default "
        f"router. {rules_note()}"
    ),
    "methods": "How each method was trained.",
    "sites": (
        "What each site contributed. The test split is never used for training or for choosing "
        "a threshold. The facts below are declared by each site in its manifest."
    ),
    "discrimination": (
        "AUC: the chance that the model scores a randomly chosen positive scan above a randomly "
        "chosen negative one (0.5: chance, 1: perfect). The brackets give the 95% confidence "
        f"interval. {UNRELIABLE_MARK} unreliable: the figure rests on fewer than 10 positives or "
        "10 negatives; hover over the mark for the counts."
    ),
    "operating": (
        "Each site's threshold is chosen on its own validation split by the run's rule, then "
        "applied to its test split. Sensitivity: share of positive scans called positive; "
        "specificity: share of negative scans called negative; PPV / NPV: share of positive / "
        "negative calls that are right. Each with its 95% CI (Wilson) and counts k/n."
    ),
    "calibration": (
        "Whether a predicted probability of, say, 0.7 means 7 in 10 such patients are positive. "
        "Brier score: mean squared error of the probabilities (lower is better). ECE: average "
        "gap between predicted and observed, over 10 bins. Intercept 0 and slope 1 are ideal; a "
        "slope below 1 means over-confident probabilities. In the diagrams, points on the "
        "dashed diagonal are perfectly calibrated."
    ),
    "cross-site": (
        "Every site's model (rows) on every site's test split (columns): how well a model "
        "travels to another hospital. The outlined diagonal is each model on its own site. "
        "Shading: white at AUC 0.5, dark blue at 1."
    ),
    "routing": (
        "A new patient's scan is sent to the site whose model fits it best, or the federation "
        "abstains (says it cannot answer). Two protocols: origin unknown (a new camera, a "
        "screening programme: each candidate site normalizes the scan with its own statistics) "
        "and origin known (a member hospital's archived scan, normalized with its own site's "
        "statistics). Sensitivity and specificity count the answered scans only, each at the "
        "answering site's operating point. The routing posterior's table says how far its site "
        "probabilities can be trusted: of the scans routed with probability p, a fraction p "
        "should reach their own site (ECE: the mean gap)."
    ),
    "network": (
        "What each method exchanged between the sites and the coordinator: model updates only, "
        "never scans. Per round, sent plus received, averaged over the rounds."
    ),
    "privacy": (
        "Runs trained with DP-SGD at every site: each scan's gradient clipped, Gaussian noise "
        "added, batches Poisson-sampled. Epsilon is what each site spent at its delta (smaller "
        "is more private); it bounds what the weights a site trained reveal about any one of "
        "its patients. It does not cover the figures sites report (AUCs) nor the feature "
        "statistics they publish for abstention. A site that reached its budget stopped training."
    ),
    "comparisons": (
        "Each method against the reference on the same test scans (written by medfed demo or "
        "medfed compare beside the runs): the paired difference with its interval, and the "
        "verdict it supports."
    ),
    "disagreements": (
        "Routed scans whose clinicians' latest reads differ: each needs a consensus read "
        "before it counts as a label (medfed review lists them too)."
    ),
    "grading": (
        "For a task of more than two classes (diabetic retinopathy grades 0-4), each site's "
        "model on its own test split: the macro AUC (each grade against the rest, averaged) "
        "and the quadratic weighted kappa (agreement of the predicted grade with the true one, "
        "a grade off counting less than two; 1: perfect, 0: chance), each with a 95% CI that "
        "resamples patients; each grade against the rest; and the clinical endpoint, "
        "referable DR, as a two-class figure at the operating point chosen on the site's "
        "validation split by the run's rule."
    ),
    "model-card": MODEL_CARD_INTRO,
    "review": (
        "New patients' scans routed after training and read by the sites' clinicians (each "
        f"run's audit log, every read so far). {PROSPECTIVE_LEGEND}"
    ),
}
REVIEW_SECTION = ("review", "Prospective review")
"""Shown after the others, only for runs whose scans clinicians have read."""
PRIVACY_SECTION = ("privacy", "Differential privacy")
"""Shown only when a run trained with differential privacy."""
COMPARISONS_SECTION = ("comparisons", "Paired comparisons")
"""Shown when medfed demo or medfed compare wrote comparisons beside the runs."""
GRADING_SECTION = ("grading", "Grading: more than two classes")
"""Shown when a run's task has more than two classes (ICDR grades)."""
DISAGREEMENTS_SECTION = ("disagreements", "Reader disagreements")
"""Shown when clinicians read a run's scans differently."""
