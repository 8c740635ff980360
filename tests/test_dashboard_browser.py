"""The dashboard in a real browser: ``medfed dashboard`` serving small real runs on loopback,
Debian's chromium driven by Playwright (no browser download: the system one is used)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from medfed.clinic.audit import AuditLog
from medfed.clinic.route import route_one
from medfed.dashboard import RUNS_ENV
from medfed.dashboard.charts import CROSS_SITE_TITLE
from medfed.dashboard.rundata import REVIEWER_HEADER_ENV
from medfed.routing.bundle import TrainedFederation
from medfed.routing.routers import make_router
from tests.dashboard_runs import SITES as CLINICAL_SITES
from tests.dashboard_runs import DashboardRuns, build, clinical_summary, write_summary_run

# A Streamlit server and Chromium: make test-fast leaves them out.
pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parent.parent  # the checkout: dashboard/app.py is here
SITES = ("acrima", "refuge", "rimone")
START_TIMEOUT_S = 90
READ = "glaucoma"  # the demo federation's positive class, as a reader picks it
CI = re.compile(r"\d\.\d{3} \(\d\.\d{3}\u2013\d\.\d{3}\)")  # 0.840 (0.780–0.900)


def require_browser() -> None:
    """Skip (fail under CI, whose .ci/run installs chromium) when no browser can be driven."""
    missing = []
    if not CHROMIUM.is_file():
        missing.append(f"{CHROMIUM} (Debian package 'chromium': apt-get install -y chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package (pip install -e '.[dev]')")
    if missing:
        message = "the browser test needs " + " and ".join(missing)
        if os.environ.get("CI"):
            pytest.fail(message + "; .ci/run installs chromium before the tests")
        pytest.skip(message)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> DashboardRuns:
    require_browser()
    return build(tmp_path_factory.mktemp("browser"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_serving(url: str, server: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"the dashboard exited with {server.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            time.sleep(0.5)
    pytest.fail(f"the dashboard did not answer within {START_TIMEOUT_S} s:\n{log.read_text()}")


def stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        os.kill(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(server.pid, signal.SIGKILL)
            server.wait(timeout=20)


def test_browser_shows_per_site_auc_and_routes_an_uploaded_scan(runs, tmp_path) -> None:
    from playwright.sync_api import expect, sync_playwright

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "dashboard.log"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    command = [sys.executable, "-m", "medfed.cli", "dashboard", str(runs.runs), "--port", str(port)]
    with open(log, "w") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    photo = runs.fundus_photo()
    try:
        wait_until_serving(url, server, log)
        assert f"127.0.0.1:{port}" in log.read_text()
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM))
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 2200})
                page.set_default_timeout(60_000)
                expect.set_options(timeout=60_000)  # the first routing loads torch and the models
                page.goto(url)

                expect(page.get_by_role("heading", name="Per-site AUC")).to_be_visible()
                table = page.locator("table").first
                for text in (*SITES, "fedavg", "feddrm", "n test (pos / neg)"):
                    expect(table).to_contain_text(text)
                expect(table).to_contain_text(CI)  # an AUC with its 95% CI
                expect(page.get_by_text("Worst site: feddrm")).to_be_visible()
                expect(page.get_by_role("heading", name="Federation figures")).to_be_visible()
                heading = page.get_by_role("heading", name="Cross-site AUC")
                heading.scroll_into_view_if_needed()
                expect(heading).to_be_visible()
                expect(page.get_by_text(CROSS_SITE_TITLE)).to_be_visible()  # the heatmap's title
                page.screenshot(path=str(tmp_path / "federation.png"), full_page=True)

                page.get_by_role("link", name="Routing").click()
                expect(page.get_by_role("heading", name="Routing", exact=True)).to_be_visible()
                page.locator('input[type="file"]').set_input_files(str(photo))

                expect(page.get_by_text(f"Result: {photo.name}")).to_be_visible()
                decision = page.locator('[data-testid="stAlert"]').first
                expect(decision).to_contain_text(re.compile(r"Routed to site \w+|abstain"))
                metrics = page.locator('[data-testid="stMetric"]')
                chosen = metrics.filter(has_text="Chosen site")
                expect(chosen).to_contain_text(re.compile("|".join([*SITES, "abstain"])))
                expect(metrics.filter(has_text="Distance to the closest site")).to_contain_text(
                    re.compile(r"threshold \d+\.\d\d")
                )
                thumbnail = page.locator('[data-testid="stImage"] img').first
                expect(thumbnail).to_be_visible()  # the scan, small, beside the answer
                page.wait_for_function(
                    "img => img.complete && img.naturalWidth > 0", arg=thumbnail.element_handle()
                )
                expect(page.get_by_text("the scan", exact=True)).to_be_visible()
                if "abstain" in decision.inner_text():  # no answer in large type
                    expect(page.get_by_text("Not to be relied on")).to_be_visible()
                    expect(metrics.filter(has_text="Prediction")).to_have_count(0)
                else:
                    expect(page.get_by_text("Site probabilities", exact=True)).to_be_visible()
                    expect(metrics.filter(has_text="Prediction")).to_contain_text(
                        re.compile("normal|glaucoma")
                    )
                expect(page.get_by_text("1 of 1 routed scans")).to_be_visible()
                shown = chosen.inner_text()
                page.screenshot(path=str(tmp_path / "routing.png"))

                # The uploaded scan is read on Review: its kept copy is the picture shown.
                page.get_by_role("link", name="Review").click()
                expect(page.get_by_role("heading", name="Review", exact=True)).to_be_visible()
                name = page.get_by_role("textbox", name="Your name (recorded with every read)")
                name.fill("dr.upload")
                name.press("Enter")
                expect(page.get_by_text("Give your name above")).to_have_count(0)
                expect(page.get_by_text(f"Scan 1: {photo.name}")).to_be_visible()
                picture = page.locator('[data-testid="stImage"] img').first
                expect(picture).to_be_visible()
                page.wait_for_function(
                    "img => img.complete && img.naturalWidth > 0", arg=picture.element_handle()
                )
                expect(page.get_by_text("No picture")).to_have_count(0)
                form = page.locator('[data-testid="stForm"]').first
                form.locator('[data-testid="stRadio"]').get_by_text(READ, exact=True).click()
                form.get_by_role("button", name="Record read").click()
                expect(
                    page.get_by_text(f"Recorded: scan 1 read as {READ} by dr.upload")
                ).to_be_visible()
                page.screenshot(path=str(tmp_path / "review_upload.png"), full_page=True)
            finally:
                browser.close()
    finally:
        stop(server)

    entries = AuditLog(runs.feddrm).read()  # the Routing page opens the run that routes
    assert [e.file for e in entries] == [photo.name]
    assert (runs.feddrm / "review" / "scans" / entries[0].sha256 / photo.name).is_file()
    assert (entries[0].chosen_site or "abstain") in shown  # the page showed what was logged
    reads = AuditLog(runs.feddrm).reads()
    assert [(r.routed_id, r.reader, r.read, r.source) for r in reads] == [
        (1, "dr.upload", READ, "dashboard")
    ]
    for shot in ("federation.png", "routing.png", "review_upload.png"):
        assert (tmp_path / shot).stat().st_size > 10_000


def test_browser_records_a_read_and_it_lands_in_the_audit_log(runs, tmp_path) -> None:
    from playwright.sync_api import expect, sync_playwright

    run = tmp_path / "runs" / "feddrm"  # a copy: the test above reads the shared runs' logs
    shutil.copytree(
        runs.feddrm, run, ignore=shutil.ignore_patterns("checkpoints", "audit.*", "review")
    )
    fed = TrainedFederation.load(run, "cpu")
    photo = runs.fundus_photo()
    AuditLog(run).append([route_one(fed, make_router("auto", fed), photo)])  # as medfed route
    read = fed.class_names()[1]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "dashboard.log"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop(REVIEWER_HEADER_ENV, None)  # no sign-in proxy sends it here: the name is typed
    command = [sys.executable, "-m", "medfed.cli", "dashboard", str(run), "--port", str(port)]
    metrics_port = free_port()  # as a service: JSON log lines and Prometheus metrics
    command += ["--log-format", "json", "--metrics-port", str(metrics_port)]
    with open(log, "w") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_until_serving(url, server, log)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM))
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 2200})
                page.set_default_timeout(60_000)
                expect.set_options(timeout=60_000)
                page.goto(url)
                page.get_by_role("link", name="Review").click()

                expect(page.get_by_role("heading", name="Review", exact=True)).to_be_visible()
                name = page.get_by_role("textbox", name="Your name (recorded with every read)")
                name.fill("dr.browser")
                name.press("Enter")
                expect(page.get_by_text("Give your name above")).to_have_count(0)  # rerun done
                card = page.get_by_text(f"Scan 1: {photo}")
                expect(card).to_have_count(1)  # no stale copy left from before the rerun
                expect(card).to_be_visible()
                thumbnail = page.locator('[data-testid="stImage"] img').first
                expect(thumbnail).to_be_visible()  # the scan as routed, from its file here
                page.wait_for_function(
                    "img => img.complete && img.naturalWidth > 0", arg=thumbnail.element_handle()
                )
                form = page.locator('[data-testid="stForm"]').first
                form.locator('[data-testid="stRadio"]').get_by_text(read, exact=True).click()
                form.get_by_role("textbox", name="Note (optional)").fill("read in the browser")
                form.get_by_role("button", name="Record read").click()

                expect(
                    page.get_by_text(f"Recorded: scan 1 read as {read} by dr.browser")
                ).to_be_visible()
                expect(page.get_by_text("No scan left to read")).to_be_visible()
                page.screenshot(path=str(tmp_path / "review.png"), full_page=True)
            finally:
                browser.close()
        metrics = _scrape(metrics_port)
    finally:
        stop(server)

    reads = AuditLog(run).reads()
    assert [(r.routed_id, r.reader, r.read, r.note, r.source) for r in reads] == [
        (1, "dr.browser", read, "read in the browser", "dashboard")
    ]
    assert (tmp_path / "review.png").stat().st_size > 10_000
    assert metrics["medfed_dashboard_up"] == 1 and metrics["medfed_dashboard_runs"] == 1
    for page in ("Federation", "Review"):  # opened, then visited (reruns vary with timing)
        assert metrics[f'medfed_dashboard_page_runs_total{{page="{page}",result="ok"}}'] >= 1
    errors = [k for k, v in metrics.items() if "page_runs_total" in k and "error" in k and v]
    assert errors == []
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    events = [r["event"] for r in records]  # every line is one JSON object
    assert events[-1] == "dashboard.stopped" and records[-1]["exit_status"] == 0
    for event in ("dashboard.started", "dashboard.ready", "dashboard.page", "streamlit.output"):
        assert event in events
    streamlit_pid = next(r["pid"] for r in records if r["event"] == "dashboard.started")
    with pytest.raises(ProcessLookupError):
        os.kill(streamlit_pid, 0)  # SIGTERM reached Streamlit: nothing left running


def _scrape(port: int) -> dict[str, float]:
    """The dashboard's Prometheus metrics: sample (name and labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    samples = (line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    return {name: float(value) for name, value in samples}


