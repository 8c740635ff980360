"""Metrics: hand-computed small cases for every public function."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from medfed.metrics import (
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

Y4 = np.array([0, 0, 1, 1])
P4 = np.array([0.1, 0.4, 0.35, 0.8])

# Three classes, four scans. One-vs-rest AUCs by hand: class 0 -> 3/4 (pos {.6,.2} vs neg
# {.3,.1}), class 1 -> 2/3 (pos {.4} vs neg {.3,.5,.2}), class 2 -> 1; macro = 29/36.
Y3 = np.array([0, 0, 1, 2])
P3 = np.array(
    [
        [0.6, 0.3, 0.1],
        [0.2, 0.5, 0.3],
        [0.3, 0.4, 0.3],
        [0.1, 0.2, 0.7],
    ]
)


def _site(auc: float | None, accuracy: float, n: int) -> SiteMetrics:
    reason = None if auc is not None else "test split has only class 0 (n=1): AUC undefined"
    return SiteMetrics(auc, reason, accuracy, accuracy, n, {0: n, 1: 0})


# --- site_metrics -------------------------------------------------------------------------------


def test_binary_auc_matches_hand_count_from_positive_class_probability():
    m = site_metrics(Y4, P4)

    # 4 positive/negative pairs; only (0.35 vs 0.4) is ranked wrong -> 3/4.
    assert m.auc == pytest.approx(0.75)
    assert m.auc_reason is None


def test_binary_accepts_one_column_or_two_columns_alike():
    one = site_metrics(Y4, P4)
    two = site_metrics(Y4, np.stack([1 - P4, P4], axis=1))

    assert one == two


def test_binary_accuracy_and_balanced_accuracy_use_argmax():
    y = np.array([0, 0, 0, 1])
    probs = np.array([0.2, 0.1, 0.3, 0.4])  # every scan predicted class 0

    m = site_metrics(y, probs)

    assert m.accuracy == pytest.approx(0.75)
    assert m.balanced_accuracy == pytest.approx(0.5)  # recalls 1.0 and 0.0
    assert m.n == 4
    assert m.n_per_class == {0: 3, 1: 1}


def test_probability_one_half_predicts_class_zero():
    m = site_metrics(np.array([0, 1]), np.array([0.5, 0.5]))

    assert m.accuracy == pytest.approx(0.5)


def test_multiclass_auc_is_macro_one_vs_rest():
    m = site_metrics(Y3, P3)

    assert m.auc == pytest.approx(29 / 36)
    assert m.n_per_class == {0: 2, 1: 1, 2: 1}


def test_multiclass_accuracy_and_balanced_accuracy():
    m = site_metrics(Y3, P3)

    # Predictions 0, 1, 1, 2: one class-0 scan wrong. Recalls 1/2, 1, 1.
    assert m.accuracy == pytest.approx(0.75)
    assert m.balanced_accuracy == pytest.approx(5 / 6)


def test_multiclass_auc_averages_over_classes_present_and_counts_absent_as_zero():
    y = np.array([0, 1, 1])
    probs = np.array([[0.7, 0.2, 0.1], [0.2, 0.6, 0.2], [0.5, 0.3, 0.2]])

    m = site_metrics(y, probs)

    # Class 0 vs rest: pos .7 beats .2 and .5 -> 1. Class 1 vs rest: pos {.6,.3} vs .2 -> 1.
    assert m.auc == pytest.approx(1.0)
    assert m.n_per_class == {0: 1, 1: 2, 2: 0}
    assert m.balanced_accuracy == pytest.approx((1.0 + 0.5) / 2)


def test_single_class_split_has_no_auc_and_says_why():
    y = np.ones(12, dtype=int)
    probs = np.linspace(0.1, 0.9, 12)

    m = site_metrics(y, probs)

    assert m.auc is None
    assert m.auc_reason == "test split has only class 1 (n=12): AUC undefined"
    assert m.accuracy == pytest.approx(np.mean(probs > 0.5))


def test_single_class_reason_names_the_split():
    m = site_metrics(np.zeros(3, dtype=int), np.full((3, 3), 1 / 3), split="val")

    assert m.auc_reason == "val split has only class 0 (n=3): AUC undefined"


def test_empty_split_is_rejected_with_a_clear_message():
    with pytest.raises(ValueError, match=r"test split is empty \(n=0\)"):
        site_metrics(np.array([], dtype=int), np.zeros((0, 2)))


@pytest.mark.parametrize(
    ("probs", "message"),
    [
        (np.array([[2.0, -1.0], [0.5, 0.5], [0.1, 0.9]]), "not logits"),
        (np.array([[0.4, 0.4], [0.5, 0.5], [0.1, 0.9]]), "sum to 1"),
        (np.array([[np.nan, 0.5], [0.5, 0.5], [0.1, 0.9]]), "NaN"),
        (np.array([[0.5, 0.5], [0.1, 0.9]]), "2 rows but y_true has 3"),
        (np.ones((3, 1)), "K >= 2"),
    ],
)
def test_unusable_probabilities_are_rejected(probs, message):
    with pytest.raises(ValueError, match=message):
        site_metrics(np.array([0, 1, 1]), probs)


def test_label_outside_the_scored_classes_is_rejected():
    with pytest.raises(ValueError, match="scores 2 classes"):
        site_metrics(np.array([0, 1, 2]), np.full((3, 2), 0.5))


def test_non_integer_labels_are_rejected():
    with pytest.raises(ValueError, match="integer"):
        site_metrics(np.array([0.0, 0.5]), np.full((2, 2), 0.5))


def test_float_labels_with_integer_values_are_accepted():
    assert site_metrics(Y4.astype(float), P4).auc == pytest.approx(0.75)


def test_site_metrics_round_trip_through_json():
    m = site_metrics(Y3, P3)

    text = json.dumps(m.to_dict(), allow_nan=False)

    assert json.loads(text)["n_per_class"] == {"0": 2, "1": 1, "2": 1}
    assert SiteMetrics.from_dict(json.loads(text)) == m


def test_site_metrics_values_are_plain_python_numbers():
    m = site_metrics(Y4, P4)

    assert type(m.auc) is float and type(m.accuracy) is float and type(m.n) is int


def test_site_metrics_rejects_missing_auc_without_reason():
    with pytest.raises(ValueError, match="auc_reason"):
        SiteMetrics(None, None, 0.5, 0.5, 2, {0: 1, 1: 1})


# --- federation_metrics -------------------------------------------------------------------------


def test_federation_summary_hand_computed():
    per_site = {"A": _site(0.9, 0.9, 10), "B": _site(0.6, 0.5, 30), "C": _site(None, 1.0, 10)}

    f = federation_metrics(per_site)

    assert f.n_sites == 3
    assert f.mean_site_auc == pytest.approx(0.75)
    assert (f.worst_site, f.worst_site_auc) == ("B", pytest.approx(0.6))
    assert (f.best_site, f.best_site_auc) == ("A", pytest.approx(0.9))
    assert f.auc_std == pytest.approx(0.15)
    assert f.worst10_auc == pytest.approx(0.6)
    assert f.auc_gini == pytest.approx(0.1)  # |0.9-0.6|*2 / (2 * 2^2 * 0.75)
    assert f.sites_without_auc == ["C"]


def test_average_accuracy_is_weighted_by_site_size_and_mean_accuracy_is_not():
    per_site = {"A": _site(0.9, 0.9, 10), "B": _site(0.6, 0.5, 30), "C": _site(None, 1.0, 10)}

    f = federation_metrics(per_site)

    assert f.average_accuracy == pytest.approx((9 + 15 + 10) / 50)
    assert f.mean_accuracy == pytest.approx(0.8)
    assert f.accuracy_std == pytest.approx(np.sqrt((0.01 + 0.09 + 0.04) / 3))


def test_average_accuracy_by_train_weights_by_training_scans():
    per_site = {"A": _site(0.9, 0.9, 10), "B": _site(0.6, 0.5, 30), "C": _site(None, 1.0, 10)}

    f = federation_metrics(per_site, n_train={"A": 60, "B": 20, "C": 20, "unused": 5})

    assert f.average_accuracy_by_train == pytest.approx((0.9 * 60 + 0.5 * 20 + 1.0 * 20) / 100)
    assert f.average_accuracy == pytest.approx((9 + 15 + 10) / 50)  # still by test scans
    assert federation_metrics(per_site).average_accuracy_by_train is None


def test_average_accuracy_by_train_needs_every_site_and_sane_counts():
    per_site = {"A": _site(0.9, 0.9, 10), "B": _site(0.6, 0.5, 30)}

    with pytest.raises(ValueError, match="site\\(s\\) B"):
        federation_metrics(per_site, n_train={"A": 5})
    with pytest.raises(ValueError, match=">= 0"):
        federation_metrics(per_site, n_train={"A": 5, "B": -1})
    with pytest.raises(ValueError, match="all 0"):
        federation_metrics(per_site, n_train={"A": 0, "B": 0})


def test_federation_metrics_from_an_older_dict_reads_by_train_as_none():
    f = federation_metrics({"A": _site(0.9, 0.9, 10)}, n_train={"A": 40})
    old = f.to_dict()
    del old["average_accuracy_by_train"]

    back = FederationMetrics.from_dict(old)

    assert back.average_accuracy_by_train is None
    assert back.average_accuracy == f.average_accuracy


def test_worst_site_tie_goes_to_smallest_id_regardless_of_order():
    per_site = {"zeta": _site(0.7, 0.8, 5), "alpha": _site(0.7, 0.8, 5), "mid": _site(0.9, 1, 5)}

    assert federation_metrics(per_site).worst_site == "alpha"


def test_worst10_takes_ceil_of_ten_percent_of_sites():
    aucs = [0.5, 0.6] + [0.9] * 9  # 11 sites -> worst 2
    per_site = {f"s{i:02d}": _site(a, 0.8, 5) for i, a in enumerate(aucs)}

    assert federation_metrics(per_site).worst10_auc == pytest.approx(0.55)


def test_worst10_uses_exact_integer_tenth_for_thirty_sites():
    aucs = [0.5, 0.6, 0.7] + [0.9] * 27  # 30 sites -> exactly 3, not 4
    per_site = {f"s{i:02d}": _site(a, 0.8, 5) for i, a in enumerate(aucs)}

    assert federation_metrics(per_site).worst10_auc == pytest.approx(0.6)


def test_federation_without_any_auc_gives_none_not_a_crash():
    per_site = {"A": _site(None, 0.5, 4), "B": _site(None, 1.0, 4)}

    f = federation_metrics(per_site)

    for name in ("mean_site_auc", "worst_site_auc", "worst_site", "best_site_auc", "best_site"):
        assert getattr(f, name) is None
    assert (f.auc_std, f.worst10_auc, f.auc_gini) == (None, None, None)
    assert f.sites_without_auc == ["A", "B"]
    assert f.average_accuracy == pytest.approx(0.75)


def test_federation_of_no_sites_is_rejected():
    with pytest.raises(ValueError, match="at least one site"):
        federation_metrics({})


def test_federation_metrics_round_trip_through_json():
    f = federation_metrics(
        {"A": _site(0.9, 0.9, 10), "B": _site(None, 0.5, 30)}, n_train={"A": 3, "B": 7}
    )

    text = json.dumps(f.to_dict(), allow_nan=False)

    assert FederationMetrics.from_dict(json.loads(text)) == f


# --- gini ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "expected"),
    [([1, 1, 1], 0.0), ([0, 0, 1], 2 / 3), ([1, 2, 3, 4], 0.25), ([0, 0, 0], 0.0), ([5], 0.0)],
)
def test_gini_of_known_vectors(values, expected):
    assert gini(values) == pytest.approx(expected)


def test_gini_is_scale_invariant():
    assert gini([2, 4, 6, 8]) == pytest.approx(gini([1, 2, 3, 4]))


@pytest.mark.parametrize(("values", "message"), [([], "at least one"), ([1, -1], ">= 0")])
def test_gini_rejects_empty_and_negative(values, message):
    with pytest.raises(ValueError, match=message):
        gini(values)


# --- system / routing ---------------------------------------------------------------------------


def test_system_accuracy_counts_matches():
    assert system_accuracy(np.array([0, 1, 2, 1]), np.array([0, 1, 1, 1])) == pytest.approx(0.75)


def test_system_accuracy_rejects_length_mismatch():
    with pytest.raises(ValueError, match="3 entries"):
        system_accuracy(np.array([0, 1, 2]), np.array([0, 1]))


def test_routing_accuracy_counts_abstentions_as_wrong():
    true = np.array([0, 1, 2, 0])
    routed = np.array([0, -1, 2, 1])

    assert routing_accuracy(true, routed) == pytest.approx(0.5)
    assert abstain_rate(routed) == pytest.approx(0.25)


def test_routing_rejects_unknown_negative_site():
    with pytest.raises(ValueError, match="abstain"):
        routing_accuracy(np.array([0, 1]), np.array([0, -2]))


# --- majority_vote ------------------------------------------------------------------------------


def test_majority_vote_follows_the_most_votes_over_confidence():
    probs = np.array([[[0.6, 0.4]], [[0.6, 0.4]], [[0.01, 0.99]]])

    assert majority_vote(probs).tolist() == [0]


def test_majority_vote_tie_goes_to_highest_mean_probability_among_tied_classes():
    # Model A votes 0, model B votes 1. Mean probs: 0.225, 0.375, 0.40. Class 2 has the highest
    # mean but no votes, so it is not eligible; class 1 wins the tie.
    probs = np.array([[[0.40, 0.25, 0.35]], [[0.05, 0.50, 0.45]]])

    assert majority_vote(probs).tolist() == [1]


def test_majority_vote_exact_tie_goes_to_lowest_class():
    probs = np.array([[[0.6, 0.4]], [[0.4, 0.6]]])

    assert majority_vote(probs).tolist() == [0]


def test_majority_vote_decides_each_scan_separately():
    probs = np.array(
        [
            [[0.9, 0.1, 0.0], [0.2, 0.1, 0.7]],
            [[0.1, 0.8, 0.1], [0.1, 0.1, 0.8]],
            [[0.7, 0.2, 0.1], [0.3, 0.6, 0.1]],
        ]
    )

    result = majority_vote(probs)

    assert result.tolist() == [0, 2]
    assert result.dtype == np.int64


def test_majority_vote_rejects_wrong_shape():
    with pytest.raises(ValueError, match="m_models"):
        majority_vote(np.full((4, 2), 0.5))


# --- roc_points ---------------------------------------------------------------------------------


def test_roc_points_hand_computed_and_json_safe():
    points = roc_points(Y4, P4)

    assert points["fpr"] == pytest.approx([0.0, 0.0, 0.5, 0.5, 1.0])
    assert points["tpr"] == pytest.approx([0.0, 0.5, 0.5, 1.0, 1.0])
    assert points["thresholds"][0] is None
    assert points["thresholds"][1:] == pytest.approx([0.8, 0.4, 0.35, 0.1])
    assert points["reason"] is None
    json.dumps(points, allow_nan=False)


def test_roc_points_accepts_two_column_probabilities():
    assert roc_points(Y4, np.stack([1 - P4, P4], axis=1)) == roc_points(Y4, P4)


def test_roc_points_of_single_class_is_none_with_reason():
    points = roc_points(np.zeros(5, dtype=int), np.linspace(0, 1, 5))

    assert (points["fpr"], points["tpr"], points["thresholds"]) == (None, None, None)
    assert points["reason"] == "test split has only class 0 (n=5): AUC undefined"


def test_roc_points_rejects_multiclass_labels():
    with pytest.raises(ValueError, match="scores 2 classes"):
        roc_points(np.array([0, 1, 2]), np.array([0.1, 0.5, 0.9]))


# --- module boundary ----------------------------------------------------------------------------


def test_metrics_module_does_not_import_torch():
    code = "import sys, medfed.metrics; sys.exit('torch' in sys.modules)"

    result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)

    assert result.returncode == 0, result.stderr.decode()
