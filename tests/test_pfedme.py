"""pFedMe: personalized models on a Moreau envelope of the global model."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch

from medfed.algorithms import make_algorithm
from medfed.algorithms.base import Batches, LocalTask, Optim
from medfed.config import TrainConfig, load_manifests
from medfed.core.errors import ConfigError
from medfed.data.cache import TensorCache
from medfed.data.sitedata import load_site
from medfed.data.synth import synthesize
from medfed.federation.training import train
from medfed.models.fedmodel import ModelSpec, build_model
from tests.test_engine import config, kill_and_resume, stable

IMAGE_SIZE = 32  # the federation's scans preprocessed at half the usual size: a fast test


@pytest.fixture(scope="module")
def fundus_sites(tmp_path_factory):
    """The synthetic fundus federation (three cameras, three glaucoma prevalences)."""
    base = tmp_path_factory.mktemp("fundus")
    paths = synthesize(base / "data", modality="fundus", n_per_site=240, seed=0, image_size=64)
    cache = TensorCache(base / "cache")
    sites = []
    for manifest in load_manifests(paths):
        small = dataclasses.replace(manifest.preprocess, image_size=IMAGE_SIZE)
        sites.append(load_site(dataclasses.replace(manifest, preprocess=small), cache))
    return sites


def mean_site_accuracy(summary: dict) -> float:
    """Each site's model on its own test scans, averaged over sites."""
    return sum(s["accuracy"] for s in summary["sites"].values()) / len(summary["sites"])


def test_personalized_models_beat_the_fedavg_model_on_their_own_sites(fundus_sites, tmp_path):
    budget = dict(rounds=10, local_steps=3, seed=0, device="cpu")
    fedavg = train(fundus_sites, TrainConfig("fedavg", **budget), tmp_path / "fedavg")
    pfedme = train(fundus_sites, TrainConfig("pfedme", **budget), tmp_path / "pfedme")
    # Same rounds and local steps (same bytes); pFedMe spends inner_steps times the compute.
    # Seed 0: mean site accuracy 0.698 -> 0.747, mean site AUC 0.783 -> 0.837; three other
    # data seeds and two other training seeds gave +7.0 to +8.8 points of accuracy.
    assert mean_site_accuracy(pfedme) >= mean_site_accuracy(fedavg) + 0.03
    assert pfedme["mean_site_auc"] >= fedavg["mean_site_auc"] - 0.02
    assert pfedme["algorithm"] == "pfedme" and pfedme["routing_method"] == "majority_vote"


# --------------------------------------------------------------------------- the update rule
def local_round(params: dict[str, str], steps: int = 2):
    """(received w, the w_i the site sends, theta) after one local round on a tiny model."""
    algorithm = make_algorithm("pfedme", params)
    torch.manual_seed(0)
    model = build_model(ModelSpec(backbone="cnn-gn"))
    received = {k: v.detach().clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 3, 16, 16, generator=g), torch.arange(16) % 2
    task = LocalTask(
        model=model,
        global_state=received,
        batches=Batches(x, y, 8, torch.Generator().manual_seed(2)),
        steps=steps,
        optim=Optim(lr=0.01, momentum=0.9, weight_decay=0.0, kind="adam"),
        site_index=0,
        n_sites=2,
        site_id="a",
        extra=algorithm.init_extra(model),
        autocast=contextlib.nullcontext,
    )
    algorithm.local_train(task)
    sent = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return received, sent, task.extra


def test_with_eta_lam_one_the_local_model_steps_onto_theta() -> None:
    received, sent, theta = local_round({"lam": "0.5", "eta": "2", "inner_steps": "3"})
    assert not torch.equal(sent["target_head.weight"], received["target_head.weight"])
    for key, value in sent.items():
        assert torch.allclose(value, theta[key], atol=1e-6), key


def test_with_a_smaller_step_the_local_model_stays_between_w_and_theta() -> None:
    received, sent, theta = local_round({"lam": "0.5", "eta": "1", "inner_steps": "3"}, steps=1)
    key = "target_head.weight"
    # One outer step with eta * lam = 0.5: halfway from the received w to theta.
    assert torch.allclose(sent[key], 0.5 * (received[key] + theta[key]), atol=1e-6)


def test_beta_scales_the_step_the_server_takes() -> None:
    received, plain, theta = local_round({"beta": "1"})
    _, boosted, theta_again = local_round({"beta": "2"})
    for key in ("backbone.features.0.weight", "target_head.bias"):
        expected = received[key] + 2 * (plain[key] - received[key])
        assert torch.allclose(boosted[key], expected, atol=1e-6)
        assert torch.equal(theta[key], theta_again[key])  # theta does not depend on beta


def test_by_default_the_local_model_goes_halfway_to_theta_whatever_lam() -> None:
    assert make_algorithm("pfedme", {"lam": "3"}).params.step_toward == 0.5
    assert make_algorithm("pfedme", {"lam": "3", "eta": "0.1"}).params.step_toward == pytest.approx(
        0.3
    )
    received, sent, theta = local_round({"lam": "2", "inner_steps": "2"}, steps=1)
    key = "target_branch.0.weight"
    assert torch.allclose(sent[key], 0.5 * (received[key] + theta[key]), atol=1e-6)


def test_every_key_travels_and_sites_answer_with_their_personal_model() -> None:
    model = build_model(ModelSpec(backbone="cnn-gn"))
    algorithm = make_algorithm("pfedme")
    assert algorithm.shared_keys(model) == sorted(model.state_dict())
    personal = {"w": torch.ones(1)}
    assert algorithm.eval_state({"w": torch.zeros(1)}, personal) is personal


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"lam": "0"}, "lam must be > 0"),
        ({"inner_steps": "0"}, "inner_steps"),
        ({"eta": "-1"}, "eta must be >= 0"),
        ({"lam": "1", "eta": "2"}, "would step past the personalized model; choose eta <= 1"),
        ({"beta": "3"}, "beta must be in"),
        ({"mu": "1"}, "no parameter"),
    ],
)
def test_bad_settings_are_refused(params, message) -> None:
    with pytest.raises(ConfigError, match=message):
        make_algorithm("pfedme", params)


def test_resume_after_a_kill_ends_exactly_like_an_uninterrupted_run(tmp_path, monkeypatch):
    whole, resumed = kill_and_resume(config("pfedme", rounds=4), tmp_path, monkeypatch)
    assert stable(resumed) == stable(whole)
    assert resumed["resumes"] == 1
