"""Plotly figures of the dashboard's tables (one function per chart, no Streamlit)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from medfed.core.units import BYTE_UNITS

WORST = "#d62728"
OTHER = "#1f77b4"
CHOSEN = "#2ca02c"  # the site a scan was routed to: never the worst site's red
NOT_RELIED_ON = "#b0b0b0"  # probabilities of a scan the router abstained on
DROPOUT = "#222222"
ERROR_BAR = "#444444"
WARNING = "\u26a0"


# Methods are compared in these colours: no red, which marks the worst site.
METHOD_PALETTE = (
    "#1f77b4",
    "#2ca02c",
    "#9467bd",
    "#ff7f0e",
    "#17becf",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
)


def method_colours(methods: list[str] | pd.Series) -> dict[str, str]:
    """One colour per method (run), in the order given, never the worst site's red."""
    unique = list(dict.fromkeys(methods))
    return {m: METHOD_PALETTE[i % len(METHOD_PALETTE)] for i, m in enumerate(unique)}


SITE_PALETTE = tuple(px.colors.qualitative.Plotly)
# Classes (and FedGMI's distributions) get palettes of their own: a colour names one kind of
# thing on every page, never a method on one chart and a class on the next.
CLASS_PALETTE = ("#66c2a5", "#fc8d62", "#8da0cb", "#e78ac3", "#a6d854", "#ffd92f", "#e5c494")
DISTRIBUTION_PALETTE = ("#b3e2cd", "#fdcdac", "#cbd5e8", "#f4cae4", "#e6f5c9", "#fff2ae")


def site_colours(sites: list[str] | pd.Series) -> dict[str, str]:
    """One colour per site, in the order given (the manifests' order, as the pages list
    sites), so a site keeps its colour on every chart of a run."""
    unique = list(dict.fromkeys(sites))
    return {s: SITE_PALETTE[i % len(SITE_PALETTE)] for i, s in enumerate(unique)}


def byte_unit(values: Any) -> tuple[str, float]:
    """The unit (name, size in bytes) a chart of ``values`` bytes is drawn in: the largest of
    medfed.core.units' kB/MB/GB that the biggest value reaches (kB below 1 kB)."""
    top = float(pd.to_numeric(pd.Series(values), errors="coerce").abs().max() or 0.0)
    for unit, size in BYTE_UNITS:
        if top >= size:
            return unit, size
    return BYTE_UNITS[-1]


def _round_axis(fig: go.Figure, rounds: pd.Series) -> None:
    """Whole-number round ticks while they fit."""
    if len(rounds) and rounds.max() <= 20:
        fig.update_xaxes(dtick=1)


def site_auc_bars(points: pd.DataFrame, worst: dict[str, tuple[str | None, Any]]) -> go.Figure:
    """Per-site AUC grouped by method, with 95% CIs as error bars; each method's worst site
    outlined in red; unreliable sites hatched and marked on the axis.

    ``points``: method, site, AUC, low, high, n, positives, negatives, unreliable (one row per
    method and site; NaN bounds where a run has no CI).
    """
    fig = go.Figure()
    sites = list(dict.fromkeys(points["site"]))
    colours = method_colours(points["method"])
    for method, rows in points.groupby("method", sort=False):
        worst_site = worst.get(str(method), (None, None))[0]
        auc = rows["AUC"].astype(float)
        plus = (rows["high"].astype(float) - auc).clip(lower=0)
        minus = (auc - rows["low"].astype(float)).clip(lower=0)
        flags = rows["unreliable"].fillna("").astype(str)
        hover = [
            f"n {n} ({_count(pos)} pos / {_count(neg)} neg)"
            + (f"<br>{WARNING} unreliable: {flag}" if flag else "")
            for n, pos, neg, flag in zip(
                rows["n"], rows["positives"], rows["negatives"], flags, strict=True
            )
        ]
        fig.add_trace(
            go.Bar(
                x=rows["site"],
                y=auc,
                name=str(method),
                error_y={
                    "type": "data",
                    "array": [None if pd.isna(v) else float(v) for v in plus],
                    "arrayminus": [None if pd.isna(v) else float(v) for v in minus],
                    "visible": bool(plus.notna().any()),  # a run without CIs: no whiskers
                    "color": ERROR_BAR,
                },
                customdata=[
                    [_bound(lo), _bound(hi)]
                    for lo, hi in zip(rows["low"], rows["high"], strict=True)
                ],
                text=hover,
                hovertemplate=(
                    "%{x}: AUC %{y:.3f} (95% CI %{customdata[0]}\u2013%{customdata[1]})"
                    "<br>%{text}<extra>%{fullData.name}</extra>"
                ),
                textposition="none",
                marker={
                    "color": colours[str(method)],
                    "line": {
                        "width": [3 if s == worst_site else 0 for s in rows["site"]],
                        "color": WORST,
                    },
                    "pattern": {"shape": ["/" if flag else "" for flag in flags]},
                },
            )
        )
    flagged = set(points.loc[points["unreliable"].fillna("").astype(bool), "site"])
    fig.update_xaxes(
        tickvals=sites, ticktext=[f"{s} {WARNING}" if s in flagged else s for s in sites]
    )
    fig.update_layout(
        barmode="group",
        yaxis_range=[0, 1.05],
        yaxis_title="test AUC (95% CI)",
        xaxis_title="site",
        legend_title_text="method",
        margin={"t": 30},
    )
    return fig


