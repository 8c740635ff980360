"""The tables of ``medfed bench``'s results.md and README section: one per federation with
its paired comparisons and their verdicts, the speed, backbone and memory tables, the caption."""

from __future__ import annotations

import re
from typing import Any

from medfed.experiments.demo import REFERENCE, WARMUP_BASE, comparisons_markdown
from medfed.experiments.paired import ORIGIN_KNOWN, ORIGIN_UNKNOWN, PROTOCOLS
from medfed.metrics import Proportion
from medfed.reports.comparisons import ci_cell, verdict_lines
from medfed.reports.evaluation import AT_ARGMAX, AT_OPERATING, rules_note
from medfed.reports.markdown import markdown_table
from medfed.reports.text import rate_text


def fixed(value: float | None, digits: int = 3) -> str:
    """``value`` to ``digits`` decimals; ``n/a`` when undefined."""
    return "n/a" if value is None else f"{value:.{digits}f}"


def _cell(s: dict[str, Any] | None, digits: int = 3, scale: float = 1.0) -> str:
    if s is None or s["mean"] is None:  # None: results.json predates the figure
        return "n/a"
    text = f"{s['mean'] * scale:.{digits}f}"
    if s["n"] > 1:
        text += f" ± {s['std'] * scale:.{digits}f}"
    return text


UNRELIABLE = " \u2020"


def _unreliable(row: dict[str, Any]) -> dict[str, list[str]]:
    """Site -> why its figures rest on too few scans, per seed (sites without a reason left
    out)."""
    found: dict[str, list[str]] = {}
    for site, reasons in row.get("test_scans", {}).get("unreliable", {}).items():
        if reasons and all(why == reasons[0] for why in reasons) and reasons[0]:
            found[site] = [f"every seed: {reasons[0]}"]
        elif marks := [f"seed {k}: {why}" for k, why in enumerate(reasons) if why]:
            found[site] = marks
    return found


def _interval_cell(row: dict[str, Any], key: str, site: str | None = None, flag: str = "") -> str:
    """The mean over seeds with its 95% CI; mean ± std where the run has no per-scan data."""
    intervals = row.get("intervals")
    if intervals is None:
        stat_ = row["metrics"]["site_auc"][site] if site else row["metrics"][key]
        return _cell(stat_) + ("" if stat_["mean"] is None else flag)
    interval = intervals["site_auc"].get(site) if site else intervals.get(key)
    if interval is None:
        # Defined on the data as given, but undefined in most resamples (a site of a handful
        # of test scans draws one class): the mean without an interval.
        stat_ = row["metrics"]["site_auc"][site] if site else row["metrics"][key]
        return "n/a" if stat_["mean"] is None else f"{stat_['mean']:.2f} (no CI){flag}"
    return ci_cell(interval, flag=flag)


def methods_markdown(federation: dict[str, Any]) -> str:
    """Rows = methods: each figure's mean over the seeds with its 95% CI (accuracy averaged
    over sites and timing: mean ± std); every accuracy at the operating point but the last two
    columns', at argmax."""
    sites = federation["sites"]
    weights = ("test scans", "training scans")
    header = ["method", "norm.", "answered by", *(f"AUC {s}" for s in sites)]
    header += ["mean AUC", "worst AUC", *(f"avg acc. {AT_OPERATING} (by {w})" for w in weights)]
    header += [f"system acc. {AT_OPERATING} ({p})" for p in (ORIGIN_UNKNOWN, ORIGIN_KNOWN)]
    header += [f"routing acc. ({ORIGIN_UNKNOWN})", "s/round (median)"]
    header += [f"avg acc. {AT_ARGMAX} (by {w})" for w in weights]
    rows = []
    for name, row in federation["methods"].items():
        m = row["metrics"]
        weak = _unreliable(row)
        any_weak = UNRELIABLE if weak else ""
        rows.append(
            [
                name,
                row.get("normalization", "site"),
                row["routing_method"],
                *(
                    _interval_cell(row, "site_auc", s, UNRELIABLE if s in weak else "")
                    for s in sites
                ),
                _interval_cell(row, "mean_site_auc", flag=any_weak),
                _interval_cell(row, "worst_site_auc", flag=any_weak),
                _cell(m.get("average_accuracy_operating")),
                _cell(m.get("average_accuracy_operating_by_train")),
                _interval_cell(row, "system_accuracy"),
                _interval_cell(row, "system_accuracy_origin_known"),
                _cell(m["routing_accuracy"]),
                _cell(m["median_seconds_per_round"], 2),
                _cell(m["average_accuracy"]),
                _cell(m["average_accuracy_by_train"]),
            ]
        )
    return markdown_table(header, rows)


