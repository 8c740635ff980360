"""The frozen-encoder feature pass against a plain torchvision forward loop (part of
``medfed bench-throughput``).

Both sides start from photos on disk and end with every photo's pooled MobileNetV2 features:
medfed loads the site into an empty cache (decoding every photo once, in its decode threads)
and passes each split through the frozen encoder (:func:`medfed.federation.features.
encoded_site`, cached); the plain loop is a ``DataLoader`` whose workers decode, resize and
centre-crop each photo as torchvision's ImageNet recipe does, into ``torchvision.models.
mobilenet_v2``'s ``features`` and pooling, without gradients. The same network (seeded random
weights: the speed does not depend on them), the same photos, the same batch.
"""

from __future__ import annotations

import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from medfed.config import load_manifest
from medfed.data.cache import TensorCache
from medfed.data.records import Split
from medfed.data.sitedata import load_site
from medfed.federation.features import Encoder, encoded_site
from medfed.federation.pretrained import state_sha256
from medfed.models.device import DeviceSetup
from medfed.models.encoder import ENCODE_BATCH, IMAGENET, FrozenEncoder

BACKBONE = "tv-mobilenet-v2"
FEATURE_GOAL = 0.95  # medfed's feature pass at least this share of the plain loop's images/s


class PhotoFiles:
    """The torchvision way: open, resize, centre-crop, to tensor, normalize, flip at random."""

    def __init__(
        self, paths: list, labels: list[int], size: int, mean, std, flip: bool = True
    ) -> None:
        from torchvision import transforms

        self.paths, self.labels = paths, labels
        steps = [transforms.Resize(size), transforms.CenterCrop(size)]
        steps += [transforms.RandomHorizontalFlip()] if flip else []
        steps += [transforms.ToTensor(), transforms.Normalize(mean, std)]
        self.transform = transforms.Compose(steps)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        with Image.open(self.paths[i]) as image:
            return self.transform(image.convert("RGB")), self.labels[i]


def _encoder(setup: DeviceSetup) -> Encoder:
    torch.manual_seed(0)
    module = FrozenEncoder(BACKBONE).to(setup.device)
    return Encoder(module, "bench (seeded random weights)", state_sha256(module.state_dict()))


def _plain_net(setup: DeviceSetup) -> torch.nn.Module:
    import torchvision

    torch.manual_seed(0)
    return torchvision.models.mobilenet_v2().features.to(setup.device).eval()


def _medfed_pass(manifest: Path, cache_dir: Path, encoder: Encoder) -> tuple[list[Path], float]:
    """Photos on disk to cached features, as a run in the frozen-encoder mode does it, from an
    empty cache; the photos' paths and the seconds it took."""
    shutil.rmtree(cache_dir, ignore_errors=True)
    start = time.perf_counter()
    cache = TensorCache(cache_dir)
    site = encoded_site(load_site(load_manifest(manifest), cache), encoder, cache)
    seconds = time.perf_counter() - start
    return [r.path for split in Split for r in site.records[split]], seconds


def _plain_pass(
    paths: list[Path], size: int, workers: int, net: torch.nn.Module, setup: DeviceSetup
) -> float:
    """Photos on disk to pooled features through a DataLoader and torchvision's network; the
    seconds it took."""
    from torch.utils.data import DataLoader

    mean, std = list(IMAGENET.mean), list(IMAGENET.std)
    files = PhotoFiles(paths, [0] * len(paths), size, mean, std, flip=False)
    loader = DataLoader(files, batch_size=ENCODE_BATCH, num_workers=workers)
    start = time.perf_counter()
    with torch.no_grad():
        for xb, _ in loader:
            out = net(xb.to(setup.device))
            torch.flatten(torch.nn.functional.adaptive_avg_pool2d(out, 1), 1).cpu()
    return time.perf_counter() - start


def feature_figures(
    manifest: Path, cache_dir: Path, size: int, workers: int, setup: DeviceSetup, repeats: int
) -> dict[str, Any]:
    """Both feature passes from nothing cached, ``repeats`` times back to back (in turn
    first), after one warm-up batch through each network: each side's images/s per repeat,
    the medians, and the median of the repeats' ratios."""
    encoder, net = _encoder(setup), _plain_net(setup)
    with torch.no_grad():  # the first pass of a batch shape builds the kernels: not counted
        probe = torch.zeros(ENCODE_BATCH, 3, size, size, device=setup.device)
        encoder.module(probe), net(probe)
    paths, _ = _medfed_pass(manifest, cache_dir, encoder)
    rates: dict[str, list[float]] = {"medfed": [], "plain": []}
    for turn in range(repeats):
        sides = [
            ("medfed", lambda: _medfed_pass(manifest, cache_dir, encoder)[1]),
            ("plain", lambda: _plain_pass(paths, size, workers, net, setup)),
        ]
        for side, run in sides if turn % 2 == 0 else sides[::-1]:
            rates[side].append(len(paths) / run())
    ratios = [a / b for a, b in zip(rates["medfed"], rates["plain"], strict=True)]
    return {
        "images": len(paths),
        "runs": rates,
        "median": {side: statistics.median(v) for side, v in rates.items()},
        "ratios": ratios,
        "ratio": statistics.median(ratios),
        "goal": FEATURE_GOAL,
    }


def feature_row(features: dict[str, Any]) -> list[str]:
    """The table row of the feature pass."""
    return [
        "frozen-encoder feature pass (nothing cached)",
        f"{features['median']['medfed']:.1f}",
        f"{features['median']['plain']:.1f}",
        f"{features['ratio']:.2f} (goal >= {features['goal']:.2f})",
    ]


def feature_words(features: dict[str, Any], workers: int) -> str:
    """How the feature pass was measured."""
    return (
        f"Feature pass: the same {features['images']} photos from disk to pooled "
        f"MobileNetV2 features (seeded random weights, batch {ENCODE_BATCH}): medfed loads the "
        "site into an empty cache (its decode threads) and runs the frozen encoder over each "
        f"split; the plain loop is a DataLoader with {workers} worker(s) decoding, resizing and "
        "centre-cropping each photo into torchvision.models.mobilenet_v2's features and "
        f"pooling, without gradients; {len(features['ratios'])} repeats back to back (in turn "
        "first) after a warm-up batch through each network, medians of each side's images/s "
        "and, as the ratio, the median of the repeats' ratios."
    )
