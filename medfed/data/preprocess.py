"""Per-site preprocessing: the modality's deterministic stage, its fingerprint, normalization.

Two stages, on purpose:
- the *deterministic* stage (decode -> crop/window -> resample/resize) runs once per file and is
  cached (``medfed.data.cache``); each modality's transforms are in ``medfed.data.transforms``;
- the *site normalization* (mean/std from the site's own training split) is applied to the
  cached tensors, because its statistics depend on the split, not on the file. It is applied
  batch by batch as the model reads (:class:`NormalizedView`), so a site's scans are held once,
  in the cache's storage dtype (:data:`STORAGE_DTYPE`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict

import torch

from medfed.config import Modality, PreprocessOptions, SiteManifest
from medfed.core.normalization import Normalization, NormalizedView
from medfed.data.disc import DiscPosition
from medfed.data.io import Decoded
from medfed.data.modality import modality_spec

# Bump when the deterministic stage changes in a way that alters its output: it invalidates caches.
# 2: DICOM series are reoriented to RAS+ like NIfTI volumes (they were kept in stored LPS order).
PIPELINE_VERSION = 2

__all__ = [
    "PIPELINE_VERSION",
    "STORAGE_DTYPE",
    "STORAGE_TOLERANCE",
    "Normalization",
    "NormalizedView",
    "apply_pipeline",
    "disc_key_part",
    "pipeline_fingerprint",
    "storage_dtype",
]

# The dtype a modality's preprocessed scans are cached and held in. Both pipelines end in [0, 1]
# (fundus: 8-bit photos scaled by 1/255 after an area resize, so values fall between the 256
# levels and uint8 would be off by up to 1/510; CT: the HU window clipped and scaled, then
# resampled bilinearly, so int16/uint8 would need a scale of their own). float16 holds [0, 1]
# within STORAGE_TOLERANCE of float32: 1/16 of an 8-bit grey level, or 0.1 HU of a 400 HU
# window (under 1 HU, the scanner's own step, for any window narrower than 4096 HU); half the
# memory of float32, and a GPU reads it as is. Part of the pipeline fingerprint.
STORAGE_DTYPE: dict[Modality, torch.dtype] = {
    Modality.FUNDUS: torch.float16,
    Modality.CT: torch.float16,
}
STORAGE_TOLERANCE = 2.0**-12  # float16's largest rounding error on [0, 1] (half its step below 1)


def storage_dtype(modality: Modality | str) -> torch.dtype:
    """The dtype ``modality``'s preprocessed scans are cached and held in."""
    return STORAGE_DTYPE[Modality(modality)]


def apply_pipeline(
    modality: Modality | str,
    options: PreprocessOptions,
    decoded: Decoded,
    disc: DiscPosition | None = None,
) -> torch.Tensor:
    """Run the modality's deterministic stage on one decoded scan (``disc``: a glaucoma photo's
    optic disc position, as its layout gives it)."""
    more = {"disc": disc} if disc is not None else {}
    return modality_spec(modality).preprocess(options, decoded, **more)


def disc_key_part(options: PreprocessOptions, disc: DiscPosition | None) -> str:
    """What a scan's cache key adds for the layout's disc position: only a disc crop uses it
    ("" otherwise, and without one, so that other caches keep their keys)."""
    if disc is None or not getattr(options, "disc_crop", 0.0):
        return ""
    return disc.cache_part()


def pipeline_fingerprint(manifest: SiteManifest) -> str:
    """A stable hash of everything that changes the deterministic stage's output."""
    options = asdict(manifest.preprocess)
    options.pop("normalize", None)  # normalization happens after the cache
    if not options.get("disc_crop"):  # an option at its default keeps older caches' keys
        options.pop("disc_crop", None)
    payload = json.dumps(
        {
            "version": PIPELINE_VERSION,
            "modality": str(manifest.modality),
            "options": options,
            "storage": str(storage_dtype(manifest.modality)),
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]
