"""The 2.5-D backbones: a 2-D network on every CT slice with its two neighbours, pooled over the
slices; 2-D weights (torchvision's, a fundus run's) start them; every algorithm trains them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import torchvision
from safetensors.torch import save_file
from torch import nn

from medfed.algorithms import ALGORITHMS, make_algorithm
from medfed.config import CTPreprocess, Modality, TrainConfig
from medfed.core.errors import ConfigError
from medfed.data.preprocess import Normalization
from medfed.federation.plan import resolved_backbone
from medfed.federation.pretrained import apply_init, resolve_init
from medfed.federation.training import train
from medfed.models.backbones import (
    BACKBONE_SUMMARIES,
    BACKBONES_3D,
    SLICE_BACKBONES,
    ModelConfigError,
    build_backbone,
    neighbour_slices,
    pool_slices,
    spatial_dims,
)
from medfed.models.fedmodel import ModelSpec, build_model
from tests.tensorsites import tensor_site
from tests.test_pretrained import tv_name

BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
BN_INTO_GN = "BatchNorm in the file, GroupNorm in the model; it never loads into GroupNorm"
# The per-slice feature width of each 2-D network; a slices backbone gives max and mean.
WIDTH = {"cnn": 128, "cnn-gn": 128, "resnet18-gn": 512, "resnet18-bn": 512}


def volumes(n: int = 2, c: int = 1, d: int = 5, size: int = 16, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, c, d, size, size, generator=torch.Generator().manual_seed(seed))


def backbone(name: str, in_channels: int = 1, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    module, _ = build_backbone(name, in_channels)
    return module.eval()


# ------------------------------------------------------------------ names and shapes
def test_slice_backbones_are_listed_described_and_take_volumes():
    assert {"slices-cnn-gn", "slices-resnet18-gn"} <= set(SLICE_BACKBONES)
    for name in SLICE_BACKBONES:
        assert name in BACKBONES_3D and spatial_dims(name) == 3
        assert "2.5-D" in BACKBONE_SUMMARIES[name]


@pytest.mark.parametrize("name", sorted(SLICE_BACKBONES))
def test_a_volume_batch_becomes_max_and_mean_features(name):
    torch.manual_seed(0)
    module, feat = build_backbone(name, in_channels=1)

    out = module(volumes(n=3, d=4))

    assert feat == 2 * WIDTH[SLICE_BACKBONES[name]]
    assert out.shape == (3, feat) and torch.isfinite(out).all()


def test_the_standard_ct_volume_gives_flat_features():
    module = backbone("slices-cnn-gn")

    with torch.no_grad():
        out = module(torch.randn(2, 1, 16, 48, 48))

    assert out.shape == (2, 256)


def test_several_channels_per_slice_stay_together():
    module, feat = build_backbone("slices-cnn-gn", in_channels=2)

    assert module.features[0].in_channels == 6
    assert module(volumes(c=2)).shape == (2, feat)


# ------------------------------------------------------------------ neighbours and pooling
def test_each_slice_is_stacked_with_the_one_before_and_after_edges_repeated():
    n, c, d = 2, 2, 4
    # Voxel value = 100 * volume + 10 * channel + slice: every stacked plane says where it is from.
    index = (
        100 * torch.arange(n).view(n, 1, 1)
        + 10 * torch.arange(c).view(1, c, 1)
        + torch.arange(d).view(1, 1, d)
    )
    x = index.float().view(n, c, d, 1, 1).expand(n, c, d, 3, 3)

    stacked = neighbour_slices(x)

    assert stacked.shape == (n * d, 3 * c, 3, 3)
    neighbours = {0: [0, 0, 1], 1: [0, 1, 2], 2: [1, 2, 3], 3: [2, 3, 3]}
    for v in range(n):
        for k, (before, at, after) in neighbours.items():
            want = [100 * v + 10 * ch + s for s in (before, at, after) for ch in range(c)]
            assert stacked[v * d + k, :, 0, 0].tolist() == want, (v, k)


def test_the_network_reads_each_slice_with_its_neighbours():
    module = backbone("slices-cnn-gn")
    x = volumes(n=1, d=3)
    seen = []
    module.features[0].register_forward_pre_hook(lambda _, args: seen.append(args[0]))

    with torch.no_grad():
        module(x)

    s0, s1, s2 = x[0, 0, 0], x[0, 0, 1], x[0, 0, 2]
    want = torch.stack(
        [torch.stack([s0, s0, s1]), torch.stack([s0, s1, s2]), torch.stack([s1, s2, s2])]
    )
    torch.testing.assert_close(seen[0], want, rtol=0, atol=0)


def test_pooling_takes_the_max_then_the_mean_over_each_volumes_slices():
    features = torch.tensor([[1.0, -2.0], [3.0, 0.0], [-1.0, 5.0], [0.0, 1.0]])  # 2 volumes x 2

    pooled = pool_slices(features, n=2)

    assert pooled.tolist() == [[3.0, 0.0, 2.0, -1.0], [0.0, 5.0, -0.5, 3.0]]


@pytest.mark.parametrize("name", ["slices-cnn-gn", "slices-resnet18-gn"])
@pytest.mark.parametrize("changed", [0, 3, 6])
def test_a_change_in_one_slice_alone_changes_the_features(name, changed):
    module = backbone(name)
    x = volumes(n=2, d=7, size=12)
    y = x.clone()
    y[1, :, changed] += 1.0

    with torch.no_grad():
        before, after = module(x), module(y)

    assert not torch.allclose(after[1], before[1])
    torch.testing.assert_close(after[0], before[0], rtol=0, atol=0)  # the other volume's own


def test_the_max_half_sees_a_bright_spot_on_a_single_slice():
    module = backbone("slices-cnn-gn")
    x = torch.zeros(1, 1, 16, 16, 16)
    y = x.clone()
    y[0, 0, 15, 6:10, 6:10] = 5.0  # the last slice only

    with torch.no_grad():
        before, after = module(x), module(y)

    assert not torch.allclose(after[0, :128], before[0, :128])


# ------------------------------------------------------------------ norms, autocast, memory format
@pytest.mark.parametrize("name", ["slices-cnn-gn", "slices-resnet18-gn"])
def test_group_norm_variants_have_no_batch_norm_anywhere(name):
    kinds = {type(m) for m in build_backbone(name, in_channels=1)[0].modules()}

    assert nn.GroupNorm in kinds
    assert not kinds & set(BATCH_NORMS)


@pytest.mark.parametrize("name", ["slices-cnn", "slices-resnet18-bn"])
def test_batch_norm_variants_have_only_batch_norm(name):
    norms = [
        m
        for m in build_backbone(name, in_channels=1)[0].modules()
        if isinstance(m, nn.GroupNorm | nn.BatchNorm2d)
    ]

    assert norms and all(isinstance(m, nn.BatchNorm2d) for m in norms)


@pytest.mark.parametrize("name", ["slices-cnn-gn", "slices-resnet18-gn"])
def test_trains_under_bf16_autocast(name):
    model = build_model(ModelSpec(backbone=name, in_channels=1)).train()
    x = volumes(n=2, d=3, size=8)

    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x).target_logits
    nn.functional.cross_entropy(logits.float(), torch.tensor([0, 1])).backward()

    grads = [p.grad for p in model.backbone.parameters() if p.grad is not None]
    assert torch.isfinite(logits.float()).all()
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_channels_last_weights_give_the_same_logits():
    torch.manual_seed(0)
    model = build_model(ModelSpec(backbone="slices-resnet18-gn", in_channels=1)).eval()
    x = volumes(n=2, d=3, size=12)

    with torch.no_grad():
        reference = model(x).target_logits
        out = model.to(memory_format=torch.channels_last)(x).target_logits

    torch.testing.assert_close(out, reference, rtol=1e-4, atol=1e-4)


def test_a_photo_batch_is_refused_naming_the_2d_backbones():
    model = build_model(ModelSpec(backbone="slices-cnn-gn", in_channels=3))

    with pytest.raises(ModelConfigError, match="takes 3D images.*use one of cnn, cnn-gn"):
        model(torch.randn(2, 3, 16, 16))
    with pytest.raises(ModelConfigError, match="5 axes"):
        backbone("slices-cnn-gn")(torch.randn(2, 3, 16, 16))


# ------------------------------------------------------------------ starting weights
def torchvision_state(seed: int = 7) -> dict[str, torch.Tensor]:
    """A torchvision ResNet-18 state dict with non-default values (so a copy shows)."""
    torch.manual_seed(seed)
    state = torchvision.models.resnet18().state_dict()
    return {k: torch.rand_like(v) + 0.5 if v.is_floating_point() else v for k, v in state.items()}


@pytest.fixture
def tv_file(tmp_path) -> tuple[Path, dict[str, torch.Tensor]]:
    state = torchvision_state()
    path = tmp_path / "resnet18.pth"
    torch.save(state, path)
    return path, state


def slices_model(name: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return build_model(ModelSpec(backbone=name, in_channels=1))


def test_torchvision_resnet18_starts_slices_resnet18_gn_except_stem_and_norms(tv_file):
    path, state = tv_file
    net = slices_model("slices-resnet18-gn")

    report = apply_init(net, resolve_init(str(path)))

    own = net.state_dict()
    convs = [k for k in state if k.startswith("layer") and state[k].dim() == 4]
    assert len(convs) == 19
    for key in convs:
        assert torch.equal(own[tv_name(key)], state[key]), key
    assert set(report.loaded) == {tv_name(k) for k in convs}
    why = {s["key"]: s["reason"] for s in report.skipped}
    assert "(64, 3, 7, 7)" in why["conv1.weight"] and "(64, 3, 3, 3)" in why["conv1.weight"]
    assert why["layer1.0.bn1.weight"] == BN_INTO_GN
    assert "backbone.stem.0.weight" in report.random


def test_torchvision_resnet18_starts_slices_resnet18_bn_except_the_stem_conv(tv_file):
    path, state = tv_file
    net = slices_model("slices-resnet18-bn")

    report = apply_init(net, resolve_init(str(path)))

    layers = [k for k in state if k.startswith(("layer", "bn1."))]
    assert set(report.loaded) == {tv_name(k) for k in layers}
    own = net.state_dict()
    assert all(torch.equal(own[tv_name(k)], state[k]) for k in layers)
    assert {s["key"] for s in report.skipped} == {"conv1.weight", "fc.weight", "fc.bias"}


def test_a_fundus_resnet18_gn_model_starts_every_slices_backbone_tensor(tmp_path):
    torch.manual_seed(3)
    fundus = build_model(ModelSpec(backbone="resnet18-gn", in_channels=3)).state_dict()
    path = tmp_path / "fundus.safetensors"
    save_file(fundus, str(path))
    net = slices_model("slices-resnet18-gn")

    report = apply_init(net, resolve_init(str(path)))

    own = net.state_dict()
    backbone_keys = [k for k in own if k.startswith("backbone.")]
    assert backbone_keys and all(torch.equal(own[k], fundus[k]) for k in backbone_keys)
    # The stem reads the 3 neighbouring slices where the fundus model read 3 colours.
    assert "backbone.stem.0.weight" in report.loaded
    # Max and mean pooling double the feature width, so the first branch layer starts fresh.
    assert "target_branch.0.weight" in report.random
    why = {s["key"]: s["reason"] for s in report.skipped}
    assert "(128, 512)" in why["target_branch.0.weight"]


def fundus_sites(k: int = 2) -> list:
    return [tensor_site(f"site{i}", i, n=16, size=8) for i in range(k)]


def test_a_finished_fundus_run_starts_slices_cnn_gn(tmp_path):
    cfg = TrainConfig(
        algorithm="fedavg", rounds=1, local_steps=1, batch_size=8, device="cpu", backbone="cnn-gn"
    )
    train(fundus_sites(), cfg, tmp_path / "fundus")
    net = slices_model("slices-cnn-gn", seed=11)

    report = apply_init(net, resolve_init(str(tmp_path / "fundus")))

    assert report.kind == "run"
    backbone_keys = {k for k in net.state_dict() if k.startswith("backbone.")}
    assert backbone_keys <= set(report.loaded)


# ------------------------------------------------------------------ training through the engine
def ct_site(site_id: str, index: int, n: int = 16, depth: int = 4, size: int = 8):
    """A CT site of tensors: the class is a faint bright square on one middle slice only, the
    site a brightness offset of its own."""
    g = torch.Generator().manual_seed(index)
    x = torch.randn(n, 1, depth, size, size, generator=g) * 0.5 + 0.3 * index
    y = torch.arange(n) % 2
    x[y == 1, :, depth // 2, size // 4 : size // 2, size // 4 : size // 2] += 1.0
    fundus = tensor_site(site_id, index, n=n, size=size)
    manifest = dataclasses.replace(
        fundus.manifest,
        modality=Modality.CT,
        layout="nifti",
        preprocess=CTPreprocess(shape=(depth, size, size)),
    )
    parts = {s: len(t) for s, t in fundus.raw.items()}
    raw, start = {}, 0
    for split, count in parts.items():
        raw[split] = x[start : start + count].clone()
        start += count
    return dataclasses.replace(
        fundus, manifest=manifest, raw=raw, normalization=Normalization.identity(1)
    )


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_every_algorithm_trains_a_slices_backbone_on_ct(algorithm, tmp_path):
    batch_norm = make_algorithm(algorithm).prefers_batch_norm()
    name = "slices-cnn" if batch_norm else "slices-cnn-gn"
    params = {"warmup_rounds": 1} if algorithm == "lora" else {}
    cfg = TrainConfig(
        algorithm=algorithm,
        rounds=2 if algorithm == "fedgmi" else 1,  # its round 1 only measures the views
        local_steps=1,
        batch_size=4,
        device="cpu",
        optimizer="sgd",
        lr=0.05,
        backbone=name,
        params=params,
    )

    summary = train([ct_site("a", 0), ct_site("b", 1)], cfg, tmp_path / "run")

    assert summary["backbone"] == name
    assert set(summary["sites"]) == {"a", "b"}
    for figures in summary["sites"].values():
        assert figures["n_test"] == 4 and 0.0 <= figures["accuracy"] <= 1.0


def test_a_backbone_for_the_other_modality_is_refused_before_training(tmp_path):
    cfg = TrainConfig(algorithm="fedavg", rounds=1, device="cpu", backbone="slices-cnn-gn")

    with pytest.raises(ConfigError, match=r"--backbone.*'slices-cnn-gn'.*fundus.*cnn-gn"):
        train(fundus_sites(), cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "config.toml").exists()  # refused before the run began
    with pytest.raises(ConfigError, match=r"'cnn-gn' takes 2-D.*ct.*slices-cnn-gn"):
        resolved_backbone(
            dataclasses.replace(cfg, backbone="cnn-gn"), Modality.CT, make_algorithm("fedavg")
        )
    assert resolved_backbone(cfg, Modality.CT, make_algorithm("fedavg")) == "slices-cnn-gn"
