"""Routers on hand-made outputs, abstention rates, ``medfed route`` on every input kind, audit."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pydicom.data
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from medfed.cli import app
from medfed.clinic.audit import AuditEntry, AuditLog
from medfed.config import TrainConfig
from medfed.core.errors import ConfigError
from medfed.data.records import Split
from medfed.federation.training import train
from medfed.routing.bundle import SiteOutputs, TrainedFederation
from medfed.routing.routers import (
    DensityRatioRouter,
    MajorityVoteRouter,
    MaxConfidenceRouter,
    SoftRouter,
    make_router,
    routers_for,
)
from tests.tensorsites import tensor_sites

runner = CliRunner()


def fake_fed(priors, thresholds=None) -> SimpleNamespace:
    """The parts of a federation the routers read (no operating points: argmax answers)."""
    return SimpleNamespace(
        priors=np.asarray(priors),
        sites=[None] * len(priors),
        thresholds=thresholds,
        routing_temperature=1.0,
    )


def outputs(class_probs, client_logits=None) -> SiteOutputs:
    return SiteOutputs(np.asarray(class_probs, float), client_logits, features=[])


def test_density_ratio_router_pools_every_sites_posterior_and_divides_out_the_prior() -> None:
    # Two sites, one scan. Site i's view gives client logits over both sites; the sites'
    # log-posteriors are averaged (logits of different views have different normalizers).
    # View 0 is undecided (0.5 / 0.5), view 1 says site 1 (0.95): site 1 wins.
    client = np.array([[[5.0, 5.0]], [[0.0, 3.0]]])  # (K views, n, K)
    probs = [[[0.9, 0.1]], [[0.2, 0.8]]]
    site_probs, routed, answer = DensityRatioRouter().decide(
        fake_fed([0.5, 0.5]), outputs(probs, client)
    )
    assert routed.tolist() == [1] and answer[0] == pytest.approx([0.2, 0.8])
    # A small prior for site 0 (log 0.1 = -2.3) outweighs its lower posterior.
    site_probs, routed, answer = DensityRatioRouter().decide(
        fake_fed([0.1, 0.9]), outputs(probs, client)
    )
    assert routed.tolist() == [0] and answer[0] == pytest.approx([0.9, 0.1])
    view1 = np.array([1.0, np.exp(3.0)]) / (1.0 + np.exp(3.0))
    pooled = np.sqrt(np.array([0.5, 0.5]) * view1)  # the geometric mean of the posteriors
    expected = pooled / np.array([0.1, 0.9])
    assert site_probs[0] == pytest.approx(expected / expected.sum())


def test_density_ratio_with_one_view_is_the_papers_logit_rule() -> None:
    # Every view the same: log-posteriors differ from the logits by one shared constant.
    rng = np.random.default_rng(0)
    row = rng.normal(size=(4, 3))
    client = np.stack([row] * 3)
    priors = np.array([0.5, 0.3, 0.2])
    site_probs, routed, _ = DensityRatioRouter().decide(
        fake_fed(priors), outputs(np.full((3, 4, 2), 0.5), client)
    )
    scores = row - np.log(priors)
    assert routed.tolist() == scores.argmax(axis=1).tolist()
    expected = np.exp(scores) / np.exp(scores).sum(axis=1, keepdims=True)
    assert site_probs == pytest.approx(expected)


def test_soft_router_mixes_the_top_sites_by_probability() -> None:
    # Every view's posterior 0.6, 0.2 and 0.0001 (up to its normalizer): the top two mix 3:1.
    client = np.log(np.array([[[0.6, 0.2, 0.0001]]] * 3))
    probs = [[[1.0, 0.0]], [[0.0, 1.0]], [[0.5, 0.5]]]
    _, routed, mixed = SoftRouter().decide(fake_fed([1 / 3] * 3), outputs(probs, client))
    assert routed.tolist() == [0]
    assert mixed[0] == pytest.approx([0.75, 0.25], abs=1e-3)  # weights 3:1 over the top two


def test_majority_vote_and_max_confidence_routers() -> None:
    probs = [[[0.6, 0.4]], [[0.3, 0.7]], [[0.45, 0.55]]]  # votes: 0, 1, 1
    site_probs, routed, answer = MajorityVoteRouter().decide(fake_fed([1 / 3] * 3), outputs(probs))
    assert answer.argmax(axis=1).tolist() == [1]
    assert routed.tolist() == [1]  # the site most behind the winning class
    _, routed, answer = MaxConfidenceRouter().decide(fake_fed([1 / 3] * 3), outputs(probs))
    assert routed.tolist() == [1] and answer[0] == pytest.approx([0.3, 0.7])


@pytest.fixture(scope="module")
def tensor_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "feddrm"
    sites = tensor_sites(3, n=96)
    config = TrainConfig(
        algorithm="feddrm",
        rounds=8,
        local_steps=4,
        batch_size=16,
        optimizer="sgd",
        lr=0.02,
        device="cpu",
    )
    summary = train(sites, config, out)
    return out, sites, summary


def test_abstention_fires_on_noise_and_another_modality_not_on_held_out_scans(tensor_run):
    out, sites, summary = tensor_run
    fed = TrainedFederation.load(out, "cpu")
    router = DensityRatioRouter()
    held_out = [torch.cat([o.as_seen_by(m, Split.TEST) for o in sites]) for m in sites]
    in_rate = router.route(fed, held_out).abstained.mean()

    g = torch.Generator().manual_seed(7)
    noise = torch.rand(40, 3, 16, 16, generator=g) * 6 - 3
    checker = ((torch.arange(16)[:, None] + torch.arange(16)[None]) % 2).float() * 4 - 2
    other = checker.expand(40, 3, 16, 16) + 0.1 * torch.randn(40, 3, 16, 16, generator=g)
    noise_rate = router.route(fed, [noise] * 3).abstained.mean()
    other_rate = router.route(fed, [other] * 3).abstained.mean()
    print(f"abstain rates: held-out {in_rate:.2f}, noise {noise_rate:.2f}, other {other_rate:.2f}")
    assert in_rate <= 0.2
    assert noise_rate >= 0.8 and other_rate >= 0.9
    assert summary["routers"]["density_ratio"]["abstain_rate"] == pytest.approx(in_rate)


def test_evaluate_reports_every_router_with_latency(tensor_run):
    out, _, summary = tensor_run
    routers = summary["routers"]
    assert set(routers) == {"density_ratio", "one_pass", "soft", "majority_vote", "max_confidence"}
    dr, mv = routers["density_ratio"], routers["majority_vote"]
    # FedDRM keeps its backbone norms on each site: every site's own model judges the scan.
    assert dr["forward_passes"] == 3 and mv["forward_passes"] == 3
    assert routers["one_pass"]["forward_passes"] == 2
    for r in routers.values():  # the median with its distribution-free interval
        assert 0 < r["latency_ms_low"] <= r["latency_ms_per_scan"] <= r["latency_ms_high"]
    result = runner.invoke(app, ["evaluate", str(out)])
    assert result.exit_code == 0 and "density_ratio" in result.output
    assert "ms per scan (95% CI)" in result.output and "one_pass" in result.output


def test_one_pass_router_reads_one_site_model_and_runs_only_the_chosen_ones(tensor_run):
    out, sites, summary = tensor_run
    fed = TrainedFederation.load(out, "cpu")
    fit = fed.routing
    assert fit.one_pass_site in range(3) and fit.one_pass_temperature > 0
    views = [torch.cat([o.as_seen_by(m, Split.TEST) for o in sites]) for m in sites]
    everything = fed.outputs(views)
    router = make_router("one_pass", fed)
    lean = router.route(fed, views)  # only the routing site's model and the chosen sites'
    full = router.answer(fed, everything)  # the same decision from every model's outputs
    assert lean.routed.tolist() == full.routed.tolist()
    assert lean.class_probs == pytest.approx(full.class_probs, abs=1e-5)
    assert lean.abstained.tolist() == full.abstained.tolist()
    # Its posterior is the routing site's own density ratio at the published temperature.
    own = everything.client_logits[fit.one_pass_site]
    z = own - np.log(np.exp(own).sum(axis=1, keepdims=True)) - np.log(fed.priors)
    expected = np.exp((z - z.max(axis=1, keepdims=True)) / fit.one_pass_temperature)
    assert lean.site_probs == pytest.approx(expected / expected.sum(axis=1, keepdims=True))
    # Its passes: the routing model once, then each chosen site's model on its scans only.
    calls = []
    real = fed.site_pass
    fed.site_pass = lambda i, x: calls.append((i, x.shape[0])) or real(i, x)
    router.route(fed, views)
    assert calls[0] == (fit.one_pass_site, views[0].shape[0])
    assert sum(n for _, n in calls[1:]) == int((lean.routed != fit.one_pass_site).sum())
    # Measured beside the m-pass router under the same protocol: both in summary.json.
    home = np.concatenate([[i] * s.n(Split.TEST) for i, s in enumerate(sites)])
    accuracy = float((full.routed == home).mean())
    assert summary["routers"]["one_pass"]["routing_accuracy"] == pytest.approx(accuracy)


def test_a_federation_whose_sites_differ_only_in_heads_routes_in_one_batched_pass(tensor_run):
    out, sites, _ = tensor_run
    fed = TrainedFederation.load(out, "cpu")
    assert not fed.shared_body
    # Every site gets site 0's body, as in the paper's FedDRM: only the target heads differ.
    states = [
        {k: v if k.startswith("target_head.") else fed.states[0][k] for k, v in state.items()}
        for state in fed.states
    ]
    heads_only = TrainedFederation(fed.spec, fed.algorithm, fed.sites, states, fed.setup)
    assert heads_only.shared_body
    assert DensityRatioRouter().forward_passes(heads_only) == 1
    views = [torch.cat([o.as_seen_by(m, Split.TEST) for o in sites]) for m in sites]
    batched = heads_only.outputs(views)
    heads_only.shared_body = False  # the same federation, one model at a time
    looped = heads_only.outputs(views)
    assert np.allclose(batched.class_probs, looped.class_probs, atol=1e-5)
    assert np.allclose(batched.client_logits, looped.client_logits, atol=1e-4)


@pytest.fixture(scope="module")
def file_runs(tmp_path_factory):
    """Tiny fundus and CT federations trained on synthetic files."""
    from medfed.data.synth import synthesize
    from medfed.federation.training import load_sites

    base = tmp_path_factory.mktemp("files")
    fundus = synthesize(base / "fundus", modality="fundus", n_per_site=24, seed=1)
    ct = synthesize(base / "ct", modality="ct", n_per_site=8, seed=1)
    cfg = dict(rounds=1, local_steps=2, batch_size=8, device="cpu")
    train(load_sites(fundus, base / "cache"), TrainConfig("feddrm", **cfg), base / "run_fundus")
    train(load_sites(ct, base / "cache"), TrainConfig("fedavg", **cfg), base / "run_ct")
    return base


def route_json(run: Path, *files: Path, extra=()):
    result = runner.invoke(app, ["route", str(run), *map(str, files), "--json", *extra])
    return result, json.loads(result.output[result.output.index("[") :])


def test_route_fundus_photos_and_refuse_other_kinds_per_file(file_runs, tmp_path):
    run = file_runs / "run_fundus"
    jpeg = next((file_runs / "fundus" / "ACRIMA").glob("*.jpg"))
    png = next((file_runs / "fundus" / "RIM-ONE_DL").rglob("*.png"))
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(jpeg.read_bytes()[:200])
    dicom = Path(pydicom.data.get_testdata_file("CT_small.dcm"))
    result, rows = route_json(run, jpeg, png, broken, dicom)
    assert result.exit_code == 1  # one file could not be read; the others were answered
    by_file = {Path(r["file"]).name: r for r in rows}
    for name in (jpeg.name, png.name):
        assert by_file[name]["status"] in {"routed", "abstained"}
        assert set(by_file[name]["site_probs"]) == {"acrima", "rimone", "refuge"}
        assert by_file[name]["prediction"] in {"normal", "glaucoma"}
        if by_file[name]["status"] == "routed":  # answered at the site's operating point
            assert "the operating threshold" in by_file[name]["reason"]
    assert by_file["broken.jpg"]["status"] == "error"
    assert "broken.jpg" in by_file["broken.jpg"]["reason"]
    assert by_file["CT_small.dcm"]["status"] == "abstained"
    assert "ct scan" in by_file["CT_small.dcm"]["reason"]


def test_route_ct_series_folder_single_dicom_and_nifti(file_runs):
    run = file_runs / "run_ct"
    series = next(p for p in (file_runs / "ct" / "CT_DICOM").rglob("*") if any(p.glob("*.dcm")))
    nifti = next((file_runs / "ct" / "CT_NIFTI").glob("*.nii.gz"))
    single = Path(pydicom.data.get_testdata_file("CT_small.dcm"))
    photo = file_runs / "photo.png"
    Image.fromarray(np.full((32, 32, 3), 120, np.uint8)).save(photo)
    result, rows = route_json(
        run, series, nifti, single, photo, extra=["--router", "max_confidence"]
    )
    assert result.exit_code == 0, result.output
    status = [r["status"] for r in rows]
    assert all(s in {"routed", "abstained"} for s in status[:3])
    assert all(r["site_probs"] for r in rows[:3])
    assert status[3] == "abstained" and "fundus scan" in rows[3]["reason"]
    text = runner.invoke(app, ["route", str(run), str(nifti)]).output
    assert "site probabilities: ct_dicom" in text


def test_density_ratio_is_refused_for_a_run_without_client_head(file_runs):
    result = runner.invoke(
        app, ["route", str(file_runs / "run_ct"), "x.nii", "--router", "density_ratio"]
    )
    assert result.exit_code == 2 and "needs a client head" in result.output


def test_every_routed_scan_lands_in_the_audit_log(file_runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(file_runs / "run_fundus", run)
    (run / "audit.sqlite").unlink(missing_ok=True)  # earlier tests routed through this run
    photos = sorted((file_runs / "fundus" / "ACRIMA").glob("*.jpg"))[:3]
    _, rows = route_json(run, *photos)
    log = AuditLog(run).read()
    assert [e.file for e in reversed(log)] == [str(p) for p in photos]
    # the log keeps every field of the answer but the class probabilities, the decision rule
    # and an abstained scan's nearest site; each answer names the row it was logged as
    unkept = {"class_probs", "decision_rule", "nearest", "audit_id"}
    assert [{k: v for k, v in e.to_dict().items() if k not in unkept} for e in reversed(log)] == [
        {k: v for k, v in r.items() if k not in unkept} for r in rows
    ]
    assert [r["audit_id"] for r in rows] == sorted(r["audit_id"] for r in rows)
    assert {r["audit_id"] for r in rows} == {i for i, _ in AuditLog(run).records()}
    assert len(log[0].sha256) == 64
    routed = [e for e in log if e.status == "routed"]
    if routed:
        assert (
            AuditLog(run).read(site=routed[0].chosen_site)[0].chosen_site == routed[0].chosen_site
        )


def test_audit_log_round_trips_and_filters(tmp_path):
    log = AuditLog(tmp_path)
    assert log.read() == []
    a = AuditEntry("t1", "a.jpg", "0" * 64, "density_ratio", "routed", "acrima",
                   {"acrima": 0.9, "rimone": 0.1}, "glaucoma", 0.8, 1.5)  # fmt: skip
    b = AuditEntry("t2", "b.jpg", "1" * 64, "density_ratio", "abstained", None,
                   {"acrima": 0.5, "rimone": 0.5}, "normal", 0.6, 9.0, "no site fits")  # fmt: skip
    assert log.append([a, b]) == [1, 2]
    # an abstained scan has no answer: a prediction logged for one (by an older medfed) is dropped
    b = dataclasses.replace(b, prediction=None, prediction_prob=None)
    assert log.read() == [b, a]
    assert log.read(site="acrima") == [a]
    assert log.read(status="abstained") == [b]
    assert log.read(limit=1) == [b]


def test_majority_vote_answers_with_the_vote_not_the_mean() -> None:
    # Votes: class 1, class 1, class 0; mean probability of class 1 is only 0.34.
    probs = np.array([[[0.49, 0.51]], [[0.49, 0.51]], [[1.0, 0.0]]])
    router = MajorityVoteRouter()
    fed = fake_fed([1 / 3] * 3)
    site_probs, routed, class_probs = router.decide(fed, outputs(probs))
    assert router.predict(fed, class_probs, site_probs, outputs(probs)).tolist() == [1]
    # At operating points of 0.6 the first two sites vote 0 and the third (threshold 0) 1.
    fed = fake_fed([1 / 3] * 3, thresholds=np.array([0.6, 0.6, 0.0]))
    assert router.predict(fed, class_probs, site_probs, outputs(probs)).tolist() == [0]


def test_feddrm_publishes_a_routing_temperature_that_calibrates_its_posterior(tensor_run):
    out, sites, summary = tensor_run
    fed = TrainedFederation.load(out, "cpu")
    assert fed.routing is not None and fed.routing.n_val == sum(s.n(Split.VAL) for s in sites)
    calibrated = summary.routing_calibration
    raw = summary.routing_calibration_uncalibrated
    assert calibrated.temperature == pytest.approx(fed.routing.temperature)
    assert raw.temperature == 1.0 and calibrated.accuracy == pytest.approx(raw.accuracy)
    print(f"routing Brier: {raw.brier:.3f} at temperature 1, {calibrated.brier:.3f} calibrated")
    # The Brier score, a proper score that no binning moves (the ECE of 72 test scans in ten
    # fixed-width bins is too coarse to rank the two).
    assert calibrated.brier < raw.brier
    # The router answers with the calibrated posterior.
    views = [torch.cat([o.as_seen_by(m, Split.TEST) for o in sites]) for m in sites]
    result = DensityRatioRouter().route(fed, views)
    scores = DensityRatioRouter().scores(fed, fed.outputs(views))
    expected = np.exp(scores / fed.routing.temperature)
    assert result.site_probs == pytest.approx(expected / expected.sum(axis=1, keepdims=True))
    text = runner.invoke(app, ["evaluate", str(out)]).output
    assert "Routing posterior P(site | scan)" in text and "uncalibrated (temperature 1)" in text


def test_a_model_published_without_a_routing_fit_routes_at_temperature_one(tensor_run, tmp_path):
    out, sites, _ = tensor_run
    old = tmp_path / "old"
    shutil.copytree(out, old)
    info = json.loads((old / "model" / "model.json").read_text())
    info.pop("routing")
    (old / "model" / "model.json").write_text(json.dumps(info))
    fed = TrainedFederation.load(old, "cpu")
    assert fed.routing is None and fed.routing_temperature == 1.0
    assert "one_pass" not in [r.name for r in routers_for(fed)]  # no routing site chosen
    with pytest.raises(ConfigError, match="one_pass.*use density_ratio"):
        make_router("one_pass", fed).route(fed, [torch.zeros(1, 3, 16, 16)] * 3)
    views = [torch.cat([o.as_seen_by(m, Split.TEST) for o in sites]) for m in sites]
    scores = DensityRatioRouter().scores(fed, fed.outputs(views))
    expected = np.exp(scores - scores.max(axis=1, keepdims=True))
    result = DensityRatioRouter().route(fed, views)
    assert result.site_probs == pytest.approx(expected / expected.sum(axis=1, keepdims=True))


def test_latency_scans_default_to_16_and_follow_their_variable(monkeypatch):
    from medfed.core.errors import ConfigError
    from medfed.routing.evaluation import LATENCY_ENV, latency_scans

    monkeypatch.delenv(LATENCY_ENV, raising=False)
    assert latency_scans() == 16
    monkeypatch.setenv(LATENCY_ENV, " 3 ")
    assert latency_scans() == 3
    for bad in ("0", "-2", "six", "1.5"):
        monkeypatch.setenv(LATENCY_ENV, bad)
        with pytest.raises(ConfigError, match=f"{LATENCY_ENV}="):
            latency_scans()
