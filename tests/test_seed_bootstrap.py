"""The two-level bootstrap (seeds, then patients within each site) and Holm's verdicts."""

from __future__ import annotations

import numpy as np
import pytest

from medfed.metrics.seeds import SiteScans, holm_verdicts, seed_bootstrap


def _site(correct: np.ndarray, index: int = 0) -> SiteScans:
    """A site whose federation answers scan k right exactly where ``correct[k]``."""
    n = correct.size
    y = np.arange(n) % 2
    system = np.where(correct, y, 1 - y)
    probs = np.stack([1 - y, y], axis=1).astype(float)
    return SiteScans(y, np.arange(n) // 2, probs, system, system, np.full(n, index), index)


def accuracy(scans) -> float:
    y = np.concatenate([s.y for s in scans.values()])
    return float(np.mean(np.concatenate([s.system for s in scans.values()]) == y))


def _method(rates_by_seed: dict[int, float], n: int = 200, seed: int = 0):
    rng = np.random.default_rng(seed)
    return {
        k: {"a": _site(rng.random(n) < rate, 0), "b": _site(rng.random(n) < rate, 1)}
        for k, rate in rates_by_seed.items()
    }


def test_variation_between_seeds_widens_the_interval():
    steady = _method({0: 0.7, 1: 0.7, 2: 0.7, 3: 0.7})
    varying = _method({0: 0.5, 1: 0.9, 2: 0.5, 3: 0.9})

    boot = seed_bootstrap({"steady": steady, "varying": varying}, accuracy, n_boot=300)

    s, v = boot.interval("steady"), boot.interval("varying")
    assert s.low < 0.7 < s.high and v.low < 0.7 < v.high
    assert (v.high - v.low) > 2 * (s.high - s.low)  # the seeds' spread is in the interval
    assert "seeds with replacement" in boot.method


def test_a_method_right_where_the_other_is_wrong_is_ahead_after_holm():
    good = _method({0: 0.95, 1: 0.95, 2: 0.95})
    same = _method({0: 0.95, 1: 0.95, 2: 0.95}, seed=1)
    bad = _method({0: 0.55, 1: 0.6, 2: 0.5}, seed=2)

    boot = seed_bootstrap({"ref": good, "same": same, "bad": bad}, accuracy, n_boot=300)
    verdicts = holm_verdicts(boot, "ref", ["same", "bad"])

    assert verdicts == {"same": "no difference detected", "bad": "ahead"}
    difference = boot.difference("ref", "bad")
    assert difference.low > 0 and "paired" in difference.method


def test_an_undefined_figure_is_not_measured():
    runs = {"a": _method({0: 0.7, 1: 0.7}), "b": _method({0: 0.7, 1: 0.7}, seed=3)}

    boot = seed_bootstrap(runs, lambda scans: float("nan"), n_boot=20)

    assert boot.interval("a") is None
    assert holm_verdicts(boot, "a", ["b"]) == {"b": "not measured"}


def test_methods_trained_on_other_seeds_are_refused():
    with pytest.raises(ValueError, match="seeds"):
        seed_bootstrap({"a": _method({0: 0.7, 1: 0.7}), "b": _method({0: 0.7})}, accuracy)
