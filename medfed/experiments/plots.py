"""PNG plots of ``medfed bench`` results (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from medfed.core.errors import ConfigError

ROUTER_COLOURS = {"density_ratio": "#1f77b4", "majority_vote": "#ff7f0e"}
DPI = 110


def pyplot():
    """pyplot on the Agg backend; matplotlib is the ``bench`` extra, not the core install."""
    try:
        import matplotlib
    except ImportError as exc:
        raise ConfigError(
            f"bench plots need matplotlib ({exc}); install it with pip install 'medfed[bench]'"
        ) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path) -> Path:
    """Lay out ``fig``, write it to ``path`` as a PNG, and close it."""
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    pyplot().close(fig)
    return path


def _with_ci(row: dict[str, Any], key: str) -> tuple[float, float, float]:
    """``(value, below, above)``: the mean over seeds and the distances to its 95% CI, or
    ± the std over seeds where the row has no interval; NaN for an undefined figure."""
    intervals = row.get("intervals")
    interval = None if intervals is None else intervals.get(key)
    if interval is not None:
        value = interval["estimate"]
        return value, max(0.0, value - interval["low"]), max(0.0, interval["high"] - value)
    s = row["metrics"][key]
    if s["mean"] is None:
        return float("nan"), 0.0, 0.0
    spread = 0.0 if intervals is not None else (s["std"] or 0.0)  # no CI: no bar drawn
    return s["mean"], spread, spread


def _floor(values: list[tuple[float, float, float]]) -> float:
    """A y-axis floor a little under the lowest bar, so close methods stay distinguishable."""
    lows = [v - below for v, below, _ in values if v == v]  # NaN != NaN: skip undefined figures
    return max(0.0, math.floor(10 * (min(lows, default=0.0) - 0.05)) / 10)


def _bars(
    axis: Any, x: list[float], values: list[tuple[float, float, float]], **style: Any
) -> None:
    axis.bar(
        x,
        [v[0] for v in values],
        yerr=[[v[1] for v in values], [v[2] for v in values]],
        capsize=2,
        **style,
    )


def federation_plot(modality: str, fed: dict[str, Any], path: Path) -> Path:
    """Mean and worst-site AUC, and system accuracy under both protocols (coloured by router),
    per method, with 95% CIs."""
    plt = pyplot()
    names = list(fed["methods"])
    rows = [fed["methods"][n] for n in names]
    x = list(range(len(names)))
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.4))
    floors = []
    for offset, key, label in (
        (-0.2, "mean_site_auc", "mean site AUC"),
        (0.2, "worst_site_auc", "worst-site AUC"),
    ):
        values = [_with_ci(r, key) for r in rows]
        floors.append(_floor(values))
        _bars(left, [i + offset for i in x], values, width=0.4, label=label)
    left.set_title(f"{modality}: site AUC, origin known (mean over seeds, 95% CI)")
    left.set_ylim(min(floors), 1.0)
    left.legend(loc="lower right")
    colours = [ROUTER_COLOURS.get(r["routing_method"], "#7f7f7f") for r in rows]
    floors = []
    for offset, key, label, hatch in (
        (-0.2, "system_accuracy", "origin unknown", ""),
        (0.2, "system_accuracy_origin_known", "origin known", "//"),
    ):
        values = [_with_ci(r, key) for r in rows]
        floors.append(_floor(values))
        _bars(
            right,
            [i + offset for i in x],
            values,
            width=0.4,
            color=colours,
            hatch=hatch,
            edgecolor="white",
            label=label,
        )
    right.set_title(
        f"{modality}: system accuracy (mean over seeds, 95% CI)\nplain: origin unknown, "
        "hatched: origin known; blue: density ratio, orange: majority vote",
        fontsize=10,
    )
    right.set_ylim(min(floors), 1.0)
    for axis in (left, right):
        axis.set_xticks(x, names, rotation=45, ha="right")
        axis.grid(axis="y", alpha=0.3)
    return save_figure(fig, path)


def speed_plot(results: dict[str, Any], path: Path) -> Path:
    """Engine vs plain loop, data path, routing latency, and bytes per round vs FedAvg."""
    plt = pyplot()
    speed = results["speed"]
    fig, axes = plt.subplots(1, 4, figsize=(16, 4))
    e = speed["engine_overhead"]
    axes[0].bar(
        ["engine", "engine\nsites at once", "plain loop"],
        [
            e["engine_seconds_per_round"],
            e["concurrent"]["seconds_per_round"],
            e["plain_seconds_per_round"],
        ],
    )
    axes[0].set_title(f"s/round, {e['local_steps']} local steps (overhead {e['ratio']:.3f})")
    feds = list(speed["data_path"])
    width = 0.8 / 3
    for k, (key, label) in enumerate(
        (
            ("decode_images_per_s", "decode every epoch"),
            ("cached_images_per_s", "cached"),
            ("in_memory_images_per_s", "in memory"),
        )
    ):
        axes[1].bar(
            [i + (k - 1) * width for i in range(len(feds))],
            [speed["data_path"][m][key] for m in feds],
            width=width,
            label=label,
        )
    axes[1].set_xticks(range(len(feds)), feds)
    axes[1].set_yscale("log")
    axes[1].set_title("data path (images/s, log)")
    axes[1].legend(fontsize=7, loc="lower left")
    labels, values, colours = [], [], []
    for m, r in speed["routing_latency"].items():
        for router, key in (
            ("density_ratio", "feddrm_density_ratio_ms_per_scan"),
            ("majority_vote", "majority_vote_ms_per_scan"),
        ):
            if r[key] is not None:
                labels.append(f"{m}\n{router.replace('_', ' ')}")
                values.append(r[key])
                colours.append(ROUTER_COLOURS[router])
    axes[2].bar(labels, values, color=colours)
    axes[2].set_title("routing latency (ms/scan)")
    axes[2].tick_params(axis="x", labelsize=7)
    first = next(iter(speed["bytes"].values()))
    names = [n for n, f in first["methods"].items() if f["ratio_to_baseline"]]
    axes[3].barh(names, [first["methods"][n]["ratio_to_baseline"] for n in names])
    axes[3].axvline(1.0, color="black", linewidth=0.8)
    axes[3].set_title(f"bytes/round / FedAvg fp32 ({next(iter(speed['bytes']))})")
    axes[3].tick_params(axis="y", labelsize=7)
    return save_figure(fig, path)


def write_plots(results: dict[str, Any], out: Path) -> list[Path]:
    """One plot per federation and one of the speed figures, as PNGs under ``out``."""
    paths = [federation_plot(m, fed, out / f"{m}.png") for m, fed in results["federations"].items()]
    paths.append(speed_plot(results, out / "speed.png"))
    return paths
