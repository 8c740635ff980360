"""``medfed demo``: synthesize a fundus federation, train FedDRM and baselines, compare."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medfed.config import TrainConfig
from medfed.data.synth import synthesize
from medfed.report import methods_table, replace_marked_section
from medfed.training import load_sites, train

DEMO_METHODS = ("feddrm", "fedavgft", "fedbn", "local")


@dataclass(frozen=True)
class Budget:
    n_per_site: int
    rounds: int
    local_steps: int


FULL = Budget(n_per_site=240, rounds=60, local_steps=3)
QUICK = Budget(n_per_site=240, rounds=30, local_steps=3)


def run_demo(
    out: Path,
    *,
    quick: bool = False,
    seed: int = 0,
    methods: tuple[str, ...] = DEMO_METHODS,
    budget: Budget | None = None,
    echo: Callable[[str], Any] = print,
    readme: Path | None = None,
) -> dict[str, dict[str, Any]]:
    """Run the demo end to end; returns each method's summary."""
    budget = budget or (QUICK if quick else FULL)
    start = time.perf_counter()
    data = out / "data"
    echo(f"synthesizing 3 fundus sites ({budget.n_per_site} scans each) into {data} ...")
    manifests = synthesize(data, modality="fundus", n_per_site=budget.n_per_site, seed=seed)
    sites = load_sites(list(manifests), out / "cache")
    summaries = {}
    for method in methods:
        run_dir = out / "runs" / method
        if run_dir.exists():
            shutil.rmtree(run_dir)
        echo(f"training {method} ({budget.rounds} rounds x {budget.local_steps} local steps) ...")
        config = TrainConfig(
            algorithm=method,
            rounds=budget.rounds,
            local_steps=budget.local_steps,
            seed=seed,
            device="auto",
        )
        summaries[method] = train(sites, config, run_dir)
    table = methods_table(summaries)
    seconds = time.perf_counter() - start
    caption = (
        f"`medfed demo{' --quick' if quick else ''}` (seed {seed}, {budget.n_per_site} scans per "
        f"site, {budget.rounds} rounds x {budget.local_steps} local steps, "
        f"{next(iter(summaries.values()))['device']}, {seconds:.0f} s in all)"
    )
    (out / "demo_table.md").write_text(f"{table}\n\n{caption}\n", encoding="utf-8")
    echo("")
    echo(table)
    echo("")
    echo(f"finished in {seconds:.0f} s; table saved to {out / 'demo_table.md'}")
    if readme is not None:
        text = readme.read_text(encoding="utf-8")
        readme.write_text(
            replace_marked_section(text, "demo-table", f"{table}\n\n{caption}"), encoding="utf-8"
        )
        echo(f"updated the demo table in {readme}")
    echo(f"inspect a run: medfed evaluate {out / 'runs' / 'feddrm'}")
    return summaries
