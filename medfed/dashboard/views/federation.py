"""Federation: per-site AUC of each method side by side with 95% CIs and counts, the pooled and
worst-site AUC, federation figures, ROC curves of several methods at one site; then, for one
method, the operating points, calibration, the cross-site matrix and the system figures under
both protocols."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd
import streamlit as st

from medfed.dashboard import charts, clinical, common, rundata, tracked
from medfed.reports import bounds_text
from medfed.reports.evaluation import system_by_site_rows
from medfed.reports.grading import grading_tables
from medfed.runs.schema import Summary

WORST_STYLE = "background-color: #f8d7da; color: #842029; font-weight: bold"
UNRELIABLE_NOTE = (
    f"{clinical.WARNING} marks a figure resting on fewer than 10 positives or 10 negatives: its "
    "CI is wide and the figure may not hold on new patients."
)


def styled_aucs(aucs: pd.DataFrame, worst: dict[str, tuple[str | None, Any]]) -> Any:
    """The per-site table with each method's worst site highlighted in its column."""

    def mark(column: pd.Series) -> list[str]:
        site = worst.get(str(column.name), (None, None))[0]
        return [WORST_STYLE if index == site else "" for index in column.index]

    methods = [c for c in aucs.columns if c in worst]
    return aucs.style.apply(mark, axis=0, subset=methods)


def per_site(summaries: dict[str, Summary]) -> None:
    st.subheader("Per-site AUC")
    worst = rundata.worst_sites(summaries)
    st.table(styled_aucs(clinical.site_auc_table(summaries), worst))
    st.caption(
        "Test AUC with its 95% CI (DeLong, or a bootstrap over patients when a patient has "
        "several scans); n counts the site's test scans. Highlighted: each method's worst site "
        f"(lowest test AUC). {UNRELIABLE_NOTE}"
    )
    for note in rundata.undefined_aucs(summaries):
        st.caption(note)
    columns = st.columns(min(len(worst), 4))
    for i, (label, (site, _)) in enumerate(worst.items()):
        columns[i % len(columns)].metric(
            f"Worst site: {label}",
            site or "n/a",
            clinical.worst_site_text(summaries[label]),
            delta_color="off",
            delta_arrow="off",
        )
    for label, summary in summaries.items():
        if warning := clinical.worst_site_warning(summary):
            st.caption(f"Worst site of {label}, {warning}")
    st.plotly_chart(charts.site_auc_bars(clinical.auc_points(summaries), worst), key="auc_bars")
    st.caption("Error bars: 95% CI. Hatched bars and a marked site name: unreliable figures.")


def pooled(summaries: dict[str, Summary]) -> None:
    st.subheader("Pooled AUC (random effects)")
    columns = st.columns(min(len(summaries), 4))
    for i, (label, summary) in enumerate(summaries.items()):
        p = summary.pooled_auc
        columns[i % len(columns)].metric(
            f"Pooled AUC: {label}",
            "n/a" if p is None else f"{p.estimate:.3f}",
            (
                "no pooled AUC in this run"
                if p is None
                else f"95% CI {bounds_text(p)}, I\u00b2 {100 * p.i2:.0f}% ({p.n_sites} sites)"
            ),
            delta_color="off",
            delta_arrow="off",
        )
    st.caption(
        "The sites' AUCs pooled by a random-effects model (DerSimonian-Laird, on the logit "
        "scale): the AUC a new site of the same kind could expect. I\u00b2 is the share of the "
        "spread between sites that chance does not explain (above 50%: the sites truly differ). "
        "n/a: fewer than two sites with a CI, or a run written before pooling."
    )


