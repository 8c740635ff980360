"""Per-site preprocessing: the modality's deterministic stage, its fingerprint, normalization.

Two stages, on purpose:
- the *deterministic* stage (decode -> crop/window -> resample/resize) runs once per file and is
  cached (``medfed.data.cache``); each modality's transforms are in ``medfed.data.transforms``;
- the *site normalization* (mean/std from the site's own training split) is applied to the
  cached tensors, because its statistics depend on the split, not on the file.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

import numpy as np
import torch

from medfed.config import Modality, PreprocessOptions, SiteManifest
from medfed.data.io import Decoded
from medfed.data.modality import modality_spec

# Bump when the deterministic stage changes in a way that alters its output: it invalidates caches.
PIPELINE_VERSION = 1


def apply_pipeline(
    modality: Modality | str, options: PreprocessOptions, decoded: Decoded
) -> torch.Tensor:
    """Run the modality's deterministic stage on one decoded scan."""
    return modality_spec(modality).preprocess(options, decoded)


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

    @staticmethod
    def moments(x: torch.Tensor) -> dict[str, list[float]]:
        """Per-channel count, sum and sum of squares of a (N, C, ...) training tensor: what a
        site shares for a federation-wide normalization (aggregates, never scans)."""
        dims = [0, *range(2, x.dim())]
        xd = x.double()
        count = float(x.numel() // x.shape[1]) if x.dim() > 1 else 0.0
        return {
            "count": [count] * x.shape[1],
            "sum": xd.sum(dim=dims).tolist(),
            "sumsq": (xd * xd).sum(dim=dims).tolist(),
        }

    @classmethod
    def pooled(cls, moments: list[dict[str, list[float]]]) -> Normalization:
        """Mean and (unbiased) std of every site's training values together, from each site's
        :meth:`moments`: the same figures as :meth:`fit` on the pooled tensors."""
        count = np.sum([m["count"] for m in moments], axis=0)
        if np.any(count < 2):
            raise ValueError("a federation-wide normalization needs at least two training values")
        total = np.sum([m["sum"] for m in moments], axis=0)
        squares = np.sum([m["sumsq"] for m in moments], axis=0)
        mean = total / count
        var = np.maximum(squares - count * mean**2, 0.0) / (count - 1)
        std = np.maximum(np.sqrt(var), 1e-6)
        return cls(mean=tuple(float(v) for v in mean), std=tuple(float(v) for v in std))

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
