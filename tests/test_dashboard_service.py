"""The dashboard as a service: the supervisor turns what Streamlit prints into log lines (JSON
or text), counts page runs and Streamlit's warnings in Prometheus metrics, passes SIGTERM on and
exits with Streamlit's status. A stand-in child process plays Streamlit here; the browser test
runs the real one (tests/test_dashboard_browser.py)."""

from __future__ import annotations

import io
import json
import os
import signal
import sys
import threading
import time

import pytest

from medfed.dashboard import EVENTS_ENV, PAGES
from medfed.dashboard.service import PAGE_EVENT, page_run, relay, supervise
from medfed.ops.telemetry import DashboardMetrics, EventLog
from medfed.ops.units import UnitSettings, unit_files

TITLES = tuple(PAGES)


def _metrics(up: bool = True, runs: int = 2) -> DashboardMetrics:
    return DashboardMetrics(TITLES, lambda: up, lambda: runs)


def _value(metrics: DashboardMetrics, sample: str) -> float:
    """The value of the sample line that starts with ``sample`` (name and labels)."""
    for line in metrics.render().decode().splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {sample}")


def _json_log() -> tuple[EventLog, io.StringIO]:
    stream = io.StringIO()
    return EventLog("json", stream), stream


def _records(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]  # every line is JSON


def test_streamlit_lines_become_json_records_with_their_level_and_are_counted() -> None:
    log, stream = _json_log()
    metrics = _metrics()
    lines = [
        "\x1b[34m  You can now view your Streamlit app in your browser.\x1b[0m\n",
        "\n",
        "2026-12-05 10:00:00.123 WARNING streamlit.runtime.caching: a cache was cleared\n",
        "2026-12-05 10:00:01.500 ERROR   streamlit.web.server: Uncaught app exception\n",
        "2026-12-05 10:00:02.000 Uvicorn server started on 127.0.0.1:8501\n",
        "Traceback (most recent call last):\n",
    ]
    for line in lines:
        relay(line, log, metrics, TITLES)

    records = _records(stream)
    assert [(r["event"], r["level"]) for r in records] == [
        ("streamlit.output", "info"),
        ("streamlit.output", "warning"),
        ("streamlit.output", "error"),
        ("streamlit.output", "info"),
        ("streamlit.output", "info"),
    ]  # the blank line is dropped; colour codes are gone
    assert records[0]["message"] == "You can now view your Streamlit app in your browser."
    assert records[1]["logger"] == "streamlit.runtime.caching"
    assert records[1]["message"] == "a cache was cleared"
    assert records[3]["message"] == "Uvicorn server started on 127.0.0.1:8501"
    assert "logger" not in records[3]  # a line with the time only: no level, no logger
    assert _value(metrics, 'medfed_dashboard_log_lines_total{level="warning"}') == 1
    assert _value(metrics, 'medfed_dashboard_log_lines_total{level="error"}') == 1
    assert _value(metrics, 'medfed_dashboard_log_lines_total{level="info"}') == 3


def test_a_page_run_line_is_logged_and_counted_by_page_and_result() -> None:
    log, stream = _json_log()
    metrics = _metrics()
    runs = [
        {"event": PAGE_EVENT, "page": "Review", "result": "ok", "seconds": 0.25},
        {"event": PAGE_EVENT, "page": "Routing", "result": "error", "error": "ValueError",
         "seconds": 1.5},
        {"event": PAGE_EVENT, "page": "/etc/passwd", "result": "ok", "seconds": 0.1},
    ]  # fmt: skip
    for record in runs:
        relay(json.dumps(record) + "\n", log, metrics, TITLES)

    records = _records(stream)
    assert [(r["page"], r["result"], r["level"]) for r in records] == [
        ("Review", "ok", "info"),
        ("Routing", "error", "error"),
        ("other", "ok", "info"),  # a title the dashboard does not have is not echoed
    ]
    assert records[1]["error"] == "ValueError"
    assert _value(metrics, 'medfed_dashboard_page_runs_total{page="Review",result="ok"}') == 1
    assert _value(metrics, 'medfed_dashboard_page_runs_total{page="Routing",result="error"}') == 1
    assert _value(metrics, 'medfed_dashboard_page_runs_total{page="other",result="ok"}') == 1
    assert _value(metrics, 'medfed_dashboard_page_seconds_count{page="Routing"}') == 1
    assert _value(metrics, 'medfed_dashboard_page_seconds_sum{page="Routing"}') == 1.5
    assert _value(metrics, 'medfed_dashboard_log_lines_total{level="info"}') == 0  # not Streamlit's


