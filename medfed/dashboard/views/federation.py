"""Federation: per-site AUC of each method side by side, the worst site, federation figures,
per-site ROC curves."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from medfed.dashboard import charts, common, rundata
from medfed.runs.report import fmt

WORST_STYLE = "background-color: #f8d7da; color: #842029; font-weight: bold"


def styled_aucs(aucs: pd.DataFrame, worst: dict[str, tuple[str | None, Any]]) -> Any:
    """The AUC table with each method's worst site highlighted."""

    def mark(column: pd.Series) -> list[str]:
        site = worst.get(str(column.name), (None, None))[0]
        return [WORST_STYLE if index == site else "" for index in column.index]

    return aucs.style.apply(mark, axis=0).format("{:.3f}", na_rep="n/a")


def main() -> None:
    st.title("Federation")
    st.caption(
        "Test-set figures of each method: every site's own model on its own held-out scans, "
        "and the federation as a whole. Look at the worst site first."
    )
    runs = common.chosen_runs()
    summaries = {}
    for run in runs:
        summary = common.read_summary(run)
        if summary is None:
            st.info(f"**{run.label}**: {common.status_line(run)}")
        else:
            summaries[run.label] = summary
    if not summaries:
        st.warning("No finished run to show yet: the figures appear once summary.json exists.")
        return

    st.subheader("Per-site AUC")
    aucs = rundata.auc_table(summaries)
    worst = rundata.worst_sites(summaries)
    st.table(styled_aucs(aucs, worst))
    st.caption("Highlighted: each method's worst site (lowest test AUC).")
    for note in rundata.undefined_aucs(summaries):
        st.caption(note)
    columns = st.columns(min(len(worst), 4))
    for i, (label, (site, auc)) in enumerate(worst.items()):
        columns[i % len(columns)].metric(
            f"Worst site: {label}",
            site or "n/a",
            f"AUC {fmt(auc)}",
            delta_color="off",
            delta_arrow="off",
        )
    st.plotly_chart(charts.site_auc_bars(aucs, worst), key="auc_bars")

    st.subheader("Federation figures")
    st.table(rundata.federation_table(summaries))
    st.caption(
        "Average accuracy weights each site by its test scans; system accuracy pools every "
        "site's test scans and answers each as the federation answers a new patient "
        "(routed to one site, or a majority vote of the site models). Spread and Gini measure "
        "how unequal the sites' AUCs are (0: all equal)."
    )

    st.subheader("Per-site ROC curves")
    label = st.selectbox("Method", list(summaries), key="roc_method")
    points, missing = rundata.roc_frame(summaries[label])
    if not points.empty:
        st.plotly_chart(charts.roc_curves(points, f"{label}: test ROC per site"), key="roc")
    for site, reason in missing.items():
        st.info(f"Site {site}: no ROC curve ({reason}).")


common.guarded(main)
