"""Statistics for clinical evaluation: intervals, pooling, operating points, calibration.

Checked against slow computations from the definitions, against sklearn and statsmodels run
directly, and by simulation with a known truth. Everything is seeded.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from statistics import NormalDist

import numpy as np
import pytest
from scipy.special import expit, logit
from sklearn.metrics import roc_auc_score
from statsmodels.stats.meta_analysis import combine_effects
from statsmodels.stats.proportion import proportion_confint

from medfed.metrics import (
    DEFAULT_OPERATING_RULE,
    RELIABLE_MIN,
    Calibration,
    Interval,
    OperatingPoint,
    OperatingRule,
    Pooled,
    Proportion,
    auc_fast,
    auc_interval,
    bootstrap_auc_interval,
    calibration,
    choose_threshold,
    delong,
    delong_paired,
    operating_point,
    paired_bootstrap,
    pooled_auc,
    unreliable,
    verdict,
    wilson,
)


def binormal(rng: np.random.Generator, n_pos: int, n_neg: int, d: float = 1.0):
    y = np.r_[np.ones(n_pos, dtype=int), np.zeros(n_neg, dtype=int)]
    s = np.r_[rng.normal(d, 1, n_pos), rng.normal(0, 1, n_neg)]
    return y, s


def json_round_trip(obj, cls):
    text = json.dumps(obj.to_dict(), allow_nan=False)
    back = cls.from_dict(json.loads(text))
    assert back == obj
    return back


# ------------------------------------------------------------------------------ DeLong
def _slow_components(y, s):
    """V10 (per positive) and V01 (per negative) from the definition, pair by pair."""
    pos, neg = s[y == 1], s[y == 0]
    psi = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])
    return psi.mean(axis=1), psi.mean(axis=0)


def test_auc_fast_and_delong_auc_equal_sklearn_with_ties():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 300)
    s = np.round(rng.normal(y * 0.8, 1), 1)  # rounding makes many ties, across classes too
    assert len(np.unique(s)) < 100
    expected = roc_auc_score(y, s)
    assert auc_fast(y, s) == pytest.approx(expected, abs=1e-12)
    assert delong(y, s)[0] == pytest.approx(expected, abs=1e-12)
    assert auc_fast(y == 1, s) == pytest.approx(expected, abs=1e-12)  # booleans are labels


def test_delong_variance_matches_the_definition():
    y = np.array([1, 1, 1, 1, 0, 0, 0, 0, 0])
    s = np.array([0.9, 0.7, 0.5, 0.5, 0.6, 0.5, 0.3, 0.2, 0.2])
    v10, v01 = _slow_components(y, s)
    m, n = v10.size, v01.size
    auc = v10.mean()
    var = ((v10 - auc) ** 2).sum() / (m - 1) / m + ((v01 - auc) ** 2).sum() / (n - 1) / n
    got_auc, got_var = delong(y, s)
    assert got_auc == pytest.approx(auc, abs=1e-12)
    assert got_var == pytest.approx(var, rel=1e-12)
    assert got_var > 0


def test_delong_paired_variance_is_var_a_plus_var_b_minus_twice_the_covariance():
    rng = np.random.default_rng(1)
    y, a = binormal(rng, 12, 15)
    b = a + rng.normal(0, 0.8, a.size)
    (a10, a01), (b10, b01) = _slow_components(y, a), _slow_components(y, b)
    m, n = a10.size, a01.size
    cov = np.cov(a10, b10)[0, 1] / m + np.cov(a01, b01)[0, 1] / n
    var_a, var_b = delong(y, a)[1], delong(y, b)[1]
    diff, var = delong_paired(y, a, b)
    assert diff == pytest.approx(roc_auc_score(y, a) - roc_auc_score(y, b), abs=1e-12)
    assert var == pytest.approx(var_a + var_b - 2 * cov, rel=1e-10)
    assert 0 < var < var_a + var_b  # correlated scores: the pairing narrows the difference
    same_diff, same_var = delong_paired(y, a, a.copy())
    assert same_diff == 0.0
    assert same_var == pytest.approx(0.0, abs=1e-15)


def test_delong_refuses_one_class_and_too_few_of_a_class():
    with pytest.raises(ValueError, match="only class 1"):
        delong([1, 1, 1], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="at least 2 positives"):
        delong([1, 0, 0, 0], [0.9, 0.2, 0.3, 0.1])
    with pytest.raises(ValueError, match="both classes"):
        auc_fast([0, 0], [0.1, 0.2])


def test_delong_and_scan_bootstrap_intervals_agree_on_a_large_sample():
    rng = np.random.default_rng(2)
    y, s = binormal(rng, 1000, 1000, d=0.9)
    d = auc_interval(y, s)
    b = bootstrap_auc_interval(y, s, n_boot=2000, seed=3)
    assert d.method == "DeLong"
    assert b.method == "scan-level bootstrap (2000 resamples)"
    assert d.estimate == b.estimate
    assert abs(d.low - b.low) < 0.01
    assert abs(d.high - b.high) < 0.01


def test_delong_interval_covers_the_true_auc_about_95_percent_of_the_time():
    d = 1.0
    true_auc = NormalDist().cdf(d / math.sqrt(2))
    rng = np.random.default_rng(2024)
    covered = 0
    for _ in range(400):
        y, s = binormal(rng, 50, 50, d)
        interval = auc_interval(y, s)
        covered += interval.low <= true_auc <= interval.high
    assert 0.92 <= covered / 400 <= 0.98


def test_bootstrap_resamples_match_explicit_resampling():
    # Pins the draw scheme (one block of rng.integers(0, G, (B, G))): the weighted AUC of each
    # resample must equal sklearn's AUC of the resample built scan by scan.
    rng = np.random.default_rng(4)
    patients = np.repeat(np.arange(10), 3)
    y = np.repeat(rng.integers(0, 2, 10), 3)
    y[:2] = [0, 1]
    s = np.round(rng.normal(y, 1.0), 1)
    n_boot, seed = 200, 7
    got = bootstrap_auc_interval(y, s, patients, n_boot=n_boot, seed=seed)
    draws = np.random.default_rng(seed).integers(0, 10, size=(n_boot, 10))
    aucs = []
    for row in draws:
        idx = np.concatenate([np.flatnonzero(patients == g) for g in row])
        if len(np.unique(y[idx])) == 2:
            aucs.append(roc_auc_score(y[idx], s[idx]))
    low, high = np.quantile(aucs, [0.025, 0.975])
    assert got.low == pytest.approx(low, abs=1e-12)
    assert got.high == pytest.approx(high, abs=1e-12)
    skipped = n_boot - len(aucs)
    assert (f"{skipped} with one class skipped" in got.method) == (skipped > 0)


def test_patient_clustered_bootstrap_is_wider_when_a_patients_scans_agree():
    rng = np.random.default_rng(5)
    y_pat, s_pat = binormal(rng, 60, 60, d=1.0)
    y = np.repeat(y_pat, 4)
    s = np.repeat(s_pat, 4) + rng.normal(0, 0.01, y.size)  # 4 near-identical scans each
    patients = np.repeat([f"P{i:03d}" for i in range(120)], 4)
    scans = bootstrap_auc_interval(y, s, seed=1)
    clustered = bootstrap_auc_interval(y, s, patients, seed=1)
    assert clustered.method == "patient-clustered bootstrap (2000 resamples, 120 patients)"
    assert (clustered.high - clustered.low) > 1.5 * (scans.high - scans.low)


def test_auc_interval_chooses_delong_or_the_clustered_bootstrap_and_says_so():
    rng = np.random.default_rng(6)
    y, s = binormal(rng, 30, 30)
    one_each = np.arange(60)
    assert auc_interval(y, s).method == "DeLong"
    assert auc_interval(y, s, one_each).method == "DeLong"
    shared = np.arange(60) // 2
    iv = auc_interval(y, s, shared, n_boot=500)
    assert iv.method.startswith("patient-clustered bootstrap (500 resamples, 30 patients")
    assert auc_interval(np.zeros(5, int), np.arange(5) / 5) is None
    # One positive bounds nothing: no interval rather than one without width.
    assert auc_interval([1, 0, 0, 0, 0], [0.9, 0.1, 0.2, 0.3, 0.95], n_boot=300) is None
    delong_iv = auc_interval(*binormal(rng, 5, 5, d=6.0))
    assert delong_iv.high <= 1.0 and delong_iv.low >= 0.0  # clipped to the AUC scale


def test_perfect_separation_gets_an_interval_that_shrinks_with_the_counts():
    small = auc_interval([1, 1, 0, 0], [0.9, 0.8, 0.2, 0.1])
    large = auc_interval([1] * 40 + [0] * 40, [0.9] * 40 + [0.1] * 40)
    assert small.estimate == large.estimate == 1.0
    assert "Hanley-McNeil" in small.method and small.high == 1.0
    assert 0.0 < 1.0 - large.low < 1.0 - small.low


def test_bootstrap_is_deterministic_with_its_seed():
    rng = np.random.default_rng(7)
    y, s = binormal(rng, 40, 40)
    a = bootstrap_auc_interval(y, s, seed=11, n_boot=300)
    assert a == bootstrap_auc_interval(y, s, seed=11, n_boot=300)
    assert a != bootstrap_auc_interval(y, s, seed=12, n_boot=300)


# ------------------------------------------------------------------------------ rates
@pytest.mark.parametrize(("k", "n"), [(0, 1), (0, 20), (3, 20), (18, 20), (20, 20), (1, 1)])
def test_wilson_matches_statsmodels(k, n):
    got = wilson(k, n)
    low, high = proportion_confint(k, n, alpha=0.05, method="wilson")
    assert got.k == k and got.n == n and got.value == k / n
    assert got.interval.low == pytest.approx(low, abs=1e-12)
    assert got.interval.high == pytest.approx(high, abs=1e-12)
    assert 0.0 <= got.interval.low <= got.value <= got.interval.high <= 1.0
    assert got.interval.method == "Wilson"
    low90, _ = proportion_confint(k, n, alpha=0.10, method="wilson")
    assert wilson(k, n, level=0.90).interval.low == pytest.approx(low90, abs=1e-12)


def test_wilson_edges_and_text():
    assert wilson(0, 20).interval.low == 0.0
    assert wilson(20, 20).interval.high == 1.0
    empty = wilson(0, 0)
    assert empty.interval is None and empty.value is None
    assert empty.text() == "n/a (0 scans)"
    assert empty.to_dict() == {
        "k": 0,
        "n": 0,
        "value": None,
        "low": None,
        "high": None,
        "method": None,
        "level": None,
    }
    assert wilson(18, 20).text() == "0.900 (0.699\u20130.972) 18/20"
    with pytest.raises(ValueError):
        wilson(5, 4)
    with pytest.raises(ValueError):
        wilson(-1, 4)


def test_unreliable_wording():
    assert RELIABLE_MIN == 10
    assert unreliable(10, 10) is None
    assert unreliable(4, 50) == "fewer than 10 positives (4)"
    assert unreliable(50, 9) == "fewer than 10 negatives (9)"
    assert unreliable(0, 3) == "fewer than 10 positives (0) and fewer than 10 negatives (3)"


# ------------------------------------------------------------------------------ pooling
AUCS = [0.72, 0.80, 0.85, 0.91, 0.76]
VARS = [0.0012, 0.0009, 0.0015, 0.0006, 0.0020]


def test_pooled_auc_matches_statsmodels_and_a_hand_dersimonian_laird():
    pooled = pooled_auc(AUCS, VARS)
    a, v = np.array(AUCS), np.array(VARS)
    theta = logit(a)
    var = v / (a * (1 - a)) ** 2

    # statsmodels directly
    res = combine_effects(theta, var, method_re="dl")
    z = NormalDist().inv_cdf(0.975)
    assert pooled.estimate == pytest.approx(expit(res.mean_effect_re), rel=1e-12)
    assert pooled.low == pytest.approx(expit(res.mean_effect_re - z * res.sd_eff_w_re), rel=1e-12)
    assert pooled.tau2 == pytest.approx(res.tau2, rel=1e-12)

    # by hand
    w = 1 / var
    fixed = np.sum(w * theta) / w.sum()
    q = np.sum(w * (theta - fixed) ** 2)
    c = w.sum() - np.sum(w**2) / w.sum()
    tau2 = max(0.0, (q - (a.size - 1)) / c)
    w_re = 1 / (var + tau2)
    mu = np.sum(w_re * theta) / w_re.sum()
    se = math.sqrt(1 / w_re.sum())
    assert tau2 > 0  # the example is heterogeneous: the random effect matters
    assert pooled.q == pytest.approx(q, rel=1e-10)
    assert pooled.tau2 == pytest.approx(tau2, rel=1e-10)
    assert pooled.i2 == pytest.approx((q - (a.size - 1)) / q, rel=1e-10)
    assert pooled.estimate == pytest.approx(expit(mu), rel=1e-10)
    assert pooled.low == pytest.approx(expit(mu - z * se), rel=1e-10)
    assert pooled.high == pytest.approx(expit(mu + z * se), rel=1e-10)
    assert pooled.n_sites == 5
    assert pooled.method == "DerSimonian-Laird on logit AUC"


def test_pooled_auc_homogeneous_sites_truncate_tau2_at_zero():
    # Q < df: DerSimonian-Laird's tau² is 0 and the pooled AUC is the fixed-effect one.
    # (statsmodels 0.15 leaves tau² negative here; pooled_auc must not follow it.)
    a, v = np.array([0.80, 0.82, 0.79]), np.array([0.001, 0.002, 0.001])
    pooled = pooled_auc(a, v)
    theta, var = logit(a), v / (a * (1 - a)) ** 2
    w = 1 / var
    fixed = np.sum(w * theta) / w.sum()
    q = np.sum(w * (theta - fixed) ** 2)
    assert q < 2
    assert pooled.i2 == 0.0 and pooled.tau2 == 0.0 and pooled.q == pytest.approx(q, rel=1e-10)
    z = NormalDist().inv_cdf(0.975)
    assert pooled.estimate == pytest.approx(expit(fixed), rel=1e-12)
    assert pooled.high == pytest.approx(expit(fixed + z / math.sqrt(w.sum())), rel=1e-12)
    same = pooled_auc([0.8, 0.8, 0.8], [0.001, 0.002, 0.001])
    assert same.i2 == 0.0 and same.q == pytest.approx(0.0, abs=1e-12)
    assert same.estimate == pytest.approx(0.8)


def test_pooled_auc_needs_two_sites_and_matching_lengths():
    assert pooled_auc([0.8], [0.001]) is None
    assert pooled_auc([], []) is None
    with pytest.raises(ValueError):
        pooled_auc([0.8, 0.7], [0.001])


def test_pooled_auc_handles_auc_of_one_and_zero_variance():
    pooled = pooled_auc([1.0, 0.8, 0.0], [0.0, 0.001, 0.0])
    assert all(math.isfinite(x) for x in (pooled.estimate, pooled.low, pooled.high, pooled.q))
    assert 0.0 < pooled.low <= pooled.estimate <= pooled.high < 1.0
    assert "2 AUC(s) clipped" in pooled.method and "2 variance(s) raised" in pooled.method
    json_round_trip(pooled, Pooled)
    assert "I\u00b2" in pooled.text() and "3 sites" in pooled.text()


# ------------------------------------------------------------------------------ thresholds
# Negatives 0.1 .. 0.4 and 0.6; positives 0.35, 0.5, 0.7, 0.8, 0.9.
Y_VAL = np.array([0, 0, 0, 0, 0, 1, 1, 1, 1, 1])
S_VAL = np.array([0.1, 0.2, 0.3, 0.4, 0.6, 0.35, 0.5, 0.7, 0.8, 0.9])


def test_specificity_rule_by_hand():
    t, note = choose_threshold(Y_VAL, S_VAL, OperatingRule.parse("specificity:0.8"))
    # Specificity 0.8 needs 4 negatives below the threshold: t in (0.4, 0.6]; the midpoint
    # between 0.4 and the next score 0.5 is the lowest candidate.
    assert t == pytest.approx(0.45) and note is None


def test_specificity_rule_reaches_the_target_with_the_lowest_threshold():
    rng = np.random.default_rng(8)
    y, s = binormal(rng, 80, 120)
    p = expit(s)
    for target in (0.5, 0.8, 0.9, 0.95):
        t, note = choose_threshold(y, p, OperatingRule("specificity", target))
        assert note is None and math.isfinite(t) and 0.0 <= t <= 1.0
        neg = p[y == 0]
        assert np.mean(neg < t) >= target
        below = p[p < t]
        if below.size:  # one step lower calls the next score positive: the target is missed
            assert np.mean(neg < below.max()) < target


def test_youden_by_hand_breaks_ties_to_the_higher_threshold():
    # tpr - fpr = 0.6 at 0.325 (1.0 - 0.4), 0.45 (0.8 - 0.2) and 0.65 (0.6 - 0): take 0.65.
    t, note = choose_threshold(Y_VAL, S_VAL, OperatingRule.parse("youden"))
    assert t == pytest.approx(0.65) and note is None


def test_fixed_threshold_and_one_class_fallback():
    assert choose_threshold(Y_VAL, S_VAL, OperatingRule.parse("threshold:0.3")) == (0.3, None)
    assert choose_threshold([0, 0], [0.1, 0.9], "threshold:0.7") == (0.7, None)
    t, note = choose_threshold(np.zeros(7, int), np.linspace(0, 1, 7), OperatingRule("youden"))
    assert t == 0.5
    assert note == "validation split has only class 0 (n=7): fixed threshold 0.5 used"
    t, note = choose_threshold([], [], DEFAULT_OPERATING_RULE)
    assert t == 0.5 and "n=0" in note


def test_thresholds_are_finite_and_within_0_1_even_at_the_extremes():
    y = np.array([0, 0, 1, 1, 0, 1])
    s = np.array([0.0, 0.0, 1.0, 1.0, 0.3, 0.3])
    for rule in ("specificity:0.5", "specificity:0.99", "youden"):
        t, _ = choose_threshold(y, s, rule)
        assert math.isfinite(t) and 0.0 <= t <= 1.0
    # Perfect separation: youden puts the cut strictly between the classes.
    t, _ = choose_threshold([0, 0, 1, 1], [0.1, 0.2, 0.8, 0.9], "youden")
    assert 0.2 < t < 0.8
    # Nothing positive is a candidate (the midpoint between the top score and 1).
    t, _ = choose_threshold([0, 1, 0], [0.2, 0.5, 0.9], "specificity:0.99")
    assert t == pytest.approx(0.95)
    # A negative at exactly 1.0: no threshold in [0, 1] reaches the target; it says so.
    t, note = choose_threshold([0, 1, 0], [0.2, 0.5, 1.0], "specificity:0.9")
    assert 0.0 <= t <= 1.0 and "no threshold in [0, 1]" in note


@pytest.mark.parametrize(
    "text",
    [
        "specificity:0.90",
        "specificity:0.925",
        "specificity:0.1234567891234",
        "youden",
        "threshold:0.5",
        "threshold:0",
        " Specificity : 0.95 ",
    ],
)
def test_operating_rule_round_trips_through_text(text):
    rule = OperatingRule.parse(text)
    assert OperatingRule.parse(str(rule)) == rule


def test_operating_rule_values():
    assert OperatingRule.parse(DEFAULT_OPERATING_RULE) == OperatingRule("specificity", 0.9)
    assert str(OperatingRule.parse("youden")) == "youden"
    assert str(OperatingRule.parse(DEFAULT_OPERATING_RULE)) == DEFAULT_OPERATING_RULE
    assert str(OperatingRule("specificity", 0.9)) == "specificity:0.90"
    assert str(OperatingRule("specificity", 0.925)) == "specificity:0.925"
    assert str(OperatingRule("threshold", 0.5)) == "threshold:0.50"
    assert OperatingRule.parse("threshold:1") == OperatingRule("threshold", 1.0)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "specificity",
        "specificity:",
        "specificity:1",
        "specificity:0",
        "specificity:abc",
        "specificity:nan",
        "threshold:1.5",
        "threshold:-0.1",
        "youden:0.3",
        "sensitivity:0.9",
        "0.9",
    ],
)
def test_operating_rule_rejects_bad_text_naming_the_accepted_forms(text):
    with pytest.raises(ValueError, match="specificity:0.90.*youden.*threshold:0.5"):
        OperatingRule.parse(text)


# ------------------------------------------------------------------------------ operating point
def test_operating_point_by_hand():
    y = np.array([1, 1, 1, 0, 0, 0, 0])
    s = np.array([0.9, 0.6, 0.2, 0.7, 0.3, 0.1, 0.05])
    op = operating_point(y, s, 0.5, "threshold:0.5")
    assert (op.tp, op.fp, op.tn, op.fn) == (2, 1, 3, 1)
    assert op.sensitivity == wilson(2, 3)
    assert op.specificity == wilson(3, 4)
    assert op.ppv == wilson(2, 3)
    assert op.npv == wilson(3, 4)
    assert op.rule == "threshold:0.5" and op.note is None
    assert operating_point(y, s, 0.6, "x").tp == 2  # score >= threshold is called positive
    json_round_trip(op, OperatingPoint)


def test_operating_point_without_predicted_positives_has_no_ppv():
    op = operating_point([1, 0, 0], [0.4, 0.2, 0.1], 0.95, "specificity:0.9", note="why")
    assert op.ppv.n == 0 and op.ppv.interval is None and op.ppv.value is None
    assert op.sensitivity.value == 0.0 and op.specificity.value == 1.0
    d = op.to_dict()
    assert d["ppv"]["value"] is None and d["note"] == "why"
    back = json_round_trip(op, OperatingPoint)
    assert back.ppv.text() == "n/a (0 scans)"


# ------------------------------------------------------------------------------ calibration
def _calibrated(seed: int, n: int = 4000):
    rng = np.random.default_rng(seed)
    p = expit(rng.normal(0, 1.5, n))
    y = (rng.random(n) < p).astype(int)
    return y, p


def test_calibrated_probabilities_have_slope_one_intercept_zero_small_ece():
    y, p = _calibrated(9)
    cal = calibration(y, p)
    assert cal.slope == pytest.approx(1.0, abs=0.1)
    assert cal.intercept == pytest.approx(0.0, abs=0.1)
    assert cal.ece < 0.03
    assert cal.reason is None and cal.n == y.size
    json_round_trip(cal, Calibration)


def test_over_confident_probabilities_have_slope_one_half():
    y, p = _calibrated(10)
    over = expit(2 * logit(p))
    cal = calibration(y, over)
    assert cal.slope == pytest.approx(0.5, abs=0.06)
    assert cal.ece > calibration(y, p).ece


def test_brier_and_equal_mass_bins():
    cal = calibration([0, 1, 1], [0.2, 0.6, 0.9], bins=3)
    assert cal.brier == pytest.approx((0.04 + 0.16 + 0.01) / 3)
    assert [b["n"] for b in cal.bins] == [1, 1, 1]
    assert cal.ece == pytest.approx((0.2 + 0.4 + 0.1) / 3)
    rng = np.random.default_rng(11)
    p = rng.beta(0.5, 3, 103)  # skewed: equal-width bins would be very uneven
    y = (rng.random(103) < p).astype(int)
    cal = calibration(y, p, bins=10)
    sizes = [b["n"] for b in cal.bins]
    assert len(sizes) == 10 and sum(sizes) == 103 and max(sizes) - min(sizes) <= 1
    means = [b["mean_predicted"] for b in cal.bins]
    assert means == sorted(means)
    expected_ece = sum(b["n"] * abs(b["fraction_positive"] - b["mean_predicted"]) for b in cal.bins)
    assert cal.ece == pytest.approx(expected_ece / 103)


def test_calibration_with_one_class_or_separation_gives_reasons():
    one = calibration([1, 1, 1], [0.7, 0.8, 1.0])
    assert one.intercept is None and one.slope is None and "only class 1" in one.reason
    json_round_trip(one, Calibration)
    separated = calibration([0, 0, 1, 1], [0.1, 0.3, 0.6, 0.99])
    assert separated.slope is None and "separate" in separated.reason
    assert separated.intercept is not None and math.isfinite(separated.intercept)
    json_round_trip(separated, Calibration)


# ------------------------------------------------------------------------------ paired bootstrap
def _worst_auc(parts):
    aucs = []
    for y, values in parts.values():
        if len(np.unique(y)) < 2:
            return math.nan
        aucs.append(auc_fast(y, values))
    return min(aucs)


def _strata(seed: int, good: float, bad: float, n: int = 80):
    rng = np.random.default_rng(seed)
    out = {}
    for site in ("A", "B", "C"):
        y = rng.integers(0, 2, n)
        out[site] = (y, y * good + rng.normal(0, 1, n), y * bad + rng.normal(0, 1, n))
    return out


def test_paired_bootstrap_of_identical_methods_is_zero():
    strata = {k: (y, a, a.copy()) for k, (y, a, _) in _strata(12, 1.0, 1.0).items()}
    iv = paired_bootstrap(strata, _worst_auc, n_boot=300)
    assert iv.estimate == 0.0 and iv.low <= 0.0 <= iv.high
    assert verdict(iv) == "no difference detected"


def test_paired_bootstrap_finds_a_clearly_better_method():
    strata = _strata(13, good=2.5, bad=0.3)
    iv = paired_bootstrap(strata, _worst_auc, n_boot=400, seed=1)
    expected = _worst_auc({k: (y, a) for k, (y, a, _) in strata.items()}) - _worst_auc(
        {k: (y, b) for k, (y, _, b) in strata.items()}
    )
    assert iv.estimate == pytest.approx(expected)
    assert iv.low > 0 and verdict(iv) == "ahead"
    assert iv.method == "paired bootstrap (400 resamples of scans within 3 strata)"
    again = paired_bootstrap(strata, _worst_auc, n_boot=400, seed=1)
    assert again == iv
    assert paired_bootstrap(strata, _worst_auc, n_boot=400, seed=2) != iv


def test_paired_bootstrap_resamples_whole_patients_and_pairs_a_with_b():
    n_pat, per = 15, 4
    patients = np.repeat(np.arange(n_pat), per)
    y = np.repeat(np.arange(n_pat) % 2, per)
    seen = []

    def stat(parts):
        y_s, ids = parts["s"]
        counts = np.bincount(ids.astype(int), minlength=n_pat)
        seen.append(bool(np.all(counts % per == 0)) and y_s.size % per == 0)
        return float(ids.sum())

    # values_a are the patient ids; values_b the same ids: a and b must see the same draw.
    iv = paired_bootstrap(
        {"s": (y, patients.astype(float), patients.astype(float))},
        stat,
        clusters={"s": patients},
        n_boot=100,
    )
    assert all(seen) and len(seen) == 2 * 101
    assert iv.estimate == 0.0 and iv.low == 0.0 and iv.high == 0.0
    assert "resamples of patients" in iv.method


def test_paired_bootstrap_drops_undefined_resamples_and_none_when_undefined():
    y = np.array([1, 0, 0, 0, 0, 0, 1, 0])
    a = np.linspace(0, 1, 8)
    b = a[::-1].copy()
    iv = paired_bootstrap({"s": (y, a, b)}, _worst_auc, n_boot=200)
    assert iv is not None and "undefined resamples dropped" in iv.method
    assert paired_bootstrap({"s": (np.zeros(5, int), a[:5], b[:5])}, _worst_auc) is None


# ------------------------------------------------------------------------------ wording and JSON
def test_verdict_wording():
    assert verdict(Interval(0.05, 0.01, 0.09, "x")) == "ahead"
    assert verdict(Interval(-0.05, -0.09, -0.01, "x")) == "behind"
    assert verdict(Interval(0.01, -0.02, 0.04, "x")) == "no difference detected"
    assert verdict(Interval(0.0, 0.0, 0.03, "x")) == "no difference detected"
    assert verdict(Interval(-0.05, -0.09, -0.01, "x"), higher_is_better=False) == "ahead"
    assert verdict(Interval(0.05, 0.01, 0.09, "x"), higher_is_better=False) == "behind"
    assert verdict(None) == "not measured"


def test_interval_text_and_json():
    iv = Interval(0.84, 0.78, 0.9, "DeLong")
    assert iv.text() == "0.840 (0.780\u20130.900)"
    assert iv.text(2) == "0.84 (0.78\u20130.90)"
    json_round_trip(iv, Interval)
    json_round_trip(Interval(np.float64(0.5), 0.4, 0.6, "x", level=0.9), Interval)
    with pytest.raises(ValueError):
        Interval(math.nan, 0.1, 0.2, "x")
    with pytest.raises(ValueError):
        Interval(0.5, 0.1, math.inf, "x")


def test_every_result_is_strict_json_and_round_trips():
    rng = np.random.default_rng(14)
    y, s = binormal(rng, 30, 40)
    p = expit(s)
    json_round_trip(auc_interval(y, s), Interval)
    json_round_trip(auc_interval(y, s, np.arange(70) // 2, n_boot=200), Interval)
    for k, n in ((0, 0), (0, 5), (5, 5), (3, 7)):
        json_round_trip(wilson(k, n), Proportion)
    json_round_trip(wilson(3, 7, level=0.9), Proportion)
    t, note = choose_threshold(y, p, DEFAULT_OPERATING_RULE)
    json_round_trip(operating_point(y, p, t, DEFAULT_OPERATING_RULE, note), OperatingPoint)
    json_round_trip(calibration(y, p), Calibration)
    json_round_trip(pooled_auc(AUCS, VARS), Pooled)
    strata = {"a": (y, s, s[::-1].copy())}
    json_round_trip(paired_bootstrap(strata, _worst_auc, n_boot=100), Interval)


def test_importing_metrics_loads_neither_torch_nor_statsmodels():
    code = (
        "import sys, medfed.metrics; "
        "sys.exit(('torch' in sys.modules) + 2 * ('statsmodels' in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