def test_scans_lines(federation: dict[str, Any]) -> list[str]:
    """How many test scans (and positives) every site had on each seed, and which figures rest
    on too few of a class."""
    rows = federation["methods"]
    row = rows.get(REFERENCE) or next(iter(rows.values()))
    scans = row.get("test_scans")
    if not scans:
        return []
    per_site = []
    for site, counts in scans["n"].items():
        positives = scans["positives"][site]
        seeds = ", ".join(
            f"{n}" + ("" if p is None else f" ({p} positive)")
            for n, p in zip(counts, positives, strict=True)
        )
        per_site.append(f"{site} {seeds}")
    lines = [f"Test scans per site on each seed: {'; '.join(per_site)}."]
    weak = _unreliable(row)
    if weak:
        reasons = "; ".join(f"{site} ({', '.join(marks)})" for site, marks in weak.items())
        lines.append(
            f"\u2020 unreliable: the figure rests on fewer than 10 positives or negatives in "
            f"some seed's test split: {reasons}."
        )
    return lines


def reading_note(results: dict[str, Any]) -> str:
    """How to read the tables: what each cell is, its CI, the protocols, the weighting."""
    seeds = len(results["seeds"])
    return (
        f"Each cell: the mean over {seeds} seed(s) with its {results['ci']}. AUC columns: each "
        f"site's model on its own test scans ({ORIGIN_KNOWN}). System accuracy: every site's "
        "test scans pooled and answered as the federation answers a new scan (routing or "
        f"voting, as 'answered by' says), under two protocols. {ORIGIN_UNKNOWN}: "
        f"{PROTOCOLS[ORIGIN_UNKNOWN]}; {ORIGIN_KNOWN}: {PROTOCOLS[ORIGIN_KNOWN]}. Rows marked "
        "[federation norm] (norm. federation) train and evaluate with that pooled "
        "normalization. Average accuracy weights the sites by their test scans, or by their "
        "training scans; it, routing accuracy and seconds per round are mean \u00b1 std over "
        "seeds. \u2020: the figure rests on fewer than 10 positives or negatives in some seed's "
        f"test split (unreliable). {rules_note()}"
    )


