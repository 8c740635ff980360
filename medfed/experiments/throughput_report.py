"""``medfed bench-throughput``'s whole report: the throughput table, DP-SGD's cost per step
and the peak memory of loading a large fundus site, in OUT/throughput.json and .md."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from medfed.config import load_manifest
from medfed.data.cache import TensorCache
from medfed.data.sitedata import load_site
from medfed.experiments.throughput import ThroughputPlan, markdown, run_throughput
from medfed.models.device import resolve_device
from medfed.reports.markdown import markdown_table

MEMORY_LIMIT_BYTES = 4 * 10**9  # a 5,000-photo site at 224 px, loaded and read once


def memory_markdown(memory: dict[str, Any]) -> str:
    """The peak-RSS table of loading a large fundus site, cold and warm."""
    rows = []
    for name, load in (("cold (empty)", memory["cold"]), ("warm (mapped)", memory["warm"])):
        peak = load["peak_rss_bytes"]
        rows.append(
            [
                name,
                f"{peak / 1e6:.0f}",
                f"{load['import_rss_bytes'] / 1e6:.0f}",
                f"{load['site_bytes'] / 1e6:.0f}",
                "yes" if load["mapped"] else "no",
                f"{load['seconds']:.0f}",
                "yes" if peak <= MEMORY_LIMIT_BYTES else "NO",
            ]
        )
    header = [
        "cache",
        "peak RSS (MB)",
        "after imports (MB)",
        "site tensors (MB)",
        "memory-mapped",
        "seconds",
        f"within {MEMORY_LIMIT_BYTES / 1e9:.0f} GB",
    ]
    shape = "x".join(map(str, memory["input_shape"]))
    return (
        f"{markdown_table(header, rows)}\n\nPeak resident memory of loading a synthetic fundus "
        f"site of {memory['patients']} photos at {shape} ({memory['storage_dtype']}; one float32 "
        f"copy would be {memory['float32_bytes'] / 1e6:.0f} MB), each load in a fresh process "
        "followed by one pass over every photo, normalized, as an epoch reads them; the cold "
        "load writes each split's rows straight into its memory-mapped cache file."
    )


def full_report(
    out: Path,
    plan: ThroughputPlan,
    memory_scans: int,
    *,
    echo: Callable[[str], Any],
    dp_steps: int = 0,
    dp_backbone: str = "tv-resnet18-gn",
) -> str:
    """Throughput (with ``dp_steps``, DP-SGD's cost per step; with ``memory_scans``, the large
    site's memory): OUT/throughput.json and OUT/throughput.md; returns the markdown."""
    import json

    from medfed.experiments.memory import fundus_site_memory

    results = run_throughput(out, plan, echo=echo)
    text = markdown(results)
    if dp_steps:
        from medfed.experiments.dpcost import dp_cost, dp_markdown

        echo(f"DP-SGD: {dp_steps} steps of each of four loops on {dp_backbone}")
        site = load_site(load_manifest(out / "data" / "site.toml"), TensorCache(out / "cache"))
        setup = resolve_device(plan.device)
        results["dp"] = dp_cost(site, plan, setup, dp_steps, dp_backbone)
        text = f"{text}\n\n{dp_markdown(results['dp'], plan.image_size)}"
    if memory_scans:
        echo(f"memory: loading a site of {memory_scans} photos at {plan.image_size} px")
        memory = fundus_site_memory(memory_scans, plan.image_size, workdir=out, seed=plan.seed)
        results["memory"] = memory.to_dict()
        text = f"{text}\n\n{memory_markdown(results['memory'])}"
    (out / "throughput.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    (out / "throughput.md").write_text(text + "\n", encoding="utf-8")
    echo(f"results: {out / 'throughput.json'}, {out / 'throughput.md'}")
    return text
