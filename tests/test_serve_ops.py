"""What an IT department runs ``medfed serve`` and ``medfed pacs watch`` by: liveness and
readiness probes that need no token and name nothing, one JSON log line per event, and
Prometheus metrics (parsed here with prometheus_client's own parser)."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.badinput import Shared
from tests.pacs_studies import assert_private, free_port

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
from fastapi.testclient import TestClient  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from medfed.ops.telemetry import EventLog, WatchMetrics  # noqa: E402

TOKEN = "s3cret-token"


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """Every sample of a Prometheus text page: (name, sorted labels) -> value."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _client(run: Path, log: EventLog | None = None, token: str | None = None) -> TestClient:
    from medfed.clinic.pacs.uploads import Limits
    from medfed.clinic.serve import Served, create_app
    from medfed.routing.bundle import TrainedFederation
    from medfed.routing.routers import make_router

    fed = TrainedFederation.load(run, "cpu")
    runs = {"run": Served("run", run, fed, make_router("auto", fed))}
    return TestClient(create_app(runs, Limits(max_pixels=200_000), token, log))


@pytest.fixture(scope="module")
def run(shared: Shared, tmp_path_factory) -> Path:
    return shared.copy_run(tmp_path_factory.mktemp("ops"))


def test_liveness_needs_no_token_and_says_only_ok(run) -> None:
    client = _client(run, token=TOKEN)

    live = client.get("/livez")

    assert live.status_code == 200 and live.text == "ok"
    assert client.get("/health").status_code == 401  # everything else still needs it


def test_readiness_checks_the_model_and_that_the_audit_log_takes_a_row(run, tmp_path) -> None:
    ready = _client(run, token=TOKEN).get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "checks": {"model": True, "audit_log": True}}

    broken = tmp_path / "broken"
    shutil.copytree(run, broken)
    (broken / "audit.sqlite").write_bytes(b"this is no database" * 100)
    stream = io.StringIO()
    answer = _client(broken, EventLog("json", stream)).get("/readyz")

    assert answer.status_code == 503
    assert answer.json()["checks"] == {"model": True, "audit_log": False}
    assert str(broken) not in answer.text  # the reason goes to the log, not to the caller
    records = [json.loads(line) for line in stream.getvalue().splitlines()]
    reasons = [r["reason"] for r in records if r["event"] == "not_ready"]
    assert any("not a database" in r and "audit.sqlite" in r for r in reasons)


def test_every_request_is_one_json_log_line_with_its_request_id(run, shared: Shared) -> None:
    stream = io.StringIO()
    client = _client(run, EventLog("json", stream))
    photo = sorted((shared.data / "ACRIMA").glob("*.jpg"))[0]

    answer = client.post("/route", params={"name": photo.name}, content=photo.read_bytes())
    given = client.get("/health", headers={"X-Request-ID": "proxy-42"})

    records = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert all({"time", "level", "event"} <= set(r) for r in records)
    rid = answer.headers["X-Request-ID"]
    mine = [r for r in records if r.get("request_id") == rid]
    assert [r["event"] for r in mine] == ["scan.answered", "request"]
    assert mine[1]["status"] == 200 and mine[1]["path"] == "/route"
    assert mine[0]["audit_id"] == answer.json()["audit_id"]
    assert given.headers["X-Request-ID"] == "proxy-42"
    assert photo.name not in stream.getvalue()  # the query (the file's name) is never logged


def test_metrics_count_requests_latency_and_outcomes(run, shared: Shared) -> None:
    client = _client(run, token=TOKEN)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    photo = sorted((shared.data / "ACRIMA").glob("*.jpg"))[0]
    client.post("/route", params={"name": photo.name}, content=photo.read_bytes(), headers=auth)
    client.post("/route", params={"name": "b.png"}, content=b"not a png", headers=auth)
    client.post("/route", params={"name": "x.jpg"}, content=b"x")  # no token: refused
    client.get("/nowhere", headers=auth)

    page = client.get("/metrics", headers=auth)

    assert client.get("/metrics").status_code == 401
    assert page.headers["content-type"].startswith("text/plain")
    got = samples(page.text)
    assert got[("medfed_serve_requests_total", (("endpoint", "/route"), ("status", "200")))] == 1
    assert got[("medfed_serve_requests_total", (("endpoint", "/route"), ("status", "401")))] == 1
    assert got[("medfed_serve_requests_total", (("endpoint", "other"), ("status", "404")))] == 1
    answered = sum(
        got[("medfed_serve_scans_total", (("outcome", o),))] for o in ("routed", "abstained")
    )
    assert answered == 1
    assert got[("medfed_serve_scans_total", (("outcome", "error"),))] == 1
    assert got[("medfed_serve_scans_total", (("outcome", "refused"),))] == 1
    count = got[("medfed_serve_request_seconds_count", (("endpoint", "/route"),))]
    inf = got[("medfed_serve_request_seconds_bucket", (("endpoint", "/route"), ("le", "+Inf")))]
    assert count == inf == 3


