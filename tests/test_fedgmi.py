"""FedGMI: recovering known mixtures of two cameras, experts per distribution, sharing rules."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from medfed.algorithms import make_algorithm
from medfed.algorithms.base import Update
from medfed.algorithms.fedgmi import (
    ASSIGNED,
    COEFFICIENTS,
    FedGMI,
    expert_probabilities,
    is_partition_round,
)
from medfed.config import FundusPreprocess, Modality, SiteManifest, TrainConfig
from medfed.core.errors import ConfigError, RunDirError
from medfed.data.preprocess import Normalization
from medfed.data.records import Record, Split
from medfed.data.sitedata import SiteData
from medfed.federation.training import train
from medfed.models.fedmodel import ModelSpec, build_model
from medfed.models.mixture import MixtureHead, greedy_spread, vae_divergence
from medfed.routing.bundle import TrainedFederation, mixture_coefficients
from medfed.runs import RunDir
from tests.tensorsites import tensor_sites
from tests.test_engine import config, kill_and_resume, stable

SIZE = 32
SHARES = ((0.9, 0.1), (0.5, 0.5), (0.2, 0.8))  # camera A : camera B at each site
SPLIT_SIZES = {Split.TRAIN: 48, Split.VAL: 24, Split.TEST: 24}  # scans per site
CASTS = ((0.5, 0.0, -0.5), (-0.5, 0.0, 0.5), (0.0, 0.6, 0.0))  # warm A, cool B, green C


def camera_scans(camera: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Scans of the given cameras and their labels.

    Every scan may hold a bright square. The cameras differ in colour cast and sharpness (B
    blurs), and in what the square means: under cameras A and C it marks the disease, under
    camera B its absence, so an expert of A is wrong on B and the other way round.
    """
    n, q = camera.shape[0], SIZE // 4
    x = torch.randn(n, 3, SIZE, SIZE, generator=g) * 0.5
    square = torch.rand(n, generator=g) < 0.5
    x[square, :, q : 2 * q, q : 2 * q] += 1.0
    blurred = camera == 1
    x[blurred] = F.avg_pool2d(x[blurred], 3, stride=1, padding=1, count_include_pad=False)
    x += torch.tensor(CASTS)[camera].view(n, 3, 1, 1)
    y = torch.where(camera == 1, ~square, square).long()
    return x, y


def mixture_sites(all_shares: tuple[tuple[float, ...], ...], seed: int):
    """Sites mixing the cameras in the given shares, and each split's camera per scan."""
    built = [mixture_site(f"site{i}", i, shares, seed) for i, shares in enumerate(all_shares)]
    return [site for site, _ in built], [cameras for _, cameras in built]


def train_shares(cameras: list[dict[Split, torch.Tensor]], m: int) -> np.ndarray:
    """(sites, m) each site's true share of training scans per camera."""
    return np.array(
        [[float((c[Split.TRAIN] == k).float().mean()) for k in range(m)] for c in cameras]
    )


def mixture_site(site_id: str, index: int, shares: tuple[float, ...], seed: int):
    """A site whose every split mixes the cameras in exactly the given shares."""
    g = torch.Generator().manual_seed(seed * 100 + index)
    x, y, cameras, records = {}, {}, {}, {}
    for split, n in SPLIT_SIZES.items():
        counts = [round(s * n) for s in shares[:-1]]
        counts.append(n - sum(counts))
        camera = torch.cat([torch.full((c,), k) for k, c in enumerate(counts)])
        camera = camera[torch.randperm(n, generator=g)]
        x[split], y[split] = camera_scans(camera, g)
        cameras[split] = camera
        records[split] = [
            Record(Path(f"{site_id}_{split}_{i}.png"), int(y[split][i]), f"{split}{i}")
            for i in range(n)
        ]
    manifest = SiteManifest(
        id=site_id,
        modality=Modality.FUNDUS,
        layout="acrima",
        root=Path("/nonexistent"),
        labels={"normal": 0, "glaucoma": 1},
        preprocess=FundusPreprocess(image_size=SIZE),
    )
    site = SiteData(
        manifest=manifest,
        raw=x,
        y=y,
        records=records,
        normalization=Normalization.identity(3),
    )
    return site, cameras


@pytest.fixture(scope="module")
def mixture_run(tmp_path_factory):
    sites, cameras = mixture_sites(SHARES, seed=0)
    out = tmp_path_factory.mktemp("fedgmi") / "run"
    cfg = TrainConfig("fedgmi", rounds=10, local_steps=5, batch_size=16, device="cpu", seed=0)
    summary = train(sites, cfg, out)
    return sites, cameras, out, summary


