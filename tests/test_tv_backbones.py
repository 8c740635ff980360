"""torchvision-shaped backbones: torchvision's ImageNet files (written here from torchvision's own
constructors, as its hub cache holds them) load tensor for tensor, and every algorithm trains
with them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torchvision

from medfed.config import TrainConfig
from medfed.federation.pretrained import apply_init, resolve_init, torchvision_hub_file
from medfed.federation.training import train
from medfed.models.backbones import (
    BACKBONE_SUMMARIES,
    BACKBONES,
    group_norm_twin,
    spatial_dims,
)
from medfed.models.fedmodel import ModelSpec, build_model, norm_state_keys
from medfed.models.torchvision_nets import TV_BACKBONES, TV_NETS
from tests.tensorsites import tensor_sites

BN_INTO_GN = "BatchNorm in the file, GroupNorm in the model; it never loads into GroupNorm"
# Each architecture once: its torchvision constructor's state, saved where the hub keeps it.
ARCHITECTURES = ("resnet18", "resnet50", "densenet121", "efficientnet_b0")


def _backbone_name(constructor: str) -> str:
    return next(name for name, net in TV_NETS.items() if net.constructor == constructor)


@pytest.fixture(scope="module")
def torch_home(tmp_path_factory) -> Path:
    """A hub cache holding each architecture's file (torchvision's values: random, seeded)."""
    home = tmp_path_factory.mktemp("torch_home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCH_HOME", str(home))
        for name in ARCHITECTURES:
            torch.manual_seed(1)
            state = getattr(torchvision.models, name)().state_dict()
            path = torchvision_hub_file(name)
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(state, path)
    return home


def _model(backbone: str, **kw) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(ModelSpec(backbone=backbone, **kw))


def test_every_torchvision_backbone_is_a_2d_backbone_with_a_group_norm_twin():
    for name in TV_BACKBONES:
        assert name in BACKBONES and spatial_dims(name) == 2 and name in BACKBONE_SUMMARIES
        twin = group_norm_twin(name)
        assert twin is not None and twin.endswith("-gn") and twin in TV_BACKBONES


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_the_imagenet_file_loads_every_backbone_tensor(torch_home, monkeypatch, architecture):
    monkeypatch.setenv("TORCH_HOME", str(torch_home))
    file = torch.load(torchvision_hub_file(architecture), weights_only=True)
    net = _model(_backbone_name(architecture))

    report = apply_init(net, resolve_init(f"torchvision:{architecture}"))

    assert report.format.startswith("torchvision-")
    assert report.weights_normalization == "imagenet"
    assert not [k for k in report.random if k.startswith("backbone.")]
    assert all("ImageNet classifier" in s["reason"] for s in report.skipped)
    own = net.state_dict()
    assert all(torch.equal(own[f"backbone.{k}"], v) for k, v in file.items() if k in own)


def test_old_densenet_names_in_the_file_load_under_the_modules_names(torch_home, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(torch_home))
    path = torchvision_hub_file("densenet121")
    state = torch.load(path, weights_only=True)
    old = {k.replace("denselayer1.norm1.", "denselayer1.norm.1."): v for k, v in state.items()}
    torch.save(old, path)
    try:
        report = apply_init(_model("tv-densenet121"), resolve_init("torchvision:densenet121"))
    finally:
        torch.save(state, path)

    assert "backbone.features.denseblock1.denselayer1.norm1.weight" in report.loaded
    assert not [k for k in report.random if k.startswith("backbone.")]


def test_a_group_norm_twin_loads_the_convolutions_and_starts_its_norms_fresh(
    torch_home, monkeypatch
):
    monkeypatch.setenv("TORCH_HOME", str(torch_home))
    net = _model("tv-resnet18-gn")

    report = apply_init(net, resolve_init("torchvision:resnet18"))

    convs = [k for k in net.state_dict() if k.startswith("backbone.") and "conv" in k]
    assert convs and set(convs) <= set(report.loaded)
    fresh = {s["reason"] for s in report.skipped if "bn" in s["key"]}
    assert fresh == {BN_INTO_GN} or fresh == {BN_INTO_GN, "no such layer in this model"}
    assert all(k in report.random for k in norm_state_keys(net) if k.startswith("backbone."))


def _config(algorithm: str, backbone: str, **kw) -> TrainConfig:
    settings = dict(rounds=2, local_steps=1, batch_size=8, device="cpu", optimizer="sgd")
    return TrainConfig(algorithm=algorithm, backbone=backbone, lr=0.01, **settings | kw)


@pytest.mark.parametrize("algorithm", ["feddrm", "fedbn"])
def test_feddrm_and_fedbn_train_two_rounds_from_torchvision_resnet18(
    torch_home, monkeypatch, tmp_path, algorithm
):
    monkeypatch.setenv("TORCH_HOME", str(torch_home))
    config = _config(algorithm, "tv-resnet18", init="torchvision:resnet18", init_strict=True)

    summary = train(tensor_sites(3, n=16, size=32), config, tmp_path / algorithm)

    assert summary.rounds == 2
    stored = json.loads((tmp_path / algorithm / "summary.json").read_text())
    assert stored["backbone"] == "tv-resnet18"
    assert all(site["n_test"] > 0 for site in stored["sites"].values())


@pytest.mark.parametrize(
    ("algorithm", "backbone", "extra"),
    [
        ("fedrep", "tv-efficientnet-b0", {}),
        ("fedavg", "tv-densenet121-gn", {"dp_noise": 1.0, "dp_delta": 1e-3}),
        ("fedavg", "tv-resnet18-gn", {"dp_noise": 1.0, "dp_delta": 1e-3}),
    ],
)
def test_other_algorithms_and_dp_sgd_train_with_torchvision_backbones(
    tmp_path, algorithm, backbone, extra
):
    config = _config(algorithm, backbone, rounds=1, **extra)

    summary = train(tensor_sites(2, n=16, size=32), config, tmp_path / "run")

    assert summary.rounds == 1


def test_lora_adapts_a_torchvision_resnet18_started_from_imagenet(
    torch_home, monkeypatch, tmp_path
):
    pytest.importorskip("peft")
    monkeypatch.setenv("TORCH_HOME", str(torch_home))
    config = _config("lora", "tv-resnet18", rounds=1, init="torchvision:resnet18")

    summary = train(tensor_sites(2, n=16, size=32), config, tmp_path / "run")

    assert summary.rounds == 1
