"""What a site releases of its data card in a statistics run, and what the coordinator makes
of the released counts.

Every count a site releases is a cell: a class's scans in a split, the scans of one image size,
a histogram bin (scans' worth of pixels, see :mod:`medfed.data.scanstats`), the scans of one
acquisition device. A cell on fewer than ``min_count`` scans is suppressed: its value is not
sent (``None``; an image size or device value on too few scans is left out by name too), and
each table counts its suppressed cells. With noise, every released cell gets independent noise
(numpy): Laplace with scale ``T / epsilon`` or Gaussian with ``sigma = sqrt(2 ln(1.25 / delta))
* sqrt(T) / epsilon``, where ``T`` is the number of tables the site releases (one scan moves each
table by at most 1 in L1 and L2, so ``epsilon`` covers all of them together). A noisy count
below 0 is clipped to 0 (counted as ``clipped``), which is post-processing and spends nothing.
Suppression looks at the true counts, before the noise; which image sizes and devices appear is
decided by them too, so ``min_count`` is what keeps a rare one from being named.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from medfed.governance.plan import Plan
from medfed.governance.statistics import StatisticsSettings
from medfed.metrics.intervals import wilson
from medfed.runs.schema import FederationStatistics, SiteStatistics

TABLES = ("counts", "sizes", "histogram", "acquisition")


@dataclass(frozen=True)
class Noise:
    """The noise a site adds to each released count (``tables``: how many it releases)."""

    mechanism: str
    epsilon: float
    delta: float
    tables: int

    @property
    def scale(self) -> float:
        """Laplace's scale b, or the Gaussian's standard deviation sigma."""
        if self.mechanism == "laplace":
            return self.tables / self.epsilon
        return math.sqrt(2 * math.log(1.25 / self.delta)) * math.sqrt(self.tables) / self.epsilon

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        if self.mechanism == "laplace":
            return rng.laplace(0.0, self.scale, size)
        return rng.normal(0.0, self.scale, size)

    def to_json(self, clipped: int) -> dict[str, Any]:
        return {
            "mechanism": self.mechanism,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "scale": self.scale,
            "tables": self.tables,
            "clipped": clipped,
        }


class _Cells:
    """Suppresses and noises one site's cells, counting what it did."""

    def __init__(self, floor: int, noise: Noise | None, rng: np.random.Generator) -> None:
        self.floor, self.noise, self.rng = floor, noise, rng
        self.suppressed = dict.fromkeys(TABLES, 0)
        self.clipped = 0

    def values(self, table: str, values: list[float], digits: int) -> list[float | None]:
        keep = [self.floor == 0 or v >= self.floor for v in values]
        self.suppressed[table] += keep.count(False)
        noisy = np.asarray(values, dtype=np.float64)
        if self.noise is not None and len(values):
            noisy = noisy + self.noise.sample(self.rng, len(values))
            self.clipped += int(np.sum((noisy < 0) & np.asarray(keep)))
            noisy = np.maximum(noisy, 0.0)
        return [round(float(v), digits) if k else None for v, k in zip(noisy, keep, strict=True)]

    def named(self, table: str, counts: Mapping[str, int]) -> dict[str, float]:
        """Values on too few scans are left out by name (a rare size or device is not named)."""
        names = list(counts)
        released = self.values(table, [float(counts[n]) for n in names], 0)
        return {n: v for n, v in zip(names, released, strict=True) if v is not None}


def tables_of(report: Mapping[str, Any]) -> int:
    """How many tables a site's data card releases (one scan moves each by at most 1)."""
    channels = len(report.get("histogram", {}).get("counts", []))
    return 2 + channels + len(report.get("acquisition", {}))


def release(
    report: Mapping[str, Any],
    settings: StatisticsSettings,
    *,
    policy_min_count: int = 0,
    rng: np.random.Generator | None = None,
) -> dict[str, Any]:
    """What a site sends of its data card (``report``: ``SiteReport.to_dict()``).

    The minimum count is the larger of the run's and the site policy's. ``rng``: the noise's
    generator (a fresh one from the operating system's entropy when None)."""
    floor = max(settings.min_count, policy_min_count)
    noise = None
    if settings.noise != "none":
        noise = Noise(settings.noise, settings.epsilon, settings.delta, tables_of(report))
    cells = _Cells(floor, noise, rng if rng is not None else np.random.default_rng())
    counts = {}
    for split, per in report.get("counts", {}).items():
        names = list(per)
        values = cells.values("counts", [float(per[n]) for n in names], 0)
        counts[split] = dict(zip(names, values, strict=True))
    histogram = dict(report.get("histogram") or {})
    if histogram:
        histogram["counts"] = [cells.values("histogram", row, 2) for row in histogram["counts"]]
    acquisition = {
        key: cells.named("acquisition", per) for key, per in report.get("acquisition", {}).items()
    }
    return {
        "site": report.get("site", ""),
        "modality": report.get("modality", ""),
        "min_count": floor,
        "counts": counts,
        "sizes": cells.named("sizes", report.get("size_counts", {})),
        "histogram": histogram or None,
        "acquisition": acquisition,
        "suppressed": cells.suppressed,
        "noise": noise.to_json(cells.clipped) if noise is not None else None,
    }


def prevalence(counts: Mapping[str, Mapping[str, float | None]]) -> dict[str, Any]:
    """Each class's share of the site's scans (all splits) with its Wilson 95% CI, from the
    released counts (rounded to whole scans); None for every class when a cell was suppressed
    (the total is then unknown)."""
    totals: dict[str, float] = {}
    hidden = False
    for per in counts.values():
        for name, value in per.items():
            if value is None:
                hidden = True
            totals[name] = totals.get(name, 0.0) + (value or 0.0)
    n = int(round(sum(totals.values())))
    out: dict[str, Any] = {}
    for name, value in totals.items():
        if hidden:
            out[name] = None
            continue
        rate = wilson(min(int(round(value)), n), n)
        ci = rate.interval
        out[name] = {
            "k": rate.k,
            "n": rate.n,
            "estimate": ci.estimate if ci else None,
            "low": ci.low if ci else None,
            "high": ci.high if ci else None,
        }
    return out


def site_entry(released: Mapping[str, Any]) -> SiteStatistics:
    """A site's released statistics, checked as the schema reads them, with each class's
    prevalence added (at the coordinator, from the released counts)."""
    where = "a site's statistics"
    data = {k: v for k, v in released.items() if k not in ("site", "prevalence")}
    entry = SiteStatistics.from_dict({"status": "released", **data}, where)  # checked first
    shares = prevalence(entry.counts)
    return SiteStatistics.from_dict({**entry.to_dict(), "prevalence": shares}, where)


def federation_statistics(
    settings: StatisticsSettings,
    sites: dict[str, SiteStatistics],
    *,
    run_name: str,
    plan: Plan,
    engine: str,
) -> FederationStatistics:
    """``statistics.json`` of a statistics run (``engine``: ``flower`` or ``in-process``)."""
    return FederationStatistics(
        run_name=run_name,
        plan_sha256=plan.sha256,
        engine=engine,
        time=time.time(),
        min_count=settings.min_count,
        noise=settings.noise,
        epsilon=settings.epsilon,
        delta=settings.delta,
        sites=sites,
    )
