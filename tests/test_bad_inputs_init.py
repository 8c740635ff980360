"""The bad-input corpus, starting weights (``medfed train --init``): sources that do not exist
or cannot be read, files that hold objects rather than tensors, unfinished runs, weights that do
not fit, and settings that contradict each other (see tests/badinput.py for the policy).

Every row fails before any training starts.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.badinput import Case, Shared, check


def _train(*options, algorithm: str = "fedavg"):
    """`medfed train` on two shared sites (read only) with ``options``; fails before training."""

    def make(tmp: Path, s: Shared) -> list:
        argv = ["train", "--sites", *s.manifests()[:2], "--device", "cpu", "--no-progress"]
        argv += ["--out", tmp / "run", "--algorithm", algorithm, "--rounds", "1"]
        return [*argv, *(o(tmp, s) if callable(o) else o for o in options)]

    return make


def _file(name: str, write):
    def make(tmp: Path, s: Shared) -> Path:
        path = tmp / name
        write(path)
        return path

    return make


def _unfinished_run(tmp: Path, s: Shared) -> Path:
    run = s.copy_run(tmp)
    (run / "summary.json").unlink()
    return run


def _nan_weights(path: Path) -> None:
    save_file({"backbone.features.0.weight": torch.full((16, 3, 3, 3), float("nan"))}, str(path))


def _objects(path: Path) -> None:
    torch.save({"backbone.features.0.weight": Path("not-a-tensor")}, path)


def _unrelated(path: Path) -> None:
    """Weights of another model: not one tensor name matches this one's."""
    save_file(
        {"encoder.layer1.weight": torch.zeros(8, 4), "decoder.bias": torch.zeros(4)}, str(path)
    )


def _resnet_file(path: Path) -> None:
    """A torchvision ResNet's names (ResNet-18, -34 and -50 share them): which one is it?"""
    torch.save(
        {"conv1.weight": torch.zeros(64, 3, 7, 7), "layer1.0.conv1.weight": torch.zeros(1)}, path
    )


def _wrong_shape(path: Path) -> None:
    save_file({"backbone.features.0.weight": torch.zeros(16, 3, 5, 5)}, str(path))


CASES = [
    Case(
        "init names a file that does not exist",
        _train("--init", lambda tmp, s: tmp / "nosuch.pt"),
        2,
        ("nosuch.pt",),
    ),
    Case(
        "init file is not a weight file",
        _train("--init", _file("garbage.pt", lambda p: p.write_bytes(b"not weights"))),
        2,
        ("garbage.pt",),
    ),
    Case(
        "init file holds python objects",
        _train("--init", _file("objects.pt", _objects)),
        2,
        ("objects.pt", "Path"),
    ),
    Case(
        "init weights hold NaN",
        _train("--init", _file("nan.safetensors", _nan_weights)),
        2,
        ("nan.safetensors", "backbone.features.0.weight"),
    ),
    Case(
        "init weights of the wrong shape under --init-strict",
        _train(
            "--backbone", "cnn", "--init-strict", "--init", _file("shape.safetensors", _wrong_shape)
        ),
        2,
        ("backbone.features.0.weight", "(16, 3, 5, 5)", "(16, 3, 3, 3)", "--init-strict"),
    ),
    Case(
        "init names an unknown torchvision model",
        _train("--init", "torchvision:resnet5000"),
        2,
        ("resnet5000", "resnet18"),
    ),
    Case(
        "init names an unfinished run",
        _train("--init", _unfinished_run),
        2,
        ("summary.json", "finish"),
    ),
    Case(
        "init weights of which no tensor fits the model",
        _train("--init", _file("unrelated.safetensors", _unrelated)),
        2,
        ("unrelated.safetensors", "none of its 2 tensor(s) fits", "random weights"),
    ),
    Case(
        "init weights all of the wrong shape (without --init-strict)",
        _train("--backbone", "cnn", "--init", _file("shape.safetensors", _wrong_shape)),
        2,
        ("shape.safetensors", "fits this model", "(16, 3, 5, 5)"),
    ),
    Case("init is empty", _train("--init", ""), 2, ("--init is empty", "leave --init out")),
    Case("init is blank", _train("--init", "  "), 2, ("--init is empty",)),
    Case("init-strict without init", _train("--init-strict"), 2, ("--init-strict", "--init")),
    Case(
        "init-normalization that does not exist",
        _train("--init-normalization", "cifar"),
        2,
        ("--init-normalization", "cifar"),
    ),
    Case(
        "init-normalization contradicting normalization",
        _train("--normalization", "federation", "--init-normalization", "imagenet"),
        2,
        ("--normalization", "--init-normalization"),
    ),
    Case(
        "lora on random weights",
        _train(algorithm="lora"),
        2,
        ("lora", "--init", "warmup_rounds"),
    ),
    Case(
        "unfreeze-blocks without the frozen encoder",
        _train("--unfreeze-blocks", "2"),
        2,
        ("--unfreeze-blocks", "--frozen-encoder"),
    ),
    Case(
        "frozen encoder without init", _train("--frozen-encoder"), 2, ("--frozen-encoder", "--init")
    ),
    Case(
        "frozen encoder on a medfed run's weights",
        _train("--frozen-encoder", "--init", lambda tmp, s: s.run),
        2,
        ("--frozen-encoder", "torchvision", "medfed weights"),
    ),
    Case(
        "negative unfreeze-blocks",
        _train("--frozen-encoder", "--init", "torchvision:mobilenet_v2", "--unfreeze-blocks", "-1"),
        2,
        ("--unfreeze-blocks", "-1"),
    ),
    Case(
        "frozen encoder from a file whose network cannot be told",
        _train("--frozen-encoder", "--init", _file("resnet.pt", _resnet_file)),
        2,
        ("cannot tell which torchvision network", "--backbone", "tv-resnet18"),
    ),
    Case(
        "feddrm's closed-form client head without the frozen encoder",
        _train("--param", "client=discriminant", algorithm="feddrm"),
        2,
        ("client=discriminant", "--frozen-encoder", "client=trained"),
    ),
    Case(
        "feddrm with an unknown client head rule",
        _train("--param", "client=gradient", algorithm="feddrm"),
        2,
        ("client", "auto, trained, discriminant"),
    ),
    Case(
        "lora given both init and a warm-up",
        _train("--param", "warmup_rounds=2", "--init", lambda tmp, s: s.run, algorithm="lora"),
        2,
        ("--init", "warmup_rounds", "one of them"),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_bad_input_gets_a_clear_answer(case: Case, tmp_path, shared: Shared) -> None:
    check(case, tmp_path, shared)
