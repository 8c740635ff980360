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


def _encoder(setup: DeviceSetup) -> Encoder:
    torch.manual_seed(0)
    module = FrozenEncoder(BACKBONE).to(setup.device)
    return Encoder(module, "bench (seeded random weights)", state_sha256(module.state_dict()))


def _medfed_pass(manifest: Path, cache_dir: Path, setup: DeviceSetup) -> tuple[int, float]:
    """Photos on disk to cached features, as a run in the frozen-encoder mode does it."""
    encoder = _encoder(setup)
    start = time.perf_counter()
    cache = TensorCache(cache_dir)
    site = encoded_site(load_site(load_manifest(manifest), cache), encoder, cache)
    seconds = time.perf_counter() - start
    return sum(site.n(split) for split in Split), seconds


def _plain_pass(
    paths: list[Path], size: int, workers: int, setup: DeviceSetup
) -> tuple[int, float]:
    """Photos on disk to pooled features through a DataLoader and torchvision's network."""
    import torchvision
    from torch.utils.data import DataLoader

    from medfed.experiments.throughput import _PhotoFiles

    torch.manual_seed(0)
    net = torchvision.models.mobilenet_v2().features.to(setup.device).eval()
    mean, std = list(IMAGENET.mean), list(IMAGENET.std)
    files = _PhotoFiles(paths, [0] * len(paths), size, mean, std, flip=False)
    loader = DataLoader(files, batch_size=ENCODE_BATCH, num_workers=workers)
    images, chunks, start = 0, [], time.perf_counter()
    with torch.no_grad():
        for xb, _ in loader:
            out = net(xb.to(setup.device))
            chunks.append(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(out, 1), 1).cpu())
            images += int(xb.shape[0])
    return images, time.perf_counter() - start


def feature_figures(
    manifest: Path, cache_dir: Path, size: int, workers: int, setup: DeviceSetup
) -> dict[str, Any]:
    """Both feature passes from nothing cached; images/s of each and their ratio."""
    images, seconds = _medfed_pass(manifest, cache_dir, setup)
    site = load_site(load_manifest(manifest), TensorCache(cache_dir))  # cached now: the paths
    paths = [r.path for split in Split for r in site.records[split]]
    plain_images, plain_seconds = _plain_pass(paths, size, workers, setup)
    medfed_rate, plain_rate = images / seconds, plain_images / plain_seconds
    return {
        "medfed": {"images": images, "seconds": seconds, "images_per_s": medfed_rate},
        "plain": {"images": plain_images, "seconds": plain_seconds, "images_per_s": plain_rate},
        "ratio": medfed_rate / plain_rate,
        "goal": FEATURE_GOAL,
    }


def feature_row(features: dict[str, Any]) -> list[str]:
    """The table row of the feature pass."""
    return [
        "frozen-encoder feature pass (nothing cached)",
        f"{features['medfed']['images_per_s']:.1f}",
        f"{features['plain']['images_per_s']:.1f}",
        f"{features['ratio']:.2f} (goal >= {features['goal']:.2f})",
    ]


def feature_words(features: dict[str, Any], workers: int) -> str:
    """How the feature pass was measured."""
    return (
        f"Feature pass: the same {features['medfed']['images']} photos from disk to pooled "
        f"MobileNetV2 features (seeded random weights, batch {ENCODE_BATCH}): medfed loads the "
        "site into an empty cache (its decode threads) and runs the frozen encoder over each "
        f"split; the plain loop is a DataLoader with {workers} worker(s) decoding, resizing and "
        "centre-cropping each photo into torchvision.models.mobilenet_v2's features and "
        "pooling, without gradients."
    )
