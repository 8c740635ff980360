"""What a deployed round costs at more sites: bytes per site for each algorithm, and the 20- and
100-site sheet ``medfed bench-deploy`` extrapolates from its measured figures.

Bytes come from in-process runs of the bench's model (what ``metrics.jsonl`` records as
``bytes_down`` and ``bytes_up``: the algorithm's downlink and uplink, in medfed's wire format),
plus the global weights a deployed round's validation message carries (``bytes_eval``); at the
default float32 wire the training part names its downlink by hash, so a deployed round moves
the validation's weights down and the update up.
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import Any

SHEET_SITES = (20, 100)
LINK_BANDWIDTH_BYTES_S = 125e6
"""The SuperLink's network link the sheet assumes: 1 Gbit/s."""
EXCHANGES_SECURE = (
    4  # SecAgg+: setup, key sharing, masked updates, unmasking (medfed.flower.secure)
)


def run_bytes(run: Path) -> dict[str, int]:
    """A run's bytes per site and round (medians over its later rounds' accepted updates):
    ``down`` (the algorithm's downlink), ``up`` (the update) and ``eval`` (the whole global
    state, float32, as a deployed validation message carries it)."""
    from medfed.federation.wire import encode
    from medfed.runs import RunDir
    from medfed.runs.checkpoints import CheckpointStore
    from medfed.runs.weights import load_state

    records = [r for r in RunDir(run).read_metrics() if r.get("status") == "ok"]
    later = [r for r in records if r["round"] > 1] or records
    store = CheckpointStore(RunDir(run).checkpoints, keep=1)
    last = store.rounds()[-1][1]
    return {
        "down": int(statistics.median(r["bytes_down"] for r in later)),
        "up": int(statistics.median(r["bytes_up"] for r in later)),
        "eval": len(encode(load_state(last / "global.safetensors"))),
    }


def algorithm_bytes(
    out: Path, sites: list[Any], base: Any, inprocess: Path, algorithms: tuple[str, ...]
) -> dict[str, dict[str, int]]:
    """Bytes per site and round of each algorithm (``base``: the bench's FedAvg settings, whose
    in-process run is ``inprocess``), each other algorithm trained two rounds of one step in
    process. LoRA starts from the bench's FedAvg run, as LoRA needs trained base weights."""
    from medfed.federation.training import train

    found = {}
    for algorithm in algorithms:
        if algorithm == base.algorithm:
            found[algorithm] = run_bytes(inprocess)
            continue
        config = dataclasses.replace(
            base,
            algorithm=algorithm,
            rounds=2,
            local_steps=1,
            keep_checkpoints=1,
            init=str(inprocess) if algorithm == "lora" else base.init,
        )
        run = out / f"bytes_{algorithm}"
        train(sites, config, run)
        found[algorithm] = run_bytes(run)
    return found


def sheet(
    per_algorithm: dict[str, dict[str, int]],
    floor_s: float,
    measured_sites: int,
    cpu_per_message_s: float,
    training_s: float,
) -> list[dict[str, Any]]:
    """The round at each of ``SHEET_SITES`` sites, extrapolated from the measured figures.

    With n sites, a round is 2n messages through the SuperLink (each site's message and its
    reply); the SuperLink handles them on one core one after another and moves n x (down + up)
    bytes each way. Round time = the measured floor + (n - measured_sites) x 2 x CPU per
    message + n x (down + up) / bandwidth (the extra sites' handling and transfer at the
    SuperLink) + the slowest site's training."""
    rows = []
    for n in SHEET_SITES:
        for algorithm, b in per_algorithm.items():
            wire = b["eval"] + b["up"]  # down: the validation's weights; up: the update
            cpu = 2 * n * cpu_per_message_s
            transfer = n * wire / LINK_BANDWIDTH_BYTES_S
            extra = max(0, n - measured_sites) * 2 * cpu_per_message_s + transfer
            rows.append(
                {
                    "sites": n,
                    "algorithm": algorithm,
                    "bytes_per_site": wire,
                    "superlink_bytes": n * wire,
                    "superlink_cpu_s": cpu,
                    "round_s": floor_s + extra + training_s,
                    "floor_s": floor_s + extra,
                    "secure_round_s": EXCHANGES_SECURE * (floor_s + extra) + training_s,
                }
            )
    return rows


def size(n: float) -> str:
    """Bytes for a reader: MB, or kB below a tenth of a MB (LoRA's adapters)."""
    return f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def sheet_markdown(results: dict[str, Any]) -> list[str]:
    """The bytes table and the 20/100-site sheet, as markdown lines."""
    per = results["algorithm_bytes"]
    lines = [
        "",
        "Bytes per site and round, by algorithm (the bench's model; float32 wire): the "
        "algorithm's downlink and uplink as `metrics.jsonl` records them, and what a deployed "
        "round moves (the validation message's global weights down, the update up; the "
        "training part names its downlink by hash).",
        "",
        "| algorithm | downlink | uplink | deployed round: down + up |",
        "| --- | --- | --- | --- |",
    ]
    for algorithm, b in per.items():
        lines.append(
            f"| {algorithm} | {size(b['down'])} | {size(b['up'])} | {size(b['eval'] + b['up'])} |"
        )
    cpu = results["superlink_cpu_per_message_s"]
    lines += [
        "",
        f"At 20 and 100 sites, extrapolated from what was measured here (a floor round of "
        f"{results['floor_s']:.1f} s at {results['plan']['sites']} sites, {cpu * 1e3:.1f} ms "
        f"of the SuperLink's CPU per message, the longest site's training "
        f"{results['training_s']:.1f} s): a round is 2n messages; round time = floor + "
        f"(n - {results['plan']['sites']}) x 2 x CPU per message + n x (down + up) / "
        f"{LINK_BANDWIDTH_BYTES_S * 8 / 1e9:g} Gbit/s + the slowest site's training; under "
        f"SecAgg+ the floor part counts {EXCHANGES_SECURE} times (its {EXCHANGES_SECURE} "
        "exchanges a round).",
        "",
        "| sites | algorithm | bytes through the SuperLink, each way | SuperLink CPU per round "
        "| expected round (s) | of it Flower's floor (s) | under SecAgg+ (s) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in results["sheet"]:
        lines.append(
            f"| {row['sites']} | {row['algorithm']} | {size(row['superlink_bytes'])} | "
            f"{row['superlink_cpu_s']:.2f} s | {row['round_s']:.1f} | {row['floor_s']:.1f} | "
            f"{row['secure_round_s']:.1f} |"
        )
    return lines