def best_permutation(true: np.ndarray, found: np.ndarray) -> tuple[int, ...]:
    """The relabelling of found components that best matches the true shares."""
    m = true.shape[1]
    return min(itertools.permutations(range(m)), key=lambda p: np.abs(found[:, p] - true).max())


def recovered(run_dir: Path, cameras: list[dict[Split, torch.Tensor]], m: int):
    """(true shares, recovered coefficients, recovered component of each camera)."""
    true = train_shares(cameras, m)
    found = np.array(list(mixture_coefficients(run_dir).values()))
    return true, found, best_permutation(true, found)


def expert_accuracy(run_dir: Path, sites: list[SiteData], cameras, m: int) -> np.ndarray:
    """(experts, cameras) accuracy of every expert on every camera's pooled test scans."""
    fed = TrainedFederation.load(run_dir, device="cpu")
    x = torch.cat([s.x[Split.TEST] for s in sites])
    y = torch.cat([s.y[Split.TEST] for s in sites])
    camera = torch.cat([c[Split.TEST] for c in cameras])
    probs = expert_probabilities(fed.models[0], x)  # the experts are federated: same everywhere
    right = probs.argmax(-1) == y[:, None]  # (N, experts)
    return np.array([right[camera == d].float().mean(0).tolist() for d in range(m)]).T


def test_fedgmi_recovers_every_sites_mixture_coefficients(mixture_run) -> None:
    sites, cameras, out, _ = mixture_run
    true, found, perm = recovered(out, cameras, 2)
    assert np.abs(found[:, perm] - true).max() <= 0.1
    # The same figures are in metrics.jsonl, for the summary and the dashboard.
    last = {r["site"]: r for r in RunDir(out).read_metrics() if r["round"] == 10}
    for site, row in zip(sites, found, strict=True):
        logged = [last[site.id][f"train_mixture_{k}"] for k in range(2)]
        assert logged == pytest.approx(row.tolist())


def test_each_expert_scores_higher_on_its_own_distribution(mixture_run) -> None:
    sites, cameras, out, _ = mixture_run
    accuracy = expert_accuracy(out, sites, cameras, 2)  # [expert, camera]
    _, _, perm = recovered(out, cameras, 2)
    for d in (0, 1):
        own, other = accuracy[perm[d], d], accuracy[perm[d], 1 - d]
        assert own >= 0.85 and own - other >= 0.5, accuracy


def test_three_distributions_are_recovered_too(tmp_path) -> None:
    shares = ((0.7, 0.2, 0.1), (0.1, 0.6, 0.3), (0.2, 0.2, 0.6))
    sites, cameras = mixture_sites(shares, seed=1)
    cfg = TrainConfig("fedgmi", params={"components": 3}, rounds=20, local_steps=5,
                      batch_size=16, device="cpu", seed=1)  # fmt: skip
    train(sites, cfg, tmp_path / "run")
    true, found, perm = recovered(tmp_path / "run", cameras, 3)
    assert np.abs(found[:, perm] - true).max() <= 0.1


def test_sites_answer_by_posterior_mixture_and_the_run_directory_is_complete(mixture_run) -> None:
    sites, _, out, summary = mixture_run
    assert summary["algorithm"] == "fedgmi" and summary["routing_method"] == "majority_vote"
    # Mixing the experts by each scan's posterior answers both cameras at every site.
    assert summary["average_accuracy"] >= 0.9
    fed = TrainedFederation.load(out, device="cpu")
    assert fed.spec.mixture_components == 2 and fed.spec.mixture_predict == "posterior"
    probs, _ = fed.site_outputs(1, sites[1].x[Split.TEST])
    assert probs.shape == (24, 2) and np.allclose(probs.sum(axis=1), 1.0)


def test_mixture_coefficients_of_another_algorithm_are_refused(tmp_path) -> None:
    train(tensor_sites(2), config("fedavg", rounds=1), tmp_path / "run")
    with pytest.raises(RunDirError, match="only fedgmi"):
        mixture_coefficients(tmp_path / "run")


# --------------------------------------------------------------------------- the sharing rule
@pytest.fixture(scope="module")
def model():
    algorithm = make_algorithm("fedgmi", {"components": "3"})
    return build_model(algorithm.adapt_spec(ModelSpec(backbone="cnn-gn"), ["a", "b"]))


