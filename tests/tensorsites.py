"""In-memory sites made of tensors, for fast engine and algorithm tests (no files decoded)."""

from __future__ import annotations

from pathlib import Path

import torch

from medfed.config import FundusPreprocess, Modality, SiteManifest
from medfed.data.preprocess import Normalization
from medfed.data.records import Record, Split
from medfed.data.sitedata import SiteData


def tensor_site(
    site_id: str,
    index: int,
    *,
    n: int = 48,
    size: int = 16,
    seed: int = 0,
    signal: float = 1.0,
    camera: str = "colour",
) -> SiteData:
    """A site whose class is a faint bright square and whose 'camera' is a colour offset
    (``camera="colour"``) or a bright band across rows of its own (``camera="band"``, which
    per-channel normalization cannot remove)."""
    g = torch.Generator().manual_seed(seed * 100 + index)
    x = torch.randn(n, 3, size, size, generator=g) * 0.5
    y = torch.arange(n) % 2
    x[y == 1, :, size // 4 : size // 2, size // 4 : size // 2] += signal
    if camera == "colour":
        # Site-specific colour cast: learnable by a client head that sees shared norms.
        x[:, index % 3] += 0.8 * (index + 1)
    elif camera == "band":
        rows = slice(size // 2 + 2 * index, size // 2 + 2 * index + 2)
        x[:, :, rows, :] += 1.5
    else:
        raise ValueError(f"camera must be colour or band, got {camera!r}")
    parts = {Split.TRAIN: slice(0, n // 2), Split.VAL: slice(n // 2, 3 * n // 4)}
    parts[Split.TEST] = slice(3 * n // 4, n)
    manifest = SiteManifest(
        id=site_id,
        modality=Modality.FUNDUS,
        layout="acrima",
        root=Path("/nonexistent"),
        labels={"normal": 0, "glaucoma": 1},
        preprocess=FundusPreprocess(image_size=size),
    )
    records = {
        s: [Record(Path(f"{site_id}_{i}.png"), int(y[i]), f"p{i}") for i in range(n)[sl]]
        for s, sl in parts.items()
    }
    return SiteData(
        manifest=manifest,
        raw={s: x[sl].clone() for s, sl in parts.items()},
        y={s: y[sl].clone() for s, sl in parts.items()},
        records=records,
        normalization=Normalization.identity(3),
    )


def tensor_sites(k: int = 3, **kwargs) -> list[SiteData]:
    return [tensor_site(f"site{i}", i, **kwargs) for i in range(k)]
