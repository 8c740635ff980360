"""Paired comparisons of methods on the same test scans: strata keyed (seed, site), verdicts read
from the intervals only, and a refusal when two methods were tested on different scans."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from medfed.core.errors import ConfigError, RunDirError
from medfed.experiments.demo import MethodSpec, with_normalization
from medfed.experiments.paired import (
    FIGURES_BY_KEY,
    Scans,
    compare,
    compare_methods,
    figure_intervals,
    paired_strata,
    scans_from_rows,
    site_auc,
)
from medfed.metrics import Interval, auc_fast, verdict, weighted_auc
from medfed.reports.comparisons import VERDICTS, comparison_rows, verdict_lines

SEEDS = (0, 1)
SITES = ("a", "b", "c")
N = 40  # test scans per site and seed, half positive

Method = dict[int, Scans]


def _rows(seed: int, site: str, skill: float, noise_seed: int) -> list[dict[str, Any]]:
    """One site's predictions.csv rows: ``skill`` 0 scores at random, 1 separates perfectly."""
    rng = np.random.default_rng([seed, SITES.index(site), noise_seed])
    y = np.tile([0, 1], N // 2)
    score = np.clip(skill * y + (1 - skill) * rng.random(N), 0.0, 1.0)
    answer = (score >= 0.5).astype(int)
    return [
        {
            "site": site,
            "scan_id": f"{site}/scan{k:03d}.png",
            "patient_id": f"{site}-p{k // 2}",  # two scans per patient
            "label": int(y[k]),
            "score": float(score[k]),
            "prediction": int(answer[k]),
            "routed_site": site,
            "abstained": False,
            "system_prediction": int(answer[k]),
            "routed_site_origin_known": site,
            "system_prediction_origin_known": int(answer[k]),
        }
        for k in range(N)
    ]


@pytest.fixture
def method() -> Callable[..., Method]:
    """Factory: a method's test scans on every (seed, site), as its predictions.csv reads."""

    def make(skill: float, noise_seed: int = 0, **change: Callable[[list], list]) -> Method:
        out = {}
        for seed in SEEDS:
            rows = [r for site in SITES for r in _rows(seed, site, skill, noise_seed)]
            for edit in change.values():
                rows = edit(rows) if seed == 0 else rows
            out[seed] = scans_from_rows(rows)
        return out

    return make


def test_paired_strata_are_keyed_by_seed_and_site(method):
    strata, clusters, left_out = paired_strata(method(0.8), method(0.2), "score", ("good", "poor"))

    assert set(strata) == {(seed, site) for seed in SEEDS for site in SITES}
    assert set(clusters) == set(strata) and left_out == []
    y, a, b = strata[(1, "b")]
    assert y.size == a.size == b.size == N
    assert np.unique(clusters[(1, "b")]).size == N // 2  # patients are resampled whole


def test_paired_strata_put_the_other_method_in_the_same_scan_order(method):
    reference = method(0.8)
    shuffled = method(0.8, shuffle=lambda rows: rows[::-1])

    strata, _, _ = paired_strata(reference, shuffled, "score", ("a", "b"))

    for _, a, b in strata.values():
        np.testing.assert_array_equal(a, b)


def test_methods_tested_on_different_scans_are_refused_with_the_scan_named(method):
    renamed = method(
        0.8,
        rename=lambda rows: [
            r | {"scan_id": "a/other.png"} if i == 0 else r for i, r in enumerate(rows)
        ],
    )

    with pytest.raises(RunDirError) as refused:
        paired_strata(method(0.8), renamed, "score", ("feddrm", "fedavg"))

    message = str(refused.value)
    assert "cannot compare feddrm with fedavg on seed 0, site a" in message
    assert "tested on different scans" in message
    assert "'a/scan000.png'" in message and "'a/other.png'" in message
    assert "same seed's data" in message


def test_methods_with_different_seeds_sites_or_labels_are_refused(method):
    one_seed = {0: method(0.8)[0]}
    with pytest.raises(RunDirError, match="seeds"):
        paired_strata(method(0.8), one_seed, "score", ("x", "y"))
    no_c = method(0.8, drop=lambda rows: [r for r in rows if r["site"] != "c"])
    with pytest.raises(RunDirError, match="seed 0: sites"):
        paired_strata(method(0.8), no_c, "score", ("x", "y"))
    flipped = method(0.8, flip=lambda rows: [rows[0] | {"label": 1 - rows[0]["label"]}, *rows[1:]])
    with pytest.raises(RunDirError, match="labelled"):
        paired_strata(method(0.8), flipped, "score", ("x", "y"))
    twice = method(0.8, twice=lambda rows: [rows[0], rows[0], *rows[2:]])
    with pytest.raises(RunDirError, match="twice"):
        paired_strata(twice, twice, "score", ("x", "y"))


def test_clearly_better_method_is_ahead_and_the_weaker_one_behind(method):
    good, poor = method(0.8), method(0.0, noise_seed=1)

    for key in FIGURES_BY_KEY:
        ahead = compare(good, poor, ("good", "poor"), FIGURES_BY_KEY[key], n_boot=200)
        behind = compare(poor, good, ("poor", "good"), FIGURES_BY_KEY[key], n_boot=200)

        assert ahead.interval is not None and ahead.interval.low > 0, key
        assert ahead.verdict == "ahead" == verdict(ahead.interval)
        assert behind.verdict == "behind" == verdict(behind.interval)


def test_identical_predictions_show_no_difference(method):
    found = compare_methods({"a": method(0.5), "b": method(0.5)}, "a", n_boot=100)

    for result in found["methods"]["b"].values():
        assert result["verdict"] == "no difference detected"
        assert result["interval"]["estimate"] == 0.0


def test_verdicts_are_read_from_the_intervals_only(method):
    found = compare_methods(
        {"ref": method(0.8), "poor": method(0.0), "same": method(0.8), "close": method(0.8, 3)},
        "ref",
        n_boot=200,
    )

    for name, figures in found["methods"].items():
        for key, result in figures.items():
            interval = result["interval"] and Interval.from_dict(result["interval"])
            assert result["verdict"] == verdict(interval), (name, key)
            assert result["verdict"] in VERDICTS
    lines = verdict_lines(found, "fundus")
    assert len(lines) == len(FIGURES_BY_KEY)
    assert lines[0].startswith("- fundus, worst-site AUC (origin known): ref ahead of poor")
    assert "no difference detected against same" in lines[0]
    assert any("system accuracy at op. point (origin unknown)" in line for line in lines)
    assert any("system accuracy at op. point (origin known)" in line for line in lines)
    header, rows = comparison_rows(found)
    assert header[1] == "ref \u2212 method: worst-site AUC (origin known)"
    poor = next(r for r in rows if r[0] == "poor")
    assert poor[1].startswith("+") and poor[1].endswith(" ahead")


def test_the_worst_site_figure_is_the_seed_mean_of_each_seeds_lowest_auc(method):
    scans = method(0.6)
    strata, _, _ = paired_strata(scans, scans, "score", ("x", "x"))

    expected = np.mean(
        [min(auc_fast(scans[s][site].y, scans[s][site].score) for site in SITES) for s in SEEDS]
    )

    parts = {key: (y, a) for key, (y, a, _) in strata.items()}
    assert FIGURES_BY_KEY["worst_site_auc"].statistic(parts) == pytest.approx(expected)


def test_a_site_with_one_class_is_left_out_of_the_auc_and_named(method):
    positives_only = method(
        0.8, one_class=lambda rows: [r | {"label": 1} if r["site"] == "c" else r for r in rows]
    )

    found = compare(
        positives_only, positives_only, ("x", "y"), FIGURES_BY_KEY["worst_site_auc"], n_boot=50
    )

    assert found.note == "left out: seed 0 c (one class)"
    assert found.verdict == "no difference detected"


def test_an_auc_on_a_handful_of_scans_is_not_measured_rather_than_given_a_verdict(method):
    # Seed 0 keeps 2 scans per site (one positive, one negative, one patient each): a resample
    # holds both classes at all three sites only 1/8 of the time.
    def tiny(rows: list) -> list:
        kept = [r for r in rows if int(r["scan_id"][-7:-4]) < 2]
        return [r | {"patient_id": r["scan_id"]} for r in kept]

    good, poor = method(0.9, tiny=tiny), method(0.0, 1, tiny=tiny)

    found = compare(good, poor, ("good", "poor"), FIGURES_BY_KEY["worst_site_auc"], n_boot=100)
    accuracy = compare(good, poor, ("good", "poor"), FIGURES_BY_KEY["system_accuracy"], n_boot=100)

    assert (found.interval, found.verdict) == (None, "not measured")
    assert "both classes at every site only 12% of the time" in found.note
    assert accuracy.interval is not None  # accuracy is defined on any resample
    assert figure_intervals(good, n_boot=100)["worst_site_auc"] is None


def test_figure_intervals_hold_the_figures_of_the_data_as_given(method):
    scans = method(0.6)

    found = figure_intervals(scans, n_boot=300)

    for site in SITES:
        expected = np.mean([auc_fast(scans[s][site].y, scans[s][site].score) for s in SEEDS])
        interval = found["site_auc"][site]
        assert interval["estimate"] == pytest.approx(expected)
        assert interval["low"] <= interval["estimate"] <= interval["high"]
        assert "within 6 (seed, site) strata" in interval["method"]
        assert "patients" in interval["method"]
    correct = [np.mean(np.concatenate([scans[s][t].correct for t in SITES])) for s in SEEDS]
    assert found["system_accuracy"]["estimate"] == pytest.approx(np.mean(correct))
    assert found["worst_site_auc"]["estimate"] <= found["mean_site_auc"]["estimate"]


def test_site_auc_matches_the_metrics_auc_with_ties_and_is_nan_for_one_class():
    rng = np.random.default_rng(4)
    for n in (2, 7, 40):
        y = np.r_[0, 1, rng.integers(0, 2, n - 2)]
        score = np.round(rng.random(n), 1)

        assert site_auc(y, score) == pytest.approx(auc_fast(y, score))
    assert np.isnan(site_auc(np.ones(5, dtype=int), rng.random(5)))


def test_weighted_auc_matches_the_plain_auc_and_weighs_repeats():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, 30)
    score = np.round(rng.random(30), 1)  # ties count one half
    w = rng.integers(0, 3, 30)

    got = weighted_auc(y, score, np.stack([np.ones(30), w]))

    assert got[0] == pytest.approx(auc_fast(y, score))
    repeated = np.repeat(np.arange(30), w)
    assert got[1] == pytest.approx(auc_fast(y[repeated], score[repeated]))
    assert np.isnan(weighted_auc(y, score, (y == 1)[None, :].astype(float))[0])


def test_federation_norm_method_specs_train_with_pooled_statistics():
    label = with_normalization("fedavg", "federation")
    spec = MethodSpec.parse(label)

    assert label == "fedavg [federation norm]"
    assert (spec.algorithm, spec.normalization, spec.dirname) == (
        "fedavg",
        "federation",
        "fedavg_federation_norm",
    )
    assert spec.config(_budget(), seed=1).normalization == "federation"
    assert MethodSpec.parse("feddrm:lam=0.9").normalization == "site"
    assert with_normalization("fedbn", "site") == "fedbn"
    with pytest.raises(ConfigError, match="normalization 'hospital'"):
        MethodSpec.parse("fedavg [hospital norm]")


def _budget():
    from medfed.experiments.demo import Budget

    return Budget(n_per_site=12, rounds=1, local_steps=1)
