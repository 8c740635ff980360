"""Backbones, the federated model's key layout, and norm-key selection."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from medfed.core.errors import ConfigError
from medfed.models import (
    BACKBONES,
    BACKBONES_2D,
    BACKBONES_3D,
    ModelConfigError,
    ModelSpec,
    build_backbone,
    build_model,
    keys_with_prefix,
    norm_state_keys,
    spatial_dims,
)

_TV_WIDTHS = {"resnet18": 512, "resnet34": 512, "resnet50": 2048, "densenet121": 1024}
_TV_WIDTHS["efficientnet-b0"] = 1280
_TV_WIDTHS["mobilenet-v2"] = 1280
FEAT_DIMS = {
    "cnn": 128,
    "cnn-gn": 128,
    "resnet18-gn": 512,
    "resnet18-bn": 512,
    "monai3d": 128,
    "monai3d-gn": 128,
    # 2.5-D: the 2-D network's features, max- and mean-pooled over the slices
    "slices-cnn": 256,
    "slices-cnn-gn": 256,
    "slices-resnet18-gn": 1024,
    "slices-resnet18-bn": 1024,
    # torchvision-shaped: torchvision's own pooled widths
    **{f"tv-{n}{gn}": w for n, w in _TV_WIDTHS.items() for gn in ("", "-gn")},
}


def _input(name: str, batch: int = 2) -> torch.Tensor:
    if name.startswith("slices-resnet18"):  # a ResNet-18 pass per slice: keep them few
        return torch.randn(batch, 1, 4, 32, 32)
    if name in BACKBONES_3D:
        return torch.randn(batch, 1, 16, 48, 48)
    size = 32 if name.startswith("resnet18") else 64
    return torch.randn(batch, 3, size, size)


def test_every_backbone_has_a_known_feature_width():
    assert set(FEAT_DIMS) == set(BACKBONES)


@pytest.mark.parametrize("name", BACKBONES)
def test_backbone_maps_a_batch_to_flat_features(name):
    torch.manual_seed(0)
    x = _input(name)
    backbone, feat = build_backbone(name, in_channels=x.shape[1])

    out = backbone(x)

    assert feat == FEAT_DIMS[name]
    assert out.shape == (2, feat)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize(
    ("name", "norm_type"), [("monai3d", nn.BatchNorm3d), ("cnn", nn.BatchNorm2d)]
)
def test_batch_norm_backbones_contain_only_batch_norm(name, norm_type):
    backbone, _ = build_backbone(name, in_channels=1)

    norms = [m for m in backbone.modules() if isinstance(m, nn.GroupNorm | norm_type)]

    assert norms and all(isinstance(m, norm_type) for m in norms)


@pytest.mark.parametrize(
    "name", ["cnn-gn", "resnet18-gn", "monai3d-gn", "tv-resnet50-gn", "tv-efficientnet-b0-gn"]
)
def test_group_norm_backbones_have_no_batch_norm_anywhere(name):
    backbone, _ = build_backbone(name, in_channels=1)

    kinds = {type(m) for m in backbone.modules()}

    assert nn.GroupNorm in kinds
    assert not kinds & {nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm}


def test_resnet18_residual_blocks_start_as_identity():
    backbone, _ = build_backbone("resnet18-gn", in_channels=3)

    last_norms = [m.norm2 for m in backbone.modules() if hasattr(m, "norm2")]

    assert len(last_norms) == 8
    assert all(torch.count_nonzero(n.weight) == 0 for n in last_norms)


def test_spatial_dims_separates_fundus_and_ct_backbones():
    assert {spatial_dims(n) for n in BACKBONES_2D} == {2}
    assert {spatial_dims(n) for n in BACKBONES_3D} == {3}


def test_unknown_backbone_error_lists_the_choices():
    with pytest.raises(ValueError, match="unknown backbone 'vit'") as info:
        build_backbone("vit", in_channels=3)

    assert isinstance(info.value, ConfigError)
    assert all(name in str(info.value) for name in BACKBONES)


@pytest.mark.parametrize(
    "bad",
    [
        {"backbone": "vit"},
        {"in_channels": 0},
        {"n_classes": 1},
        {"n_sites": 0},
        {"branch_dim": 0},
    ],
)
def test_model_spec_rejects_invalid_settings(bad):
    with pytest.raises(ModelConfigError, match=next(iter(bad))):
        ModelSpec(**bad)


def test_model_spec_round_trips_through_a_dict_and_rejects_unknown_fields():
    spec = ModelSpec(backbone="cnn-gn", n_sites=4, client_branch=True)

    assert ModelSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(ModelConfigError, match="unknown field"):
        ModelSpec.from_dict({**spec.to_dict(), "dropout": 0.1})


def test_fed_model_without_client_branch_has_only_target_submodules():
    model = build_model(ModelSpec(n_classes=3))

    out = model(torch.randn(2, 3, 64, 64))

    assert {k.split(".")[0] for k in model.state_dict()} == {
        "backbone",
        "target_branch",
        "target_head",
    }
    assert out.target_logits.shape == (2, 3)
    assert out.client_logits is None


def test_fed_model_with_client_branch_adds_client_submodules():
    model = build_model(ModelSpec(n_sites=4, client_branch=True))

    out = model(torch.randn(2, 3, 64, 64))

    assert {k.split(".")[0] for k in model.state_dict()} == {
        "backbone",
        "target_branch",
        "target_head",
        "client_branch",
        "client_head",
    }
    assert out.target_logits.shape == (2, 2)
    assert out.client_logits is not None and out.client_logits.shape == (2, 4)


def test_branches_are_linear_layernorm_relu_and_head_is_linear():
    model = build_model(ModelSpec(branch_dim=16, n_sites=2, client_branch=True))

    for branch in (model.target_branch, model.client_branch):
        assert [type(m) for m in branch] == [nn.Linear, nn.LayerNorm, nn.ReLU]
        assert branch[0].out_features == 16
    assert isinstance(model.target_head, nn.Linear) and model.target_head.in_features == 16


def test_heads_on_shared_features_match_the_full_forward_pass():
    torch.manual_seed(0)
    model = build_model(ModelSpec(n_sites=3, client_branch=True)).eval()
    x = torch.randn(2, 3, 64, 64)

    with torch.no_grad():
        full = model(x)
        split = model.heads(model.features(x))

    torch.testing.assert_close(split.target_logits, full.target_logits)
    torch.testing.assert_close(split.client_logits, full.client_logits)


def test_norm_state_keys_selects_batch_norm_statistics_but_no_conv_weights():
    model = build_model(ModelSpec(backbone="cnn"))

    keys = norm_state_keys(model)

    assert "backbone.features.1.running_mean" in keys
    assert "backbone.features.1.running_var" in keys
    assert "backbone.features.1.num_batches_tracked" in keys
    assert "backbone.features.1.weight" in keys
    assert "target_branch.1.weight" in keys  # the branch's LayerNorm
    assert "backbone.features.0.weight" not in keys  # first conv
    assert not any(k.startswith("target_head.") for k in keys)
    assert keys <= set(model.state_dict())


def test_norm_state_keys_selects_group_and_layer_norm_affine_parameters():
    model = build_model(ModelSpec(backbone="cnn-gn"))
    convs = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, nn.Conv2d)}

    keys = norm_state_keys(model)

    assert {"backbone.features.1.weight", "backbone.features.1.bias"} <= keys
    assert {"target_branch.1.weight", "target_branch.1.bias"} <= keys
    assert not any("running" in k for k in keys)
    assert len(convs) == 4 and not keys & convs


def test_norm_state_keys_finds_norms_by_type_whatever_their_name():
    model = nn.Sequential()
    model.add_module("conv", nn.Conv2d(1, 2, 3))
    model.add_module("renamed", nn.InstanceNorm2d(2, affine=True, track_running_stats=True))

    keys = norm_state_keys(model)

    assert keys == {
        "renamed.weight",
        "renamed.bias",
        "renamed.running_mean",
        "renamed.running_var",
        "renamed.num_batches_tracked",
    }


def test_keys_with_prefix_matches_whole_module_paths():
    keys = ["stages.1.w", "stages.10.w", "target_head.weight", "target_headx.weight", "stem"]

    assert keys_with_prefix(keys, ["stages.1"]) == {"stages.1.w"}
    assert keys_with_prefix(keys, ["target_head."]) == {"target_head.weight"}
    assert keys_with_prefix(keys, ["stem", "target_head"]) == {"stem", "target_head.weight"}
    assert keys_with_prefix(keys, []) == set()
    with pytest.raises(ValueError, match="empty prefix"):
        keys_with_prefix(keys, [""])


@pytest.mark.parametrize("backbone", ["cnn", "monai3d-gn"])
def test_same_seed_builds_identical_weights(backbone):
    spec = ModelSpec(backbone=backbone, in_channels=1, n_sites=3, client_branch=True)

    torch.manual_seed(7)
    first = build_model(spec).state_dict()
    torch.manual_seed(7)
    second = build_model(spec).state_dict()
    torch.manual_seed(8)
    other = build_model(spec).state_dict()

    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert not torch.equal(first["target_head.weight"], other["target_head.weight"])


@pytest.mark.parametrize("backbone", ["cnn", "resnet18-gn"])
def test_channels_last_gives_the_same_logits(backbone):
    torch.manual_seed(0)
    model = build_model(ModelSpec(backbone=backbone)).eval()
    x = torch.randn(2, 3, 32, 32)

    with torch.no_grad():
        reference = model(x).target_logits
        model = model.to(memory_format=torch.channels_last)
        out = model(x.contiguous(memory_format=torch.channels_last)).target_logits

    torch.testing.assert_close(out, reference, rtol=1e-4, atol=1e-4)


def test_small_cnn_accepts_the_smallest_allowed_fundus_size():
    backbone, feat = build_backbone("cnn", in_channels=3)

    assert backbone(torch.randn(2, 3, 8, 8)).shape == (2, feat)


def test_volume_given_to_a_2d_backbone_names_the_3d_choices():
    model = build_model(ModelSpec(backbone="cnn", in_channels=1))

    with pytest.raises(ModelConfigError, match="takes 2D images.*use one of monai3d"):
        model(torch.randn(2, 1, 16, 48, 48))


def test_unbatched_image_is_rejected_with_a_shape_hint():
    model = build_model(ModelSpec(backbone="monai3d", in_channels=1))

    with pytest.raises(ModelConfigError, match="batch axis and the channel axis"):
        model(torch.randn(16, 48, 48))
