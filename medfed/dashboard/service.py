"""The dashboard as a service: Streamlit run under a small supervisor that logs and counts.

``medfed dashboard --log-format json`` (or ``--metrics-port``) starts Streamlit as a child
process instead of handing it this one. The supervisor

* turns every line Streamlit prints into one log line of :class:`~medfed.ops.telemetry.EventLog`
  (``streamlit.output`` with Streamlit's level, when the line has one), so a JSON log holds
  nothing but JSON;
* reads the one line each page run prints (:func:`page_run`, in the Streamlit process) and logs
  it as ``dashboard.page`` (page title, result, seconds, and the exception's type when the page
  failed: never a message, which may name a scan);
* logs ``dashboard.started``, ``dashboard.ready`` (Streamlit's health check answered) and
  ``dashboard.stopped`` (with Streamlit's exit status);
* serves :class:`~medfed.ops.telemetry.DashboardMetrics` on a loopback port;
* passes SIGTERM and SIGINT on to Streamlit and exits with its status, so systemd's stop and
  restart policy see Streamlit's.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING, Any

from medfed.dashboard import EVENTS_ENV

if TYPE_CHECKING:
    from medfed.ops.telemetry import DashboardMetrics

PAGE_EVENT = "dashboard.page"
READY_TIMEOUT_S = 120.0  # Streamlit's first start imports plotly and pandas: tens of seconds
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Streamlit's console format: "2026-12-05 10:00:00.123 WARNING streamlit.x: message"; some of
# its lines have the time only.
_STREAMLIT_LINE = re.compile(
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?\s+"
    r"(?:(DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+(\S+?):\s?)?(.*)"
)


@contextlib.contextmanager
def page_run(title: str, stream: IO[str] | None = None) -> Iterator[None]:
    """Time one run of a page's script and, under the supervisor (EVENTS_ENV set), print one
    JSON line saying how it ended. Streamlit's own ends of a run (``st.stop``, ``st.rerun``)
    count as ok; an exception counts as an error and goes on to Streamlit, which shows it."""
    if os.environ.get(EVENTS_ENV) != "1":
        yield
        return
    started = time.perf_counter()
    fields: dict[str, Any] = {"result": "ok"}
    try:
        yield
    except Exception as exc:
        fields = {"result": "error", "error": type(exc).__name__}
        raise
    finally:
        record = {"event": PAGE_EVENT, "page": title, **fields}
        record["seconds"] = round(time.perf_counter() - started, 4)
        out = stream or sys.stderr
        out.write(json.dumps(record) + "\n")
        out.flush()


def relay(
    line: str, log: Callable[..., None], metrics: DashboardMetrics | None, pages: tuple[str, ...]
) -> None:
    """Log (and count) one line Streamlit printed."""
    text = _ANSI.sub("", line).rstrip()
    if not text.strip():
        return
    record = _page_record(text, pages)
    if record is not None:
        if metrics is not None:
            metrics.page_run(record["page"], record["result"], record["seconds"])
        level = "error" if record["result"] == "error" else "info"
        log(PAGE_EVENT, level=level, **record)
        return
    found = _STREAMLIT_LINE.fullmatch(text)
    level = found.group(1).lower() if found and found.group(1) else "info"
    if metrics is not None:
        metrics.line(level)
    source = {"logger": found.group(2)} if found and found.group(2) else {}
    message = found.group(3) if found else text.strip()
    log("streamlit.output", level=level, **source, message=message)


def _page_record(text: str, pages: tuple[str, ...]) -> dict[str, Any] | None:
    """The fields of a page run's line, or None when ``text`` is not one. Only known fields
    are kept, and an unknown page title is logged as "other"."""
    if not text.startswith("{"):
        return None
    try:
        record = json.loads(text)
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("event") != PAGE_EVENT:
        return None
    seconds = record.get("seconds")
    kept: dict[str, Any] = {
        "page": record.get("page") if record.get("page") in pages else "other",
        "result": "error" if record.get("result") == "error" else "ok",
        "seconds": float(seconds) if isinstance(seconds, int | float) else 0.0,
    }
    if kept["result"] == "error" and isinstance(record.get("error"), str):
        kept["error"] = record["error"][:80]
    return kept


def healthy(url: str, timeout: float = 2.0) -> bool:
    """Whether Streamlit at ``url`` answers its health check with ok."""
    try:
        with urllib.request.urlopen(f"{url}/_stcore/health", timeout=timeout) as answer:
            return answer.status == 200 and answer.read(16).strip() == b"ok"
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _await_ready(url: str, child: subprocess.Popen[str], log: Callable[..., None]) -> None:
    started = time.monotonic()
    while child.poll() is None:
        if healthy(url, timeout=1.0):
            log("dashboard.ready", url=url, seconds=round(time.monotonic() - started, 1))
            return
        if time.monotonic() - started > READY_TIMEOUT_S:
            log("dashboard.not_ready", level="warning", url=url, seconds=READY_TIMEOUT_S)
            return
        time.sleep(0.5)


def supervise(
    command: list[str],
    env: dict[str, str],
    url: str,
    log: Callable[..., None],
    metrics: DashboardMetrics | None = None,
    pages: tuple[str, ...] = (),
) -> int:
    """Run Streamlit's ``command`` as a child, relaying its lines to ``log``; its exit status
    (128 + the signal's number when a signal ended it)."""
    env = {**env, EVENTS_ENV: "1", "PYTHONUNBUFFERED": "1"}
    child = subprocess.Popen(
        command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1,
    )  # fmt: skip

    def forward(signum: int, _frame: Any) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        log("dashboard.started", pid=child.pid, url=url)
        threading.Thread(target=_await_ready, args=(url, child, log), daemon=True).start()
        assert child.stdout is not None
        for line in child.stdout:
            relay(line, log, metrics, pages)
        code = child.wait()
    finally:
        if child.poll() is None:  # this process is failing: leave no Streamlit behind
            child.kill()
            child.wait()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    status = 128 - code if code < 0 else code
    stopped_by = {-signal.SIGTERM, -signal.SIGINT, 0}
    log("dashboard.stopped", level="info" if code in stopped_by else "error", exit_status=status)
    return status
