"""What an IT department watches a running service by: its log lines and its metrics.

* :class:`EventLog`: one line per event on stderr, a JSON object (``time``, ``level``,
  ``event``, ``request_id`` and the event's fields) or the same as text. No line holds a file
  name or anything else a request's query carries: those may name a patient.
* :class:`ServeMetrics`: ``medfed serve``'s Prometheus metrics (requests by endpoint and
  status, latency, answers by outcome), on the service's own ``/metrics``.
* :class:`WatchMetrics`: ``medfed pacs watch``'s (polls, lag since the last good poll, studies
  waiting in the current poll, scans answered or skipped), served on a loopback port.
* :class:`ListenMetrics`: ``medfed pacs listen``'s (instances received by result, series
  waiting for their quiet time, seconds since the last instance, scans answered or skipped,
  answers that could not be sent), served the same way.
* :class:`DashboardMetrics`: the dashboard's (whether Streamlit answers its health check, page
  runs by page and result, their duration, Streamlit's warnings and errors, runs it can show),
  served the same way by the process that supervises Streamlit.

Each object keeps its own registry, so two services in one process (the tests) never mix.
"""

from __future__ import annotations

import json
import re
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TextIO

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from medfed.core.errors import ConfigError

__all__ = [
    "LOG_FORMATS",
    "DashboardMetrics",
    "EventLog",
    "ListenMetrics",
    "ServeMetrics",
    "WatchMetrics",
    "check_log_format",
    "request_id",
]

LOG_FORMATS = ("text", "json")
# The endpoints metrics are labelled with; any other path counts as "other", so that a scan
# of random paths cannot grow the metrics without bound.
ENDPOINTS = ("/route", "/health", "/model-card", "/review-queue", "/livez", "/readyz", "/metrics")
_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
# Seconds: from a cached answer (milliseconds) to a CT series on a busy CPU (a minute).
_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def check_log_format(value: str, option: str = "--log-format") -> str:
    """``value`` when it is a log format; ConfigError naming ``option`` otherwise."""
    if value not in LOG_FORMATS:
        raise ConfigError(f"{option} {value!r}: expected one of {', '.join(LOG_FORMATS)}")
    return value


def request_id(given: str | None) -> str:
    """The request's id: the caller's X-Request-ID when it is a short plain token (so a
    reverse proxy's id follows the request), else a new random one."""
    if given and _REQUEST_ID.fullmatch(given):
        return given
    return uuid.uuid4().hex


class EventLog:
    """Writes one line per event: JSON (``fmt="json"``) or text."""

    def __init__(self, fmt: str = "text", stream: TextIO | None = None) -> None:
        self.fmt = check_log_format(fmt)
        self.stream = stream

    def __call__(self, event: str, level: str = "info", **fields: Any) -> None:
        stamp = datetime.now(UTC).isoformat(timespec="milliseconds")
        stream = self.stream or sys.stderr
        if self.fmt == "json":
            record = {"time": stamp, "level": level, "event": event, **fields}
            line = json.dumps(record, default=str, separators=(",", ":"))
        else:
            words = " ".join(f"{k}={v}" for k, v in fields.items())
            line = f"{stamp} {level.upper()} {event}" + (f" {words}" if words else "")
        stream.write(line + "\n")
        stream.flush()


def _counter(
    name: str, doc: str, label: str, values: tuple[str, ...], registry: CollectorRegistry
) -> Counter:
    """A counter by ``label``, every one of ``values`` shown (at 0 until it happens)."""
    counter = Counter(name, doc, (label,), registry=registry)
    for value in values:
        counter.labels(value)
    return counter


class ServeMetrics:
    """``medfed serve``'s metrics, rendered in Prometheus' text format by :meth:`render`."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "medfed_serve_requests",
            "HTTP requests answered, by endpoint and status code.",
            ("endpoint", "status"),
            registry=self.registry,
        )
        self.latency = Histogram(
            "medfed_serve_request_seconds",
            "Time from a request's arrival to its answer, by endpoint.",
            ("endpoint",),
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.outcomes = Counter(
            "medfed_serve_scans",
            "Scans sent to POST /route, by outcome: routed, abstained, error (answered and "
            "logged), refused (over a limit, no scan, no token, or the log not writable: not "
            "answered, not logged).",
            ("outcome",),
            registry=self.registry,
        )
        for outcome in ("routed", "abstained", "error", "refused"):
            self.outcomes.labels(outcome)  # every outcome shows, 0 until it happens
        self.model_changes = _counter(
            "medfed_serve_model_changes",
            "Replacements of a served model taken up (medfed ops promote or rollback), by "
            "result: replaced, or failed (the model it had still answers).",
            "result",
            ("replaced", "failed"),
            self.registry,
        )

    def observe(self, path: str, status: int, seconds: float, outcome: str | None) -> None:
        endpoint = path if path in ENDPOINTS else "other"
        self.requests.labels(endpoint, str(status)).inc()
        self.latency.labels(endpoint).observe(seconds)
        if endpoint == "/route" and outcome is None:
            outcome = "refused"
        if outcome is not None:
            self.outcomes.labels(outcome).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class WatchMetrics:
    """``medfed pacs watch``'s metrics; :meth:`serve` starts their HTTP endpoint."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.registry = CollectorRegistry()
        self.started = clock()
        self.last_ok: float | None = None
        self.polls = _counter(
            "medfed_pacs_watch_polls",
            "Polls of the PACS, by result: ok, or failed (the PACS could not be reached).",
            "result",
            ("ok", "failed"),
            self.registry,
        )
        self.scans = _counter(
            "medfed_pacs_watch_scans",
            "Scans handled for the first time, by outcome: answered or skipped.",
            "outcome",
            ("answered", "skipped"),
            self.registry,
        )
        self.queue = Gauge(
            "medfed_pacs_watch_queue_depth",
            "Studies with new instances found by the current poll and not yet handled "
            "(0 between polls).",
            registry=self.registry,
        )
        lag = Gauge(
            "medfed_pacs_watch_lag_seconds",
            "Seconds since the last poll that reached the PACS and handled every study it "
            "found (since the start, before the first).",
            registry=self.registry,
        )
        lag.set_function(self.lag)

    def lag(self) -> float:
        return max(0.0, self.clock() - (self.last_ok if self.last_ok is not None else self.started))

    def polled(self, ok: bool) -> None:
        self.polls.labels("ok" if ok else "failed").inc()
        self.queue.set(0)
        if ok:
            self.last_ok = self.clock()

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def serve(self, port: int, host: str = "127.0.0.1") -> Any:
        return serve_registry(self.registry, port, host)


