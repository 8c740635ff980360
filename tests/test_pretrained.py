"""Starting weights (--init): files, torchvision's cache and finished runs mapped onto medfed's
models, with a report of what loaded, what was skipped and why, and what stayed random."""

from __future__ import annotations

import pathlib
import tomllib

import pytest
import tomli_w
import torch
import torchvision
from safetensors.torch import load_file, save_file

from medfed.config import TrainConfig
from medfed.core.errors import ConfigError, MedfedError, RunDirError
from medfed.core.normalization import IMAGENET_MEAN, IMAGENET_STD
from medfed.federation.pretrained import (
    InitReport,
    apply_init,
    read_init,
    resolve_init,
    state_sha256,
    torchvision_hub_file,
)
from medfed.federation.training import train
from medfed.models.backbones import build_backbone
from medfed.models.fedmodel import ModelSpec, build_model
from tests.tensorsites import tensor_sites

TV_FILE = "resnet18-f37072fd.pth"  # the basename of torchvision's ImageNet ResNet-18 weights
BN_INTO_GN = "BatchNorm in the file, GroupNorm in the model; it never loads into GroupNorm"
LORA_SPEC = dict(client_branch=True, n_sites=2)


def model(backbone: str, seed: int = 0, **kw) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(ModelSpec(backbone=backbone, **kw))


def torchvision_state(seed: int = 7) -> dict[str, torch.Tensor]:
    """A torchvision ResNet-18 state dict with non-default BatchNorm values (so a copy shows)."""
    torch.manual_seed(seed)
    state = torchvision.models.resnet18().state_dict()
    for key, value in state.items():
        if value.is_floating_point():
            state[key] = torch.rand_like(value) + 0.5
    return state


def tv_name(key: str) -> str:
    """The medfed name of a torchvision ResNet-18 key (written out independently of the module)."""
    head, rest = key.split(".", 1)
    if head == "bn1":
        return f"backbone.stem.1.{rest}"
    stage = int(head.removeprefix("layer")) - 1
    rest = (
        rest.replace("bn1.", "norm1.").replace("bn2.", "norm2.").replace("downsample.", "shortcut.")
    )
    return f"backbone.stages.{stage}.{rest}"


def reasons(report: InitReport) -> dict[str, str]:
    return {s["key"]: s["reason"] for s in report.skipped}


@pytest.fixture
def tv_file(tmp_path) -> tuple[pathlib.Path, dict[str, torch.Tensor]]:
    state = torchvision_state()
    path = tmp_path / "resnet18.pth"
    torch.save(state, path)
    return path, state


# ------------------------------------------------------------------ torchvision ResNet-18
def test_torchvision_resnet_loads_into_resnet18_bn_except_stem_conv_and_classifier(tv_file):
    path, state = tv_file
    net = model("resnet18-bn")

    report = apply_init(net, resolve_init(str(path)))

    assert report.format == "torchvision-resnet"
    own = net.state_dict()
    layer_keys = [k for k in state if k.startswith(("layer", "bn1."))]
    assert len(layer_keys) > 100
    for key in layer_keys:
        assert torch.equal(own[tv_name(key)], state[key]), key
    assert set(report.loaded) == {tv_name(k) for k in layer_keys}
    why = reasons(report)
    assert set(why) == {"conv1.weight", "fc.weight", "fc.bias"}
    assert "(64, 3, 7, 7)" in why["conv1.weight"] and "(64, 3, 3, 3)" in why["conv1.weight"]
    assert "ImageNet classifier" in why["fc.weight"]
    assert "backbone.stem.0.weight" in report.random
    assert report.adapters == 0
    assert report.weights_normalization == ""  # a plain file: nothing known of its training
    assert state_sha256(report.loaded_state(net)) == report.sha256


