"""Plotly figures of the dashboard's tables (one function per chart, no Streamlit)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

WORST = "#d62728"
OTHER = "#1f77b4"
DROPOUT = "#222222"


def site_colours(sites: list[str] | pd.Series) -> dict[str, str]:
    """One colour per site, the same on every chart (sites in sorted order)."""
    palette = px.colors.qualitative.Plotly
    return {s: palette[i % len(palette)] for i, s in enumerate(sorted(set(sites)))}


def _round_axis(fig: go.Figure, rounds: pd.Series) -> None:
    """Whole-number round ticks while they fit."""
    if len(rounds) and rounds.max() <= 20:
        fig.update_xaxes(dtick=1)


def site_auc_bars(aucs: pd.DataFrame, worst: dict[str, tuple[str | None, Any]]) -> go.Figure:
    """Per-site AUC grouped by method; each method's worst site outlined in red."""
    long = aucs.reset_index().melt(id_vars="site", var_name="method", value_name="AUC")
    fig = px.bar(long, x="site", y="AUC", color="method", barmode="group", range_y=[0, 1])
    for trace in fig.data:
        worst_site = worst.get(trace.name, (None, None))[0]
        trace.marker.line.width = [3 if s == worst_site else 0 for s in trace.x]
        trace.marker.line.color = WORST
    fig.update_layout(legend_title_text="method", margin={"t": 30})
    return fig


def roc_curves(points: pd.DataFrame, title: str) -> go.Figure:
    """One ROC curve per site (``points``: site, curve (legend text), fpr, tpr)."""
    colours = site_colours(points["site"])
    legend = dict(zip(points["curve"], points["site"], strict=True))
    fig = px.line(
        points,
        x="fpr",
        y="tpr",
        color="curve",
        title=title,
        range_x=[0, 1],
        color_discrete_map={curve: colours[site] for curve, site in legend.items()},
    )
    fig.add_shape(type="line", x0=0, y0=0, x1=1, y1=1, line={"dash": "dot", "color": "grey"})
    fig.update_layout(
        xaxis_title="false positive rate (1 - specificity)",
        yaxis_title="true positive rate (sensitivity)",
        yaxis_range=[0, 1.02],
    )
    return fig


def round_curves(
    frame: pd.DataFrame,
    curve: str,
    title: str,
    dropped: pd.DataFrame,
    resumed_after: list[int],
    skipped: list[int],
) -> go.Figure:
    """One line per site over rounds; dropouts as crosses, resumes and skipped rounds as lines."""
    data = frame[["round", "site", curve]].copy()
    data[curve] = pd.to_numeric(data[curve], errors="coerce")
    fig = px.line(
        data,
        x="round",
        y=curve,
        color="site",
        markers=True,
        title=title,
        color_discrete_map=site_colours(data["site"]),
    )
    if not dropped.empty:
        fig.add_trace(
            go.Scatter(
                x=dropped["round"],
                y=dropped["value"],
                mode="markers",
                name="dropped out",
                marker={"symbol": "x", "size": 13, "color": DROPOUT},
                text=[f"{s}: {r}" for s, r in zip(dropped["site"], dropped["reason"], strict=True)],
                hovertemplate="round %{x}<br>%{text}<extra>dropout</extra>",
            )
        )
    for done in resumed_after:
        fig.add_vline(
            x=done + 0.5,
            line={"dash": "dash", "color": "green"},
            annotation_text=f"resumed after round {done}",
        )
    for round_ in skipped:
        fig.add_vline(
            x=round_, line={"dash": "dot", "color": WORST}, annotation_text="not aggregated"
        )
    fig.update_layout(yaxis_title=title)
    _round_axis(fig, data["round"])
    return fig


def class_ratio_bars(counts: pd.DataFrame) -> go.Figure:
    """Scans per class at each site (all splits)."""
    fig = px.bar(counts, x="site", y="scans", color="class", barmode="group", text="share")
    fig.update_traces(texttemplate="%{text:.0%}", textposition="outside")
    return fig


def distance_heatmap(sites: list[str], matrix: list[list[float]], method: str) -> go.Figure:
    fig = px.imshow(
        matrix,
        x=sites,
        y=sites,
        text_auto=".3f",
        color_continuous_scale="Reds",
        labels={"color": "distance"},
        title=method,
    )
    fig.update_layout(title_font_size=13)
    return fig


def embedding_scatter(points: dict[str, Any]) -> go.Figure:
    frame = pd.DataFrame({k: points[k] for k in ("x", "y", "site", "label")})
    share = [*(points.get("explained_variance") or []), None, None]
    axis = [f"component {i + 1}" + (f" ({share[i]:.0%})" if share[i] else "") for i in (0, 1)]
    fig = px.scatter(
        frame,
        x="x",
        y="y",
        color="site",
        symbol="label",
        opacity=0.75,
        color_discrete_map=site_colours(frame["site"]),
    )
    fig.update_layout(xaxis_title=axis[0], yaxis_title=axis[1])
    return fig


def site_probability_bars(probs: pd.DataFrame) -> go.Figure:
    colours = [WORST if chosen else OTHER for chosen in probs["chosen"]]
    fig = go.Figure(go.Bar(x=probs["site"], y=probs["probability"], marker_color=colours))
    fig.update_layout(yaxis_range=[0, 1], yaxis_title="probability", xaxis_title="site")
    return fig


def traffic_lines(traffic: pd.DataFrame, column: str) -> go.Figure:
    """Bytes per round per site, one panel per method."""
    fig = px.line(
        traffic,
        x="round",
        y=column,
        color="site",
        facet_col="method",
        facet_col_wrap=2,
        markers=True,
        color_discrete_map=site_colours(traffic["site"]),
    )
    fig.for_each_annotation(lambda a: a.update(text=a.text.split("=", 1)[-1]))
    _round_axis(fig, traffic["round"])
    return fig


def traffic_bars(traffic: pd.DataFrame) -> go.Figure:
    """Mean kB per round per site, sent and received, grouped by method."""
    per_round = traffic.groupby(["method", "site"], as_index=False)[
        ["kB sent", "kB received"]
    ].mean()
    long = per_round.melt(id_vars=["method", "site"], var_name="direction", value_name="kB")
    fig = px.bar(
        long,
        x="method",
        y="kB",
        color="site",
        pattern_shape="direction",
        barmode="group",
        color_discrete_map=site_colours(long["site"]),
    )
    fig.update_layout(yaxis_title="mean kB per round")
    return fig


def mixture_bars(mixture: pd.DataFrame) -> go.Figure:
    """Each site's mixture coefficients as a stacked bar (FedGMI)."""
    fig = px.bar(mixture, x="site", y="share", color="distribution", barmode="stack")
    fig.update_yaxes(range=[0, 1], title="share of the site's scans")
    return fig
