"""Sites: each site's data card, class ratio and sample scans, and the shift between sites
(a distance heatmap and a 2-D map of the scans coloured by site)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from medfed.dashboard import charts, checks, common, rundata
from medfed.dashboard.rundata import Run
from medfed.dashboard.views import heterogeneity
from medfed.dashboard.views.overview import section as overview_section
from medfed.data.overview import OVERVIEW_DIR, OVERVIEW_FILE, overview_dir

SPLITS = ("train", "val", "test")
NO_IMAGES = (
    "No sample images in this run directory. A federation deployed across machines does not "
    "publish images (they stay at the hospitals); the counts and the card above are the "
    "statistics the site shared."
)


def inside(folder: Path, relative: str) -> Path | None:
    """``folder / relative`` if it stays inside ``folder`` and exists (the overview names it)."""
    path = (folder / relative).resolve()
    return path if path.is_relative_to(folder.resolve()) and path.is_file() else None


def class_counts(sites: dict[str, Any]) -> pd.DataFrame:
    rows = []
    for site, info in sites.items():
        totals: dict[str, int] = {}
        for per in info.get("counts", {}).values():
            for name, n in per.items():
                totals[name] = totals.get(name, 0) + int(n)
        ratio = info.get("class_ratio", {})
        rows += [
            {"site": site, "class": name, "scans": n, "share": ratio.get(name, 0.0)}
            for name, n in totals.items()
        ]
    return pd.DataFrame(rows, columns=["site", "class", "scans", "share"])


def split_table(info: dict[str, Any]) -> pd.DataFrame:
    counts = info.get("counts", {})
    order = [s for s in SPLITS if s in counts] + [s for s in counts if s not in SPLITS]
    frame = pd.DataFrame({s: counts[s] for s in order}).T.fillna(0).astype(int)
    frame.index.name = "split"
    frame["total"] = frame.sum(axis=1)
    return frame


def without_overview(run: Run) -> None:
    st.info(
        f"This run directory has no site overview ({OVERVIEW_DIR}/{OVERVIEW_FILE}): it was "
        "written before the overview existed, or by a deployment whose sites publish nothing "
        "beyond their test figures. Retrain it to see cards, class ratios and site distances."
    )
    summary = common.read_summary(run)
    if summary and summary.sites:
        rows = [
            {
                "site": site,
                "train scans": f.n_train,
                "val scans": f.n_val,
                "test scans": f.n_test,
                "share of training data": summary.priors.get(site),
            }
            for site, f in summary.sites.items()
        ]
        st.write("What summary.json tells about the sites:")
        st.table(pd.DataFrame(rows).set_index("site"))


def shift(overview: dict[str, Any]) -> None:
    st.subheader("Shift between sites")
    distances = overview.get("distances")
    left, right = st.columns(2)
    with left:
        if distances:
            fig = charts.distance_heatmap(
                distances["sites"], distances["matrix"], distances.get("method", "distance")
            )
            st.plotly_chart(fig, key="distances")
            st.caption("Larger: the two sites' preprocessed scans look more different.")
        else:
            st.info("No site distances in this run (fewer than two sites with scans).")
    with right:
        points = overview.get("embedding")
        if points:
            st.plotly_chart(charts.embedding_scatter(points), key="embedding")
            st.caption(f"Each point is a scan: {points.get('method', '2-D embedding')}.")
        else:
            st.info("No per-scan embedding in this run directory: its sites published none.")


def site_tab(folder: Path, site: str, info: dict[str, Any], images: bool) -> None:
    card_path = checks.card_path(folder, info)
    cols = st.columns([3, 2])
    with cols[0]:
        if card_path is not None:
            with st.expander(f"Data card: {site}", expanded=True):
                st.markdown(rundata.card_markdown(card_path.read_text(encoding="utf-8")))
        else:
            st.info(f"No data card for site {site} in this run directory.")
    with cols[1]:
        if card_path is None:  # the card holds the same table: shown once
            st.markdown("**Scans per split and class**")
            st.table(split_table(info))
        samples = [(inside(folder, s.get("file", "")), s) for s in info.get("samples", [])]
        shown = [(p, s) for p, s in samples if p is not None]
        if shown:
            st.markdown("**Sample scans (preprocessed, training split)**")
            st.image(
                [str(p) for p, _ in shown],
                caption=[s.get("label", "") for _, s in shown],
                width=120,
            )
        else:
            st.info(NO_IMAGES if not images or not samples else "Sample images are missing.")


def mixture(run: Run) -> None:
    """FedGMI's mixture coefficients: which shared distributions each site's scans come from."""
    frame = rundata.mixture_frame(common.read_metrics(run), common.site_order(run))
    if frame.empty:
        return
    st.subheader("Mixture coefficients")
    st.plotly_chart(charts.mixture_bars(frame), key="mixture")
    table = frame.pivot(index="site", columns="distribution", values="share")
    table = table.loc[list(dict.fromkeys(frame["site"]))]  # the chart's order
    st.table(table.round(3))
    st.caption(
        f"Each site's share of scans per intrinsic distribution, as of round "
        f"{int(frame['round'].max())} (FedGMI infers them; they stay at the site)."
    )


def main() -> None:
    common.heading(
        "Sites", "Who each site's patients are, and how different the sites' scans look."
    )
    run = common.pick_run(common.chosen_runs(), key="sites_run")
    st.caption(common.status_line(run))
    if overview_section(run) and not run.has_config:  # a statistics-only run
        return
    mixture(run)
    overview = common.read_overview(run)
    if overview is None:
        without_overview(run)
        return
    sites = overview["sites"]
    if not sites:
        st.info(f"The site overview of {run.label} lists no site.")
        return
    st.subheader("Class ratio")
    st.plotly_chart(charts.class_ratio_bars(class_counts(sites)), key="class_ratio")
    shift(overview)
    heterogeneity.section(run, overview)
    st.subheader("Site by site")
    folder = overview_dir(run.path)
    for tab, (site, info) in zip(st.tabs(list(sites)), sites.items(), strict=True):
        with tab:
            site_tab(folder, site, info, bool(overview.get("images")))


common.guarded(main)