def speed_markdown(speed: dict[str, Any]) -> str:
    e = speed["engine_overhead"]
    measured = [
        speed[k] for k in ("engine_overhead", "engine_overhead_larger_rounds") if k in speed
    ]
    engine = markdown_table(
        [
            "local steps",
            "engine, one site at a time (s/round)",
            "engine, every site at once (s/round)",
            "plain loop (s/round)",
            "one at a time / plain",
            "every site at once / plain",
        ],
        [
            [
                m["local_steps"],
                f"{m['engine_seconds_per_round']:.4f}",
                f"{m['concurrent']['seconds_per_round']:.4f}",
                f"{m['plain_seconds_per_round']:.4f}",
                f"{m['ratio']:.3f} (goal ≤ {m['goal']:.2f})",
                f"{m['concurrent']['ratio']:.3f} (goal ≤ {m['concurrent']['goal']:.2f})",
            ]
            for m in measured
        ],
    )
    engine += (
        f"\n\nEngine speed ({e['federation']}, {e['algorithm']}, {e['sites']} sites, batch "
        f"{e['batch_size']}, {e['rounds']} rounds, best of {e['repeats']}): {e['definition']}. "
        f"One site at a time and the plain loop use {e['threads']} thread(s); every site at "
        f"once: {e['concurrent']['lanes']} (`--concurrency`)."
    )
    data = markdown_table(
        [
            "federation",
            "scans",
            "decode every epoch (img/s)",
            "cached (img/s)",
            "speed-up",
            "in memory (img/s)",
        ],
        [
            [
                m,
                d["n_images"],
                f"{d['decode_images_per_s']:.0f}",
                f"{d['cached_images_per_s']:.0f}",
                f"{d['cached_speedup']:.1f}x",
                f"{d['in_memory_images_per_s']:.0f}",
            ]
            for m, d in speed["data_path"].items()
        ],
    )
    routing = markdown_table(
        [
            "federation",
            "m sites",
            "FedDRM density ratio (ms/scan)",
            "majority vote (ms/scan)",
            "vote / density ratio",
        ],
        [
            [
                m,
                r["m_sites"],
                fixed(r["feddrm_density_ratio_ms_per_scan"], 2),
                fixed(r["majority_vote_ms_per_scan"], 2),
                fixed(r["majority_vote_over_density_ratio"], 1),
            ]
            for m, r in speed["routing_latency"].items()
        ],
    )
    parts = [engine, data, routing]
    runs = [f for r in speed["routing_latency"].values() for f in r["methods"].values()]
    if any(len(f.get("routers") or {}) > 1 for f in runs):
        parts.append(routing_cost_markdown(speed["routing_latency"]))
    parts.append(bytes_markdown(speed["bytes"]))
    if speed.get("ct_backbones"):
        parts.append(backbones_markdown(speed["ct_backbones"]))
    return "\n\n".join(parts)


def routing_cost_markdown(latency: dict[str, Any]) -> str:
    """Every router of each run that routes (FedDRM, LoRA) on the first seed: forward passes
    and milliseconds per scan (median, 95% interval) beside its routing and system accuracy
    on the pooled test scans (origin unknown, Wilson 95% CIs); the majority vote of the same
    run is the reference that needs no client head."""
    rows = []
    for modality, found in latency.items():
        for method, figures in found["methods"].items():
            routers = figures.get("routers") or {}
            if len(routers) < 2:
                continue  # a run that only votes: the routing table above has it
            for name, r in routers.items():
                low, high = r.get("ms_low"), r.get("ms_high")
                ms = fixed(r["ms_per_scan"], 2)
                if low is not None and high is not None:
                    ms += f" ({fixed(low, 2)}\u2013{fixed(high, 2)})"
                rows.append(
                    [
                        modality,
                        method,
                        f"{name} (default)" if name == figures["router"] else name,
                        r["forward_passes"],
                        ms,
                        *(_rate(r.get(k)) for k in ("routing_accuracy", "system_accuracy")),
                    ]
                )
    header = ["federation", "method", "router", "forward passes", "ms/scan (95% CI)"]
    header += ["routing acc. (origin unknown)", f"system acc. {AT_OPERATING} (origin unknown)"]
    return markdown_table(header, rows)


def _rate(found: dict[str, Any] | None) -> str:
    return rate_text(None if found is None else Proportion.from_dict(found))


def _norm_family(norm: str) -> str:
    """BatchNorm2d and BatchNorm3d are one kind of norm layer for comparing paths."""
    return re.sub(r"[123]d$", "", norm)