def test_coefficients_never_leave_a_site(model) -> None:
    component = make_algorithm("fedgmi", {"components": "3"})
    assert component.private_keys(model) == {COEFFICIENTS}
    shared = set(component.shared_keys(model))
    assert shared == set(model.state_dict()) - {COEFFICIENTS}
    assert {"target_head.weight", "vaes.dec_w2", "vaes.view_mean"} <= shared
    # The counts behind the coefficients are no weights: they travel in the side channel.
    assert not any("assigned" in k for k in model.state_dict())


def test_vaes_travel_only_in_the_statistics_round_and_partition_rounds(model) -> None:
    algorithm = make_algorithm("fedgmi", {"components": "3", "repartition_every": "3"})
    shared = algorithm.shared_keys(model)
    vaes = {k for k in shared if k.startswith("vaes.")}
    first = set(algorithm.round_keys(model, 1, rounds=9))
    assert first == vaes  # round 1 only measures the view statistics
    for round_ in range(2, 10):
        keys = set(algorithm.round_keys(model, round_, rounds=9))
        assert (vaes <= keys) == (round_ in {2, 5, 8})
        assert keys - vaes == set(shared) - vaes
    assert [r for r in range(1, 10) if is_partition_round(r, 3)] == [1, 2, 5, 8]
    with pytest.raises(ConfigError, match="at least 2 rounds"):
        algorithm.round_keys(model, 1, rounds=1)


def test_component_keys_are_averaged_over_the_scans_each_distribution_holds(model) -> None:
    algorithm = make_algorithm("fedgmi", {"components": "3"})
    state = {k: v.clone() for k, v in model.state_dict().items() if k != COEFFICIENTS}
    a = {k: v.clone() for k, v in state.items()}
    b = {k: v.clone() for k, v in state.items()}
    a["vaes.dec_b1"][:] = 1.0
    b["vaes.dec_b1"][:] = 3.0
    a["backbone.features.0.weight"][:] = 1.0
    b["backbone.features.0.weight"][:] = 3.0
    out = algorithm.aggregate(
        [
            Update(a, 45.0, {ASSIGNED: [30.0, 10.0, 5.0]}),
            Update(b, 45.0, {ASSIGNED: [10.0, 30.0, 5.0]}),
        ]
    )
    assert out["vaes.dec_b1"][:, 0].tolist() == pytest.approx([1.5, 2.5, 2.0])
    assert float(out["backbone.features.0.weight"].mean()) == pytest.approx(2.0)  # n_i / N
    # Without the counts (weighting=site, or round 1) every key is averaged by n_i / N.
    site = make_algorithm("fedgmi", {"components": "3", "weighting": "site"})
    plain = site.aggregate([Update(a, 45.0), Update(b, 45.0)])
    assert plain["vaes.dec_b1"][:, 0].tolist() == pytest.approx([2.0, 2.0, 2.0])
    with pytest.raises(ValueError, match="3 non-negative counts"):
        algorithm.aggregate([Update(a, 45.0, {ASSIGNED: [1.0, 2.0]})])
    with pytest.raises(ValueError, match="finite"):
        algorithm.check_stats({ASSIGNED: [1.0, float("nan"), 2.0]})


def test_a_distribution_no_site_holds_is_split_off_the_largest(model) -> None:
    algorithm = make_algorithm("fedgmi", {"components": "3"})
    algorithm.initialize(model, seed=0)
    state = {k: v.clone() for k, v in model.state_dict().items() if k != COEFFICIENTS}
    out = algorithm.aggregate([Update(state, 45.0, {ASSIGNED: [5.0, 40.0, 0.0]})])
    assert torch.equal(out["vaes.enc_w1"][2], out["vaes.enc_w1"][1])
    assert torch.equal(out["target_head.weight"][2], out["target_head.weight"][1])
    before = state["vaes.dec_b2"][1]
    shift = out["vaes.dec_b2"][1] - before
    assert float(shift.abs().max()) > 0
    assert torch.allclose(out["vaes.dec_b2"][2] - before, -shift)  # parent and child move apart


# --------------------------------------------------------------------------- initialization
def test_greedy_spread_picks_the_farthest_pair_then_the_farthest_from_them() -> None:
    points = torch.tensor([0.0, 1.0, 10.0, 3.0, 6.0])
    divergence = (points[:, None] - points[None]).abs()
    chosen = greedy_spread(divergence, 3)
    assert set(chosen[:2]) == {0, 2} and chosen[2] == 4  # 6 is 4 from its closest; 3 only 3


