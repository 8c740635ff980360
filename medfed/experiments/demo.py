"""``medfed demo``: synthesize a fundus federation, train FedDRM and baselines, compare."""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medfed.config import TrainConfig
from medfed.data.synth import synthesize
from medfed.errors import ConfigError
from medfed.federation.training import load_sites, train
from medfed.runs import Summary
from medfed.runs.report import communication_table, methods_table, replace_marked_section

DEMO_METHODS = ("feddrm", "fedavgft", "fedbn", "local")
COMMUNICATION_METHODS = (
    "fedavg",
    "feddrm",
    "fedavg@int8",
    "feddrm@int8+delta",
    "fedals:base=feddrm,alpha=5",
    "fedals:base=feddrm,alpha=10",
    "fedals:base=feddrm,alpha=5@int8+delta",
    "lora",
    "lora@int8+delta",
)


@dataclass(frozen=True)
class MethodSpec:
    """``NAME[:KEY=VALUE,...][@PRECISION[+delta]]``, e.g. ``fedals:base=feddrm,alpha=5@int8``."""

    label: str
    algorithm: str
    params: dict[str, str]
    wire_precision: str = "float32"
    wire_delta: bool = False

    @classmethod
    def parse(cls, text: str) -> MethodSpec:
        head, _, wire_text = text.partition("@")
        name, _, param_text = head.partition(":")
        params = {}
        for item in filter(None, param_text.split(",")):
            key, sep, value = item.partition("=")
            if not sep:
                raise ConfigError(f"method {text!r}: parameter {item!r} must be KEY=VALUE")
            params[key] = value
        precision, _, delta = wire_text.partition("+")
        if delta not in ("", "delta"):
            raise ConfigError(f"method {text!r}: after '+' only 'delta' is understood")
        return cls(text, name, params, precision or "float32", delta == "delta")

    @property
    def dirname(self) -> str:
        """The label as a run-directory name."""
        return re.sub(r"[:,@=+]", "_", self.label)

    def config(self, budget: Budget, seed: int) -> TrainConfig:
        """The training config of this method at ``budget``."""
        return TrainConfig(
            algorithm=self.algorithm,
            params=self.params,
            rounds=budget.rounds,
            local_steps=budget.local_steps,
            seed=seed,
            device="auto",
            wire_precision=self.wire_precision,
            wire_delta=self.wire_delta,
        )


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
    marker: str = "demo-table",
    command: str = "medfed demo",
    budget: Budget | None = None,
    echo: Callable[[str], Any] = print,
    readme: Path | None = None,
) -> dict[str, Summary]:
    """Run the demo end to end; returns each method's summary."""
    budget = budget or (QUICK if quick else FULL)
    start = time.perf_counter()
    data = out / "data"
    echo(f"synthesizing 3 fundus sites ({budget.n_per_site} scans each) into {data} ...")
    manifests = synthesize(data, modality="fundus", n_per_site=budget.n_per_site, seed=seed)
    sites = load_sites(list(manifests), out / "cache")
    summaries: dict[str, Summary] = {}
    for method in map(MethodSpec.parse, methods):
        run_dir = out / "runs" / method.dirname
        if run_dir.exists():
            shutil.rmtree(run_dir)
        echo(f"training {method.label} ({budget.rounds} rounds x {budget.local_steps} steps) ...")
        # The summary as training returns it keeps the sites in federation order (the table's
        # columns); summary.json on disk lists them sorted.
        summaries[method.label] = train(sites, method.config(budget, seed), run_dir)
    table = methods_table(summaries)
    if "fedavg" in summaries:
        table += "\n\n" + communication_table(summaries, baseline="fedavg")
    seconds = time.perf_counter() - start
    caption = (
        f"`{command}{' --quick' if quick else ''}` (seed {seed}, {budget.n_per_site} scans per "
        f"site, {budget.rounds} rounds x {budget.local_steps} local steps, "
        f"{next(iter(summaries.values())).device}, {seconds:.0f} s in all)"
    )
    (out / f"{marker}.md").write_text(f"{table}\n\n{caption}\n", encoding="utf-8")
    echo("")
    echo(table)
    echo("")
    echo(f"finished in {seconds:.0f} s; table saved to {out / f'{marker}.md'}")
    if readme is not None:
        text = readme.read_text(encoding="utf-8")
        readme.write_text(
            replace_marked_section(text, marker, f"{table}\n\n{caption}"), encoding="utf-8"
        )
        echo(f"updated the {marker} section of {readme}")
    echo(f"inspect a run: medfed evaluate {out / 'runs' / next(iter(summaries))}")
    make = "make dashboard" + ("" if out == Path("demo_out") else f" RUNS={out}")
    echo(f"open the dashboard: medfed dashboard {out}  (or {make})")
    return summaries
