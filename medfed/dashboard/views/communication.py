"""Communication: bytes per round per site and per method."""

from __future__ import annotations

import streamlit as st

from medfed.dashboard import charts, common, rundata
from medfed.runs.schema import OK

DIRECTIONS = charts.TRAFFIC


def main() -> None:
    common.heading(
        "Communication",
        "What each site sent to the server and received from it in every round (the encoded "
        "update, as it would cross the network), per method.",
    )
    runs, records = common.chosen_runs_holding(
        common.read_metrics, "No round recorded in any selected run yet: nothing to count."
    )
    orders = {run.label: common.site_order(run) for run in runs if run.label in records}
    traffic = rundata.traffic_frame(records, orders)

    st.subheader("Mean traffic per round, per site and method")
    st.plotly_chart(charts.traffic_bars(traffic), key="traffic_bars")
    summaries = {r.label: s for r in runs if (s := common.read_summary(r)) is not None}
    if summaries:
        st.table(rundata.traffic_table(summaries))
        st.caption(
            "Bytes per round (kB = 1000 bytes), from summary.json; 'local' trains without "
            "exchanging weights."
        )

    st.subheader("Bytes per round")
    column = st.radio(
        "Direction",
        list(DIRECTIONS),
        format_func=DIRECTIONS.get,
        horizontal=True,
        key="traffic_direction",
    )
    st.plotly_chart(charts.traffic_lines(traffic, column), key="traffic_lines")
    silent = traffic[traffic["status"] != OK]
    if not silent.empty:
        st.caption(
            f"{len(silent)} site-round(s) exchanged nothing (dropped out or not sampled): "
            "they show as 0."
        )


common.guarded(main)