def roc_by_method(summaries: dict[str, Summary]) -> None:
    st.subheader("ROC curves of the methods at one site")
    if len(summaries) < 2:
        st.caption("Select several runs in the sidebar to overlay their ROC curves here.")
        return
    site = st.selectbox("Site", clinical.sites_of(summaries), key="roc_site")
    points, missing = clinical.roc_overlay_frame(summaries, site)
    operating = []
    for label, summary in summaries.items():
        frame = clinical.operating_points(summary)
        operating.append(frame[frame["site"] == site].assign(method=label))
    marks = pd.concat(operating, ignore_index=True) if operating else None
    if not points.empty:
        fig = charts.roc_overlay(points, f"{site}: test ROC per method", marks)
        st.plotly_chart(fig, key="roc_overlay")
    for label, reason in missing.items():
        st.info(f"{label}: no ROC curve at site {site} ({reason}).")


def roc_per_site(label: str, summary: Summary) -> None:
    st.subheader("Per-site ROC curves")
    points, missing = rundata.roc_frame(summary)
    if not points.empty:
        fig = charts.roc_curves(
            points, f"{label}: test ROC per site", clinical.operating_points(summary)
        )
        st.plotly_chart(fig, key="roc")
        st.caption("Diamonds: each site's operating point (its threshold, in hover).")
    for site, reason in missing.items():
        st.info(f"Site {site}: no ROC curve ({reason}).")


def summary_table(
    heading: str, make: Callable[[Summary], pd.DataFrame], summary: Summary, missing: str
) -> bool:
    """``heading`` over ``make(summary)``, or over the note ``missing`` where that table is
    empty; whether the table was shown."""
    st.subheader(heading)
    table = make(summary)
    if table.empty:
        st.info(missing)
        return False
    st.table(table)
    return True


def operating(label: str, summary: Summary) -> None:
    missing = (
        f"{label} has no operating points: it was written before they were stored, or its "
        "task has more than two classes (the most probable class answers)."
    )
    if not summary_table("Operating points", clinical.operating_table, summary, missing):
        return
    rule = summary.operating_rule or "n/a"
    st.caption(
        f"Each site's threshold on P(positive) was chosen on its validation split (rule: {rule}) "
        "and is applied to its test scans: rate (95% Wilson CI) k/n. PPV and NPV hold at the "
        f"site's own prevalence. {UNRELIABLE_NOTE}"
    )


def grading(label: str, summary: Summary) -> None:
    """A task of more than two classes: macro AUC and kappa per site, each grade against the
    rest, the referable endpoint at its operating point, the routed system's kappa."""
    graded = grading_tables(summary)
    if graded is None:
        return
    st.subheader("Grading")
    st.table(_frame(*graded.sites))
    st.caption(
        "Each site's model on its own test scans: macro AUC (each grade against the rest, "
        "averaged) and quadratic weighted kappa (1: perfect agreement with the true grade, 0: "
        "chance), with 95% CIs that resample patients."
    )
    st.markdown("**Each grade against the rest** (AUC, 95% CI)")
    st.table(_frame(*graded.classes))
    if graded.referable is not None:
        st.markdown(f"**{graded.referable.heading}**")
        st.table(_frame(*graded.referable.table))
        for note in graded.referable.notes:
            st.caption(note)
    kappa = graded.system_kappa
    if kappa is not None:
        st.caption(kappa[0].upper() + kappa[1:])


