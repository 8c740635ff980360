"""Plain-text and markdown tables of run summaries (evaluate, demo, bench)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


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


def site_table(summary: dict[str, Any]) -> str:
    """Per-site rows of one run, with each site's traffic per round."""
    traffic = summary.get("bytes_per_round_by_site", {})
    rows = []
    for site, m in summary["sites"].items():
        auc = m["auc"] if m["auc"] is not None else f"n/a ({m.get('auc_reason') or 'undefined'})"
        t = traffic.get(site, {})
        up, down = (f"{t[k] / 1e3:.1f} kB" if k in t else "n/a" for k in ("up", "down"))
        rows.append([site, auc, m["accuracy"], m["balanced_accuracy"], m["n_test"], up, down])
    header = ["site", "AUC", "accuracy", "balanced acc.", "n test", "sent/round", "received/round"]
    return markdown_table(header, rows)


def federation_lines(summary: dict[str, Any]) -> list[str]:
    pairs = [
        ("mean site AUC", summary.get("mean_site_auc")),
        ("worst site AUC", summary.get("worst_site_auc")),
        ("worst site", summary.get("worst_site")),
        ("AUC spread (std)", summary.get("auc_std")),
        ("AUC Gini", summary.get("auc_gini")),
        ("average accuracy (weighted)", summary.get("average_accuracy")),
        ("mean accuracy", summary.get("mean_accuracy")),
        (f"system accuracy ({summary.get('routing_method')})", summary.get("system_accuracy")),
        ("routing accuracy", summary.get("routing_accuracy")),
        ("abstain rate", summary.get("abstain_rate")),
        ("bytes per round", summary.get("bytes_per_round")),
        ("seconds per round", summary.get("seconds_per_round")),
        ("dropouts", summary.get("dropouts")),
    ]
    return [f"{name}: {fmt(value)}" for name, value in pairs]


def routers_table(summary: dict[str, Any]) -> str:
    """System accuracy, routing accuracy, abstain rate and latency of every router."""
    header = ["router", "system acc.", "routing acc.", "abstain rate", "answered acc."]
    header += ["forward passes", "ms per scan"]
    rows = [
        [
            name,
            r["system_accuracy"],
            r["routing_accuracy"],
            r["abstain_rate"],
            r["answered_accuracy"],
            r["forward_passes"],
            r["latency_ms_per_scan"],
        ]
        for name, r in summary["routers"].items()
    ]
    return markdown_table(header, rows)


def methods_table(summaries: dict[str, dict[str, Any]]) -> str:
    """One row per method: each site's AUC, worst-site AUC, average and system accuracy."""
    site_ids = list(next(iter(summaries.values()))["sites"])
    header = ["method", *(f"AUC {s}" for s in site_ids), "worst-site AUC"]
    header += ["avg accuracy", "system accuracy", "answered by", "routing acc."]
    rows = []
    for name, s in summaries.items():
        rows.append(
            [
                name,
                *(s["sites"][sid]["auc"] for sid in site_ids),
                s.get("worst_site_auc"),
                s.get("average_accuracy"),
                s.get("system_accuracy"),
                s.get("routing_method"),
                s.get("routing_accuracy"),
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


def communication_table(summaries: dict[str, dict[str, Any]], baseline: str) -> str:
    """Bytes per round against ``baseline`` (FedAvg, float32) and what the savings cost."""
    base = summaries[baseline]
    header = ["method", "bytes per round", "fewer than " + baseline, "system accuracy"]
    header += ["change (points)", "mean site AUC", "worst-site AUC"]
    rows = []
    for name, s in summaries.items():
        ratio = base["bytes_per_round"] / s["bytes_per_round"] if s["bytes_per_round"] else None
        rows.append(
            [
                name,
                f"{s['bytes_per_round'] / 1e6:.3f} MB",
                f"{ratio:.1f}x" if ratio else "n/a",
                s["system_accuracy"],
                f"{100 * (s['system_accuracy'] - base['system_accuracy']):+.1f}",
                s.get("mean_site_auc"),
                s.get("worst_site_auc"),
            ]
        )
    return markdown_table(header, rows)