def test_streamlit_run_of_the_top_level_app_serves_the_given_runs_on_loopback(tmp_path) -> None:
    from playwright.sync_api import expect, sync_playwright

    require_browser()
    runs = tmp_path / "runs"
    write_summary_run(runs / "clinical", clinical_summary())
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "dashboard.log"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for name in (RUNS_ENV, "STREAMLIT_SERVER_ADDRESS", "STREAMLIT_SERVER_PORT"):
        env.pop(name, None)  # the runs come from `-- RUN`, the address from dashboard/.streamlit
    app = ["dashboard/app.py", "--server.port", str(port), "--", str(runs)]
    command = [sys.executable, "-m", "streamlit", "run", *app]
    with open(log, "w") as out:
        server = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_until_serving(url, server, log)
        assert f"127.0.0.1:{port}" in log.read_text()  # loopback, from dashboard/.streamlit
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM))
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1600})
                page.set_default_timeout(60_000)
                expect.set_options(timeout=60_000)
                page.goto(url)

                expect(page.get_by_role("heading", name="Per-site AUC")).to_be_visible()
                expect(page.locator("table").first).to_contain_text(CLINICAL_SITES[0])
                expect(page.get_by_text(f"Reading: {runs}")).to_be_visible()
            finally:
                browser.close()
    finally:
        stop(server)
    assert server.returncode is not None