def _frame(header: list[str], rows: list[list[Any]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=header)


def calibration(label: str, summary: Summary) -> None:
    missing = (
        f"{label} has no calibration figures: it was written before they were stored, or "
        "its task has more than two classes."
    )
    if not summary_table("Calibration", clinical.calibration_table, summary, missing):
        return
    st.caption(
        "Brier score (lower is better) and expected calibration error (ECE) over equal-size "
        "bins; calibration intercept (0 is ideal; above 0, risks are under-estimated) and "
        "slope (1 is ideal; below 1, the model is over-confident)."
    )
    bins = clinical.reliability_frame(summary)
    if not bins.empty:
        fig = charts.reliability_diagram(bins, f"{label}: reliability diagram")
        st.plotly_chart(fig, key="reliability")
        st.caption("Points on the dotted diagonal: predicted probabilities match what happened.")


def cross_site(label: str, summary: Summary) -> None:
    st.subheader("Cross-site AUC")
    matrix = clinical.cross_site_matrix(summary)
    if not matrix:
        st.info(f"{label} has no cross-site figures: it was written before they were stored.")
        return
    st.plotly_chart(charts.cross_site_heatmap(matrix), key="cross_site")
    st.caption(
        "Each site's model on each site's test scans (the diagonal: a model on its own site). "
        "A low cell off the diagonal: that model does not carry over to that site's patients; "
        "hover for accuracy and the number of scans."
    )
    header, rows = system_by_site_rows(summary)
    if rows:
        st.table(
            pd.DataFrame([r[1:] for r in rows], columns=header[1:], index=[r[0] for r in rows])
        )
        st.caption("The routed system on each site's test scans: accuracy (95% Wilson CI) k/n.")


def protocols(label: str, summary: Summary) -> None:
    missing = f"{label} has no router figures."
    heading = "System figures under both protocols"
    if not summary_table(heading, clinical.protocol_table, summary, missing):
        return
    known = "" if summary.routers_origin_known else " (this run has no origin-known figures)"
    st.caption(
        "Every site's test scans pooled and answered as the federation answers a new patient. "
        "Origin unknown: each candidate site reads the scan with its own normalization; origin "
        "known: the scan is read with its own site's normalization, as a member hospital's "
        f"archived scan would be{known}. Rate (95% Wilson CI) k/n; sensitivity and specificity "
        "count the answered scans, each at the answering site's operating point."
    )


def privacy(summaries: dict[str, Summary]) -> None:
    """Each differentially private run's epsilon per site (nothing for other runs)."""
    frame = rundata.privacy_frame(summaries)
    if frame.empty:
        return
    st.subheader("Differential privacy")
    st.dataframe(frame, hide_index=True)
    st.caption(
        "Epsilon each site spent at its delta (DP-SGD: each scan's gradient clipped, Gaussian "
        "noise added; smaller is more private). It bounds what the site's trained weights "
        "reveal about any one patient; it does not cover reported figures or the feature "
        "statistics published for abstention. A site that reached its budget stopped training."
    )


def settings(runs: list[rundata.Run]) -> None:
    """What each run trained with, side by side (one column per run)."""
    configs = {r.label: common.read_config(r) for r in runs}
    summaries = {r.label: s for r in runs if (s := common.read_summary(r)) is not None}
    with st.expander("Settings of the runs", expanded=len(runs) > 1):
        st.table(rundata.settings_table(configs, summaries))
        st.caption("From each run's config.toml (summary.json where the config is silent).")
        for run in runs:
            record = tracked.tracking_record(run.path)
            if record is not None:
                st.markdown(tracked.tracking_line(run.label, record))


def main() -> None:
    common.heading(
        "Federation",
        "Test-set figures of each method: every site's own model on its own held-out scans, "
        "and the federation as a whole. Look at the worst site first.",
    )
    runs, summaries = common.chosen_runs_holding(
        common.read_summary,
        "No finished run to show yet: the figures appear once summary.json exists.",
    )

    per_site(summaries)
    pooled(summaries)

    st.subheader("Federation figures")
    st.table(rundata.federation_table(summaries))
    st.caption(
        "Average accuracy weights each site by its test scans; system accuracy pools every "
        "site's test scans and answers each as the federation answers a new patient "
        "(routed to one site, or a majority vote of the site models). Spread and Gini measure "
        "how unequal the sites' AUCs are (0: all equal)."
    )
    privacy(summaries)
    settings(runs)
    roc_by_method(summaries)

    st.divider()
    st.header("One method in detail")
    preferred = common.routing_run([r for r in runs if r.label in summaries])
    labels = list(summaries)
    first = labels.index(preferred.label) if preferred is not None else 0
    label = st.selectbox("Method", labels, index=first, key="roc_method")
    summary = summaries[label]
    roc_per_site(label, summary)
    operating(label, summary)
    grading(label, summary)
    calibration(label, summary)
    cross_site(label, summary)
    protocols(label, summary)


common.guarded(main)
