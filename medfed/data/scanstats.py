"""Per-scan statistics a data card and a federated statistics run share: the intensity
histogram of a decoded scan on fixed bins, and the acquisition fields a record names.

The bins are fixed per intensity unit (not fitted to the data), so that two sites' histograms
add up bin by bin and a released histogram says nothing through its edges. Each scan adds its
own histogram as fractions of its pixels (each channel's bins sum to 1 per scan): a bin then
counts "scans' worth" of pixels, one scan moves a channel's histogram by at most 1 in all, and
a minimum count on it means what it means for any other count.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

HISTOGRAM_BINS = 16
"""Bins per channel of the intensity histogram."""
HISTOGRAM_RANGE: dict[str, tuple[float, float]] = {"0-255": (0.0, 256.0), "HU": (-1024.0, 3072.0)}
"""The fixed range of each intensity unit's histogram; values outside go to the end bins."""
ACQUISITION_FIELDS = ("manufacturer", "model", "camera", "scanner")
"""The record fields that name the device a scan came from (a DICOM header's Manufacturer, a
layout's camera column), counted per value when a site's records carry them."""


def histogram_edges(unit: str, bins: int = HISTOGRAM_BINS) -> np.ndarray:
    """The ``bins + 1`` fixed bin edges of intensity ``unit``."""
    low, high = HISTOGRAM_RANGE.get(unit, (0.0, 1.0))
    return np.linspace(low, high, bins + 1)


def scan_histogram(channels: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """(channels, bins): each channel's share of pixels per bin (each row sums to 1).

    ``channels``: the decoded scan as (pixels, channels); values beyond the edges count in the
    first or last bin."""
    bins = len(edges) - 1
    out = np.zeros((channels.shape[1], bins))
    for c in range(channels.shape[1]):
        values = np.clip(channels[:, c], edges[0], np.nextafter(edges[-1], edges[0]))
        counts, _ = np.histogram(values, bins=edges)
        out[c] = counts / max(1, counts.sum())
    return out


def acquisition_values(meta: Mapping[str, Any]) -> dict[str, str]:
    """The acquisition fields a record's metadata names (empty values left out)."""
    return {k: str(meta[k]).strip() for k in ACQUISITION_FIELDS if str(meta.get(k) or "").strip()}