def test_health_and_run_count_are_read_at_each_scrape() -> None:
    state = {"up": False, "runs": 0}
    metrics = DashboardMetrics(TITLES, lambda: state["up"], lambda: state["runs"])
    assert _value(metrics, "medfed_dashboard_up") == 0
    state.update(up=True, runs=3)
    assert _value(metrics, "medfed_dashboard_up") == 1
    assert _value(metrics, "medfed_dashboard_runs") == 3


class _StopLikeStreamlit(BaseException):
    """Streamlit ends a run early (st.stop, st.rerun) with a BaseException of its own."""


def test_page_run_prints_one_line_only_under_the_supervisor(monkeypatch) -> None:
    out = io.StringIO()
    monkeypatch.delenv(EVENTS_ENV, raising=False)
    with page_run("Review", out):
        pass
    assert out.getvalue() == ""  # `medfed dashboard` without --log-format json: nothing extra

    monkeypatch.setenv(EVENTS_ENV, "1")
    with page_run("Review", out):
        pass
    with pytest.raises(_StopLikeStreamlit), page_run("Sites", out):
        raise _StopLikeStreamlit
    with pytest.raises(KeyError), page_run("Routing", out):
        raise KeyError("/data/patient 0042.png")

    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(r["page"], r["result"]) for r in lines] == [
        ("Review", "ok"), ("Sites", "ok"), ("Routing", "error"),
    ]  # fmt: skip
    assert lines[2]["error"] == "KeyError"
    assert "patient" not in out.getvalue()  # the exception's type, never its message
    assert all(r["event"] == PAGE_EVENT and r["seconds"] >= 0 for r in lines)


def _child(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_supervise_relays_every_line_and_exits_with_the_child_status() -> None:
    log, stream = _json_log()
    metrics = _metrics()
    code = (
        "import json, os, sys\n"
        f"assert os.environ[{EVENTS_ENV!r}] == '1'\n"
        "print('  Local URL: http://127.0.0.1:1')\n"
        f"print(json.dumps({{'event': {PAGE_EVENT!r}, 'page': 'Sites', 'result': 'ok', "
        "'seconds': 0.1}), file=sys.stderr)\n"
        "sys.exit(3)\n"
    )
    status = supervise(_child(code), dict(os.environ), "http://127.0.0.1:9", log, metrics, TITLES)

    assert status == 3
    records = _records(stream)
    events = [r["event"] for r in records]
    assert events[0] == "dashboard.started" and events[-1] == "dashboard.stopped"
    assert "streamlit.output" in events and PAGE_EVENT in events
    assert records[-1]["exit_status"] == 3 and records[-1]["level"] == "error"
    assert _value(metrics, 'medfed_dashboard_page_runs_total{page="Sites",result="ok"}') == 1


def test_sigterm_is_passed_on_and_no_child_is_left(tmp_path) -> None:
    log, stream = _json_log()
    waiting = threading.Event()

    def watching(event: str, level: str = "info", **fields) -> None:
        log(event, level, **fields)
        if fields.get("message") == "waiting":
            waiting.set()

    def stop_when_waiting() -> None:
        if waiting.wait(60):
            os.kill(os.getpid(), signal.SIGTERM)  # as systemd stops the service

    before = signal.getsignal(signal.SIGTERM)
    threading.Thread(target=stop_when_waiting, daemon=True).start()
    code = "import time\nprint('waiting', flush=True)\ntime.sleep(120)\n"
    started = time.monotonic()
    status = supervise(_child(code), dict(os.environ), "http://127.0.0.1:9", watching)

    assert waiting.is_set() and time.monotonic() - started < 60
    assert status == 128 + signal.SIGTERM
    pid = _records(stream)[0]["pid"]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped: nothing left running
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is put back
    last = _records(stream)[-1]
    assert (last["event"], last["level"]) == ("dashboard.stopped", "info")  # a stop, not a crash


def test_the_dashboard_unit_logs_json_and_serves_metrics_when_asked(tmp_path) -> None:
    run = tmp_path / "run"
    plain = unit_files(UnitSettings(run=run))["medfed-dashboard.service"]
    assert "--log-format json" in plain and "--metrics-port" not in plain
    served = UnitSettings(run=run, dashboard_metrics_port=9102)
    assert "--metrics-port 9102" in unit_files(served)["medfed-dashboard.service"]
