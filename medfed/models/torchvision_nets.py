"""torchvision-shaped backbones: torchvision's own networks, classifier removed, under
torchvision's own tensor names, so that its ImageNet weights load into them tensor for tensor.

They are for clinical resolutions (224-512 px fundus photos): a 7x7 stride-2 stem and a max-pool
bring the image down fourfold before the first stage, where medfed's small ResNet-18 (a 3x3
stride-1 stem, no max-pool) works on every pixel. Each has a GroupNorm twin (``-gn``) for the
algorithms and privacy settings that need one (DP-SGD, sites that keep no batch statistics):
every BatchNorm is swapped for a GroupNorm of the same width. ImageNet's BatchNorm weights never
start a GroupNorm layer (their scale and shift were learnt against running statistics that a
GroupNorm does not have), so a ``-gn`` backbone loads every convolution from torchvision's file
and starts its norm layers fresh; ``--init`` reports them.
"""

from __future__ import annotations

import math
import types
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional

TV_GROUPS = 32  # GroupNorm's groups, reduced to a divisor of narrow layers


@dataclass(frozen=True)
class TorchvisionNet:
    """One torchvision architecture: its constructor, feature width and ImageNet weights."""

    constructor: str  # the function in torchvision.models
    features: int  # width of the pooled features the classifier used to take
    classifier: str  # the attribute holding torchvision's classifier
    weights: tuple[str, str]  # (weights enum in torchvision.models, member): the hub file
    summary: str


TV_NETS: dict[str, TorchvisionNet] = {
    "tv-resnet18": TorchvisionNet(
        "resnet18", 512, "fc", ("ResNet18_Weights", "IMAGENET1K_V1"), "torchvision ResNet-18"
    ),
    "tv-resnet34": TorchvisionNet(
        "resnet34", 512, "fc", ("ResNet34_Weights", "IMAGENET1K_V1"), "torchvision ResNet-34"
    ),
    "tv-resnet50": TorchvisionNet(
        "resnet50", 2048, "fc", ("ResNet50_Weights", "IMAGENET1K_V2"), "torchvision ResNet-50"
    ),
    "tv-densenet121": TorchvisionNet(
        "densenet121",
        1024,
        "classifier",
        ("DenseNet121_Weights", "IMAGENET1K_V1"),
        "torchvision DenseNet-121",
    ),
    "tv-efficientnet-b0": TorchvisionNet(
        "efficientnet_b0",
        1280,
        "classifier",
        ("EfficientNet_B0_Weights", "IMAGENET1K_V1"),
        "torchvision EfficientNet-B0",
    ),
    "tv-mobilenet-v2": TorchvisionNet(
        "mobilenet_v2",
        1280,
        "classifier",
        ("MobileNet_V2_Weights", "IMAGENET1K_V1"),
        "torchvision MobileNetV2",
    ),
}
# Every architecture with BatchNorm (as torchvision has it) and with GroupNorm.
TV_BACKBONES: tuple[str, ...] = tuple(n for name in TV_NETS for n in (name, f"{name}-gn"))
TV_SUMMARIES: dict[str, str] = {
    name: f"{TV_NETS[name.removesuffix('-gn')].summary} with "
    f"{'GroupNorm' if name.endswith('-gn') else 'BatchNorm'}, for 128-512 pixel images "
    "(2-D, fundus; loads torchvision's ImageNet weights)"
    for name in TV_BACKBONES
}


def tv_net(name: str) -> TorchvisionNet:
    """The architecture of the torchvision-shaped backbone ``name`` (``-gn`` or not)."""
    return TV_NETS[name.removesuffix("-gn")]


def build_torchvision(name: str, in_channels: int) -> tuple[nn.Module, int]:
    """torchvision's network ``name`` with fresh weights (torchvision's own initialisation) and
    its classifier removed, so it returns the pooled (N, features) batch."""
    import torchvision.models

    net = tv_net(name)
    module = getattr(torchvision.models, net.constructor)(weights=None)
    setattr(module, net.classifier, nn.Identity())  # EfficientNet's and MobileNet's dropout too
    if net.constructor.startswith("densenet"):
        module = DenseNetFeatures(module.features)
    if in_channels != 3:
        _refit_first_conv(module, in_channels)
    if name.endswith("-gn"):
        _to_group_norm(module)
        # DP-SGD hooks every layer; an activation that overwrites a hooked layer's output
        # breaks its backward pass, so the twins for DP-SGD compute out of place.
        for layer in module.modules():
            if hasattr(layer, "inplace"):
                layer.inplace = False
            if type(layer).__name__ in ("BasicBlock", "Bottleneck"):
                layer.forward = types.MethodType(_residual_out_of_place, layer)
    return module, net.features


def _residual_out_of_place(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """torchvision's ResNet block with its shortcut added out of place (torchvision adds it in
    place, onto the output of the hooked norm layer)."""
    out = self.relu(self.bn1(self.conv1(x)))
    if hasattr(self, "conv3"):  # a bottleneck
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
    else:
        out = self.bn2(self.conv2(out))
    shortcut = x if self.downsample is None else self.downsample(x)
    return self.relu(out + shortcut)


class DenseNetFeatures(nn.Module):
    """torchvision's DenseNet without its classifier, its ``features`` under the same name; its
    last activation is out of place (torchvision's forward applies one in place)."""

    def __init__(self, features: nn.Module) -> None:
        super().__init__()
        self.features = features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = functional.relu(self.features(x))
        return torch.flatten(functional.adaptive_avg_pool2d(out, 1), 1)


def _refit_first_conv(module: nn.Module, in_channels: int) -> None:
    """The stem's convolution for ``in_channels`` channels (its ImageNet weights then skip)."""
    for parent in module.modules():
        for child_name, child in parent.named_children():
            if isinstance(child, nn.Conv2d):
                setattr(
                    parent,
                    child_name,
                    nn.Conv2d(
                        in_channels,
                        child.out_channels,
                        child.kernel_size,
                        child.stride,
                        child.padding,
                        bias=child.bias is not None,
                    ),
                )
                return


def _to_group_norm(module: nn.Module) -> None:
    """Every BatchNorm2d -> a GroupNorm over the same channels (weight 1, bias 0)."""
    for child_name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d):
            channels = child.num_features
            setattr(module, child_name, nn.GroupNorm(math.gcd(TV_GROUPS, channels), channels))
        else:
            _to_group_norm(child)
