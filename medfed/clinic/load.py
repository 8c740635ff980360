"""``medfed pacs load``: a bounded load test of ``medfed serve`` on loopback.

A copy of the run is served by a real ``medfed serve`` process (its audit log stays the
copy's); N client threads send a fixed count of requests (the same scan each time, under a
distinct name), and every accepted request (one that got an answer) is checked against the
audit log: its row exists with its name and status. Phase ``kill`` kills the service
(SIGKILL) halfway through and starts it again; clients retry what the dead service refused.
Throughput, p50 and p99 latency (of accepted requests) and the count lost (accepted, with no
audit row) go into a table (and a docs page between its markers).
"""

from __future__ import annotations

import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from medfed.clinic.audit import AuditLog
from medfed.core.errors import ConfigError, MedfedError

__all__ = ["LoadResult", "load_test", "load_table"]

_START_TIMEOUT = 120.0  # seconds for the service to load the run and answer /health


@dataclass
class LoadResult:
    """One phase: what was sent, answered, how fast, and how many answers the log lacks."""

    phase: str
    clients: int
    requests: int
    accepted: int = 0
    retries: int = 0  # requests sent again: the service was down (refused or dropped)
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    lost: int = 0
    restarts: int = 0
    down: float = 0.0  # seconds from the kill until the restarted service answered /health

    @property
    def throughput(self) -> float:
        return self.accepted / self.seconds if self.seconds > 0 else float("nan")

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies, q)) * 1000 if self.latencies else float("nan")


class _Service:
    """``medfed serve`` in its own process, on a free loopback port."""

    def __init__(self, run: Path, device: str, log: Path) -> None:
        self.run, self.device, self.log = run, device, log
        self.port = _free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        import httpx

        argv = [sys.executable, "-m", "medfed", "serve", str(self.run), "--port", str(self.port)]
        argv += ["--device", self.device]
        with self.log.open("a") as out:
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + _START_TIMEOUT
        while True:
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise MedfedError(
                    f"medfed serve did not start (see {self.log}):\n"
                    + self.log.read_text(errors="replace")[-2000:]
                )
            time.sleep(0.2)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _phase(
    service: _Service, scan: Path, result: LoadResult, kill_at: int | None
) -> dict[int, tuple[str, str]]:
    """Send ``result.requests`` requests from ``result.clients`` threads; audit id -> (name,
    status) of every accepted one."""
    import httpx

    data, suffix = scan.read_bytes(), "".join(scan.suffixes) or ".png"
    answers: dict[int, tuple[str, str]] = {}
    lock = threading.Lock()
    counter = iter(range(result.requests))
    done = [0]
    restarted = threading.Event()

    def client() -> None:
        with httpx.Client(timeout=120) as http:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                name = f"{result.phase}-{i:06d}{suffix}"
                while True:
                    began = time.perf_counter()
                    try:
                        reply = http.post(
                            f"{service.url}/route", params={"name": name}, content=data
                        )
                    except httpx.TransportError:
                        with lock:
                            result.retries += 1
                        time.sleep(0.2)
                        continue  # the service is down: try again until it is back
                    elapsed = time.perf_counter() - began
                    if reply.status_code in (200, 422):
                        body = reply.json()
                        with lock:
                            answers[int(body["audit_id"])] = (name, body["status"])
                            result.latencies.append(elapsed)
                            done[0] += 1
                            kill = kill_at is not None and done[0] == kill_at
                        if kill:
                            killed = time.perf_counter()
                            service.kill()
                            service.start()
                            result.down += time.perf_counter() - killed
                            result.restarts += 1
                            restarted.set()
                    else:
                        with lock:
                            result.retries += 1
                    break

    threads = [threading.Thread(target=client) for _ in range(result.clients)]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result.seconds = time.perf_counter() - began
    result.accepted = len(result.latencies)
    return answers


