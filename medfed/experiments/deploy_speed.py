"""``medfed bench-deploy``: a deployed round on loopback against the same round in one process.

The same sites, model, budget and seed train three ways, one after the other on this machine:
in-process (``medfed train``), deployed on Flower with each SuperNode's resident worker
(``medfed deploy worker``), and deployed without workers (a fresh ClientApp process, importing
PyTorch and reading the site, for every message). A round's time is the time between two rounds'
checkpoints (the server writes one when a round's training, aggregation and validation are
done), taken for every round but the first, whose loads and start-up differ, and the last: a
deployed round's validation carries the next round's training, so the last round's holds none.
The median is reported. Each SuperNode, like each in-process site when sites train side by
side, has one thread.

On the same SuperLink and SuperNodes, after the deployed run, a floor run
(:mod:`medfed.flower.floor`) exchanges messages of the deployed round's sizes, one exchange a
round, with no training, data or checks: what Flower 1.42 itself takes to carry a round. medfed's
share of a deployed round is what is left of it beyond that floor and the longest site's
training, round by round. The SuperLink's CPU per message is read (psutil) on its process
during the floor run, less its idle rate with the same nodes connected; with the algorithms'
bytes (:mod:`medfed.experiments.deploy_sheet`) it gives the 20- and 100-site sheet.

What the deployed round adds, per message exchange (a round has one: a round's validation also
carries the next round's training): the SuperNode's wait for the message (Flower 1.42's
SuperNode asks the SuperLink every 3 s when idle: 1.5 s on average), its SuperExec's wait to
start the task (``TASK_POLL_S`` here), the ClientApp's process start (measured here), the
reply's pickup (polled every 0.5 s by the SuperNode and every 0.2 s by the ServerApp), and the
weights' transfer.
"""

from __future__ import annotations

import dataclasses
import statistics
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import tomli_w

from medfed.config import TrainConfig
from medfed.experiments.deploy_sheet import algorithm_bytes, sheet, sheet_markdown
from medfed.flower.loopback import TASK_POLL_ENV
from medfed.reports.markdown import write_results
from medfed.runs import RunDir
from medfed.runs.checkpoints import CheckpointStore

MARKER = "deploy-bench"
"""The README section ``--update-readme`` writes, and the stem of OUT's results files."""
GOAL = 1.3
"""A deployed round on loopback should take at most this times the in-process round."""
SHARE_GOAL_S = 1.0
"""medfed's own share of a deployed round, beyond Flower's floor and the training, at most."""
EXCHANGES_PER_ROUND = 1  # validation of round r, with round r+1's training
SUPERNODE_IDLE_POLL_S = 3.0  # Flower 1.42's SuperNode, between pulls when no message waited
FLOWER_TASK_POLL_S = 1.0  # Flower 1.42's SuperExec, between looks for a task, unless set
TASK_POLL_S = 0.1
"""The task poll the bench's SuperNodes run with, as the README advises a pilot's."""
SHEET_ALGORITHMS = ("fedavg", "fedbn", "feddrm", "fedrep", "lora")
FLOOR = "Flower's floor: the same messages, no training"
IDLE_S = 5.0  # seconds the SuperLink's CPU is watched with its nodes connected and no run


@dataclasses.dataclass(frozen=True)
class DeployBenchPlan:
    """The round the bench measures: realistic by default (each site's local work about 5 s on
    one thread of this 2-core machine: cnn-gn at 128 px, 10 steps of 32), tiny for tests."""

    sites: int = 3
    n_per_site: int = 64
    image_size: int = 128
    backbone: str = "cnn-gn"
    rounds: int = 5
    local_steps: int = 10
    batch_size: int = 32
    seed: int = 0
    without_workers: bool = True  # also measure the deployment without resident workers
    task_poll_s: float = TASK_POLL_S  # each SuperExec's (FLWR_SUPEREXEC_TASK_POLL_INTERVAL)
    # the algorithms whose bytes the 20/100-site sheet lists (each but FedAvg: two rounds in
    # process)
    algorithms: tuple[str, ...] = SHEET_ALGORITHMS

    def config(self) -> TrainConfig:
        return TrainConfig(
            algorithm="fedavg",
            backbone=self.backbone,
            rounds=self.rounds,
            local_steps=self.local_steps,
            batch_size=self.batch_size,
            seed=self.seed,
            keep_checkpoints=self.rounds,  # every round's checkpoint: they time the rounds
        )