def _count(value: Any) -> str:
    return "n/a" if value is None or pd.isna(value) else str(int(value))


def _bound(value: Any) -> str:
    return "n/a" if value is None or pd.isna(value) else f"{float(value):.3f}"


def _diagonal(fig: go.Figure) -> None:
    fig.add_shape(type="line", x0=0, y0=0, x1=1, y1=1, line={"dash": "dot", "color": "grey"})


def _operating_markers(
    fig: go.Figure, operating: pd.DataFrame | None, label: str, colours: dict[str, str]
) -> None:
    """Each curve's operating point as a diamond outlined in the curve's colour (the
    threshold in hover)."""
    if operating is None or operating.empty:
        return
    fig.add_trace(
        go.Scatter(
            x=operating["fpr"],
            y=operating["tpr"],
            mode="markers",
            name="operating point",
            marker={
                "symbol": "diamond",
                "size": 11,
                "color": "white",
                "line": {"width": 2, "color": [colours.get(w, "black") for w in operating[label]]},
            },
            text=[
                f"{who}: threshold {t:.3f} ({rule})"
                for who, t, rule in zip(
                    operating[label], operating["threshold"], operating["rule"], strict=True
                )
            ],
            hovertemplate="%{text}<br>sensitivity %{y:.3f}, 1 - specificity %{x:.3f}"
            "<extra></extra>",
        )
    )


def roc_curves(
    points: pd.DataFrame, title: str, operating: pd.DataFrame | None = None
) -> go.Figure:
    """One ROC curve per site (``points``: site, curve (legend text), fpr, tpr), and each
    site's operating point (``operating``: site, fpr, tpr, threshold, rule)."""
    return _roc_figure(points, title, operating, "site", site_colours(points["site"]))


def roc_overlay(
    points: pd.DataFrame, title: str, operating: pd.DataFrame | None = None
) -> go.Figure:
    """Several methods' ROC curves at one site (``points``: method, curve, fpr, tpr), and
    each method's operating point there (``operating``: method, fpr, tpr, threshold, rule)."""
    return _roc_figure(points, title, operating, "method", method_colours(points["method"]))


def _roc_figure(
    points: pd.DataFrame,
    title: str,
    operating: pd.DataFrame | None,
    by: str,
    colours: dict[str, str],
) -> go.Figure:
    """ROC curves coloured by ``by`` (site or method), the chance line and operating points."""
    legend = dict(zip(points["curve"], points[by], strict=True))
    fig = px.line(
        points,
        x="fpr",
        y="tpr",
        color="curve",
        title=title,
        range_x=[0, 1],
        color_discrete_map={curve: colours[key] for curve, key in legend.items()},
    )
    _diagonal(fig)
    _operating_markers(fig, operating, by, colours)
    _roc_axes(fig)
    return fig


def _roc_axes(fig: go.Figure) -> None:
    fig.update_layout(
        xaxis_title="false positive rate (1 - specificity)",
        yaxis_title="true positive rate (sensitivity)",
        yaxis_range=[0, 1.02],
        legend_title_text="",
    )


