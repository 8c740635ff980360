"""HTML for the study report: escaped markup built from small pieces, tables whose cells keep a
figure and its CI on one line, and the inline SVG plots (forest plot, reliability diagram,
bytes per round). Every value placed is escaped unless it is markup built here."""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from medfed.core.units import human_bytes
from medfed.metrics import Pooled, Proportion
from medfed.reports.evaluation import auc_text
from medfed.reports.study_runs import StudyRun
from medfed.reports.text import UNRELIABLE_MARK, ci_text, count_text, fmt, pooled_text, rate_text
from medfed.runs.schema import SiteFigures

# Okabe-Ito colours, told apart by colour-blind readers; yellow left out (unreadable on white).
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")


# ---------------------------------------------------------------------------- HTML pieces
class Html(str):
    """Markup built here, already escaped; any other value is escaped where it is placed."""


def esc(value: Any) -> Html:
    """``value`` as safe HTML text (numbers as the tables print them, None as ``n/a``)."""
    if isinstance(value, Html):
        return value
    return Html(html.escape(value if isinstance(value, str) else fmt(value), quote=True))


def join(parts: Iterable[Any], sep: str = "") -> Html:
    return Html(sep.join(esc(p) for p in parts))


def tag(name: str, content: Any = "", **attrs: Any) -> Html:
    """``<name attrs>content</name>``; attribute values escaped, ``class_`` for ``class``."""
    text = "".join(
        f' {k.rstrip("_").replace("_", "-")}="{esc(v)}"' for k, v in attrs.items() if v is not None
    )
    return Html(f"<{name}{text}>{esc(content)}</{name}>")


@dataclass(frozen=True)
class Cell:
    """A table cell with attributes of its own (a style, a class)."""

    content: Any
    attrs: dict[str, Any]


def _td(cell: Any) -> Html:
    if isinstance(cell, Cell):
        return tag("td", cell.content, **cell.attrs)
    return tag("td", cell)


def table(
    header: Sequence[Any], rows: Sequence[Sequence[Any]], caption: Any = None, **attrs: Any
) -> Html:
    """A table whose first column heads its rows; a :class:`Cell` carries its own attributes."""
    head = tag("tr", join(tag("th", h, scope="col") for h in header))
    body = join(
        tag("tr", join([tag("th", row[0], scope="row"), *(_td(c) for c in row[1:])]))
        for row in rows
    )
    cap = tag("caption", caption) if caption is not None else ""
    inner = tag("table", join([cap, tag("thead", head), tag("tbody", body)]), **attrs)
    return tag("div", inner, class_="scroll")


def fig(text: Any) -> Html:
    """A figure with its CI, kept on one line."""
    return tag("span", text, class_="fig")


def flagged(text: str, reason: str | None) -> Html:
    """``text`` followed by the unreliable mark (its reason as a tooltip) when ``reason``."""
    if not reason:
        return fig(text)
    flag = tag("span", f"{UNRELIABLE_MARK} unreliable", class_="flag", title=reason)
    return join([fig(text), " ", flag])


def rate_cell(
    rate: Proportion | None,
    fallback: float | None = None,
    note: str = "",
    unreliable: str | None = None,
) -> Html:
    """A rate with its CI on one line (flagged when ``unreliable`` says why) and its counts
    (and ``note``) under it."""
    flag = tag("span", UNRELIABLE_MARK, class_="flag", title=unreliable) if unreliable else ""
    if rate is None or rate.interval is None:
        text = join([fig(rate_text(rate, fallback)), flag])
        return join([text, tag("span", note, class_="counts")]) if note else text
    counts = count_text(rate.k, rate.n) + (f" \u00b7 {note}" if note else "")
    return join([fig(ci_text(rate.interval)), flag, tag("span", counts, class_="counts")])


def _colour(k: int) -> str:
    return PALETTE[k % len(PALETTE)]


def _svg(width: float, height: float, label: str, body: Iterable[Any]) -> Html:
    return tag(
        "svg",
        join(body),
        viewBox=f"0 0 {width:.0f} {height:.0f}",
        width=f"{width:.0f}",
        height=f"{height:.0f}",
        role="img",
        aria_label=label,
        class_="plot",
    )