def round_seconds(run: Path) -> list[float]:
    """Seconds of each round but the first and the last: from one round's checkpoint to the
    next."""
    store = CheckpointStore(RunDir(run).checkpoints, keep=1)
    times = [(p / "state.json").stat().st_mtime for _, p in store.rounds()]
    return [b - a for a, b in zip(times[:-2], times[1:-1], strict=True)]


def site_seconds(run: Path) -> list[float]:
    """Each round's (but the first and the last) longest local training of a site, in
    seconds."""
    by_round: dict[int, float] = {}
    records = RunDir(run).read_metrics()
    last = max(r["round"] for r in records)
    for r in records:
        if 1 < r["round"] < last and isinstance(r.get("seconds"), int | float):
            by_round[r["round"]] = max(by_round.get(r["round"], 0.0), float(r["seconds"]))
    return [by_round[k] for k in sorted(by_round)]


def clientapp_start_seconds(repeats: int = 3) -> float:
    """Wall seconds for a fresh Python process to load medfed's ClientApp (what a SuperNode's
    ClientApp process does before it can answer), best of ``repeats``."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import flwr.supernode.runtime.run_clientapp, medfed.flower.client_app",
            ],
            check=True,
            capture_output=True,
        )
        best = min(best, time.perf_counter() - start)
    return best


def _sites(out: Path, plan: DeployBenchPlan) -> tuple[dict[str, Path], Path]:
    from medfed.data.synth import synthesize
    from medfed.federation.training import load_sites

    manifests = synthesize(out / "data", "fundus", n_per_site=plan.n_per_site, seed=plan.seed)
    manifests = manifests[: plan.sites]
    for path in manifests:  # the round's input size: the manifests' preprocessing
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        data.setdefault("preprocess", {})["image_size"] = plan.image_size
        path.write_text(tomli_w.dumps(data), encoding="utf-8")
    cache = out / "cache"
    load_sites(manifests, cache)
    return {p.stem: p for p in manifests}, cache


def _deployed(
    out: Path, manifests: dict[str, Path], cache: Path, plan: DeployBenchPlan, workers: bool
) -> tuple[Path, dict[str, Any] | None]:
    """The plan's run deployed on a fresh loopback federation; with ``workers``, then the
    floor run (:func:`_floor`) on the same SuperLink and SuperNodes."""
    from medfed.flower.deploy import write_app
    from medfed.flower.loopback import LoopbackFederation

    out.mkdir(parents=True)
    run_dir = out / "run"
    sites = list(manifests)
    write_app(out / "app", plan.config(), sites, str(run_dir), wait_s=600, reply_timeout_s=3600)
    fed = LoopbackFederation(out, task_poll_s=plan.task_poll_s)
    try:
        fed.start_superlink()
        for site in sites:
            worker = fed.start_worker(site) if workers else None
            fed.start_supernode(site, manifests[site], cache=cache, worker=worker)
        fed.submit(out / "app")
        fed.wait_for_summary(run_dir, timeout=24 * 3600)
        floor = _floor(fed, out, run_dir, plan) if workers else None
    finally:
        fed.close()
    return run_dir, floor


def _floor(fed: Any, out: Path, run_dir: Path, plan: DeployBenchPlan) -> dict[str, Any]:
    """Flower's floor under the deployed run: :mod:`medfed.flower.floor` exchanging messages of
    the run's median sizes with the same nodes; its rounds' seconds
    and the SuperLink's CPU seconds (its own process, from psutil) per message."""
    import json

    import psutil

    from medfed.flower.floor import write_floor_app

    records = [r for r in RunDir(run_dir).read_metrics() if r.get("status") == "ok"]
    records = [r for r in records if r["round"] > 1] or records  # as the table's rows
    down = int(
        statistics.median(
            r.get("bytes_eval", 0) + r["bytes_down"] - r.get("bytes_down_reused", 0)
            for r in records
        )
    )
    up = int(statistics.median(r["bytes_up"] for r in records))
    link = psutil.Process(fed.procs["superlink"].pid)

    def cpu() -> float:
        times = link.cpu_times()
        return times.user + times.system

    c0, w0 = cpu(), time.monotonic()
    time.sleep(IDLE_S)  # the nodes' idle polls and heartbeats alone
    idle = (cpu() - c0) / (time.monotonic() - w0)
    result = out / "floor.json"
    app = out / "floor_app"
    # As many rounds measured as the deployed run's (its first and last left out; here the
    # first, which starts the nodes' processes for this app)
    rounds = plan.rounds - 1
    write_floor_app(app, nodes=plan.sites, rounds=rounds, down_bytes=down, up_bytes=up,
                    out=result)  # fmt: skip
    fed.submit(app)
    started = result.with_suffix(".started")
    deadline = time.monotonic() + 600
    while not started.exists():
        if time.monotonic() > deadline or fed.procs["superlink"].poll() is not None:
            raise RuntimeError(f"the floor run did not start:\n{fed.log('superlink')[-3000:]}")
        time.sleep(0.05)
    c1, w1 = cpu(), time.monotonic()
    while not result.exists():
        if time.monotonic() > deadline or fed.procs["superlink"].poll() is not None:
            raise RuntimeError(f"the floor run did not finish:\n{fed.log('superlink')[-3000:]}")
        time.sleep(0.05)
    c2, w2 = cpu(), time.monotonic()
    messages = 2 * plan.sites * rounds  # each node's message and its reply
    return {
        "rounds_s": json.loads(result.read_text())["rounds_s"][1:],  # the first: start-up
        "down_bytes": down,
        "up_bytes": up,
        "superlink_cpu_idle_s_per_node_s": idle / plan.sites,
        "superlink_cpu_per_message_s": max(0.0, (c2 - c1) - idle * (w2 - w1)) / messages,
        "superlink_cpu_run_s": c2 - c1,
        "messages": messages,
    }