def reliability_diagram(bins: pd.DataFrame, title: str) -> go.Figure:
    """Observed fraction of positives against mean predicted probability, per bin and site
    (``bins``: site, curve, mean_predicted, fraction_positive, n); the diagonal is perfect
    calibration."""
    colours = site_colours(bins["site"])
    fig = go.Figure()
    for curve, rows in bins.groupby("curve", sort=False):
        fig.add_trace(
            go.Scatter(
                x=rows["mean_predicted"],
                y=rows["fraction_positive"],
                mode="lines+markers",
                name=str(curve),
                line={"color": colours[rows["site"].iloc[0]]},
                customdata=rows["n"],
                hovertemplate="predicted %{x:.3f}, observed %{y:.3f} (%{customdata} scans)"
                "<extra>%{fullData.name}</extra>",
            )
        )
    fig.add_trace(
        go.Scatter(
            x=[0, 1],
            y=[0, 1],
            mode="lines",
            name="perfect calibration",
            line={"dash": "dot", "color": "grey"},
            hoverinfo="skip",
        )
    )
    fig.update_layout(
        title=title,
        xaxis_title="mean predicted probability (per bin)",
        yaxis_title="fraction of positives (per bin)",
        xaxis_range=[0, 1],
        yaxis_range=[0, 1.02],
    )
    return fig


CROSS_SITE_TITLE = "Cross-site AUC (rows: model's site, columns: data's site)"


def cross_site_heatmap(matrix: dict[str, Any], title: str = CROSS_SITE_TITLE) -> go.Figure:
    """Every site's model on every site's test scans: AUC in the cells, accuracy and scans in
    hover (``matrix``: models, data, data_labels, auc, accuracy, n, reason)."""
    auc = [[None if v is None else float(v) for v in row] for row in matrix["auc"]]
    text = [["n/a" if v is None else f"{v:.3f}" for v in row] for row in auc]
    custom = [
        [
            [_bound(acc), "" if n is None else str(n), reason or ""]
            for acc, n, reason in zip(accs, ns, reasons, strict=True)
        ]
        for accs, ns, reasons in zip(matrix["accuracy"], matrix["n"], matrix["reason"], strict=True)
    ]
    fig = go.Figure(
        go.Heatmap(
            z=auc,
            x=matrix["data_labels"],
            y=matrix["models"],
            text=text,
            texttemplate="%{text}",
            customdata=custom,
            hovertemplate="model of %{y} on the scans of %{x}<br>AUC %{text}, accuracy "
            "%{customdata[0]} over %{customdata[1]} scans %{customdata[2]}<extra></extra>",
            colorscale="RdYlGn",
            zmin=0.5,
            zmax=1.0,
            colorbar={"title": {"text": "AUC"}},
        )
    )
    fig.update_layout(
        title=title,
        xaxis_title="data's site (test scans)",
        yaxis_title="model's site",
        yaxis_autorange="reversed",
        xaxis_type="category",
        yaxis_type="category",
    )
    return fig


def runs_overlay(frame: pd.DataFrame, curve: str, label: str) -> go.Figure:
    """Several runs on one chart: one line per run, the mean over its sites in each round
    (``frame``: run, round, and the curve's column; ``label``: the curve in words)."""
    fig = px.line(
        frame,
        x="round",
        y=curve,
        color="run",
        markers=True,
        title=f"{label}: runs compared",
        color_discrete_map=method_colours(frame["run"]),
    )
    fig.update_layout(yaxis_title=f"{label} (mean over sites)", legend_title_text="run")
    _round_axis(fig, frame["round"])
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
    fig = px.bar(
        counts,
        x="site",
        y="scans",
        color="class",
        barmode="group",
        text="share",
        color_discrete_sequence=CLASS_PALETTE,
    )
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


def site_probability_bars(probs: pd.DataFrame, relied_on: bool = True) -> go.Figure:
    """How likely the scan comes from each site; the chosen site in its own colour (never the
    worst site's red). ``relied_on`` False (the router abstained): every bar greyed out."""
    if relied_on:
        colours = [CHOSEN if chosen else OTHER for chosen in probs["chosen"]]
    else:
        colours = [NOT_RELIED_ON] * len(probs)
    fig = go.Figure(go.Bar(x=probs["site"], y=probs["probability"], marker_color=colours))
    fig.update_layout(yaxis_range=[0, 1], yaxis_title="probability", xaxis_title="site")
    if not relied_on:
        fig.update_layout(title="not to be relied on: the router abstained")
    return fig


