"""The frozen-encoder mode: a pretrained torchvision backbone cut in two.

The **encoder** (:class:`FrozenEncoder`) is the backbone's first blocks, frozen: it runs once
per scan, and its output (the pooled feature vector, or the feature map before the last
``unfreeze`` blocks) is what training reads, cached on disk. The **trained part**
(:class:`EncodedBackbone`) is the rest: the last ``unfreeze`` blocks of the same network (none by
default) and the pooling, then a shared trunk (a linear layer, LayerNorm and ReLU) that every
algorithm's heads sit on. Both halves keep torchvision's own tensor names, so one ImageNet
weights file starts both: the encoder's tensors and the unfrozen blocks' tensors together are
the whole backbone.

A hospital without a GPU trains the small part only, on features that cost one forward pass
of the encoder per scan, once.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping

import torch
from torch import nn
from torch.nn import functional

from medfed.core.normalization import IMAGENET_MEAN, IMAGENET_STD, Normalization
from medfed.models.torchvision_nets import TV_BACKBONES, build_torchvision

TRUNK_DIM = 512  # width of the trained trunk on the encoder's features
ENCODE_BATCH = 32  # photos per forward pass of the encoder
IMAGENET = Normalization(mean=IMAGENET_MEAN, std=IMAGENET_STD)


class EncoderError(ValueError):
    """A frozen-encoder setting that cannot be built (backbone, number of blocks)."""


def _blocks(module: nn.Module) -> tuple[str, nn.Module, list[str]]:
    """Where a torchvision network keeps its blocks in order: (path, parent, child names)."""
    features = getattr(module, "features", None)
    if isinstance(features, nn.Sequential):  # MobileNetV2, EfficientNet
        return "features", features, [name for name, _ in features.named_children()]
    inner = getattr(features, "features", None)
    if isinstance(inner, nn.Sequential):  # DenseNetFeatures keeps torchvision's under .features
        return "features", inner, [name for name, _ in inner.named_children()]
    names = ["conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4"]
    return "", module, names  # ResNet


def _checked(backbone: str) -> str:
    if backbone not in TV_BACKBONES or backbone.endswith("-gn"):
        frozen = ", ".join(n for n in TV_BACKBONES if not n.endswith("-gn"))
        raise EncoderError(
            f"the frozen encoder needs a torchvision-shaped backbone with its ImageNet "
            f"BatchNorm ({frozen}); got {backbone!r}"
        )
    return backbone


def _pool(x: torch.Tensor, densenet: bool) -> torch.Tensor:
    """torchvision's pooling after the last block: the global mean of every channel."""
    if densenet:
        x = functional.relu(x)
    return torch.flatten(functional.adaptive_avg_pool2d(x, 1), 1)


