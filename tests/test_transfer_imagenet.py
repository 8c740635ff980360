"""The transfer experiment's ImageNet start: trained where torchvision's weights file is in the
local hub cache, skipped with its reason where it is not (nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path

import pytest

from medfed.experiments.transfer import (
    ARMS,
    IMAGENET_PAIR,
    PAIRS,
    arm_init,
    arms_of,
    chosen_pairs,
    imagenet_text,
    imagenet_weights,
)


def test_without_the_weights_file_the_imagenet_start_is_skipped_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))

    path, reason = imagenet_weights()

    assert path.parent == tmp_path / "torch" / "hub" / "checkpoints"
    assert reason is not None and str(path) in reason and "TORCH_HOME" in reason
    assert chosen_pairs(False) == PAIRS and arms_of(PAIRS) == ARMS
    text = imagenet_text({"imagenet": {"weights": str(path), "skipped": reason}})
    assert text.startswith("ImageNet start: skipped;") and path.name in text


def test_with_the_weights_file_the_imagenet_pair_trains_at_224_px(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    path, _ = imagenet_weights()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"weights")

    found, reason = imagenet_weights()

    assert found == path and reason is None
    assert chosen_pairs(True)[-1] is IMAGENET_PAIR
    pretrained, random = IMAGENET_PAIR.pretrained, IMAGENET_PAIR.random
    assert arm_init(pretrained, tmp_path / "base") == "torchvision:resnet18"
    assert arm_init(random, tmp_path / "base") is None
    # the two differ only in their start: same model, resolution and normalization
    assert (
        (pretrained.backbone, pretrained.image_size, pretrained.normalization)
        == (
            random.backbone,
            random.image_size,
            random.normalization,
        )
        == ("tv-resnet18", 224, "imagenet")
    )
    # the other pairs still start from the FedAvg base
    assert arm_init(PAIRS[0].pretrained, tmp_path / "base") == str(tmp_path / "base")
    assert "ImageNet start: FedAvg on tv-resnet18 at 224 px" in imagenet_text(
        {"imagenet": {"weights": str(path), "skipped": None}}
    )