def backbones_markdown(found: dict[str, Any]) -> str:
    """Seconds per round, parameters and bytes per round of each CT backbone, each against the
    3-D backbone with the same kind of norm layers, and what `auto` picks."""
    rows = found["backbones"]
    three_d = {
        _norm_family(r["norm"]): r["seconds_per_round"] for r in rows.values() if r["path"] == "3-D"
    }
    auto = found["auto"]
    picks = {auto["shared_norms"]: "shared norms", auto["private_norms"]: "private norms"}
    if auto["shared_norms"] == auto["private_norms"]:
        picks = {auto["shared_norms"]: "always"}
    table = markdown_table(
        [
            "backbone",
            "path",
            "norm",
            "parameters",
            "MB/round",
            "s/round (median)",
            "vs 3-D, same norm",
            "`auto` picks it",
        ],
        [
            [
                name,
                r["path"],
                r["norm"],
                f"{r['parameters']:,}",
                f"{r['bytes_per_round'] / 1e6:.3f}",
                fixed(r["seconds_per_round"], 3),
                _ratio(r["seconds_per_round"], three_d.get(_norm_family(r["norm"]))),
                picks.get(name, ""),
            ]
            for name, r in rows.items()
        ],
    )
    private = ", ".join(auto.get("private_norm_algorithms", [])) or "none"
    return (
        f"{table}\n\n{found['federation']} backbones ({found['algorithm']}, {found['sites']} "
        f"sites, input {'x'.join(map(str, found['input_shape']))}, {found['local_steps']} local "
        f"steps of batch {found['batch_size']}, {found['device']}): "
        f"{found['definition']}, over {found['rounds']} timed round(s). With `backbone = auto`, "
        f"{found['federation']} trains **{auto['shared_norms']}** where every layer is shared "
        f"and **{auto['private_norms']}** where normalization layers stay on each site "
        f"(so, at their default parameters: {private})."
    )


def _ratio(value: float | None, reference: float | None) -> str:
    if value is None or not reference:
        return "n/a"
    return f"{value / reference:.2f}x"


def memory_markdown(memory: dict[str, Any]) -> str:
    """Peak RSS of loading one CT site with a cold and a warm cache, against the limit."""
    mb = 1e6
    table = markdown_table(
        [
            "cache",
            "peak RSS (MB)",
            "after imports (MB)",
            "site tensors (MB)",
            "memory-mapped",
            "cache hits / misses",
            "seconds",
        ],
        [
            [
                name,
                f"{load['peak_rss_bytes'] / mb:.0f}",
                f"{load['import_rss_bytes'] / mb:.0f}",
                f"{load['site_bytes'] / mb:.1f}",
                "yes" if load["mapped"] else "no",
                f"{load['cache_hits']} / {load['cache_misses']}",
                f"{load['seconds']:.1f}",
            ]
            for name, load in (("cold", memory["cold"]), ("warm", memory["warm"]))
        ],
    )
    limit = f"{memory['limit_bytes'] / 1e9:g} GB"
    verdict_ = "under" if memory["under_limit"] else "OVER"
    return (
        f"Loading one CT site of {memory['patients']} patients (each "
        f"{'x'.join(map(str, memory['input_shape']))}, stored as {memory['storage_dtype']}; one "
        f"float32 copy would be {memory['float32_bytes'] / mb:.1f} MB), each load in a fresh "
        f"process that then reads every scan once:\n\n{table}\n\nPeak RSS "
        f"{memory['peak_rss_bytes'] / mb:.0f} MB: {verdict_} the {limit} limit."
    )


def bytes_markdown(by_federation: dict[str, Any]) -> str:
    feds = list(by_federation)
    header = ["method"]
    for m in feds:
        header += [f"{m} MB/round", f"{m} vs FedAvg fp32"]
    methods = list(next(iter(by_federation.values()))["methods"])
    rows = []
    for name in methods:
        row: list[Any] = [name]
        for m in feds:
            figures = by_federation[m]["methods"][name]
            ratio = figures["ratio_to_baseline"]
            row += [
                f"{figures['bytes_per_round'] / 1e6:.3f}",
                "n/a" if ratio is None else f"{ratio:.3f}",
            ]
        rows.append(row)
    return markdown_table(header, rows)


