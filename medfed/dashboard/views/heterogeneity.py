"""The Sites page's heterogeneity section: label shift (class shares with Wilson CIs), covariate
shift (the MMD² level), concept shift (cross-site drops beyond what the MMD² explains) and the
synthetic scenario the run's sites resemble (``medfed.reports.heterogeneity``, as
``medfed sites heterogeneity`` prints it)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from medfed.dashboard import common
from medfed.dashboard.rundata import Run
from medfed.reports.heterogeneity import (
    GUIDANCE,
    NEEDS_RUN,
    HeterogeneityError,
    cross_figures,
    heterogeneity,
    measured_sweep,
    ranking_text,
    task_of,
    test_sizes,
)


def run_report(run: Run, overview: dict[str, Any]) -> dict[str, Any]:
    """The report of a run's sites: counts and distances from its site overview, the
    concept-shift indicator from its cross-site matrix (when it has finished)."""
    counts = {site: info.get("counts", {}) for site, info in overview["sites"].items()}
    summary = common.read_summary(run)
    cross = sizes = None
    if summary is not None and summary.cross_site:
        cross, sizes = cross_figures(summary.cross_site), test_sizes(summary.sites)
    task = task_of(overview.get("modality"), counts)
    return heterogeneity(
        counts, overview.get("distances"), task, cross, measured_sweep(), sizes=sizes
    )


def share_frame(report: dict[str, Any]) -> pd.DataFrame:
    """One row per site and class: the share, its Wilson 95% CI and its counts."""
    rows = [
        {
            "site": site,
            "class": name,
            "share": p["value"],
            "95% CI": "n/a" if p["low"] is None else f"{p['low']:.3f}\u2013{p['high']:.3f}",
            "scans": f"{p['k']}/{p['n']}",
        }
        for site, per in report["prevalence"].items()
        for name, p in per.items()
    ]
    return pd.DataFrame(rows).set_index(["site", "class"])


def pair_frame(concept: dict[str, Any]) -> pd.DataFrame:
    rows = [
        {
            "model \u2192 data": f"{r['model']} \u2192 {r['data']}",
            "MMD²": r["mmd"],
            f"{concept['figure']} drop": r["drop"],
            "explained by MMD²": r["expected"],
            "upper 95%": r["upper"],
            "concept shift?": "flagged"
            if r["flag"]
            else ("too few scans" if r["unreliable"] else ""),
        }
        for r in concept["pairs"]
    ]
    return pd.DataFrame(rows).set_index("model \u2192 data")


def section(run: Run, overview: dict[str, Any]) -> None:
    st.subheader("Heterogeneity")
    try:
        report = run_report(run, overview)
    except HeterogeneityError as exc:
        st.caption(f"No heterogeneity report: {exc}")
        return
    st.caption(GUIDANCE)
    st.markdown("**Label shift: each site's class shares (Wilson 95% CI)**")
    st.table(share_frame(report).round(3))
    label, cov, found = report["label_shift"], report["covariate_shift"], report["regime"]
    alpha = "none beyond sampling" if label["alpha"] is None else f"{label['alpha']:.2g}"
    p_value = "n/a" if label["p_value"] is None else f"{label['p_value']:.4f}"
    mmd = "n/a" if cov["mean_mmd"] is None else f"{cov['mean_mmd']:.4f}"
    st.markdown(
        f"- label shift: **{label['level']}** (chi-square p = {p_value}; Dirichlet alpha "
        f"{alpha})\n- covariate shift: **{cov['level'] or 'not calibrated'}** (mean MMD² "
        f"{mmd}, bands of medfed's synthetic {cov['task']} sites)"
    )
    concepts = list(report["concept_shift"].values())
    for concept in concepts:
        if concept["reason"] is None:
            flagged = ", ".join(concept["flagged"]) or "none"
            st.markdown(f"**Concept shift ({concept['figure']}): flagged pairs: {flagged}**")
            st.table(pair_frame(concept).round(3))
        elif concept["reason"] != NEEDS_RUN:
            st.caption(f"Concept shift ({concept['figure']}): {concept['reason']}")
    if all(c["reason"] == NEEDS_RUN for c in concepts):
        st.caption(f"Concept shift: {NEEDS_RUN} (this run has no cross-site matrix yet).")
    st.markdown(
        f"**Resembles:** `{found['resembles'] or 'no shift'}`  \n"
        f"**Methods:** {ranking_text(report['methods'])}"
    )