def run_deploy_bench(out: Path, plan: DeployBenchPlan) -> dict[str, Any]:
    """Train the plan's round in process, deployed with workers and (``without_workers``)
    deployed without; their round times, side by side, in ``OUT/deploy-bench.json`` and
    ``.md``."""
    import torch

    from medfed.experiments.speed import device_info
    from medfed.federation.training import load_sites, train

    out.mkdir(parents=True, exist_ok=True)
    manifests, cache = _sites(out, plan)
    config = plan.config()
    runs: dict[str, Path] = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each SuperNode has; in-process sites then train side by side
    try:
        local = dataclasses.replace(config, concurrency=len(manifests))
        train(load_sites(list(manifests.values()), cache), local, out / "inprocess")
    finally:
        torch.set_num_threads(threads)
    runs["in-process"] = out / "inprocess"
    runs["deployed, resident workers"], floor = _deployed(
        out / "deployed_workers", manifests, cache, plan, workers=True
    )
    if plan.without_workers:
        runs["deployed, no workers"] = _deployed(
            out / "deployed_plain", manifests, cache, plan, workers=False
        )[0]
    assert floor is not None
    rows = {}
    for name, run in runs.items():
        rounds = round_seconds(run)
        records = [r for r in RunDir(run).read_metrics() if r.get("round", 0) > 1]
        rows[name] = {
            "round_s": statistics.median(rounds),
            "rounds_s": rounds,
            "site_training_s": statistics.median(site_seconds(run)),
            # What crossed the wire: a downlink the site rebuilt from its validated weights
            # did not.
            "bytes_per_site_round": statistics.median(
                r.get("bytes_up", 0)
                + r.get("bytes_down", 0)
                - r.get("bytes_down_reused", 0)
                + r.get("bytes_eval", 0)
                for r in records
            ),
        }
    floor_s = statistics.median(floor["rounds_s"])
    rows[FLOOR] = {
        "round_s": floor_s,
        "rounds_s": floor["rounds_s"],
        "site_training_s": 0.0,
        "bytes_per_site_round": floor["down_bytes"] + floor["up_bytes"],
    }
    base = rows["in-process"]["round_s"]
    for row in rows.values():
        row["ratio"] = row["round_s"] / base
        row["overhead_s"] = row["round_s"] - base
    deployed = runs["deployed, resident workers"]
    share = medfed_share(round_seconds(deployed), site_seconds(deployed), floor_s)
    training_s = rows["deployed, resident workers"]["site_training_s"]
    per_algorithm = algorithm_bytes(
        out, load_sites(list(manifests.values()), cache), config, runs["in-process"],
        plan.algorithms,
    )  # fmt: skip
    cpu = floor["superlink_cpu_per_message_s"]
    results = {
        "plan": dataclasses.asdict(plan),
        "rows": rows,
        "floor_s": floor_s,
        "medfed_share": share,
        "share_goal_s": SHARE_GOAL_S,
        "training_s": training_s,
        "superlink_cpu_per_message_s": cpu,
        "superlink_cpu_idle_s_per_node_s": floor["superlink_cpu_idle_s_per_node_s"],
        "algorithm_bytes": per_algorithm,
        "sheet": sheet(per_algorithm, floor_s, plan.sites, cpu, training_s),
        "goal": GOAL,
        "met": rows["deployed, resident workers"]["ratio"] <= GOAL,
        "clientapp_start_s": clientapp_start_seconds(),
        "exchanges_per_round": EXCHANGES_PER_ROUND,
        "supernode_poll_s": SUPERNODE_IDLE_POLL_S,
        "device": device_info(),
    }
    write_results(out, MARKER, results, markdown(results))
    return results


