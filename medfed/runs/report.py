"""Plain-text and markdown tables of run summaries (evaluate, demo, bench)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from medfed.runs.schema import Summary


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in header]] + [[fmt(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def line(row: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"

    sep = "| " + " | ".join("-" * w for w in widths) + " |"
    return "\n".join([line(cells[0]), sep, *(line(r) for r in cells[1:])])


def site_table(summary: Summary) -> str:
    """Per-site rows of one run, with each site's traffic per round."""
    rows = []
    for site, m in summary.sites.items():
        auc = m.auc if m.auc is not None else f"n/a ({m.auc_reason or 'undefined'})"
        t = summary.bytes_per_round_by_site.get(site)
        up, down = (
            ("n/a", "n/a") if t is None else (f"{t.up / 1e3:.1f} kB", f"{t.down / 1e3:.1f} kB")
        )
        rows.append([site, auc, m.accuracy, m.balanced_accuracy, m.n_test, up, down])
    header = ["site", "AUC", "accuracy", "balanced acc.", "n test", "sent/round", "received/round"]
    return markdown_table(header, rows)


def federation_lines(summary: Summary) -> list[str]:
    pairs = [
        ("mean site AUC", summary.mean_site_auc),
        ("worst site AUC", summary.worst_site_auc),
        ("worst site", summary.worst_site),
        ("AUC spread (std)", summary.auc_std),
        ("AUC Gini", summary.auc_gini),
        ("average accuracy (weighted)", summary.average_accuracy),
        ("mean accuracy", summary.mean_accuracy),
        (f"system accuracy ({summary.routing_method})", summary.system_accuracy),
        ("routing accuracy", summary.routing_accuracy),
        ("abstain rate", summary.abstain_rate),
        ("bytes per round", summary.bytes_per_round),
        ("seconds per round", summary.seconds_per_round),
        ("dropouts", summary.dropouts),
    ]
    return [f"{name}: {fmt(value)}" for name, value in pairs]


def routers_table(summary: Summary) -> str:
    """System accuracy, routing accuracy, abstain rate and latency of every router."""
    header = ["router", "system acc.", "routing acc.", "abstain rate", "answered acc."]
    header += ["forward passes", "ms per scan"]
    rows = [
        [
            name,
            r.system_accuracy,
            r.routing_accuracy,
            r.abstain_rate,
            r.answered_accuracy,
            r.forward_passes,
            r.latency_ms_per_scan,
        ]
        for name, r in summary.routers.items()
    ]
    return markdown_table(header, rows)


def methods_table(summaries: Mapping[str, Summary]) -> str:
    """One row per method: each site's AUC, worst-site AUC, average and system accuracy."""
    site_ids = list(next(iter(summaries.values())).sites)
    header = ["method", *(f"AUC {s}" for s in site_ids), "worst-site AUC"]
    header += ["avg accuracy", "system accuracy", "answered by", "routing acc."]
    rows = []
    for name, s in summaries.items():
        rows.append(
            [
                name,
                *(s.sites[sid].auc for sid in site_ids),
                s.worst_site_auc,
                s.average_accuracy,
                s.system_accuracy,
                s.routing_method,
                s.routing_accuracy,
            ]
        )
    return markdown_table(header, rows)


def replace_marked_section(text: str, marker: str, body: str) -> str:
    """Replace what stands between ``<!-- marker:start -->`` and ``<!-- marker:end -->``."""
    start, end = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"
    if start not in text or end not in text:
        raise ValueError(f"markers {start} ... {end} not found")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body.rstrip()}\n{end}{tail}"


def communication_table(summaries: Mapping[str, Summary], baseline: str) -> str:
    """Bytes per round against ``baseline`` (FedAvg, float32) and what the savings cost."""
    base = summaries[baseline]
    header = ["method", "bytes per round", "fewer than " + baseline, "system accuracy"]
    header += ["change (points)", "mean site AUC", "worst-site AUC"]
    rows = []
    for name, s in summaries.items():
        ratio = base.bytes_per_round / s.bytes_per_round if s.bytes_per_round else None
        change = _points(s.system_accuracy, base.system_accuracy)
        rows.append(
            [
                name,
                f"{s.bytes_per_round / 1e6:.3f} MB",
                f"{ratio:.1f}x" if ratio else "n/a",
                s.system_accuracy,
                change,
                s.mean_site_auc,
                s.worst_site_auc,
            ]
        )
    return markdown_table(header, rows)


def _points(value: float | None, baseline: float | None) -> str:
    """The change from ``baseline`` in percentage points, signed."""
    if value is None or baseline is None:
        return "n/a"
    return f"{100 * (value - baseline):+.1f}"
