"""Clinical evaluation of a trained federation: CIs, operating points, calibration, the
cross-site matrix, both protocols, per-scan predictions, and the settings behind them."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from medfed.config import TrainConfig
from medfed.core.errors import ConfigError
from medfed.data.preprocess import Normalization
from medfed.data.records import Split
from medfed.federation.normalizing import federation_normalized
from medfed.federation.training import train
from medfed.routing.bundle import OperatingChoice, TrainedFederation
from medfed.routing.routers import DensityRatioRouter, MajorityVoteRouter
from medfed.runs import RunDir
from tests.tensorsites import tensor_sites


def config(algorithm: str = "feddrm", **kw) -> TrainConfig:
    base = dict(algorithm=algorithm, rounds=3, local_steps=3, batch_size=8, device="cpu")
    base |= dict(optimizer="sgd", lr=0.05)
    return TrainConfig(**(base | kw))


@pytest.fixture(scope="module")
def feddrm_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("clinical") / "feddrm"
    summary = train(tensor_sites(3, n=96), config("feddrm"), out)
    return out, summary


def test_every_site_has_its_auc_ci_counts_operating_point_and_calibration(feddrm_run):
    _, summary = feddrm_run
    for site_id, site in summary.sites.items():
        assert (site.n_pos, site.n_neg) == (12, 12), site_id
        assert site.unreliable is None
        assert site.auc_ci is not None and site.auc_ci.method.startswith("DeLong")
        assert site.auc_ci.low <= site.auc <= site.auc_ci.high
        op = site.operating_point
        assert op is not None and op.rule == "specificity:0.90"
        assert op.tp + op.fn == 12 and op.tn + op.fp == 12
        assert site.calibration is not None and site.calibration.n == 24
    assert summary.operating_rule == "specificity:0.90"


def test_operating_thresholds_are_stored_with_the_model(feddrm_run):
    out, summary = feddrm_run
    fed = TrainedFederation.load(out, device="cpu")
    for entry in fed.sites:
        assert entry.operating is not None
        assert entry.operating.threshold == summary.sites[entry.id].operating_point.threshold
        assert entry.operating.n_val_pos + entry.operating.n_val_neg == 24


def test_cross_site_diagonal_is_each_sites_own_figure(feddrm_run):
    _, summary = feddrm_run
    assert set(summary.cross_site) == set(summary.sites)
    for site_id, row in summary.cross_site.items():
        assert set(row) == set(summary.sites)
        assert row[site_id].auc == pytest.approx(summary.sites[site_id].auc)
        assert row[site_id].n == summary.sites[site_id].n_test


def test_pooled_auc_and_worst_site_ci(feddrm_run):
    _, summary = feddrm_run
    pooled = summary.pooled_auc
    assert pooled is not None and pooled.n_sites == 3
    assert pooled.low <= pooled.estimate <= pooled.high
    assert 0.0 <= pooled.i2 <= 1.0
    assert summary.worst_site_auc_ci == summary.sites[summary.federation.worst_site].auc_ci


def test_both_protocols_report_every_router_with_intervals(feddrm_run):
    _, summary = feddrm_run
    assert set(summary.routers) == set(summary.routers_origin_known)
    for figures in (summary.routers, summary.routers_origin_known):
        for name, r in figures.items():
            rate = r.rates["system_accuracy"]
            assert rate.n == r.n_pooled == 72
            assert rate.value == pytest.approx(r.system_accuracy)
            assert rate.interval.low <= rate.value <= rate.interval.high
            assert "sensitivity" in r.rates and "specificity" in r.rates
            assert np.isfinite(r.latency_ms_per_scan), name


def test_the_routed_system_on_each_sites_scans_adds_up_to_the_pooled_figure(feddrm_run):
    _, summary = feddrm_run
    for protocol, routers in (
        ("origin_unknown", summary.routers),
        ("origin_known", summary.routers_origin_known),
    ):
        by_site = summary.system_by_site[protocol]
        assert set(by_site) == set(summary.sites)
        pooled = routers[summary.routing_method].rates["system_accuracy"]
        assert sum(r.k for r in by_site.values()) == pooled.k
        assert sum(r.n for r in by_site.values()) == pooled.n


def test_every_figure_can_be_recomputed_from_predictions_csv(feddrm_run):
    out, summary = feddrm_run
    rows = RunDir(out).read_predictions()
    assert len(rows) == 72
    for site_id, site in summary.sites.items():
        mine = [r for r in rows if r["site"] == site_id]
        y = [r["label"] for r in mine]
        assert roc_auc_score(y, [r["score"] for r in mine]) == pytest.approx(site.auc)
        point = site.operating_point
        tp = sum(1 for r in mine if r["label"] == 1 and r["prediction"] == 1)
        assert tp == point.tp
    main = summary.routers[summary.routing_method]
    correct = sum(r["system_prediction"] == r["label"] for r in rows)
    assert correct / len(rows) == pytest.approx(main.system_accuracy)
    known = summary.routers_origin_known[summary.routing_method]
    correct = sum(r["system_prediction_origin_known"] == r["label"] for r in rows)
    assert correct / len(rows) == pytest.approx(known.system_accuracy)
    home = sum(r["routed_site"] == r["site"] for r in rows)
    assert home / len(rows) == pytest.approx(main.routing_accuracy)


def test_routers_answer_at_the_sites_operating_points(feddrm_run):
    out, _ = feddrm_run
    fed = TrainedFederation.load(out, device="cpu")
    views = [torch.cat([s.raw[Split.TEST] for s in tensor_sites(3, n=96)])] * 3

    def at(threshold: float) -> None:
        for k, entry in enumerate(fed.sites):
            fed.sites[k] = replace(
                entry, operating=OperatingChoice("threshold:t", threshold, None, 0, 0)
            )

    for router in (DensityRatioRouter(), MajorityVoteRouter()):
        at(0.0)
        assert (router.route(fed, views).prediction == 1).all()
        at(1.0)
        result = router.route(fed, views)
        assert (result.prediction == (result.class_probs[:, 1] >= 1.0)).all()


def test_old_models_without_operating_points_answer_by_argmax(feddrm_run):
    out, _ = feddrm_run
    fed = TrainedFederation.load(out, device="cpu")
    for k, entry in enumerate(fed.sites):
        fed.sites[k] = replace(entry, operating=None)
    assert fed.thresholds is None
    views = [torch.cat([s.raw[Split.TEST] for s in tensor_sites(3, n=96)])] * 3
    result = DensityRatioRouter().route(fed, views)
    assert (result.prediction == result.class_probs.argmax(axis=1)).all()


def test_pooled_normalization_equals_statistics_of_the_pooled_scans():
    g = torch.Generator().manual_seed(0)
    parts = [torch.randn(n, 3, 4, 4, generator=g) * (k + 1) + k for k, n in enumerate((5, 9, 2))]
    pooled = Normalization.pooled([Normalization.moments(x) for x in parts])
    direct = Normalization.fit(torch.cat(parts))
    np.testing.assert_allclose(pooled.mean, direct.mean, rtol=1e-9)
    np.testing.assert_allclose(pooled.std, direct.std, rtol=1e-9)


def test_federation_normalization_gives_every_site_the_same_statistics(tmp_path):
    sites = federation_normalized(tensor_sites(3, n=48))
    assert len({s.normalization for s in sites}) == 1
    summary = train(tensor_sites(3, n=48), config("fedavg", normalization="federation"), tmp_path)
    assert summary.normalization == "federation"
    fed = TrainedFederation.load(tmp_path, device="cpu")
    assert len({s.normalization for s in fed.sites}) == 1
    # One normalization for all: a scan of unknown origin meets every model as its own site's.
    vote = "majority_vote"
    assert (
        summary.routers[vote].system_accuracy == summary.routers_origin_known[vote].system_accuracy
    )
    assert RunDir(tmp_path).read_config()["train"]["normalization"] == "federation"


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"augment": "mirror"}, "augment must be one of"),
        ({"normalization": "global"}, "normalization must be one of"),
        ({"operating_point": "sensitivity:0.9"}, "operating_point"),
    ],
)
def test_bad_evaluation_settings_are_named(settings, words):
    with pytest.raises(ConfigError, match=words):
        TrainConfig(algorithm="fedavg", **settings)


def test_augment_is_a_recorded_setting_and_old_true_false_still_reads():
    assert (
        TrainConfig.from_dict({"algorithm": "fedavg", "augment": True}, where="x").augment == "flip"
    )
    assert (
        TrainConfig.from_dict({"algorithm": "fedavg", "augment": False}, where="x").augment
        == "none"
    )
    assert (
        TrainConfig.from_dict({"algorithm": "fedavg", "augment": "none"}, where="x").augment
        == "none"
    )


def test_a_deployment_refuses_federation_normalization():
    pytest.importorskip("cryptography")
    from medfed.flower.deploy import refuse_unsupported

    with pytest.raises(ConfigError, match="normalization = 'site'"):
        refuse_unsupported(TrainConfig(algorithm="fedavg", normalization="federation"))
