"""The routing posterior P(site | scan): its temperature, calibration figures and margin line."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binom

from medfed.clinic.review import LOW_MARGIN, run_low_margin
from medfed.metrics import (
    RoutingCalibration,
    fit_temperature,
    margin_band,
    margin_threshold,
    routing_calibration,
    softmax_rows,
    top_margin,
    wilson,
)
from medfed.metrics.latency import median_interval
from medfed.metrics.routing import MIN_BAND, nll
from medfed.routing.bundle import RoutingFit
from medfed.runs import RunDir


def sampled_sites(scores: np.ndarray, temperature: float, seed: int = 0) -> np.ndarray:
    """True sites drawn from softmax(scores / temperature): a posterior that is right at it."""
    rng = np.random.default_rng(seed)
    probs = softmax_rows(scores, temperature)
    return np.array([rng.choice(probs.shape[1], p=p) for p in probs])


def test_fitted_temperature_minimises_the_validation_nll() -> None:
    rng = np.random.default_rng(1)
    scores = rng.normal(size=(3000, 3)) * 0.05  # far too flat: the true temperature is 0.02
    sites = sampled_sites(scores, 0.02)
    fitted = fit_temperature(scores, sites)
    assert fitted == pytest.approx(0.02, rel=0.15)
    best = nll(scores, sites, fitted)
    for other in (fitted * 0.8, fitted * 1.25, 1.0):
        assert best <= nll(scores, sites, other)


def test_temperature_is_one_with_nothing_to_fit_and_keeps_every_decision() -> None:
    assert fit_temperature(np.zeros((0, 3)), np.zeros(0)) == 1.0
    assert fit_temperature(np.zeros((5, 1)), np.zeros(5)) == 1.0
    scores = np.random.default_rng(2).normal(size=(50, 4))
    sharp = softmax_rows(scores, 0.1)
    assert sharp.argmax(axis=1).tolist() == scores.argmax(axis=1).tolist()
    with pytest.raises(ValueError, match="temperature"):
        softmax_rows(scores, 0.0)


def test_routing_calibration_ece_brier_and_reliability_by_hand() -> None:
    probs = np.array([[0.9, 0.1], [0.6, 0.4], [0.2, 0.8]])
    sites = np.array([0, 1, 1])  # chosen 0, 0, 1: right, wrong, right
    c = routing_calibration(probs, sites, temperature=0.5, low_margin=0.1, bins=3)
    assert c.n == 3 and c.accuracy == pytest.approx(2 / 3)
    # Each scan its own bin: |1 - 0.9| + |0 - 0.6| + |1 - 0.8| over 3 scans.
    assert c.ece == pytest.approx(0.9 / 3)
    assert c.brier == pytest.approx((0.01 * 2 + 0.36 * 2 + 0.04 * 2) / 3)
    assert c.mean_chosen == pytest.approx((0.9 + 0.6 + 0.8) / 3)
    assert c.mean_chosen_correct == pytest.approx(0.85)
    assert [b["fraction_correct"] for b in c.bins] == [0.0, 1.0, 1.0]
    assert RoutingCalibration.from_dict(c.to_dict()) == c


def test_a_calibrated_posterior_has_small_ece_and_an_overconfident_one_large() -> None:
    scores = np.random.default_rng(3).normal(size=(4000, 3)) * 2
    sites = sampled_sites(scores, 1.0, seed=4)
    assert routing_calibration(softmax_rows(scores), sites).ece < 0.03
    assert routing_calibration(softmax_rows(scores, 0.2), sites).ece > 0.1


def test_routing_calibration_refuses_bad_figures_when_read() -> None:
    c = routing_calibration(np.array([[0.7, 0.3]]), np.array([0])).to_dict()
    with pytest.raises(ValueError, match="ece"):
        RoutingCalibration.from_dict(c | {"ece": 1.5})
    with pytest.raises(ValueError, match="temperature"):
        RoutingCalibration.from_dict(c | {"temperature": 0})


def test_margin_threshold_is_where_validation_routing_is_shown_under_the_target() -> None:
    # 30 low-margin scans routed right half the time, then 70 routed right every time
    margins = np.concatenate([np.linspace(0.01, 0.30, 30), np.linspace(0.31, 0.99, 70)])
    correct = np.concatenate([np.arange(30) % 2 == 0, np.ones(70, bool)])

    line = margin_threshold(margins, correct, target=0.9)

    below = margins < line
    n, right = margin_band(margins, correct, line)
    assert n == below.sum() >= MIN_BAND and right == correct[below].sum()
    # the band is shown worse than the target: its Wilson upper bound is below it
    assert wilson(right, n).interval.high < 0.9
    # it sets the poorly routed scans apart: all 30, and not the 70 routed right
    assert n == 30 and 0.30 < line < 0.31
    assert margin_threshold(margins, np.ones(100, bool)) == 0.0  # never wrong: none is low
    # a few early errors among few scans flag nothing: fewer than MIN_BAND cannot show it
    few = np.linspace(0.05, 0.95, 13)
    assert margin_threshold(few, np.array([False, True, False] + [True] * 10), 0.75) == 0.0
    assert top_margin(np.array([[0.5, 0.2, 0.3]])) == pytest.approx([0.2])


def test_the_review_queue_takes_its_low_margin_line_from_the_published_model(tmp_path) -> None:
    run = RunDir(tmp_path)
    assert run_low_margin(tmp_path) == LOW_MARGIN  # no model: the fixed line
    run.model_dir.mkdir(parents=True)
    run.write_model_json({"algorithm": "fedavg"})
    assert run_low_margin(tmp_path) == LOW_MARGIN  # published before the fit
    run.write_model_json({"routing": RoutingFit(0.05, 0.12, 0.9, 60).to_dict()})
    assert run_low_margin(tmp_path) == pytest.approx(0.12)


def test_routing_fit_round_trips_and_refuses_a_bad_temperature() -> None:
    fit = RoutingFit(0.05, 0.12, 0.9, 60)
    assert RoutingFit.from_dict(fit.to_dict()) == fit
    with pytest.raises(ValueError, match="temperature"):
        RoutingFit.from_dict(fit.to_dict() | {"temperature": -1})


def test_routing_fit_keeps_the_one_pass_site_and_refuses_a_bad_one() -> None:
    fit = RoutingFit(0.05, 0.12, 0.9, 60, one_pass_site=2, one_pass_temperature=0.7)
    assert RoutingFit.from_dict(fit.to_dict()) == fit
    assert "one_pass_site" not in RoutingFit(0.05, 0.12, 0.9, 60).to_dict()  # as before
    with pytest.raises(ValueError, match="one_pass"):
        RoutingFit.from_dict(fit.to_dict() | {"one_pass_temperature": 0.0})


def test_median_interval_is_the_sign_test_interval() -> None:
    x = np.arange(18.0)[::-1]  # order does not matter
    median, low, high = median_interval(x)
    # n = 18: the 5th and 14th order statistics cover the median with probability >= 95%.
    assert (median, low, high) == (8.5, 4.0, 13.0)
    assert binom.cdf(4, 18, 0.5) * 2 <= 0.05 < binom.cdf(5, 18, 0.5) * 2
    assert median_interval([1.0, 2.0, 3.0, 4.0, 5.0]) is None  # too few to reach 95%
    assert median_interval([*range(6), np.nan]) == median_interval(range(6))
    rng = np.random.default_rng(0)  # coverage of a skewed distribution's median
    intervals = [median_interval(rng.exponential(size=18)) for _ in range(400)]
    hits = [low <= np.log(2) <= high for _, low, high in intervals]
    assert np.mean(hits) >= 0.93
