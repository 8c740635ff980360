"""The Sites page's "Federation overview (statistics run)": what a statistics-only run
(``medfed deploy stats``) released of every site, read from ``RUN/statistics.json``.

Not a page of its own: :func:`section` is called by the Sites page for the run it shows.
"""

from __future__ import annotations

import datetime as dt

import streamlit as st

from medfed.core.errors import MedfedError
from medfed.dashboard import statsdata
from medfed.dashboard.common import escape
from medfed.dashboard.rundata import Run
from medfed.runs.schema import STATISTICS_FILE, FederationStatistics
from medfed.runs.statistics import read_statistics

TITLE = "Federation overview (statistics run)"


def section(run: Run) -> bool:
    """Show the run's statistics overview; True when the run directory holds one."""
    try:
        stats = read_statistics(run.path)
    except MedfedError as exc:
        st.subheader(TITLE)
        st.error(escape(str(exc)))
        return True
    if stats is None:
        return False
    st.subheader(TITLE)
    when = dt.datetime.fromtimestamp(stats.time, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    st.caption(
        escape(
            f"Statistics run {stats.run_name} ({when}, plan {stats.plan_sha256[:12]}): no "
            f"training, no weights; each site released its data card's statistics "
            f"({STATISTICS_FILE})."
        )
    )
    st.info(escape(statsdata.disclosure_text(stats)))
    for site, status, reason in statsdata.not_released(stats):
        st.warning(escape(f"Site {site} released nothing ({status}): {reason}"))
    if not statsdata.released(stats):
        return True
    st.markdown("**Scans and prevalence per site** (Wilson 95% CI, from the released counts)")
    st.table(statsdata.prevalence_frame(stats))
    _sizes_and_devices(stats)
    for tab, (name, site) in zip(
        st.tabs(list(statsdata.released(stats))), statsdata.released(stats).items(), strict=True
    ):
        with tab:
            left, right = st.columns(2)
            with left:
                st.markdown("**Scans per split and class**")
                st.table(statsdata.counts_frame(site))
            with right:
                frame = statsdata.histogram_frame(site)
                if frame is None:
                    st.info(f"Site {name} released no intensity histogram.")
                    continue
                st.markdown("**Intensity histogram per channel** (scans' worth of pixels)")
                st.bar_chart(frame)
                with st.expander("Histogram as numbers"):
                    st.table(statsdata.histogram_table(site))
    return True


def _sizes_and_devices(stats: FederationStatistics) -> None:
    left, right = st.columns(2)
    with left:
        st.markdown("**Image sizes**")
        sizes = statsdata.sizes_frame(stats)
        if sizes.empty:
            st.info("No image size was released.")
        else:
            st.table(sizes.set_index("site"))
    with right:
        st.markdown("**Cameras and scanners**")
        devices = statsdata.acquisition_frame(stats)
        if devices.empty:
            st.info(
                "No site's records name their camera or scanner (a DICOM header's Manufacturer, "
                "a layout's camera column)."
            )
        else:
            st.table(devices.set_index("site"))
