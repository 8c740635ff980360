"""Evaluation that keeps scans at home: the pooled and system figures come from what each site
may send (counts, confusion matrices, bin sums) and equal the figures of the pooled per-scan
rows; a site's policy's min_count withholds every small cell before its part leaves."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import cohen_kappa_score

from medfed.config import TrainConfig
from medfed.data.records import Split
from medfed.federation.training import train
from medfed.metrics import (
    confusion_counts,
    poisson_confusions,
    pooled_kappa,
    quadratic_kappa,
    replicate_seed,
    routing_bin_sums,
    routing_calibration,
    softmax_rows,
    sum_bins,
)
from medfed.metrics.federated import calibration_of_sums
from medfed.routing.bundle import TrainedFederation
from medfed.routing.evaluation import (
    WITHHELD,
    combine_evaluation,
    prediction_rows,
    site_evaluation,
    suppress_small,
)
from medfed.routing.routers import DensityRatioRouter
from tests.tensorsites import tensor_sites


def _graded_sites(n_sites: int = 3, n: int = 240, k: int = 5, seed: int = 1):
    """Per site: true grades, predicted grades (mostly near the truth), two scans a patient."""
    rng = np.random.default_rng(seed)
    out = []
    for s in range(n_sites):
        y = rng.integers(0, k, n)
        pred = np.clip(y + rng.choice([-1, 0, 0, 0, 1], n), 0, k - 1)
        patients = np.array([f"s{s}p{i // 2}" for i in range(n)])
        out.append((f"site{s}", y, pred, patients))
    return out


def assert_same_calibration(got, expected) -> None:
    mine, theirs = got.to_dict(), expected.to_dict()
    assert [b["n"] for b in mine.pop("bins")] == [b["n"] for b in theirs["bins"]]
    for b, e in zip(got.bins, theirs.pop("bins"), strict=True):
        assert b == pytest.approx(e, abs=1e-12)
    assert mine == pytest.approx(theirs, abs=1e-12)


# ---------------------------------------------------------------------------- statistics
def test_summed_confusion_matrices_give_the_pooled_kappa_exactly() -> None:
    sites = _graded_sites()
    counts = sum(confusion_counts(y, p, 5) for _, y, p, _ in sites)
    figure = pooled_kappa(counts, None)
    y = np.concatenate([s[1] for s in sites])
    pred = np.concatenate([s[2] for s in sites])
    expected = cohen_kappa_score(y, pred, weights="quadratic", labels=list(range(5)))
    assert figure.value == pytest.approx(expected, abs=1e-12)
    assert figure.n == y.size


def test_federated_poisson_bootstrap_is_close_to_the_pooled_patient_bootstrap() -> None:
    sites = _graded_sites()
    counts = sum(confusion_counts(y, p, 5) for _, y, p, _ in sites)
    replicates = sum(
        poisson_confusions(y, p, 5, patients, np.random.default_rng(replicate_seed(3, site)))
        for site, y, p, patients in sites
    )
    federated = pooled_kappa(counts, replicates).interval
    y = np.concatenate([s[1] for s in sites])
    pred = np.concatenate([s[2] for s in sites])
    patients = np.concatenate([s[3] for s in sites])
    pooled = quadratic_kappa(y, pred, 5, patients).interval
    assert federated.low == pytest.approx(pooled.low, abs=0.015)
    assert federated.high == pytest.approx(pooled.high, abs=0.015)
    assert "Poisson bootstrap" in federated.method
    # A site's replicates depend on the run's seed and its id only: both engines draw alike.
    site, y0, p0, g0 = sites[0]
    again = poisson_confusions(y0, p0, 5, g0, np.random.default_rng(replicate_seed(3, site)))
    first = poisson_confusions(y0, p0, 5, g0, np.random.default_rng(replicate_seed(3, site)))
    assert np.array_equal(again, first)


def test_a_patients_scans_share_their_bootstrap_weight() -> None:
    y = np.array([0, 1, 2, 3])
    patients = np.array(["a", "a", "b", "b"])
    boot = poisson_confusions(y, y, 4, patients, np.random.default_rng(0), n_boot=50)
    diagonal = np.diagonal(boot, axis1=1, axis2=2)
    assert np.array_equal(diagonal[:, 0], diagonal[:, 1])
    assert np.array_equal(diagonal[:, 2], diagonal[:, 3])
    assert not np.array_equal(diagonal[:, 0], diagonal[:, 2])


def test_summed_bin_sums_give_the_routing_calibration_of_the_pooled_scores() -> None:
    rng = np.random.default_rng(0)
    scores = [rng.normal(size=(n, 3)) + 2.0 * np.eye(3)[i] for i, n in enumerate((30, 45, 25))]
    truth = [np.full(len(z), i) for i, z in enumerate(scores)]
    for temperature in (1.0, 0.6):
        sums = sum_bins(
            routing_bin_sums(softmax_rows(z, temperature), t)
            for z, t in zip(scores, truth, strict=True)
        )
        got = calibration_of_sums(sums, temperature=temperature, low_margin=0.1)
        pooled = routing_calibration(
            softmax_rows(np.concatenate(scores), temperature),
            np.concatenate(truth),
            temperature=temperature,
            low_margin=0.1,
            binning="width",
        )
        assert_same_calibration(got, pooled)


# ---------------------------------------------------------------------------- evaluation
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("home") / "feddrm"
    sites = tensor_sites(3, n=48)
    config = TrainConfig(
        algorithm="feddrm", rounds=1, local_steps=2, batch_size=8, device="cpu", seed=5
    )
    summary = train(sites, config, out)
    fed = TrainedFederation.load(out, "cpu")
    norms = [s.normalization for s in sites]
    parts = [site_evaluation(fed, s, i, norms, seed=5) for i, s in enumerate(sites)]
    return fed, sites, parts, summary


def test_combine_reads_no_per_scan_row_and_the_run_equals_its_sites_parts(trained) -> None:
    fed, sites, parts, summary = trained
    home = [{k: v for k, v in p.items() if k != "scans"} for p in parts]
    kept = combine_evaluation(fed, home)
    sent = combine_evaluation(fed, parts)
    assert kept.predictions == "sites" and sent.predictions == "run"
    assert prediction_rows(home) is None and len(prediction_rows(parts)) == 3 * 48 // 4
    assert kept.to_dict() | {"predictions": "run"} == sent.to_dict()
    # The in-process run's summary is the same combination.
    assert summary.routing_calibration == sent.routing_calibration
    assert summary.pooled_auc == sent.pooled_auc and summary.predictions == "run"


def test_routing_calibration_equals_the_pooled_test_scans(trained) -> None:
    fed, sites, parts, _ = trained
    calibrated = combine_evaluation(fed, parts).routing_calibration
    views = [s.normalization.view(torch_cat(sites)) for s in sites]
    z = DensityRatioRouter().scores(fed, fed.outputs(views))
    truth = np.concatenate([np.full(s.n(Split.TEST), i) for i, s in enumerate(sites)])
    pooled = routing_calibration(
        softmax_rows(z, fed.routing_temperature),
        truth,
        temperature=fed.routing_temperature,
        low_margin=fed.routing.low_margin,
        binning="width",
    )
    assert_same_calibration(calibrated, pooled)


def torch_cat(sites):
    import torch

    return torch.cat([s.raw[Split.TEST] for s in sites])


# ---------------------------------------------------------------------------- min_count
def test_min_count_withholds_small_cells_and_combine_names_them(trained) -> None:
    fed, _, parts, _ = trained
    m = 5
    released = [suppress_small(p, m) for p in parts]
    for part in released:
        assert part["roc"]["fpr"] is None and "roc" in part["suppressed"]
        for counts in (*part["routers"].values(), *part["routers_origin_known"].values()):
            for key, value in counts.items():
                if key not in ("n", "latency_ms") and value is not None:
                    assert value == 0 or value >= m, (key, value)
        for bins in part.get("routing_bins", {}).values():
            assert all(b is None or b["n"] == 0 or b["n"] >= m for b in bins)
        point = part["figures"].get("operating_point")
        if point is not None:
            assert all(point[c] == 0 or point[c] >= m for c in ("tp", "fp", "tn", "fn"))
    withheld = [
        v for p in released for c in p["routers"].values() for k, v in c.items() if v is None
    ]
    assert withheld  # twelve test scans a site: some router cells are small
    evaluation = combine_evaluation(fed, released)
    assert evaluation.suppressed and all(
        "outputs.min_count" in why for why in evaluation.suppressed.values()
    )
    assert any(key.endswith(": roc") for key in evaluation.suppressed)
    assert suppress_small(parts[0], 0) is parts[0]


def test_a_site_with_fewer_test_scans_than_min_count_sends_no_figures(trained) -> None:
    fed, _, parts, _ = trained
    n_test = parts[0]["metrics"]["n"]
    released = [suppress_small(parts[0], n_test + 1), *parts[1:]]
    assert set(released[0]) == {"id", "n_train", "n_val", "suppressed"}
    evaluation = combine_evaluation(fed, released)
    first = parts[0]["id"]
    assert first not in evaluation.sites and evaluation.suppressed == {
        f"{first}: {WITHHELD}": released[0]["suppressed"][WITHHELD]
    }
    main = evaluation.routers[evaluation.routing_method]
    assert main.n_pooled == sum(p["metrics"]["n"] for p in parts[1:])
