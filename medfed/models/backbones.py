"""Feature extractors: an image batch in, a flat (N, feat_dim) feature batch out.

All backbones start from random weights (no pretrained downloads) with Kaiming initialisation.
2D backbones take (N, C, H, W) fundus batches; 3D backbones take (N, C, D, H, W) CT volumes.
The 2.5-D ``slices-*`` backbones also take CT volumes: a 2-D network sees every slice together
with its two neighbours as 3C channels, and its feature maps are pooled over slices and positions.
They hold the same layers, under the same names, as their 2-D counterparts, so 2-D weights (a
fundus run's, torchvision's ImageNet ResNet-18) start them.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable

import torch
from torch import nn

from medfed.core.errors import ConfigError
from medfed.models.torchvision_nets import TV_BACKBONES, TV_SUMMARIES, build_torchvision

BACKBONES_2D: tuple[str, ...] = ("cnn", "cnn-gn", "resnet18-gn", "resnet18-bn", *TV_BACKBONES)
# 2.5-D: a 2-D network on every slice of a volume (see on_slices); -> its 2-D counterpart.
SLICE_BACKBONES: dict[str, str] = {
    "slices-cnn": "cnn",
    "slices-cnn-gn": "cnn-gn",
    "slices-resnet18-gn": "resnet18-gn",
    "slices-resnet18-bn": "resnet18-bn",
}
BACKBONES_3D: tuple[str, ...] = ("monai3d", "monai3d-gn", *SLICE_BACKBONES)
BACKBONES: tuple[str, ...] = BACKBONES_2D + BACKBONES_3D
# One line per backbone, shown by the CLI's help.
BACKBONE_SUMMARIES: dict[str, str] = {
    "cnn": "small 4-block CNN with BatchNorm (2-D, fundus)",
    "cnn-gn": "small 4-block CNN with GroupNorm (2-D, fundus)",
    "resnet18-gn": "ResNet-18 with GroupNorm, for 32-128 pixel images (2-D, fundus)",
    "resnet18-bn": "ResNet-18 with BatchNorm, for 32-128 pixel images (2-D, fundus)",
    "monai3d": "MONAI 3-D ResNet with BatchNorm (3-D, CT volumes)",
    "monai3d-gn": "MONAI 3-D ResNet with GroupNorm (3-D, CT volumes)",
    "slices-cnn": "small CNN with BatchNorm on each slice + neighbours (2.5-D, CT volumes)",
    "slices-cnn-gn": "small CNN with GroupNorm on each slice + neighbours (2.5-D, CT volumes)",
    "slices-resnet18-gn": "ResNet-18 with GroupNorm on each slice + neighbours (2.5-D, CT volumes)",
    "slices-resnet18-bn": "ResNet-18 with BatchNorm on each slice + neighbours (2.5-D, CT volumes)",
    **TV_SUMMARIES,
}

CNN_WIDTHS = (16, 32, 64, 128)
RESNET18_WIDTHS = (64, 128, 256, 512)
RESNET18_DEPTHS = (2, 2, 2, 2)
MONAI3D_WIDTHS = (16, 32, 64, 128)
CNN_GROUPS = 8
RESNET_GROUPS = 16
MONAI3D_GROUPS = 8
# A slice is given with the slice before and after it (the edge slices repeated), so a 2-D
# network made for RGB photos takes it; its feature maps are pooled over slices and positions by
# their maximum (a lesion shows at a few places of a few slices only) and their mean, concatenated.
SLICE_CONTEXT = 3
SLICE_POOLS = 2

NormFactory = Callable[[int], nn.Module]
_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


class ModelConfigError(ConfigError, ValueError):
    """A model setting is invalid (unknown backbone, impossible size)."""


def spatial_dims(name: str) -> int:
    """Number of spatial axes the named backbone expects: 2 for fundus photos, 3 for CT."""
    _check_name(name)
    return 3 if name in BACKBONES_3D else 2


def build_backbone(name: str, in_channels: int) -> tuple[nn.Module, int]:
    """Build the named backbone with fresh weights; return it and its feature width."""
    _check_name(name)
    if in_channels < 1:
        raise ModelConfigError(f"backbone {name!r}: in_channels must be >= 1, got {in_channels}")
    if name in TV_BACKBONES:  # torchvision's own initialisation, as its ImageNet training began
        return build_torchvision(name, in_channels)
    sliced = name in SLICE_BACKBONES
    flat = SLICE_BACKBONES.get(name, name)  # a 2.5-D backbone's 2-D network
    channels = in_channels * SLICE_CONTEXT if sliced else in_channels
    if flat in ("cnn", "cnn-gn"):
        norm = _batch_norm_2d if flat == "cnn" else _group_norm(CNN_GROUPS)
        module, feat = (SliceCNN if sliced else SmallCNN)(channels, norm), CNN_WIDTHS[-1]
    elif flat in ("resnet18-gn", "resnet18-bn"):
        norm = _batch_norm_2d if flat == "resnet18-bn" else _group_norm(RESNET_GROUPS)
        module, feat = (SliceResNet18 if sliced else ResNet18)(channels, norm), RESNET18_WIDTHS[-1]
    else:
        module, feat = _monai_resnet3d(in_channels, group_norm=name == "monai3d-gn")
    if sliced:
        feat *= SLICE_POOLS
    kaiming_init(module)
    if isinstance(module, ResNet18):
        module.zero_init_residual_norms()
    return module, feat


def kaiming_init(module: nn.Module) -> None:
    """Kaiming-normal weights and zero biases for every conv and linear layer in ``module``."""
    for m in module.modules():
        if isinstance(m, nn.Conv1d | nn.Conv2d | nn.Conv3d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.Linear):
            nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
        else:
            continue
        if m.bias is not None:
            nn.init.zeros_(m.bias)


def _check_name(name: str) -> None:
    if name not in BACKBONES:
        raise ModelConfigError(
            f"unknown backbone {name!r}; choose one of: {', '.join(BACKBONES)} "
            "(set 'backbone' in the training config, or 'auto' for the modality's default)"
        )


def _batch_norm_2d(channels: int) -> nn.Module:
    return nn.BatchNorm2d(channels)


def _group_norm(groups: int) -> NormFactory:
    """Factory for GroupNorm; the group count is reduced to a divisor of narrow layers."""

    def make(channels: int) -> nn.Module:
        return nn.GroupNorm(math.gcd(groups, channels), channels)

    return make


class SmallCNN(nn.Module):
    """Four conv3x3-norm-ReLU-maxpool blocks, then global average pooling."""

    def __init__(self, in_channels: int, norm: NormFactory) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        prev = in_channels
        for width in CNN_WIDTHS:
            layers += [
                nn.Conv2d(prev, width, 3, padding=1, bias=False),
                norm(width),
                nn.ReLU(inplace=True),
                # ceil_mode keeps a 1-pixel map alive, so inputs as small as 8x8 still work.
                nn.MaxPool2d(2, ceil_mode=True),
            ]
            prev = width
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(self.pool(self.features(x)), 1)


class BasicBlock(nn.Module):
    """Two conv3x3 layers with an identity (or 1x1 projection) shortcut."""

    def __init__(self, in_ch: int, out_ch: int, stride: int, norm: NormFactory) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1, bias=False)
        self.norm1 = norm(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1, bias=False)
        self.norm2 = norm(out_ch)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), norm(out_ch)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18 with a 3x3 stride-1 stem and no max-pool, sized for 32-128 pixel images."""

    def __init__(self, in_channels: int, norm: NormFactory) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, RESNET18_WIDTHS[0], 3, padding=1, bias=False),
            norm(RESNET18_WIDTHS[0]),
            nn.ReLU(inplace=True),
        )
        stages: list[nn.Module] = []
        prev = RESNET18_WIDTHS[0]
        for i, (width, depth) in enumerate(zip(RESNET18_WIDTHS, RESNET18_DEPTHS, strict=True)):
            stride = 1 if i == 0 else 2
            blocks = [BasicBlock(prev, width, stride, norm)]
            blocks += [BasicBlock(width, width, 1, norm) for _ in range(depth - 1)]
            stages.append(nn.Sequential(*blocks))
            prev = width
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def zero_init_residual_norms(self) -> None:
        """Start each residual branch at zero so every block begins as the identity."""
        for m in self.modules():
            if isinstance(m, BasicBlock):
                nn.init.zeros_(m.norm2.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(self.pool(self.stages(self.stem(x))), 1)


def neighbour_slices(x: torch.Tensor) -> torch.Tensor:
    """(N, C, D, H, W) volumes -> (N*D, 3C, H, W): slice k as channels [k-1, k, k+1] (C each).

    The first and last slices stand in for their missing neighbour (edge slices repeated).
    """
    if x.dim() != 5:
        raise ModelConfigError(
            f"a slices backbone takes CT volumes, batches of 5 axes (N, C, D, H, W), but got "
            f"shape {tuple(x.shape)}"
        )
    n, c, d, h, w = x.shape
    padded = torch.cat([x[:, :, :1], x, x[:, :, -1:]], dim=2)
    context = torch.cat([padded[:, :, i : i + d] for i in range(SLICE_CONTEXT)], dim=1)
    slices = context.transpose(1, 2).reshape(n * d, SLICE_CONTEXT * c, h, w)
    if slices.is_cuda:
        # cuDNN's fast 2-D kernels want channels-last; the volume itself is (N, C, D, H, W).
        slices = slices.contiguous(memory_format=torch.channels_last)
    return slices


def pool_slices(features: torch.Tensor, n: int) -> torch.Tensor:
    """(N*D, F, ...) per-slice feature maps -> (N, 2F): the maximum over each volume's slices
    and positions, then the mean.

    A small lesion lights up a few positions of a few slices: averaging a slice's map first
    would dilute it a hundredfold, so the maximum is taken over positions too (on the synthetic
    CT federation, per-slice averages learned the lesion task about half as well per step).
    """
    f = features.shape[1]
    per_volume = features.reshape(n, -1, f, *features.shape[2:]).transpose(1, 2).reshape(n, f, -1)
    return torch.cat([per_volume.amax(dim=2), per_volume.mean(dim=2)], dim=1)


def on_slices(net: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Run the 2-D feature-map network ``net`` on every slice of the volumes ``x`` (with its
    neighbours); pool the maps."""
    return pool_slices(net(neighbour_slices(x)), x.shape[0])


class SliceCNN(SmallCNN):
    """SmallCNN's convolutions on every slice of a CT volume and its two neighbours, max- and
    mean-pooled over slices and positions."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return on_slices(self.features, x)


class SliceResNet18(ResNet18):
    """ResNet18's convolutions on every slice of a CT volume and its two neighbours, max- and
    mean-pooled over slices and positions."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return on_slices(lambda t: self.stages(self.stem(t)), x)


def _monai_resnet3d(in_channels: int, group_norm: bool) -> tuple[nn.Module, int]:
    # Imported here: MONAI takes seconds to import and 2-D models never need it.
    from monai.networks.nets import ResNet as MonaiResNet

    net = MonaiResNet(
        block="basic",
        layers=[1, 1, 1, 1],
        block_inplanes=list(MONAI3D_WIDTHS),
        spatial_dims=3,
        n_input_channels=in_channels,
        conv1_t_size=3,  # CT volumes are already coarse (about 4 mm voxels); 7^3 would be wasted
        conv1_t_stride=1,
        feed_forward=False,
    )
    for module in net.modules():
        if type(module).__name__ == "ResNetBlock":
            module.forward = types.MethodType(_residual_block_forward, module)
    if group_norm:
        # MONAI 1.6.1's ResNet applies its `norm` argument to the stem only (residual blocks and
        # shortcuts always get BatchNorm), so every BatchNorm is swapped here instead.
        _replace_batch_norm(net, _group_norm(MONAI3D_GROUPS))
    return net, MONAI3D_WIDTHS[-1]


def _residual_block_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """MONAI's basic residual block with the shortcut added out of place (MONAI adds it in
    place, which autograd refuses once DP-SGD's per-scan hooks wrap the norm's output); the
    arithmetic is the same."""
    out = self.act(self.bn1(self.conv1(x)))
    out = self.bn2(self.conv2(out))
    residual = x if self.downsample is None else self.downsample(x)
    return self.act(out + residual)


def group_norm_twin(name: str) -> str | None:
    """The GroupNorm backbone of the same architecture as ``name`` (None: there is none)."""
    if name in BACKBONES and name.endswith("-gn"):
        return name
    if name in TV_BACKBONES:
        return f"{name}-gn"
    twin = {"cnn": "cnn-gn", "resnet18-bn": "resnet18-gn", "monai3d": "monai3d-gn"}
    return twin.get(name)


def _replace_batch_norm(module: nn.Module, make: NormFactory) -> None:
    for name, child in module.named_children():
        if isinstance(child, _BATCH_NORMS):
            setattr(module, name, make(child.num_features))
        else:
            _replace_batch_norm(child, make)