TRAFFIC = {"bytes total": "sent + received", "bytes sent": "sent", "bytes received": "received"}


TRAFFIC_PANEL_HEIGHT = 280  # pixels per row of traffic_lines' panels
TRAFFIC_ROW_GAP = 90  # pixels between two rows: the round axis below, the next title above


def traffic_lines(traffic: pd.DataFrame, column: str) -> go.Figure:
    """Bytes per round per site, one panel per method, in one unit (title and axis say
    which). Each panel's axis starts at 0 and fits its own method; sites that send the same
    bytes share a line, so each site has its own marker and dash and the hover lists all."""
    unit, size = byte_unit(traffic[column])
    data = traffic.assign(**{unit: traffic[column] / size})
    rows = max(1, -(-traffic["method"].nunique() // 2))
    height = TRAFFIC_PANEL_HEIGHT * rows + TRAFFIC_ROW_GAP * (rows - 1) + 120
    fig = px.line(
        data,
        x="round",
        y=unit,
        color="site",
        line_dash="site",
        symbol="site",
        facet_col="method",
        facet_col_wrap=2,
        # Each panel's title sits above it: with plotly's default spacing it lands on the
        # round axis of the panel above, so the rows get room for both, at a fixed height each.
        facet_row_spacing=TRAFFIC_ROW_GAP / height,
        height=height,
        markers=True,
        title=f"{TRAFFIC.get(column, column)} per round and site ({unit})",
        color_discrete_map=site_colours(traffic["site"]),
        category_orders={"site": list(dict.fromkeys(traffic["site"]))},
    )
    fig.for_each_annotation(lambda a: a.update(text=a.text.split("=", 1)[-1]))
    fig.update_yaxes(matches=None, rangemode="tozero", showticklabels=True, title_text="")
    fig.update_yaxes(title_text=f"{unit} per round", col=1)
    # Sites sending the same bytes draw on top of each other: earlier sites get wider lines
    # and bigger markers, so every site's line still shows around the ones above it.
    sites = list(dict.fromkeys(traffic["site"]))
    for trace in fig.data:
        behind = len(sites) - 1 - sites.index(trace.name) if trace.name in sites else 0
        trace.update(line={"width": 2 + 3 * behind}, marker={"size": 8 + 5 * behind})
    top: dict[str, float] = {}  # each panel's y axis, from 0 to a little above its largest
    for trace in fig.data:
        axis = "yaxis" + (trace.yaxis or "y")[1:]
        values = pd.to_numeric(pd.Series(trace.y), errors="coerce")
        top[axis] = max(top.get(axis, 0.0), float(values.max() or 0.0))
    for axis, high in top.items():
        fig.layout[axis].range = [0, high * 1.15 if high > 0 else 1]
    fig.update_layout(hovermode="x unified")
    _round_axis(fig, traffic["round"])
    return fig


def traffic_bars(traffic: pd.DataFrame) -> go.Figure:
    """Mean bytes per round per site, sent and received, grouped by method (one unit)."""
    per_round = traffic.groupby(["method", "site"], as_index=False, sort=False)[
        ["bytes sent", "bytes received"]
    ].mean()
    long = per_round.melt(id_vars=["method", "site"], var_name="direction", value_name="bytes")
    long["direction"] = long["direction"].str.removeprefix("bytes ")
    unit, size = byte_unit(long["bytes"])
    long[unit] = long["bytes"] / size
    fig = px.bar(
        long,
        x="method",
        y=unit,
        color="site",
        pattern_shape="direction",
        barmode="group",
        title=f"mean traffic per round ({unit})",
        color_discrete_map=site_colours(long["site"]),
        category_orders={"site": list(dict.fromkeys(long["site"]))},
    )
    fig.update_layout(yaxis_title=f"mean {unit} per round")
    return fig


def mixture_bars(mixture: pd.DataFrame) -> go.Figure:
    """Each site's mixture coefficients as a stacked bar (FedGMI)."""
    fig = px.bar(
        mixture,
        x="site",
        y="share",
        color="distribution",
        barmode="stack",
        color_discrete_sequence=DISTRIBUTION_PALETTE,
    )
    fig.update_yaxes(range=[0, 1], title="share of the site's scans")
    return fig