def _text(x: float, y: float, text: Any, **attrs: Any) -> Html:
    return tag("text", text, x=f"{x:.1f}", y=f"{y:.1f}", **attrs)


def _line(x1: float, y1: float, x2: float, y2: float, **attrs: Any) -> Html:
    return tag("line", "", x1=f"{x1:.1f}", y1=f"{y1:.1f}", x2=f"{x2:.1f}", y2=f"{y2:.1f}", **attrs)


# ---------------------------------------------------------------------------- plots
def forest_plot(label: str, sites: Mapping[str, SiteFigures | None], pooled: Pooled | None) -> Html:
    """Each site's AUC and 95% CI on one line, the random-effects pool as a diamond below."""
    left, width, right, row, top = 150.0, 340.0, 230.0, 26.0, 10.0
    n_rows = len(sites) + 1
    axis_y = top + n_rows * row + 6
    height = axis_y + 40
    ends = [0.5]
    for m in sites.values():
        if m is not None and m.auc is not None:
            ends.append(m.auc_ci.low if m.auc_ci is not None else m.auc)
    if pooled is not None:
        ends.append(pooled.low)
    low_end = math.floor(min(ends) * 10 + 1e-9) / 10

    def x(v: float) -> float:
        return left + (min(max(v, low_end), 1.0) - low_end) / (1.0 - low_end) * width

    parts: list[Any] = [
        _line(x(0.5), top, x(0.5), axis_y, class_="chance"),
        _text(x(0.5) + 3, top + 8, "chance", class_="small"),
    ]
    for i, (site, m) in enumerate(sites.items()):
        y = top + (i + 0.5) * row
        parts.append(_text(left - 8, y + 4, site, text_anchor="end"))
        if m is None or m.auc is None:
            why = "not in this run" if m is None else f"n/a ({m.auc_reason or 'undefined'})"
            parts.append(_text(left + 6, y + 4, why, class_="muted"))
            continue
        if m.auc_ci is not None:
            parts.append(_line(x(m.auc_ci.low), y, x(m.auc_ci.high), y, class_="ci"))
            for end in (m.auc_ci.low, m.auc_ci.high):
                parts.append(_line(x(end), y - 5, x(end), y + 5, class_="ci"))
        hollow = "hollow" if m.unreliable else "solid"
        box = tag(
            "rect",
            tag("title", f"{site}: AUC {auc_text(m, mark=False)}"),
            x=f"{x(m.auc) - 5:.1f}",
            y=f"{y - 5:.1f}",
            width="10",
            height="10",
            class_=hollow,
        )
        parts += [box, _text(left + width + 12, y + 4, auc_text(m))]
    y = top + (n_rows - 0.5) * row
    parts.append(_text(left - 8, y + 4, "pooled", text_anchor="end", class_="bold"))
    if pooled is None:
        parts.append(_text(left + 6, y + 4, "n/a (needs 2 sites with an AUC CI)", class_="muted"))
    else:
        points = (
            f"{x(pooled.low):.1f},{y:.1f} {x(pooled.estimate):.1f},{y - 7:.1f} "
            f"{x(pooled.high):.1f},{y:.1f} {x(pooled.estimate):.1f},{y + 7:.1f}"
        )
        title = tag("title", f"pooled AUC {pooled_text(pooled, sites=True)}")
        diamond = tag("polygon", title, points=points)
        parts += [diamond, _text(left + width + 12, y + 4, pooled_text(pooled), class_="bold")]
    parts.append(_line(left, axis_y, left + width, axis_y, class_="axis"))
    steps = round((1.0 - low_end) * 10)
    for k in range(steps + 1):
        v = low_end + k / 10
        parts.append(_line(x(v), axis_y, x(v), axis_y + 4, class_="axis"))
        parts.append(_text(x(v), axis_y + 16, f"{v:.1f}", text_anchor="middle", class_="small"))
    parts.append(_text(left + width / 2, axis_y + 32, "AUC (95% CI)", text_anchor="middle"))
    return _svg(left + width + right, height, f"Forest plot of per-site AUC, {label}", parts)