def test_server_keeps_the_most_divergent_of_its_random_vaes(model) -> None:
    algorithm = make_algorithm("fedgmi", {"components": "3", "candidates": "12"})
    algorithm.initialize(model, seed=3)
    bank = model.vaes
    chosen = [bank.component(k) for k in range(3)]
    generator = torch.Generator().manual_seed(3)
    candidates = [bank.candidate(generator, 1.0) for _ in range(12)]
    spread = vae_divergence(bank, chosen, 64, torch.Generator().manual_seed(0))
    first_three = vae_divergence(bank, candidates[:3], 64, torch.Generator().manual_seed(0))
    assert spread.sum() > first_three.sum()
    # The chosen offsets are centred, so the first partition's boundaries pass through the data.
    assert torch.allclose(bank.dec_b2.sum(dim=0), torch.zeros(bank.dim), atol=1e-5)


# --------------------------------------------------------------------------- prediction rules
@pytest.mark.parametrize(("rule", "expected"), [("posterior", 1), ("coefficients", 0)])
def test_prediction_follows_the_posterior_or_the_site_coefficients(rule, expected) -> None:
    head = MixtureHead(branch_dim=4, n_classes=2, components=2, view_dim=10, predict=rule)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.copy_(torch.tensor([[5.0, 0.0], [0.0, 5.0]]))  # expert 0 says 0, expert 1 says 1
        head.coefficients.copy_(torch.tensor([0.9, 0.1]))
    scores = torch.tensor([[-3.0, 0.0]])  # per-dimension ELBO: the scan is clearly from 1
    with torch.no_grad():
        out = head(torch.cat([torch.zeros(1, 4), scores], dim=1))
    assert int(out.argmax(dim=1)) == expected
    assert float(out.exp().sum()) == pytest.approx(1.0)  # log mixture probabilities


def test_a_ct_mixture_model_scores_volumes() -> None:
    spec = ModelSpec(backbone="monai3d-gn", in_channels=1, mixture_components=2)
    volumes = torch.randn(2, 1, 16, 16, 16)
    model = build_model(spec).eval()
    out = model(volumes)
    assert out.target_logits.shape == (2, 2)
    assert model.vaes.dim == 2 * 4**3  # volumes are pooled to half the resolution per axis


# --------------------------------------------------------------------------- settings, resume
@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"components": "1"}, "components must be >= 2"),
        ({"repartition_every": "0"}, "repartition_every"),
        ({"predict": "vote"}, "predict must be one of"),
        ({"components": "4", "candidates": "3"}, "candidates must be >= components"),
        ({"weighting": "equal"}, "weighting"),
        ({"vae_lr": "0"}, "vae_lr"),
    ],
)
def test_bad_settings_are_refused(params, message) -> None:
    with pytest.raises(ConfigError, match=message):
        make_algorithm("fedgmi", params)


def test_resume_after_a_kill_keeps_the_partition_and_ends_the_same(tmp_path, monkeypatch) -> None:
    # Partitions in rounds 2 and 4: round 3, the first after the kill, uses the stored one.
    cfg = config("fedgmi", rounds=4, params={"repartition_every": 2})
    whole, resumed = kill_and_resume(cfg, tmp_path, monkeypatch, kill_after=2)
    assert stable(resumed) == stable(whole)
    assert resumed["resumes"] == 1


def test_a_site_reporting_unusable_counts_is_dropped_not_the_run(tmp_path, monkeypatch) -> None:
    original = FedGMI.local_train

    def lying(self, task):
        result = original(self, task)
        if task.site_id == "site1" and ASSIGNED in result.stats:
            result.stats[ASSIGNED] = [-1.0] * self.params.components
        return result

    monkeypatch.setattr(FedGMI, "local_train", lying)
    summary = train(tensor_sites(3), config("fedgmi", rounds=3), tmp_path / "run")
    records = RunDir(tmp_path / "run").read_metrics()
    dropped = [r for r in records if r["status"] == "dropped"]
    assert {(r["round"], r["site"]) for r in dropped} == {(2, "site1"), (3, "site1")}
    assert all("non-negative counts" in r["reason"] for r in dropped)
    assert summary["dropouts"] == 2 and set(summary["sites"]) == {"site0", "site1", "site2"}
