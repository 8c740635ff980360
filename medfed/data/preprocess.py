"""Per-site preprocessing pipelines built from MONAI dictionary transforms.

MONAI is imported where a pipeline is built: it takes seconds to import, and cached scans (the
common case) never need it.

Two stages, on purpose:
- the *deterministic* stage (decode -> crop/window -> resample/resize) runs once per file and is
  cached (``medfed.data.cache``);
- the *site normalization* (mean/std from the site's own training split) is applied to the
  cached tensors, because its statistics depend on the split, not on the file.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from medfed.config import CTPreprocess, FundusPreprocess, Modality, SiteManifest
from medfed.data.io import Volume

if TYPE_CHECKING:
    from monai.data import MetaTensor
    from monai.transforms import Compose

# Bump when the deterministic stage changes in a way that alters its output: it invalidates caches.
PIPELINE_VERSION = 1


class CameraField:
    """Foreground selector for the camera field: pixels brighter than a share of the maximum."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold

    def __call__(self, img: torch.Tensor | np.ndarray) -> torch.Tensor | np.ndarray:
        brightness = (
            img.mean(0, keepdims=True) if isinstance(img, np.ndarray) else img.mean(0, True)
        )
        return brightness > self.threshold * float(brightness.max())


def fundus_pipeline(options: FundusPreprocess) -> Compose:
    """uint8 RGB (H, W, 3) -> float32 (3, S, S) in [0, 1], cropped to the camera field."""
    from monai.transforms import (
        Compose,
        CropForegroundd,
        EnsureChannelFirstd,
        EnsureTyped,
        Resized,
        ScaleIntensityRanged,
        SpatialPadd,
    )

    size = options.image_size
    steps = [EnsureChannelFirstd(keys="image", channel_dim=-1)]
    if options.roi_crop:
        steps.append(
            CropForegroundd(
                keys="image",
                source_key="image",
                select_fn=CameraField(options.roi_threshold),
                allow_smaller=True,
            )
        )
    steps += [
        Resized(keys="image", spatial_size=size, size_mode="longest", mode="area"),
        SpatialPadd(keys="image", spatial_size=(size, size)),
        ScaleIntensityRanged(keys="image", a_min=0.0, a_max=255.0, b_min=0.0, b_max=1.0),
        EnsureTyped(keys="image", data_type="tensor", dtype=torch.float32, track_meta=False),
    ]
    return Compose(steps)


def ct_pipeline(options: CTPreprocess) -> Compose:
    """HU volume (D, H, W) with spacing -> float32 (1, *shape) in [0, 1] after the HU window."""
    from monai.transforms import (
        Compose,
        EnsureTyped,
        ResizeWithPadOrCropd,
        ScaleIntensityRanged,
        Spacingd,
    )

    lo, hi = options.hu_window
    return Compose(
        [
            ScaleIntensityRanged(keys="image", a_min=lo, a_max=hi, b_min=0.0, b_max=1.0, clip=True),
            Spacingd(keys="image", pixdim=options.spacing, mode="bilinear", padding_mode="border"),
            ResizeWithPadOrCropd(keys="image", spatial_size=options.shape),
            EnsureTyped(keys="image", data_type="tensor", dtype=torch.float32, track_meta=False),
        ]
    )


def _volume_to_meta(volume: Volume) -> MetaTensor:
    from monai.data import MetaTensor

    affine = torch.diag(torch.tensor([*volume.spacing, 1.0], dtype=torch.float64))
    return MetaTensor(torch.from_numpy(np.ascontiguousarray(volume.array))[None], affine=affine)


def apply_pipeline(modality: Modality, options, decoded: np.ndarray | Volume) -> torch.Tensor:
    """Run the deterministic stage on one decoded scan."""
    if modality is Modality.FUNDUS:
        # float32 copy: the decoder's array may be read-only, and the ROI mask needs floats.
        out = fundus_pipeline(options)({"image": np.asarray(decoded, dtype=np.float32).copy()})
    else:
        out = ct_pipeline(options)({"image": _volume_to_meta(decoded)})
    return out["image"].contiguous()


def pipeline_fingerprint(manifest: SiteManifest) -> str:
    """A stable hash of everything that changes the deterministic stage's output."""
    options = asdict(manifest.preprocess)
    options.pop("normalize", None)  # normalization happens after the cache
    payload = json.dumps(
        {"version": PIPELINE_VERSION, "modality": str(manifest.modality), "options": options},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Normalization:
    """Per-channel mean/std of a site's training split, applied to every split of that site."""

    mean: tuple[float, ...]
    std: tuple[float, ...]

    @classmethod
    def identity(cls, channels: int) -> Normalization:
        return cls(mean=(0.0,) * channels, std=(1.0,) * channels)

    @classmethod
    def fit(cls, x: torch.Tensor) -> Normalization:
        """Statistics over a (N, C, ...) training tensor."""
        if x.shape[0] == 0:
            raise ValueError("cannot compute site normalization from an empty training split")
        dims = [0, *range(2, x.dim())]
        mean = x.double().mean(dim=dims)
        std = x.double().std(dim=dims).clamp_min(1e-6)
        return cls(mean=tuple(mean.tolist()), std=tuple(std.tolist()))

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        shape = (1, -1) + (1,) * (x.dim() - 2)
        mean = torch.tensor(self.mean, dtype=x.dtype).view(shape)
        std = torch.tensor(self.std, dtype=x.dtype).view(shape)
        return (x - mean) / std

    def to_dict(self) -> dict[str, list[float]]:
        return {"mean": list(self.mean), "std": list(self.std)}

    @classmethod
    def from_dict(cls, data: dict[str, list[float]]) -> Normalization:
        return cls(mean=tuple(data["mean"]), std=tuple(data["std"]))