class FrozenEncoder(nn.Module):
    """The first blocks of a torchvision network (all of them when ``unfreeze`` is 0, then
    pooled), in evaluation mode, without gradients. Its state holds torchvision's names."""

    def __init__(self, backbone: str, unfreeze: int = 0) -> None:
        super().__init__()
        self.backbone, self.unfreeze = _checked(backbone), unfreeze
        module, self.width = build_torchvision(backbone, 3)
        path, parent, names = _blocks(module)
        if not 0 <= unfreeze < len(names):
            raise EncoderError(
                f"unfreeze_blocks must be between 0 and {len(names) - 1} for {backbone} "
                f"({len(names)} blocks), got {unfreeze}"
            )
        self._densenet = backbone.startswith("tv-densenet")
        kept = names[: len(names) - unfreeze]
        self._path = path
        children = OrderedDict((n, getattr(parent, n)) for n in kept)
        if path:
            self.features = nn.Sequential(children)
        else:
            for name, child in children.items():
                setattr(self, name, child)
        self._order = kept
        self.requires_grad_(False)
        self.eval()

    def train(self, mode: bool = True) -> FrozenEncoder:
        """Always in evaluation mode: BatchNorm keeps ImageNet's running statistics."""
        return super().train(False)

    def _children_in_order(self) -> list[nn.Module]:
        holder = self.features if self._path else self
        return [getattr(holder, n) for n in self._order]

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self._children_in_order():
            x = block(x)
        return _pool(x, self._densenet) if self.unfreeze == 0 else x

    @torch.no_grad()
    def encode(self, raw: torch.Tensor, batches: Iterable[int] | None = None) -> torch.Tensor:
        """Features (float32, on the CPU) of preprocessed photos not yet normalized: (N, 3, H,
        W) in [0, 1], normalized with ImageNet's statistics as the weights expect.
        ``batches``: the start of every batch (a progress bar's iterator), by default all."""
        device = next(self.parameters()).device
        chunks = []
        starts = range(0, raw.shape[0], ENCODE_BATCH) if batches is None else batches
        for start in starts:
            batch = IMAGENET.apply(raw[start : start + ENCODE_BATCH].to(device))
            chunks.append(self(batch).float().cpu())
        if not chunks:
            return torch.zeros((0, *self.output_shape(tuple(raw.shape[-2:]))))
        return torch.cat(chunks)

    def output_shape(self, image_size: tuple[int, int]) -> tuple[int, ...]:
        """The shape of one scan's features for images of ``image_size`` (H, W)."""
        probe = torch.zeros(1, 3, *image_size, device=next(self.parameters()).device)
        return tuple(int(d) for d in self(probe).shape[1:])

    def load_torchvision(self, state: Mapping[str, torch.Tensor]) -> list[str]:
        """Load this encoder's tensors from ``state``, named as the torchvision-shaped backbone
        names them (every one must be there, in its shape); returns the keys it took."""
        own = self.state_dict()
        missing = [k for k in own if k not in state]
        if missing:
            raise EncoderError(
                f"the weights hold no tensor for {len(missing)} of the frozen encoder's "
                f"{len(own)} tensors ({', '.join(missing[:3])}, ...); give the torchvision "
                f"ImageNet file of {self.backbone}"
            )
        loaded = {k: state[k] for k in own}
        for key, tensor in loaded.items():
            if tensor.shape != own[key].shape:
                raise EncoderError(
                    f"frozen encoder tensor {key}: the weights have shape {tuple(tensor.shape)}, "
                    f"the {self.backbone} encoder {tuple(own[key].shape)}"
                )
        self.load_state_dict({k: v.to(own[k].dtype) for k, v in loaded.items()}, strict=True)
        return list(own)


class EncodedBackbone(nn.Module):
    """What trains on the encoder's features: the last ``unfreeze`` blocks of the network
    (torchvision's names and weights), its pooling, then the shared trunk."""

    def __init__(self, backbone: str, unfreeze: int, in_width: int) -> None:
        super().__init__()
        module, width = build_torchvision(_checked(backbone), 3)
        path, parent, names = _blocks(module)
        if not 0 <= unfreeze < len(names):
            raise EncoderError(
                f"unfreeze_blocks must be between 0 and {len(names) - 1} for {backbone}, "
                f"got {unfreeze}"
            )
        self.unfreeze = unfreeze
        self._densenet = backbone.startswith("tv-densenet")
        self._order = names[len(names) - unfreeze :] if unfreeze else []
        self._path = path
        children = OrderedDict((n, getattr(parent, n)) for n in self._order)
        if path:
            self.features = nn.Sequential(children)
        else:
            for name, child in children.items():
                setattr(self, name, child)
        pooled = width if unfreeze else in_width
        self.trunk = nn.Sequential(nn.Linear(pooled, TRUNK_DIM), nn.LayerNorm(TRUNK_DIM), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._order:
            holder = self.features if self._path else self
            for name in self._order:
                x = getattr(holder, name)(x)
            x = _pool(x, self._densenet)
        return self.trunk(x)


class EncoderView(nn.Module):
    """What a closed-form client head reads of the frozen encoder's output: pooled where it is
    a feature map, then power-normalized (sign(f) sqrt|f|). The pooled activations of a ReLU
    network are skewed and non-negative; their square roots are much closer to the Gaussian
    shape a linear discriminant assumes (on the real federation's validation photos: routing
    0.972 with it, 0.958 on the raw features, shrinkage 0.1)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 4:
            x = torch.flatten(functional.adaptive_avg_pool2d(x.float(), 1), 1)
        return torch.sign(x) * torch.sqrt(torch.abs(x))


def encoded_backbone(backbone: str, unfreeze: int, in_width: int) -> tuple[nn.Module, int]:
    """The trained part of the frozen-encoder mode and its output width."""
    return EncodedBackbone(backbone, unfreeze, in_width), TRUNK_DIM