def medfed_share(rounds: list[float], training: list[float], floor_s: float) -> dict[str, Any]:
    """What each deployed round took beyond Flower's floor and its longest site's training:
    medfed's own handling (encoding, checks, aggregation, checkpoints, audit log, the worker's
    hand-over); its median and interquartile range over the rounds."""
    values = [r - t - floor_s for r, t in zip(rounds, training, strict=True)]
    q1, median, q3 = (float(v) for v in np.percentile(values, [25, 50, 75]))
    return {"rounds_s": values, "median_s": median, "q1_s": q1, "q3_s": q3}


def markdown(results: dict[str, Any]) -> str:
    """The bench's table and what the deployed round's overhead is made of."""
    plan = results["plan"]
    lines = [
        f"FedAvg, {plan['sites']} synthetic fundus sites of {plan['n_per_site']} scans, "
        f"{plan['backbone']} at {plan['image_size']} px, {plan['local_steps']} local steps of "
        f"batch {plan['batch_size']}, {plan['rounds']} rounds (the first and the last left "
        f"out); one thread per site; {results['device']['cpu']}, "
        f"{results['device']['cpu_count']} cores.",
        "",
        "| run | seconds per round (median) | / in-process | overhead (s) | longest site's "
        "local training (s) | bytes per site and round |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, row in results["rows"].items():
        training = "none" if name == FLOOR else f"{row['site_training_s']:.1f}"
        lines.append(
            f"| {name} | {row['round_s']:.1f} | {row['ratio']:.2f} | {row['overhead_s']:+.1f} | "
            f"{training} | {row['bytes_per_site_round'] / 1e6:.1f} MB |"
        )
    share = results["medfed_share"]
    met = "met" if share["median_s"] <= results["share_goal_s"] else "not met"
    lines += [
        "",
        f"medfed's share of a deployed round (with workers), beyond Flower's floor "
        f"({results['floor_s']:.1f} s) and the longest site's training, round by round: median "
        f"{share['median_s']:+.2f} s (interquartile range {share['q1_s']:+.2f} to "
        f"{share['q3_s']:+.2f} s, {len(share['rounds_s'])} rounds); goal at most "
        f"{results['share_goal_s']:g} s: {met}. The SuperLink's own CPU: "
        f"{results['superlink_cpu_per_message_s'] * 1e3:.1f} ms per message (the floor run's, "
        f"less its idle polls: {results['superlink_cpu_idle_s_per_node_s'] * 1e3:.1f} ms per "
        "connected node and second).",
    ]
    worker = results["rows"]["deployed, resident workers"]
    verdict = "met" if results["met"] else "not met"
    poll = results["supernode_poll_s"]
    lines += [
        "",
        f"Goal: a deployed round (with workers) at most {results['goal']}x the in-process round: "
        f"{verdict} ({worker['ratio']:.2f}x).",
        f"What a deployed round adds, per message exchange ({results['exchanges_per_round']} a "
        "round: round r's validation carries round r+1's training): the SuperNode's wait for "
        f"the message (it asks every {poll:g} s when idle, {poll / 2:g} s on average), its "
        f"SuperExec's wait to start the task (it looks every {plan['task_poll_s']:g} s here: "
        f"{TASK_POLL_ENV}; {FLOWER_TASK_POLL_S:g} s unless set), a fresh ClientApp process "
        f"({results['clientapp_start_s']:.1f} s to start here), the reply's pickup (polled every "
        "0.5 s by the SuperNode, 0.2 s by the ServerApp) and the transfer of the weights; "
        "without workers, each message also imports PyTorch and reads the site again.",
    ]
    lines += sheet_markdown(results)
    return "\n".join(lines) + "\n"
