"""A statistics run's ``statistics.json`` as the tables of the Sites page's federation overview,
without Streamlit: suppressed cells in words, noise stated, prevalence with its CI."""

from __future__ import annotations

from typing import Any

import pandas as pd

from medfed.runs.schema import FederationStatistics, SiteStatistics

SPLITS = ("train", "val", "test")


def suppressed(site: SiteStatistics) -> str:
    return f"suppressed (< {site.min_count})"


def cell(value: float | None, site: SiteStatistics, digits: int = 0) -> str:
    """A released count as shown: the number, or why it is not there."""
    if value is None:
        return suppressed(site)
    return f"{value:.{digits}f}"


def released(stats: FederationStatistics) -> dict[str, SiteStatistics]:
    return {s: v for s, v in stats.sites.items() if v.status == "released"}


def not_released(stats: FederationStatistics) -> list[tuple[str, str, str]]:
    """(site, status, reason) of every site that released nothing."""
    return [(s, v.status, v.reason or "") for s, v in stats.sites.items() if v.status != "released"]


def disclosure_text(stats: FederationStatistics) -> str:
    """The run's disclosure control in words, with each site's own minimum and noise."""
    floors = {s: v.min_count for s, v in released(stats).items()}
    parts = [
        f"Counts on fewer scans than the minimum count are suppressed (run: {stats.min_count}"
        + (
            "; per site: " + ", ".join(f"{s} {n}" for s, n in floors.items())
            if any(n != stats.min_count for n in floors.values())
            else ""
        )
        + ")."
    ]
    if stats.noise == "none":
        parts.append("No differential-privacy noise: released counts are exact.")
    else:
        delta = f", delta {stats.delta:g}" if stats.noise == "gaussian" else ""
        parts.append(
            f"Every released count carries {stats.noise} noise (epsilon {stats.epsilon:g} per "
            f"site for all its tables{delta}); noisy counts below 0 were clipped to 0."
        )
        for site, info in released(stats).items():
            if info.noise is not None:
                n = info.noise
                what = "scale b" if n.mechanism == "laplace" else "sigma"
                parts.append(
                    f"{site}: {what} {n.scale:.3g} over {n.tables} tables, {n.clipped} "
                    "count(s) clipped to 0."
                )
    return " ".join(parts)


def _share(share: Any, site: SiteStatistics) -> str:
    if share is None:
        return f"not computed: a count is {suppressed(site)}"
    if share.estimate is None:
        return "no scans"
    return f"{share.estimate:.1%} ({share.low:.1%}\u2013{share.high:.1%}), {share.k}/{share.n}"


def prevalence_frame(stats: FederationStatistics) -> pd.DataFrame:
    """One row per site: its scans and each class's prevalence with the Wilson 95% CI."""
    rows = []
    for name, site in released(stats).items():
        values = [v for per in site.counts.values() for v in per.values()]
        hidden = any(v is None for v in values)
        row: dict[str, Any] = {
            "site": name,
            "modality": site.modality,
            "scans": suppressed(site) if hidden else f"{sum(values):.0f}",
            "suppressed cells": sum(site.suppressed.values()),
        }
        for cls, share in site.prevalence.items():
            row[f"{cls} (95% CI)"] = _share(share, site)
        rows.append(row)
    return pd.DataFrame(rows).set_index("site") if rows else pd.DataFrame()


def counts_frame(site: SiteStatistics) -> pd.DataFrame:
    """Split by class, suppressed cells in words."""
    order = [s for s in SPLITS if s in site.counts] + [s for s in site.counts if s not in SPLITS]
    rows = {s: {c: cell(v, site) for c, v in site.counts[s].items()} for s in order}
    frame = pd.DataFrame(rows).T
    frame.index.name = "split"
    return frame


def sizes_frame(stats: FederationStatistics) -> pd.DataFrame:
    rows = [
        {"site": name, "image size (before preprocessing)": size, "scans": f"{n:.0f}"}
        for name, site in released(stats).items()
        for size, n in site.sizes.items()
    ]
    for name, site in released(stats).items():
        hidden = site.suppressed.get("sizes", 0)
        if hidden:
            rows.append(
                {
                    "site": name,
                    "image size (before preprocessing)": f"{hidden} other size(s)",
                    "scans": suppressed(site),
                }
            )
    return pd.DataFrame(rows, columns=["site", "image size (before preprocessing)", "scans"])


def acquisition_frame(stats: FederationStatistics) -> pd.DataFrame:
    rows = [
        {"site": name, "field": key, "value": value, "scans": f"{n:.0f}"}
        for name, site in released(stats).items()
        for key, per in site.acquisition.items()
        for value, n in per.items()
    ]
    for name, site in released(stats).items():
        hidden = site.suppressed.get("acquisition", 0)
        if hidden:
            rows.append(
                {"site": name, "field": "(any)", "value": f"{hidden} other value(s)",
                 "scans": suppressed(site)}
            )  # fmt: skip
    return pd.DataFrame(rows, columns=["site", "field", "value", "scans"])


def _channels(n: int) -> list[str]:
    return ["R", "G", "B"] if n == 3 else [f"channel {i}" for i in range(n)]


def histogram_frame(site: SiteStatistics) -> pd.DataFrame | None:
    """Bins by channel, for a bar chart (a suppressed bin is empty)."""
    h = site.histogram
    if h is None:
        return None
    labels = [f"{h.edges[i]:g}\u2013{h.edges[i + 1]:g}" for i in range(len(h.edges) - 1)]
    rows = [[float("nan") if v is None else v for v in row] for row in h.counts]
    data = dict(zip(_channels(len(rows)), rows, strict=True))
    return pd.DataFrame(data, index=pd.Index(labels, name=f"intensity ({h.unit})"))


def histogram_table(site: SiteStatistics) -> pd.DataFrame | None:
    """The same bins as text: scans' worth of pixels, or ``suppressed (< N)``."""
    frame = histogram_frame(site)
    if frame is None or site.histogram is None:
        return None
    rows = [[cell(v, site, 2) for v in row] for row in site.histogram.counts]
    return pd.DataFrame(dict(zip(frame.columns, rows, strict=True)), index=frame.index)