def reliability_diagram(label: str, sites: Mapping[str, SiteFigures | None]) -> Html:
    """Observed share of positives against mean predicted probability, per bin, one line per
    site; the diagonal is perfect calibration."""
    left, top, size, legend = 48.0, 12.0, 300.0, 260.0
    height = top + size + 46

    def px(v: float) -> float:
        return left + min(max(v, 0.0), 1.0) * size

    def py(v: float) -> float:
        return top + (1.0 - min(max(v, 0.0), 1.0)) * size

    parts: list[Any] = []
    for k in range(6):
        v = k / 5
        parts += [
            _line(px(v), top, px(v), top + size, class_="grid"),
            _line(left, py(v), left + size, py(v), class_="grid"),
            _text(px(v), top + size + 16, f"{v:.1f}", text_anchor="middle", class_="small"),
            _text(left - 6, py(v) + 4, f"{v:.1f}", text_anchor="end", class_="small"),
        ]
    parts += [
        tag(
            "rect",
            "",
            x=f"{left:.0f}",
            y=f"{top:.0f}",
            width=f"{size:.0f}",
            height=f"{size:.0f}",
            class_="frame",
        ),
        _line(px(0), py(0), px(1), py(1), class_="chance"),
        _text(left + size / 2, top + size + 34, "mean predicted probability", text_anchor="middle"),
        _text(
            14,
            top + size / 2,
            "observed share of positives",
            text_anchor="middle",
            transform=f"rotate(-90 14 {top + size / 2:.1f})",
        ),
    ]
    legend_x = left + size + 20
    for k, (site, m) in enumerate(sites.items()):
        colour = _colour(k)
        ly = top + 10 + k * 36
        calib = None if m is None else m.calibration
        parts.append(_line(legend_x, ly, legend_x + 18, ly, stroke=colour, class_="series"))
        parts.append(_text(legend_x + 24, ly + 4, site, class_="bold"))
        if calib is None:
            parts.append(_text(legend_x + 24, ly + 18, "n/a (not in this run)", class_="muted"))
            continue
        summary_text = f"Brier {fmt(calib.brier)}, ECE {fmt(calib.ece)}"
        parts.append(_text(legend_x + 24, ly + 18, summary_text, class_="small"))
        bins = [b for b in calib.bins if _bin_ok(b)]
        if not bins:
            continue
        points = " ".join(
            f"{px(b['mean_predicted']):.1f},{py(b['fraction_positive']):.1f}" for b in bins
        )
        parts.append(tag("polyline", "", points=points, stroke=colour, class_="series"))
        for b in bins:
            tip = (
                f"{site}: predicted {b['mean_predicted']:.3f}, observed "
                f"{b['fraction_positive']:.3f}, n {b.get('n', 'n/a')}"
            )
            parts.append(
                tag(
                    "circle",
                    tag("title", tip),
                    cx=f"{px(b['mean_predicted']):.1f}",
                    cy=f"{py(b['fraction_positive']):.1f}",
                    r="3.5",
                    fill=colour,
                )
            )
    return _svg(legend_x + legend, height, f"Reliability diagram, {label}", parts)


def _bin_ok(b: Any) -> bool:
    return isinstance(b, Mapping) and all(
        isinstance(b.get(k), int | float) and math.isfinite(b[k])
        for k in ("mean_predicted", "fraction_positive")
    )


def bytes_chart(runs: Sequence[StudyRun]) -> Html:
    """One bar per method: bytes sent and received per round, all sites together."""
    left, width, right, row = 170.0, 320.0, 110.0, 28.0
    height = 10 + row * len(runs) + 10
    largest = max((r.summary.bytes_per_round for r in runs), default=0.0) or 1.0
    parts: list[Any] = []
    for k, run in enumerate(runs):
        y = 10 + k * row
        n = run.summary.bytes_per_round
        bar = max(1.0, n / largest * width) if n > 0 else 0.0
        parts += [
            _text(left - 8, y + row / 2 + 4, run.label, text_anchor="end"),
            tag(
                "rect",
                tag("title", f"{run.label}: {human_bytes(n)} per round"),
                x=f"{left:.0f}",
                y=f"{y + 5:.1f}",
                width=f"{bar:.1f}",
                height=f"{row - 10:.0f}",
                fill=_colour(k),
            ),
            _text(left + bar + 6, y + row / 2 + 4, human_bytes(n), class_="small"),
        ]
    return _svg(left + width + right, height, "Bytes per round, by method", parts)