def test_torchvision_batch_norms_never_load_into_group_norms(tv_file):
    path, state = tv_file
    net = model("resnet18-gn")
    before = {k: v.clone() for k, v in net.state_dict().items()}

    report = apply_init(net, resolve_init(str(path)))

    own = net.state_dict()
    convs = [k for k in state if k.startswith("layer") and state[k].dim() == 4]
    for key in convs:
        assert torch.equal(own[tv_name(key)], state[key]), key
    assert set(report.loaded) == {tv_name(k) for k in convs}
    norms = [k for k in state if k.startswith("bn1.") or state[k].dim() < 4 and "layer" in k]
    why = reasons(report)
    for key in norms:
        assert why[key] == BN_INTO_GN, key
    group_norm_keys = [k for k in own if ".norm" in k or "stem.1." in k or "shortcut.1." in k]
    assert group_norm_keys
    for key in group_norm_keys:
        assert torch.equal(own[key], before[key]), key
        assert key in report.random


def test_torchvision_weights_do_not_fit_another_backbone(tv_file):
    """Weights of which nothing fits are refused, with why: the run would start from random
    weights while its config.toml says it started from them."""
    path, _ = tv_file
    net = model("cnn")
    before = {k: v.clone() for k, v in net.state_dict().items()}

    with pytest.raises(ConfigError, match=r"none of its .* fits this model.*resnet18-bn"):
        apply_init(net, resolve_init(str(path)))

    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())
    with pytest.raises(ConfigError, match=r"--init-strict.*backbone\.features\.0\.weight"):
        apply_init(model("cnn"), resolve_init(str(path)), strict=True)


# ------------------------------------------------------------------ shapes and strict mode
def test_a_mismatched_shape_is_skipped_naming_the_key_and_both_shapes(tmp_path):
    state = model("cnn", seed=1).state_dict()
    state["backbone.features.4.weight"] = torch.zeros(32, 16, 5, 5)
    path = tmp_path / "odd.safetensors"
    save_file(state, path)
    net = model("cnn")

    report = apply_init(net, resolve_init(str(path)))

    assert reasons(report)["backbone.features.4.weight"] == (
        "backbone.features.4.weight: file has (32, 16, 5, 5), model has (32, 16, 3, 3)"
    )
    assert report.random == ["backbone.features.4.weight"]
    assert torch.equal(
        net.state_dict()["backbone.features.0.weight"], state["backbone.features.0.weight"]
    )


def test_strict_refuses_a_mismatched_shape_and_leaves_the_model_unchanged(tmp_path):
    state = model("cnn", seed=1).state_dict()
    state["target_head.weight"] = torch.zeros(5, 128)
    path = tmp_path / "odd.safetensors"
    save_file(state, path)
    net = model("cnn")
    before = {k: v.clone() for k, v in net.state_dict().items()}

    with pytest.raises(ConfigError) as err:
        apply_init(net, resolve_init(str(path)), strict=True)

    message = str(err.value)
    assert "target_head.weight" in message and "(5, 128)" in message and "(2, 128)" in message
    assert "drop --init-strict" in message and str(path) in message
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())


def test_strict_names_a_backbone_key_the_file_lacks(tmp_path):
    state = model("cnn", seed=1).state_dict()
    del state["backbone.features.8.weight"]
    path = tmp_path / "partial.safetensors"
    save_file(state, path)

    with pytest.raises(ConfigError, match=r"backbone\.features\.8\.weight \(the file has no"):
        apply_init(model("cnn"), resolve_init(str(path)), strict=True)
    report = apply_init(model("cnn"), resolve_init(str(path)))
    assert report.random == ["backbone.features.8.weight"]


