"""Start the dashboard: check the run folders, then hand the process over to Streamlit, or,
as a service (a log format or a metrics port given), supervise it (:mod:`.service`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medfed.core.errors import ConfigError
from medfed.dashboard import APP, MAX_UPLOAD_MB, PAGES, RUNS_ENV, STATE_ENV
from medfed.dashboard.rundata import (
    DEFAULT_REVIEWER_HEADER,
    REVIEWER_HEADER_ENV,
    find_runs,
    reviewer_header,
)
from medfed.governance.records import AUDIT

ADDRESS = "127.0.0.1"  # loopback only: the pages show patient-level results


def streamlit_command(port: int) -> list[str]:
    """The Streamlit command line: loopback, no browser prompt, no usage statistics, uploads
    capped at MAX_UPLOAD_MB."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP),
        f"--server.address={ADDRESS}",
        f"--server.port={port}",
        "--server.headless=true",
        f"--server.maxUploadSize={MAX_UPLOAD_MB}",
        "--server.fileWatcherType=none",
        "--browser.gatherUsageStats=false",
        f"--browser.serverAddress={ADDRESS}",
        "--global.developmentMode=false",
        "--client.toolbarMode=viewer",
    ]


def check_roots(roots: Sequence[Path]) -> list[Path]:
    """Absolute run folders; ConfigError naming a path that does not exist."""
    for root in roots:
        if not root.exists():
            raise ConfigError(
                f"{root}: no such run directory or folder; give a folder written by "
                "'medfed train --out' or 'medfed demo --out' ('make demo' writes demo_out)"
            )
        if not root.is_dir():
            raise ConfigError(f"{root}: not a folder; give a run directory or a folder of them")
    return [root.resolve() for root in roots]


def check_state_dir(state_dir: Path, echo: Callable[[str], Any] = print) -> Path:
    """A SuperNode's state folder, absolute; ConfigError when it is not a folder."""
    if not state_dir.is_dir():
        raise ConfigError(
            f"--state-dir {state_dir}: no such folder; give the SuperNode's state-dir (its "
            "--node-config state-dir), which holds audit.jsonl"
        )
    if not (state_dir / AUDIT).is_file():
        echo(f"{state_dir}: no audit.jsonl yet; the Site audit page shows it once the node logs")
    return state_dir.resolve()


@dataclass(frozen=True)
class Service:
    """How the dashboard runs as a service: its log lines' format and its metrics' address."""

    log_format: str = "text"
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"

    @property
    def supervised(self) -> bool:
        return self.log_format != "text" or self.metrics_port is not None


def launch(
    roots: Sequence[Path],
    port: int,
    echo: Callable[[str], Any] = print,
    reviewer: str | None = None,
    state_dir: Path | None = None,
    service: Service = Service(),
) -> int:
    """Replace this process with the Streamlit server over ``roots`` (returns only on error),
    or, with ``service.supervised``, run it as a child and return its exit status.

    ``reviewer``: the request header the Review page takes the reader's name from (empty: none,
    the page asks); None keeps MEDFED_REVIEWER_HEADER as the environment has it.
    ``state_dir``: a SuperNode's state folder, whose audit log the Site audit page shows."""
    if not 1 <= port <= 65535:
        raise ConfigError(f"--port {port}: choose a port between 1 and 65535")
    if service.metrics_port == port:
        raise ConfigError(
            f"--metrics-port {port}: the dashboard's own --port; give the metrics another port"
        )
    if reviewer is not None:
        try:
            reviewer_header({REVIEWER_HEADER_ENV: reviewer})
        except ConfigError as exc:
            raise ConfigError(
                f"--reviewer-header {reviewer!r}: not an HTTP header name; give the header your "
                f"sign-in proxy sends (such as {DEFAULT_REVIEWER_HEADER}), or '' to type the "
                "reader's name on the page"
            ) from exc
    folders = check_roots(roots)
    if service.supervised:
        from medfed.ops.telemetry import EventLog

        log = EventLog(service.log_format)

        def echo(message: str) -> None:
            log("dashboard.message", message=message)

    state = check_state_dir(state_dir, echo) if state_dir is not None else None
    runs = find_runs(folders)
    if runs:
        echo(f"{len(runs)} run(s): " + ", ".join(p.name for p in runs))
    elif folders:
        echo(
            "no run directory (a folder holding config.toml) under "
            + ", ".join(map(str, folders))
            + " yet; the dashboard says so until one is written"
        )
    if state is not None:
        echo(f"site audit log: {state / AUDIT} (the Site audit page)")
    echo(f"dashboard: http://{ADDRESS}:{port}  (Ctrl+C to stop)")
    env = dict(os.environ)
    env[RUNS_ENV] = os.pathsep.join(map(str, folders))
    if reviewer is not None:
        env[REVIEWER_HEADER_ENV] = reviewer.strip()
    if state is not None:
        env[STATE_ENV] = str(state)
    env.setdefault("STREAMLIT_BROWSER_GATHER_USAGE_STATS", "false")
    if service.supervised:
        return _supervised(folders, port, env, log, service)
    sys.stdout.flush()
    os.execve(sys.executable, streamlit_command(port), env)
    return 0  # not reached: execve replaces this process (or raises)


def _supervised(
    folders: list[Path], port: int, env: dict[str, str], log: Callable[..., None], service: Service
) -> int:
    from medfed.dashboard import service as supervisor

    url = f"http://{ADDRESS}:{port}"
    metrics = None
    if service.metrics_port is not None:
        from medfed.ops.telemetry import DashboardMetrics

        metrics = DashboardMetrics(
            tuple(PAGES), lambda: supervisor.healthy(url), lambda: len(find_runs(folders))
        )
        metrics.serve(service.metrics_port, service.metrics_host)
        log(
            "dashboard.metrics", url=f"http://{service.metrics_host}:{service.metrics_port}/metrics"
        )
    return supervisor.supervise(streamlit_command(port), env, url, log, metrics, tuple(PAGES))