def warmup_markdown(fed: dict[str, Any], modality: str, h: str) -> str:
    """What the warm-up base rows cost in rounds, and LoRA against FedAvg+FT from that base."""
    base = fed.get("warmup_base")
    if not base:
        return ""
    parts = [
        f"{h}# {modality}: from a FedAvg warm-up base",
        f"Rows marked {WARMUP_BASE} start from one FedAvg run of {base['fedavg_rounds']} "
        f"round(s) on the same federation and seed, then train {base['method_rounds']} "
        f"round(s) of their own: {base['fedavg_rounds'] + base['method_rounds']} rounds in "
        "all, as every other row. Their bytes per round count their own rounds; each warm-up "
        "round cost what a FedAvg round costs. LoRA freezes the base and keeps its adapters "
        "and target head on each site: only its client head travels, and once, each site's "
        "feature statistics (count, sum, scatter) from which the server sets that head.",
    ]
    found = fed.get("base_comparison")
    if found:
        parts.append(comparisons_markdown(found, f"{modality}, same base"))
    return "\n\n".join(parts)


def findings_lines(results: dict[str, Any]) -> list[str]:
    """The findings of every federation: the verdicts of the paired differences with FedDRM,
    each naming its figure and protocol (nothing else is claimed)."""
    lines = []
    for modality, fed in results["federations"].items():
        if fed.get("comparisons"):
            lines += verdict_lines(fed["comparisons"], modality)
        if fed.get("base_comparison"):
            lines += verdict_lines(fed["base_comparison"], f"{modality}, same base")
    return lines


def caption(results: dict[str, Any]) -> str:
    budgets = ", ".join(
        f"{m}: {f['budget']['n_per_site']} per site, {f['budget']['rounds']} rounds x "
        f"{f['budget']['local_steps']} local steps"
        for m, f in results["federations"].items()
    )
    d = results["device"]
    where = d["gpu"] or d["cpu"]
    return (
        f"`{results['command']}` (seeds {results['seeds'][0]}..{results['seeds'][-1]}; "
        f"{budgets}; {d['device']}, {where}; {results['seconds_total']:.0f} s in all, "
        f"{results['started_at']}{_load_text(results.get('load_average'))})"
    )


def _load_text(load: dict[str, Any] | None) -> str:
    if not load or not load.get("start") or not load.get("end"):
        return ""
    return (
        f"; load average {load['start'][0]:.1f} at the start, {load['end'][1]:.1f} over the "
        "last 5 minutes"
    )


def results_markdown(
    results: dict[str, Any], *, image_prefix: str = "", heading_level: int = 2
) -> str:
    """The whole report: one table per federation with its paired comparisons and their
    verdicts, the speed tables, the plots, the caption."""
    h = "#" * heading_level
    parts = [reading_note(results)]
    for modality, fed in results["federations"].items():
        parts.append(
            f"{h} {modality} federation ({len(fed['sites'])} sites), mean over "
            f"{len(results['seeds'])} seed(s) with 95% CIs"
        )
        parts.append(methods_markdown(fed))
        parts.append("\n".join(test_scans_lines(fed)))
        found = fed.get("comparisons")
        if found:
            parts.append(
                f"{h}# {modality}: {found['reference']} against each method, paired on the "
                "same test scans"
            )
            parts.append(comparisons_markdown(found, modality))
        parts.append(warmup_markdown(fed, modality, h))
    parts.append(f"{h} Speed")
    parts.append(speed_markdown(results["speed"]))
    if results.get("memory"):
        parts.append(f"{h} Memory")
        parts.append(memory_markdown(results["memory"]))
    parts.append("\n".join(f"![{name[:-4]}]({image_prefix}{name})" for name in results["plots"]))
    parts.append(caption(results))
    return "\n\n".join(p for p in parts if p)