def _lost(run: Path, answers: dict[int, tuple[str, str]]) -> int:
    """Accepted answers whose row is missing from the audit log (or names another scan)."""
    logged = dict(AuditLog(run).records())
    return sum(
        1
        for audit_id, (name, status) in answers.items()
        if audit_id not in logged
        or (logged[audit_id].file, logged[audit_id].status) != (name, status)
    )


def load_test(
    run: Path,
    scan: Path,
    clients: int,
    requests: int,
    device: str = "cpu",
    echo: Callable[[str], None] = print,
) -> list[LoadResult]:
    """Phases ``steady`` and ``kill`` (SIGKILL at half the requests, then a restart)."""
    if clients < 1 or requests < 2:
        raise ConfigError("--clients must be at least 1 and --requests at least 2")
    if not scan.is_file():
        raise ConfigError(f"--scan {scan}: no such file")
    results = []
    with tempfile.TemporaryDirectory(prefix="medfed-load-") as folder:
        copy = Path(folder) / run.resolve().name
        shutil.copytree(run, copy, ignore=shutil.ignore_patterns("audit.sqlite*", "review"))
        for phase, kill_at in (("steady", None), ("kill", requests // 2)):
            service = _Service(copy, device, Path(folder) / "serve.log")
            service.start()
            result = LoadResult(phase, clients, requests)
            try:
                answers = _phase(service, scan, result, kill_at)
            finally:
                service.stop()
            result.lost = _lost(copy, answers) + (result.accepted - len(answers))
            echo(describe(result))
            results.append(result)
    return results


def describe(r: LoadResult) -> str:
    return (
        f"{r.phase}: {r.accepted}/{r.requests} answered by {r.clients} clients in "
        f"{r.seconds:.1f} s ({r.throughput:.1f}/s), p50 {r.percentile(50):.0f} ms, "
        f"p99 {r.percentile(99):.0f} ms, lost {r.lost}"
        + (
            f", {r.restarts} kill and restart ({r.down:.1f} s down), {r.retries} requests "
            "sent again while it was down"
            if r.restarts
            else ""
        )
    )


def _run_words(run: Path) -> str:
    """The served run in words: its algorithm, backbone, sites and input size."""
    from medfed.runs import RunDir

    config = RunDir(run).read_config()
    sites = config.get("sites") or []
    size = ((sites[0] if sites else {}).get("preprocess") or {}).get("image_size")
    return (
        f"run `{run.resolve().name}` ({config.get('train', {}).get('algorithm')}, backbone "
        f"{config.get('model', {}).get('backbone')}, {len(sites)} sites"
        + (f", {size}-pixel inputs)" if size else ")")
    )


def load_table(results: list[LoadResult], scan: Path, run: Path) -> str:
    """The markdown table of the phases, and how they were measured."""
    lines = [
        "| phase | clients | requests | answered | throughput (scans/s) | p50 (ms) | p99 (ms) "
        "| down (s) | lost |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        down = f"{r.down:.1f}" if r.restarts else "-"
        lines.append(
            f"| {r.phase} | {r.clients} | {r.requests} | {r.accepted} | {r.throughput:.1f} | "
            f"{r.percentile(50):.0f} | {r.percentile(99):.0f} | {down} | {r.lost} |"
        )
    cpus = os.cpu_count() or 0
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines += [
        "",
        f"One `medfed serve` process serving {_run_words(run)} on 127.0.0.1 "
        f"({cpus} CPU cores, {platform.machine()}, "
        f"Python {platform.python_version()}; load average {load:.1f} at the end, other work "
        f"included), each request the {scan.stat().st_size}-byte "
        f"scan `{scan.name}`; latency from request to answer at the client, of the attempt "
        "that was answered. *kill*: the service is killed (SIGKILL) after half the requests "
        "were answered and started again (*down*: until it answered again, loading the run "
        "included; the throughput counts that time); clients send again what the dead "
        "service could not take. *lost*: answers given whose audit row is missing.",
    ]
    return "\n".join(lines)