def test_the_watchers_metrics_count_polls_lag_and_queue(monkeypatch) -> None:
    from medfed.clinic.pacs.connection import PacsUnreachable
    from medfed.clinic.pacs.watcher import DicomwebWatcher

    now = [1000.0]
    metrics = WatchMetrics(clock=lambda: now[0])
    watcher = DicomwebWatcher(inbox=None, client=None, warn=lambda line: None, metrics=metrics)
    results = iter([[], PacsUnreachable("down"), []])

    def poll() -> list:
        now[0] += 10
        result = next(results)
        if isinstance(result, Exception):
            raise result
        return result

    monkeypatch.setattr(watcher, "poll", poll)
    monkeypatch.setattr(time, "sleep", lambda s: None)
    watcher.watch(1, lambda line: None, polls=2)
    now[0] += 5

    got = samples(metrics.render().decode())
    assert got[("medfed_pacs_watch_polls_total", (("result", "ok"),))] == 1
    assert got[("medfed_pacs_watch_polls_total", (("result", "failed"),))] == 1
    assert got[("medfed_pacs_watch_lag_seconds", ())] == 15  # the last good poll ended at 1010
    assert got[("medfed_pacs_watch_queue_depth", ())] == 0


def test_the_watchers_metrics_are_served_on_loopback() -> None:
    metrics = WatchMetrics()
    metrics.queue.set(3)
    port = free_port()
    server = metrics.serve(port)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            got = samples(reply.read().decode())
    finally:
        server.shutdown()
        server.server_close()
    assert got[("medfed_pacs_watch_queue_depth", ())] == 3


def test_a_real_service_answers_the_probes_and_logs_json(shared: Shared, tmp_path) -> None:
    run = shared.copy_run(tmp_path)
    port = free_port()
    log = tmp_path / "serve.log"
    argv = [sys.executable, "-m", "medfed", "serve", str(run), "--port", str(port)]
    argv += ["--device", "cpu", "--log-format", "json"]
    with log.open("w") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/livez", timeout=2) as reply:
                    assert reply.read() == b"ok"
                    break
            except OSError:
                assert process.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "medfed serve did not start in 120 s"
                time.sleep(0.3)
        with urllib.request.urlopen(f"{url}/readyz", timeout=5) as reply:
            assert json.loads(reply.read())["status"] == "ready"
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as reply:
            got = samples(reply.read().decode())
        assert ("medfed_serve_scans_total", (("outcome", "refused"),)) in got
    finally:
        os.kill(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    assert lines and lines[0]["event"] == "service.started"
    assert lines[0]["url"] == url


def test_a_service_makes_the_patient_data_an_older_version_left_readable_owner_only(tmp_path):
    from medfed.cli.pacs import keep_data_private

    run = tmp_path / "run"
    (run / "review" / "scans" / "abc").mkdir(parents=True)
    (run / "pacs" / "answers").mkdir(parents=True)
    readable = [
        run / "audit.sqlite",
        run / "audit.sqlite-wal",
        run / "pacs.sqlite",
        run / "review" / "scans" / "abc" / "photo.png",
        run / "pacs" / "answers" / "1.2.3.dcm",
    ]
    for path in readable:
        path.write_bytes(b"x")
        path.chmod(0o644)
    (run / "summary.json").write_text("{}", encoding="utf-8")
    (run / "summary.json").chmod(0o644)

    keep_data_private(run)
    (run / "review" / "later.txt").write_text("written by the service afterwards")

    assert assert_private(run) == len(readable) + 1
    assert (run / "summary.json").stat().st_mode & 0o777 == 0o644  # not patient data
