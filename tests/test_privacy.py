"""Differential privacy: DP-SGD through Opacus at every site, its accounting and its budget."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from opacus.accountants import PRVAccountant, RDPAccountant
from torch import nn

from medfed.algorithms import ALGORITHMS, dp_algorithms, make_algorithm
from medfed.algorithms.base import Batches, LocalTask, Optim, supervised_steps
from medfed.algorithms.privacy import SitePrivacy, check_model, per_sample_gradients
from medfed.config import DPSettings, Modality, TrainConfig
from medfed.core.errors import ConfigError
from medfed.federation.training import train
from medfed.models.backbones import BACKBONES
from medfed.models.fedmodel import FedModel, ModelSpec
from medfed.reports.evaluation import federation_lines
from medfed.runs import RunDir
from tests.tensorsites import tensor_sites

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def config(algorithm: str = "fedavg", **kw) -> TrainConfig:
    base = dict(algorithm=algorithm, rounds=3, local_steps=3, batch_size=8, device="cpu")
    base |= dict(optimizer="sgd", lr=0.05, dp_epsilon=3.0)
    return TrainConfig(**(base | kw))


@pytest.fixture(scope="module")
def private_run(tmp_path_factory):
    """A FedDRM run at epsilon 3 (shared by the tests that read it)."""
    out = tmp_path_factory.mktemp("dp") / "run"
    summary = train(tensor_sites(3), config("feddrm"), out)
    return summary, RunDir(out)


def opacus_epsilon(kind: str, noise: float, rate: float, steps: int, delta: float) -> float:
    """Opacus' own accountant, stepped once per DP-SGD step as its optimizer hook does."""
    accountant = RDPAccountant() if kind == "rdp" else PRVAccountant()
    for _ in range(steps):
        accountant.step(noise_multiplier=noise, sample_rate=rate)
    return accountant.get_epsilon(delta=delta)


def test_the_epsilon_each_round_records_is_opacus_own(private_run) -> None:
    summary, run = private_run
    n_train = 24  # tensor_site: 48 scans, half of them for training
    for site, spent in summary.privacy.items():
        assert spent.sample_rate == pytest.approx(8 / n_train)
        assert spent.delta == pytest.approx(0.1 / n_train)
        assert spent.steps == spent.planned_steps == 3 * 3
        assert spent.stopped_round is None
        records = [r for r in run.read_metrics() if r.site == site]
        for record in records:
            steps = int(record.extra["train_dp_steps"])
            assert steps == 3 * record.round
            expected = opacus_epsilon(
                "rdp", spent.noise_multiplier, 8 / n_train, steps, spent.delta
            )
            assert record.extra["train_dp_epsilon"] == pytest.approx(expected, rel=1e-9)
        # The noise was chosen to spend the budget over the planned run, not more.
        assert 2.9 < spent.epsilon <= 3.0
    lines = "\n".join(federation_lines(summary))
    assert "differential privacy, site0: epsilon" in lines and "of budget 3" in lines


def test_the_prv_accountant_agrees_with_opacus_too() -> None:
    plan = SitePrivacy.plan(DPSettings(epsilon=2.0, accountant="prv"), "a", 200, 16, 40)
    expected = opacus_epsilon("prv", plan.noise, 16 / 200, 40, 0.1 / 200)
    assert plan.epsilon(40) == pytest.approx(expected, rel=1e-6)
    assert plan.epsilon(40) <= 2.0 and plan.epsilon(20) < plan.epsilon(40)


def one_private_step(noise: float, clip: float, seed: int, scale: float = 50.0):
    """(weights before, weights after, raw gradient norm of one scan) of one DP-SGD step at SGD
    lr 1 on six identical scans, every scan in the batch (sampling rate 1)."""
    torch.manual_seed(0)
    model = FedModel(ModelSpec("cnn-gn", 3, 2, 1))
    x = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(1)).repeat(6, 1, 1, 1)
    x, y = x * scale, torch.ones(6, dtype=torch.long)
    before = [p.detach().clone() for p in model.parameters()]
    raw = torch.autograd.grad(_target_loss(None, model, x[:1], y[:1]), list(model.parameters()))
    raw_norm = torch.sqrt(sum(g.pow(2).sum() for g in raw)).item()
    task = LocalTask(
        model=model,
        global_state={},
        batches=Batches(x, y, 6, torch.Generator().manual_seed(seed)),
        steps=1,
        optim=Optim(lr=1.0, momentum=0.0, weight_decay=0.0, kind="sgd"),
        site_index=0,
        n_sites=1,
        site_id="a",
        extra={},
        autocast=contextlib.nullcontext,
        privacy=SitePrivacy("a", noise, 1.0, clip, 1e-3, None, "rdp", 1),
    )
    supervised_steps(task, model, model.parameters(), _target_loss)
    # The model is shared scratch space: nothing of Opacus is left on it.
    assert all(not hasattr(p, "grad_sample") for p in model.parameters())
    assert all(not m._forward_hooks for m in model.modules())
    return before, [p.detach().clone() for p in model.parameters()], raw_norm