# ------------------------------------------------------------------ files refused
class _TouchOnLoad:
    """Unpickling this object creates the file ``marker``: proof that a load ran its code."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def test_a_pickled_object_file_is_refused_without_unpickling(tmp_path):
    marker = tmp_path / "code_ran"
    path = tmp_path / "objects.pt"
    torch.save({"weights": torch.zeros(2), "hook": _TouchOnLoad(marker)}, path)

    with pytest.raises(ConfigError) as err:
        read_init(resolve_init(str(path)))

    message = str(err.value)
    assert str(path) in message and "never unpickles" in message
    assert "torch.save(model.state_dict()" in message
    assert "weights_only" not in message  # never advises turning the safeguard off
    assert not marker.exists()


def test_a_non_tensor_entry_is_named(tmp_path):
    path = tmp_path / "mixed.pt"
    torch.save({"conv.weight": torch.zeros(2), "epoch": 3}, path)

    with pytest.raises(ConfigError, match=r"entry 'epoch' is a int, not a tensor"):
        read_init(resolve_init(str(path)))


def test_garbage_and_missing_sources_get_clear_errors(tmp_path):
    text = tmp_path / "notes.pt"
    text.write_text("hello")
    with pytest.raises(ConfigError, match="not a PyTorch weights file"):
        read_init(resolve_init(str(text)))
    fake = tmp_path / "fake.safetensors"
    fake.write_bytes(b"\x00" * 16)
    with pytest.raises(ConfigError, match="cannot read it as safetensors"):
        read_init(resolve_init(str(fake)))
    with pytest.raises(ConfigError, match=r"no such file or folder.*torchvision:resnet18"):
        resolve_init(str(tmp_path / "absent.pt"))
    with pytest.raises(
        ConfigError, match=r"unknown torchvision weights 'vgg16'.*torchvision:resnet18"
    ):
        resolve_init("torchvision:vgg16")


def test_a_nan_tensor_is_refused_naming_key_and_file(tmp_path):
    state = model("cnn").state_dict()
    state["backbone.features.8.weight"][0, 0, 0, 0] = float("nan")
    path = tmp_path / "nan.safetensors"
    save_file(state, path)

    with pytest.raises(
        ConfigError, match=r"nan\.safetensors: tensor 'backbone\.features\.8\.weight' holds NaN"
    ):
        apply_init(model("cnn"), resolve_init(str(path)))


# ------------------------------------------------------------------ torchvision's hub cache
def test_torchvision_source_is_read_only_from_the_local_cache(tmp_path, monkeypatch):
    home = tmp_path / "torch_home"
    home.mkdir()
    monkeypatch.setenv("TORCH_HOME", str(home))
    expected = home / "hub" / "checkpoints" / TV_FILE
    assert torchvision_hub_file("resnet18") == expected

    with pytest.raises(ConfigError) as err:
        resolve_init("torchvision:resnet18")
    message = str(err.value)
    assert str(expected) in message and "never downloads" in message
    assert "weights='IMAGENET1K_V1'" in message and "TORCH_HOME" in message
    assert not expected.exists()

    state = torchvision_state(seed=3)
    expected.parent.mkdir(parents=True)
    torch.save(state, expected)
    net = model("resnet18-bn")
    report = apply_init(net, resolve_init("torchvision:resnet18"))

    assert report.kind == "torchvision" and report.file == str(expected)
    assert report.weights_normalization == "imagenet"
    assert len(report.loaded) == len(state) - 3  # all but conv1 (7x7) and fc
    assert torch.equal(
        net.state_dict()["backbone.stages.3.1.conv2.weight"], state["layer4.1.conv2.weight"]
    )
    assert any("ImageNet" in line for line in report.lines())


def test_the_torchvision_file_given_by_path_keeps_its_imagenet_normalization(tmp_path):
    path = tmp_path / TV_FILE
    torch.save(torchvision_state(), path)

    report = apply_init(model("resnet18-bn"), resolve_init(str(path)))

    assert report.kind == "state_dict" and report.weights_normalization == "imagenet"


def test_imagenet_constants_match_torchvision():
    transforms = torchvision.models.ResNet18_Weights.IMAGENET1K_V1.transforms()
    assert tuple(transforms.mean) == IMAGENET_MEAN
    assert tuple(transforms.std) == IMAGENET_STD
    assert torchvision.models.ResNet18_Weights.IMAGENET1K_V1.url.endswith("/" + TV_FILE)


# ------------------------------------------------------------------ medfed and backbone files
def test_medfed_safetensors_round_trip_exactly(tmp_path):
    source = model("resnet18-gn", seed=5, client_branch=True, n_sites=3)
    path = tmp_path / "medfed.safetensors"
    save_file(source.state_dict(), path)
    net = model("resnet18-gn", seed=6, client_branch=True, n_sites=3)

    report = apply_init(net, resolve_init(str(path)))

    assert report.format == "medfed" and report.skipped == [] and report.random == []
    saved = load_file(path)
    assert set(report.loaded) == set(saved)
    assert all(torch.equal(net.state_dict()[k], v) for k, v in saved.items())
    assert report.sha256 == state_sha256(saved)


def test_a_backbone_only_state_dict_gets_the_backbone_prefix(tmp_path):
    backbone, _ = build_backbone("cnn-gn", 3)
    path = tmp_path / "backbone.pth"
    torch.save(backbone.state_dict(), path)
    net = model("cnn-gn")

    report = apply_init(net, resolve_init(str(path)))

    assert report.format == "backbone"
    assert set(report.loaded) == {f"backbone.{k}" for k in backbone.state_dict()}
    own = net.state_dict()
    assert all(torch.equal(own[f"backbone.{k}"], v) for k, v in backbone.state_dict().items())
    assert all(not k.startswith("backbone.") for k in report.random)


def test_a_medfed_batch_norm_model_never_loads_into_group_norm(tmp_path):
    path = tmp_path / "bn.safetensors"
    save_file(model("cnn", seed=2).state_dict(), path)

    report = apply_init(model("cnn-gn"), resolve_init(str(path)))

    assert (
        "BatchNorm in the file, GroupNorm in the model"
        in reasons(report)["backbone.features.1.weight"]
    )
    assert "backbone.features.1.weight" in report.random
    assert "backbone.features.0.weight" in report.loaded


# ------------------------------------------------------------------ MedicalNet (3-D)
@pytest.fixture
def medicalnet_file(tmp_path) -> tuple[pathlib.Path, dict[str, torch.Tensor]]:
    torch.manual_seed(4)
    net, _ = build_backbone("monai3d", 1)
    state = {k: (v + 0.25 if v.is_floating_point() else v) for k, v in net.state_dict().items()}
    wrapped = {f"module.{k}": v for k, v in state.items()}
    wrapped["module.conv_seg.weight"] = torch.ones(2, 128, 1, 1, 1)
    path = tmp_path / "resnet_10.pth"
    torch.save({"state_dict": wrapped, "epoch": 200}, path)
    return path, state


def test_medicalnet_checkpoint_loads_fully_into_monai3d(medicalnet_file):
    path, state = medicalnet_file
    net = model("monai3d", in_channels=1)

    report = apply_init(net, resolve_init(str(path)))

    assert report.format == "medicalnet"
    assert set(report.loaded) == {f"backbone.{k}" for k in state}
    own = net.state_dict()
    assert all(torch.equal(own[f"backbone.{k}"], v) for k, v in state.items())
    assert list(reasons(report)) == ["module.conv_seg.weight"]
    assert "segmentation head" in reasons(report)["module.conv_seg.weight"]
    assert all(not k.startswith("backbone.") for k in report.random)


def test_medicalnet_norms_are_skipped_for_monai3d_gn(medicalnet_file):
    path, state = medicalnet_file
    net = model("monai3d-gn", in_channels=1)

    report = apply_init(net, resolve_init(str(path)))

    why = reasons(report)
    norm_keys = [k for k in state if ".bn" in f".{k}" or "downsample.1" in k]
    assert norm_keys
    for key in norm_keys:
        assert "BatchNorm in the file, GroupNorm in the model" in why[f"module.{key}"], key
    assert set(report.loaded) == {f"backbone.{k}" for k in state if k not in norm_keys}
    assert "backbone.bn1.weight" in report.random


# ------------------------------------------------------------------ LoRA
def test_a_lora_model_takes_plain_weights_onto_its_base_layers(tmp_path):
    plain = model("cnn", seed=3, **LORA_SPEC)
    path = tmp_path / "plain.safetensors"
    save_file(plain.state_dict(), path)
    net = model("cnn", lora_rank=2, lora_adapters=("a", "b"), **LORA_SPEC)
    adapters_before = {k: v.clone() for k, v in net.state_dict().items() if ".lora_" in k}

    report = apply_init(net, resolve_init(str(path)))

    own = net.state_dict()
    assert report.skipped == [] and report.random == []
    assert len(report.loaded) == len(plain.state_dict())
    for key, value in plain.state_dict().items():
        lora_key = key.replace(".weight", ".base_layer.weight").replace(".bias", ".base_layer.bias")
        target = lora_key if lora_key in own else key
        assert torch.equal(own[target], value), key
    assert "backbone.features.0.base_layer.weight" in report.loaded
    assert report.adapters == len(adapters_before) == 20
    assert all(torch.equal(own[k], v) for k, v in adapters_before.items())


def test_adapters_of_the_same_names_load_by_name(tmp_path):
    source = model("cnn", seed=8, lora_rank=2, lora_adapters=("a", "b"), **LORA_SPEC)
    path = tmp_path / "lora.safetensors"
    save_file(source.state_dict(), path)
    net = model("cnn", lora_rank=2, lora_adapters=("a", "c"), **LORA_SPEC)

    report = apply_init(net, resolve_init(str(path)))

    own = net.state_dict()
    assert torch.equal(
        own["backbone.features.0.lora_B.a.weight"],
        source.state_dict()["backbone.features.0.lora_B.a.weight"],
    )
    assert "backbone.features.0.lora_B.a.weight" in report.loaded
    assert "adapter" in reasons(report)["backbone.features.0.lora_A.b.weight"]
    assert "backbone.features.0.lora_A.c.weight" not in report.loaded + report.random
    assert any("10 of 20 tensors start fresh" in line for line in report.lines())


# ------------------------------------------------------------------ a finished run
@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("init_run") / "run"
    cfg = TrainConfig(
        algorithm="fedavg",
        rounds=2,
        local_steps=1,
        batch_size=8,
        device="cpu",
        backbone="cnn",
        optimizer="sgd",
        lr=0.05,
    )
    train(tensor_sites(2, n=16, size=8), cfg, out)
    return out


def test_a_finished_run_starts_a_model_with_its_last_global_weights(finished_run):
    net = model("cnn", seed=11)

    report = apply_init(net, resolve_init(str(finished_run)))

    last = finished_run / "checkpoints" / "round_0002" / "global.safetensors"
    assert report.kind == "run" and report.format == "medfed" and report.file == str(last)
    saved = load_file(last)
    own = net.state_dict()
    assert saved and all(torch.equal(own[k], v) for k, v in saved.items())
    assert sorted(report.loaded) == sorted(saved)


def test_an_unfinished_run_is_refused_naming_the_folder(finished_run, tmp_path):
    import shutil

    copy = tmp_path / "unfinished"
    shutil.copytree(finished_run, copy)
    (copy / "summary.json").unlink()

    with pytest.raises(
        RunDirError, match=r"unfinished: not a finished medfed run: no summary\.json"
    ):
        resolve_init(str(copy))


def test_a_run_whose_last_round_checkpoint_is_gone_is_refused(finished_run, tmp_path):
    import shutil

    copy = tmp_path / "cut"
    shutil.copytree(finished_run, copy)
    shutil.rmtree(copy / "checkpoints" / "round_0002")

    with pytest.raises(RunDirError, match="newest checkpoint is round 1, but the run has 2 rounds"):
        resolve_init(str(copy))


def test_a_folder_that_is_no_run_is_refused(tmp_path):
    with pytest.raises(MedfedError, match="not a medfed run directory"):
        resolve_init(str(tmp_path))


# ------------------------------------------------------------------ the report
def test_the_report_round_trips_through_toml(tv_file):
    path, _ = tv_file
    report = apply_init(model("resnet18-gn"), resolve_init(str(path)))

    text = tomli_w.dumps({"init": report.to_dict()})
    again = InitReport.from_dict(tomllib.loads(text)["init"])

    assert again == report
    assert again.lines() == report.lines()
    assert report.lines()[0].startswith(f"loaded {len(report.loaded)} tensors from {path}")
    with pytest.raises(ConfigError, match="adapters must be a whole number"):
        InitReport.from_dict(report.to_dict() | {"adapters": "3"})


def test_state_sha256_sees_names_dtypes_shapes_and_values():
    base = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.ones(2)}
    same = {"b": torch.ones(2), "a": torch.arange(6.0).reshape(2, 3)}
    variants = [
        {**base, "a": base["a"].reshape(3, 2)},
        {**base, "a": base["a"].double()},
        {**base, "b": torch.tensor([1.0, 2.0])},
        {"a2": base["a"], "b": base["b"]},
    ]
    assert state_sha256(base) == state_sha256(same)
    assert len({state_sha256(v) for v in variants} | {state_sha256(base)}) == 5