def serve_registry(registry: CollectorRegistry, port: int, host: str = "127.0.0.1") -> Any:
    """Serve ``registry`` at http://HOST:PORT/metrics from a daemon thread; the server."""
    from prometheus_client import start_http_server

    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise ConfigError(
            f"--metrics-port {port}: cannot listen on {host}:{port} ({exc.strerror or exc}); "
            "choose a free port"
        ) from None
    return server


class ListenMetrics:
    """``medfed pacs listen``'s metrics; ``waiting`` reads how many series wait for their
    quiet time (the listener's queue)."""

    def __init__(self, waiting: Callable[[], int], clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.registry = CollectorRegistry()
        self.started = clock()
        self.last_instance: float | None = None
        self.instances = _counter(
            "medfed_pacs_listen_instances",
            "DICOM instances received by C-STORE, by result: kept, refused (malformed: not "
            "kept), failed (could not be written: the sender was told to retry), ignored (a "
            "report, not an image).",
            "result",
            ("kept", "refused", "failed", "ignored"),
            self.registry,
        )
        self.scans = _counter(
            "medfed_pacs_listen_scans",
            "Scans handled for the first time, by outcome: answered or skipped.",
            "outcome",
            ("answered", "skipped"),
            self.registry,
        )
        self.retries = Counter(
            "medfed_pacs_listen_series_retried",
            "Series whose answer failed (e.g. the PACS refused it) and wait to be tried again.",
            registry=self.registry,
        )
        queue = Gauge(
            "medfed_pacs_listen_queue_depth",
            "Series received and waiting for their quiet time before they are answered.",
            registry=self.registry,
        )
        queue.set_function(lambda: float(waiting()))
        idle = Gauge(
            "medfed_pacs_listen_idle_seconds",
            "Seconds since the last instance was received (since the start, before the first).",
            registry=self.registry,
        )
        idle.set_function(self.idle)

    def idle(self) -> float:
        last = self.last_instance if self.last_instance is not None else self.started
        return max(0.0, self.clock() - last)

    def received(self, result: str) -> None:
        self.instances.labels(result).inc()
        if result == "kept":
            self.last_instance = self.clock()

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def serve(self, port: int, host: str = "127.0.0.1") -> Any:
        return serve_registry(self.registry, port, host)


class DashboardMetrics:
    """The dashboard's metrics. ``healthy`` asks Streamlit's health endpoint (at each scrape),
    ``runs`` counts the run directories the pages can show; page runs and log lines are counted
    from what the Streamlit process prints (:mod:`medfed.dashboard.service`)."""

    LEVELS = ("debug", "info", "warning", "error", "critical")

    def __init__(
        self, pages: tuple[str, ...], healthy: Callable[[], bool], runs: Callable[[], int]
    ) -> None:
        self.pages = pages
        self.registry = CollectorRegistry()
        up = Gauge(
            "medfed_dashboard_up",
            "1 when Streamlit's health endpoint answers ok, 0 when it does not (asked at each "
            "scrape).",
            registry=self.registry,
        )
        up.set_function(lambda: float(healthy()))
        shown = Gauge(
            "medfed_dashboard_runs",
            "Run directories the dashboard can show (looked up at each scrape).",
            registry=self.registry,
        )
        shown.set_function(lambda: float(runs()))
        self.page_runs = Counter(
            "medfed_dashboard_page_runs",
            "Runs of a page's script (each visit and each interaction), by page and result: ok, "
            "or error (the page failed; its exception's type is logged).",
            ("page", "result"),
            registry=self.registry,
        )
        for page in (*pages, "other"):
            for result in ("ok", "error"):
                self.page_runs.labels(page, result)
        self.page_seconds = Histogram(
            "medfed_dashboard_page_seconds",
            "Time a page's script took to run, by page.",
            ("page",),
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.lines = _counter(
            "medfed_dashboard_log_lines",
            "Lines Streamlit printed, by level (a line without one counts as info).",
            "level",
            self.LEVELS,
            self.registry,
        )

    def page_run(self, page: str, result: str, seconds: float) -> None:
        page = page if page in self.pages else "other"
        self.page_runs.labels(page, "ok" if result == "ok" else "error").inc()
        self.page_seconds.labels(page).observe(max(0.0, seconds))

    def line(self, level: str) -> None:
        self.lines.labels(level if level in self.LEVELS else "info").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def serve(self, port: int, host: str = "127.0.0.1") -> Any:
        return serve_registry(self.registry, port, host)