def _distance(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return torch.sqrt(sum((p - q).pow(2).sum() for p, q in zip(a, b, strict=True))).item()


def test_a_budget_no_noise_can_keep_is_refused_and_epsilon_is_never_negative() -> None:
    with pytest.raises(ConfigError, match=r"no noise multiplier keeps 9 DP-SGD steps.*--dp-eps"):
        SitePrivacy.plan(DPSettings(epsilon=1e-6), "a", 24, 8, 9)
    drowned = SitePrivacy("a", 1e4, 0.3, 1.0, 0.02, None, "rdp", 10)  # RDP bound: -0.02
    assert drowned.epsilon(10) == 0.0 and drowned.epsilon(0) == 0.0


def test_each_scans_gradient_is_clipped_to_the_bound() -> None:
    """No noise: the step is exactly one clipped gradient (norm C), while the raw gradient of
    a scan is far larger."""
    clip = 0.01
    before, after, raw_norm = one_private_step(noise=0.0, clip=clip, seed=0)
    assert raw_norm > 100 * clip
    assert _distance(before, after) == pytest.approx(clip, rel=1e-4)


def test_the_noise_is_drawn_from_the_sites_seeded_generator() -> None:
    """With noise, the same seed gives the same step, another seed another one, and the noise
    is as large as sigma * C / batch per weight says."""
    _, first, _ = one_private_step(noise=1.0, clip=0.01, seed=0)
    _, again, _ = one_private_step(noise=1.0, clip=0.01, seed=0)
    before, other, _ = one_private_step(noise=1.0, clip=0.01, seed=1)
    assert _distance(first, again) == 0.0
    assert _distance(first, other) > 0.0
    n_weights = sum(p.numel() for p in before)
    expected = 1.0 * 0.01 / 6 * n_weights**0.5  # the noise's norm; the clipped mean is 0.01
    assert _distance(before, other) == pytest.approx(expected, rel=0.1)


def _target_loss(task, model, x, y):
    return nn.functional.cross_entropy(model(x).target_logits.float(), y)


def test_the_same_seed_trains_the_same_private_models(private_run, tmp_path) -> None:
    summary, run = private_run
    again = train(tensor_sites(3), config("feddrm"), tmp_path / "again")
    assert again.privacy == summary.privacy
    for site in summary.sites:
        assert again.sites[site].auc == summary.sites[site].auc
    first = {k: v for k, v in run.read_metrics()[-1].extra.items()}
    assert RunDir(tmp_path / "again").read_metrics()[-1].extra == first


def test_a_site_never_spends_more_than_its_budget(tmp_path) -> None:
    """A noise multiplier that spends the budget early: each site stops, with a reason, before
    the round that would overspend; the run finishes with what the sites had."""
    cfg = config("fedavg", rounds=6, dp_epsilon=2.0, dp_noise=1.6)  # stops in round 3
    summary = train(tensor_sites(3), cfg, tmp_path / "run")
    run = RunDir(tmp_path / "run")
    for site, spent in summary.privacy.items():
        assert spent.epsilon <= 2.0
        assert spent.stopped_round == 3
        assert spent.steps == 3 * (spent.stopped_round - 1)
        records = [r for r in run.read_metrics() if r.site == site]
        spent_by_round = [r.extra["train_dp_epsilon"] for r in records if r.status == "ok"]
        assert spent_by_round == sorted(spent_by_round) and max(spent_by_round) <= 2.0
        stopped = [r for r in records if r.round >= spent.stopped_round]
        assert stopped and all(r.status == "dropped" for r in stopped)
        assert "past its budget 2" in stopped[0].reason and "budget is spent" in stopped[0].reason
    assert "stopped in round 3 (budget spent)" in "\n".join(federation_lines(summary))
    events = [e for e in run.read_events() if e["event"] == "privacy_budget_spent"]
    assert sorted((e["site"], e["round"]) for e in events) == [
        (s, 3) for s in sorted(summary.privacy)
    ]


def test_fine_tuning_is_planned_into_the_budget(tmp_path) -> None:
    summary = train(tensor_sites(2), config("fedavgft", rounds=1), tmp_path / "run")
    for spent in summary.privacy.values():
        assert spent.planned_steps == 1 * 3 + 2 * 3  # rounds, then two rounds' worth of tuning
        assert spent.steps == spent.planned_steps and spent.epsilon <= 3.0


def test_dp_picks_a_group_norm_backbone_and_refuses_what_cannot_be_private(tmp_path) -> None:
    summary = train(tensor_sites(2), config("fedbn", rounds=1), tmp_path / "fedbn")
    assert summary.backbone == "cnn-gn"  # FedBN keeps its GroupNorm layers on each site
    with pytest.raises(ConfigError, match=r"BatchNorm.*--backbone resnet18-gn"):
        train(tensor_sites(2), config(backbone="resnet18-bn"), tmp_path / "bn")
    for name in sorted(set(ALGORITHMS) - set(dp_algorithms()) - {"fedals"}):
        reason = make_algorithm(name).dp_refusal
        assert reason
        with pytest.raises(ConfigError, match="cannot train under differential privacy"):
            train(tensor_sites(2), config(name, rounds=1), tmp_path / name)
    assert {"fedavg", "feddrm", "fedbn", "fedrep", "fedavgft", "local"} <= set(dp_algorithms())


@pytest.mark.parametrize("backbone", [b for b in BACKBONES if b.startswith("slices-")])
def test_slice_backbones_are_refused_for_their_per_slice_gradients(backbone) -> None:
    model = FedModel(ModelSpec(backbone, 1, 2, 2))
    with pytest.raises(ConfigError, match=r"slice's, not a scan's.*monai3d-gn"):
        check_model(model, backbone)


def test_the_3d_backbone_trains_under_dp() -> None:
    """CT's DP backbone: its residual blocks must take Opacus' per-scan hooks."""
    from medfed.federation.plan import resolved_backbone

    cfg = config()
    assert resolved_backbone(cfg, Modality.CT, make_algorithm("feddrm")) == "monai3d-gn"
    model = FedModel(ModelSpec("monai3d-gn", 1, 2, 2, client_branch=True))
    check_model(model, "monai3d-gn")
    x, y = torch.randn(3, 1, 12, 12, 12), torch.tensor([0, 1, 1])
    with per_sample_gradients(model):
        out = model(x)
        (F.cross_entropy(out.target_logits, y) + F.cross_entropy(out.client_logits, y)).backward()
        shapes = {p.grad_sample.shape[0] for p in model.parameters() if p.requires_grad}
    assert shapes == {3}  # one gradient per scan for every weight


def test_the_report_and_the_dashboard_show_what_each_site_spent(private_run) -> None:
    from medfed.dashboard.rundata import privacy_frame
    from medfed.reports.study import load_study, render_study

    summary, run = private_run
    frame = privacy_frame({"feddrm": summary})
    assert list(frame["site"]) == list(summary.privacy)
    spent = summary.privacy["site0"]
    assert frame.iloc[0]["epsilon spent"] == f"{spent.epsilon:.2f}"
    assert frame.iloc[0]["budget"] == "3" and frame.iloc[0]["steps"] == "9 of 9"
    html = render_study(load_study([run.path]))
    assert 'id="privacy"' in html and "Differential privacy" in html
    assert f"{spent.epsilon:.2f}" in html
    assert privacy_frame({"plain": summary | {"privacy": None}}).empty


def test_a_site_secret_replaces_the_run_seed_for_batches_and_noise(tmp_path) -> None:
    """On a deployment each node seeds DP-SGD from its own secret: the server, which knows the
    run's seed, cannot draw the same batches and noise again. Without DP the seed rules."""
    from medfed.federation.engine import Engine
    from medfed.federation.plan import SiteInfo, plan_run

    def first_draws(cfg: TrainConfig, secrets: list[int | None]) -> list[torch.Tensor]:
        sites = tensor_sites(2)
        plan = plan_run(cfg, [SiteInfo.of(s) for s in sites])
        engine = Engine(sites, plan, RunDir(tmp_path / "r"))
        worker, out = engine.link.workers[0], []
        for secret in secrets:
            worker.secret = secret
            out.append(torch.rand(4, generator=worker.task(1, 0.1, {}).batches.generator))
        return out

    seeded, again, mine, theirs = first_draws(config(), [None, None, 123, 124])
    assert torch.equal(seeded, again)
    assert not torch.equal(mine, seeded) and not torch.equal(mine, theirs)
    plain, plain_with_secret = first_draws(config(dp_epsilon=0.0), [None, 123])
    assert torch.equal(plain, plain_with_secret)
