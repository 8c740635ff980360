"""The dashboard's Review page through Streamlit's AppTest: the queue of routed scans (abstained
and low-margin first), reads recorded into the audit log, a second reader and their
disagreement, the prospective figures with CIs and n, and the reader's name from the sign-in
proxy's header.

Most tests use a crafted run directory (its config names the sites and classes; the audit log
holds routing decisions written here for small scan files), so the queue order and the figures
are known; one test reviews a scan routed by a real trained run.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from streamlit import config as streamlit_config
from streamlit.runtime.context import ContextProxy, StreamlitHeaders
from streamlit.testing.v1 import AppTest

from medfed.clinic.audit import AuditEntry, AuditLog
from medfed.clinic.kept import keep_scan
from medfed.clinic.review import (
    EXPORT_COLUMNS,
    FIGURE_COLUMNS,
    FIGURE_NAMES,
    Review,
    write_figures_csv,
)
from medfed.clinic.route import route_one
from medfed.core.errors import ConfigError
from medfed.dashboard import APP, RUNS_ENV, clinical, reviewdata, rundata
from medfed.data.cache import content_hash
from medfed.metrics import wilson
from medfed.routing.bundle import TrainedFederation
from medfed.routing.routers import make_router
from medfed.routing.scans import read_scan
from medfed.runs import RunDir
from tests.dashboard_runs import DashboardRuns, dashboard_runs  # noqa: F401 - session fixture

TIMEOUT = 120  # seconds per script run: the first one imports plotly and the data layer
SITES = ("acrima", "refuge", "rimone")
CLASSES = {"normal": 0, "glaucoma": 1}
NOW = datetime.now(UTC).replace(microsecond=0)
CI = re.compile(r"-?\d\.\d{3} \(-?\d\.\d{3}\u2013-?\d\.\d{3}\)")  # 0.500 (0.100–0.900)
DAY0 = datetime.combine((NOW - timedelta(days=3)).date(), datetime.min.time(), UTC)


# ---------------------------------------------------------------------------- a crafted run
def stamp(day: int, hour: int = 12, minute: int = 0) -> str:
    """A time of the log: ``day`` days after three days ago, at ``hour``:``minute`` UTC."""
    return (DAY0 + timedelta(days=day, hours=hour, minutes=minute)).isoformat(timespec="seconds")


def scan_file(folder: Path, name: str, seed: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, size=(20, 24, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(folder / name)
    return folder / name


def decision(
    path: Path | str,
    time: str,
    probs: dict[str, float],
    *,
    status: str = "routed",
    prediction: str | None = "glaucoma",
) -> AuditEntry:
    """A routing decision as 'medfed route' logs it, for a scan file (or a bare name)."""
    path = Path(path)
    digest = content_hash(read_scan(path).files) if path.is_file() else "0" * 64
    chosen = max(probs, key=probs.__getitem__) if status == "routed" else None
    reason = {
        "routed": "P(glaucoma) 0.70, at or above the operating threshold 0.40",
        "abstained": "no site fits: distance 9.00 above the threshold 3.00",
        "error": f"{path}: cannot be read",
    }[status]
    return AuditEntry(
        time=time,
        file=str(path),
        sha256=digest,
        router="density_ratio",
        status=status,
        chosen_site=chosen,
        site_probs=probs if status != "error" else {},
        prediction=prediction if status != "error" else None,
        prediction_prob=0.7 if prediction and status != "error" else None,
        ood_score=9.0 if status == "abstained" else 1.0,
        reason=reason,
    )


def crafted_run(tmp_path: Path) -> Path:
    """A run directory whose config names three fundus sites and the classes normal/glaucoma."""
    run = tmp_path / "runs" / "crafted"
    run.mkdir(parents=True)
    sites = [{"id": s, "modality": "fundus", "labels": dict(CLASSES)} for s in SITES]
    RunDir(run).write_config({"train": {"rounds": 3}, "sites": sites})
    return run


FIRM = {"acrima": 0.8, "refuge": 0.1, "rimone": 0.1}
FIRM_REFUGE = {"acrima": 0.05, "refuge": 0.9, "rimone": 0.05}
CLOSE = {"acrima": 0.45, "refuge": 0.40, "rimone": 0.15}  # top two 0.05 apart
CLOSER = {"acrima": 0.50, "refuge": 0.42, "rimone": 0.08}


@pytest.fixture
def queue_run(tmp_path: Path) -> tuple[Path, dict[str, int]]:
    """Six decisions logged in this order (scan id: what): 1 routine, routed last; 2 low margin;
    3 abstained; 4 routine, routed first; 5 an error (never reviewed); 6 low margin, an
    upload (no file here). Scan 1's file is changed after routing."""
    run, scans = crafted_run(tmp_path), tmp_path / "scans"
    entries = [
        decision(scan_file(scans, "late.png", 1), stamp(0, 13), FIRM),
        decision(scan_file(scans, "close.png", 2), stamp(0, 12, 30), CLOSE),
        decision(scan_file(scans, "odd.png", 3), stamp(0, 12, 45), FIRM, status="abstained"),
        decision(scan_file(scans, "early.png", 4), stamp(0, 12), FIRM_REFUGE, prediction="normal"),
        decision(scans / "missing.png", stamp(0, 12, 10), FIRM, status="error"),
        decision("upload.png", stamp(0, 12, 20), CLOSER),
    ]
    AuditLog(run).append(entries)
    scan_file(scans, "late.png", 99)  # a new image under the routed name
    return run, {"late": 1, "close": 2, "odd": 3, "early": 4, "error": 5, "upload": 6}


# ---------------------------------------------------------------------------- the app
@pytest.fixture(autouse=True)
def no_proxy_header(monkeypatch) -> None:
    """The header variable as a bare start leaves it (tests that need it set it)."""
    monkeypatch.delenv(rundata.REVIEWER_HEADER_ENV, raising=False)


def open_page(monkeypatch, roots: list[Path]) -> AppTest:
    """The app over ``roots``, switched to the Review page; fails on any exception."""
    monkeypatch.setenv(RUNS_ENV, os.pathsep.join(map(str, roots)))
    streamlit_config.set_option("server.address", "127.0.0.1")
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT).run()
    at.switch_page("views/review.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def open_review(monkeypatch, roots: list[Path]) -> AppTest:
    """:func:`open_page`, which must also show no error."""
    return ok(open_page(monkeypatch, roots))


def ok(at: AppTest) -> AppTest:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, texts(at, "error")
    return at


def texts(at: AppTest, *kinds: str) -> str:
    return "\n".join(str(e.value) for kind in kinds for e in at.get(kind))


def plain(text: str) -> str:
    """Markdown text as it reads on the page (escapes dropped)."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", text)


TABLES = {  # a column only that table has
    "queue": "priority",
    "reads": "recorded (UTC)",
    "disagreements": "reads (latest per reader)",
}


def table(at: AppTest, name: str) -> pd.DataFrame:
    """The page's queue, reads or disagreements table."""
    return next(d.value for d in at.dataframe if TABLES[name] in d.value.columns)


def site_probabilities(at: AppTest) -> list[pd.DataFrame]:
    """Each card's site probabilities (one row), in queue order."""
    return [d.value for d in at.dataframe if d.value.index.tolist() == ["probability"]]


def has_widget(at: AppTest, kind: str, key: str) -> bool:
    return any(w.key == key for w in at.get(kind))


def sign_in(at: AppTest, name: str) -> AppTest:
    at.text_input(key="reviewer").input(name).run()
    return ok(at)


def record(at: AppTest, scan: int, read: str | None, note: str = "") -> AppTest:
    if read is not None:
        at.radio(key=f"read_{scan}").set_value(read)
    if note:
        at.text_input(key=f"note_{scan}").input(note)
    at.button(key=f"record_{scan}").click().run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def show(at: AppTest, which: str) -> AppTest:
    at.radio(key="review_show").set_value(which).run()
    return ok(at)


@pytest.fixture
def proxy_headers(monkeypatch) -> Iterator[list[tuple[str, str]]]:
    """The request headers the pages see (``st.context.headers``), as a sign-in proxy sends
    them: append (name, value) pairs. AppTest has no browser request, so they are set here."""
    sent: list[tuple[str, str]] = []
    monkeypatch.setattr(ContextProxy, "headers", property(lambda self: StreamlitHeaders(sent)))
    yield sent


# ---------------------------------------------------------------------------- the queue
def test_queue_lists_abstained_then_low_margin_then_oldest_first(monkeypatch, queue_run) -> None:
    run, ids = queue_run
    at = open_review(monkeypatch, [run])

    queue = table(at, "queue")
    order = [ids[n] for n in ("odd", "upload", "close", "early", "late")]  # no error entry
    assert queue["scan"].tolist() == order
    assert queue["priority"].tolist() == [
        "abstained",
        "low margin",
        "low margin",
        "routine",
        "routine",
    ]
    assert queue.loc[queue["scan"] == ids["close"], "top-2 margin"].item() == pytest.approx(0.05)
    cards = [m.value for m in at.markdown if str(m.value).startswith("**Scan ")]
    assert [c.split("**")[1] for c in cards] == [f"Scan {i}" for i in order]
    assert "5 scans (not read by you): 1 abstained, 2 low margin" in texts(at, "caption")


def test_each_scan_shows_its_picture_and_hides_the_models_answer_until_read(
    monkeypatch, queue_run
) -> None:
    run, ids = queue_run
    at = open_review(monkeypatch, [run])

    # pictures of the files still holding the routed bytes, in queue order: odd, close, early
    assert len(at.image) == 3 and all(i.captions == ["the scan"] for i in at.image)
    captions = texts(at, "caption")
    assert "No picture: the file is not on this machine" in captions  # an upload not kept
    assert "No picture: the file has changed since it was routed" in captions  # late.png
    assert not [m for m in at.metric if m.label in ("Chosen site", "Prediction")]
    assert texts(at, "info").count("The model's answer is hidden until you record your read") == 5
    assert "glaucoma" not in texts(at, "markdown", "caption", "metric")
    assert "prediction" not in table(at, "queue").columns
    assert at.radio(key=f"read_{ids['close']}").options == ["normal", "glaucoma", "ungradable"]

    at = sign_in(at, "dr.a")
    ok(record(at, ids["early"], "normal"))
    assert "The model's answer: normal (probability 0.70) at site refuge." in texts(at, "success")
    (read,) = AuditLog(run).reads()
    assert read.blinded is True
    assert [(v.routed_id, v.reader) for v in AuditLog(run).reveals()] == [(ids["early"], "dr.a")]
    show(at, "every routed scan")
    chosen = [m.value for m in at.metric if m.label == "Chosen site"]
    predictions = [(m.value, m.delta) for m in at.metric if m.label == "Prediction"]
    assert chosen == ["refuge"] and predictions == [("normal", "probability 0.70")]
    assert "at or above the operating threshold 0.40" in texts(at, "caption")
    assert site_probabilities(at)[0].iloc[0].to_dict() == pytest.approx(FIRM_REFUGE)


def test_an_abstained_scan_shows_no_answer_and_its_outputs_folded_away(
    monkeypatch, queue_run
) -> None:
    run, ids = queue_run
    at = sign_in(open_review(monkeypatch, [run]), "dr.a")
    at.button(key=f"reveal_{ids['odd']}").click().run()
    ok(at)

    assert "abstain: no site fits" in texts(at, "warning")
    assert not [m for m in at.metric if m.label == "Prediction"]
    (folded,) = [e for e in at.expander if e.label.startswith("Not to be relied on")]
    # the log keeps no prediction for an abstained scan: none is shown, even folded away
    assert "glaucoma" not in "\n".join(str(c.value) for c in folded.caption)
    ok(record(at, ids["odd"], "ungradable"))
    assert [r.blinded for r in AuditLog(run).reads(ids["odd"])] == [False]  # answer seen first
    reads = table(at, "reads")
    assert reads["prediction"].tolist() == ["abstained: not an answer"]


def test_an_uploaded_scan_is_kept_with_the_run_and_shown(monkeypatch, tmp_path) -> None:
    run = crafted_run(tmp_path)
    upload = scan_file(tmp_path / "browser", "fundus.png", 7)
    routed = decision(upload, stamp(0, 12), FIRM)
    AuditLog(run).append([AuditEntry(**{**routed.__dict__, "file": "fundus.png"})])
    assert keep_scan(run, upload, routed.sha256, "fundus.png") is not None
    upload.unlink()  # the browser's file is gone: only the run's copy is left
    at = open_review(monkeypatch, [run])
    assert len(at.image) == 1 and at.image[0].captions == ["the scan"]
    kept = run / "review" / "scans" / routed.sha256 / "fundus.png"
    kept.write_bytes(b"other bytes")  # a copy that no longer holds the routed bytes
    at = open_review(monkeypatch, [run])
    assert not at.image and "No picture" in texts(at, "caption")


# ---------------------------------------------------------------------------- reads
def test_a_read_is_recorded_in_the_audit_log_and_survives_a_restart(monkeypatch, queue_run) -> None:
    run, ids = queue_run
    at = sign_in(open_review(monkeypatch, [run]), "dr.a")

    ok(record(at, ids["close"], "glaucoma", note="cup to disc 0.8"))

    reads = AuditLog(run).reads()
    assert [(r.routed_id, r.reader, r.read, r.note, r.source) for r in reads] == [
        (ids["close"], "dr.a", "glaucoma", "cup to disc 0.8", "dashboard")
    ]
    assert f"Recorded: scan {ids['close']} read as glaucoma by dr.a" in texts(at, "success")
    assert ids["close"] not in table(at, "queue")["scan"].tolist()  # read by you
    assert table(at, "reads")[["scan", "reader", "read"]].values.tolist() == [
        [ids["close"], "dr.a", "glaucoma"]
    ]

    restarted = open_review(monkeypatch, [run])  # a new server process reads the same database
    shown = table(restarted, "reads")
    assert shown[["scan", "reader", "read", "note"]].values.tolist() == [
        [ids["close"], "dr.a", "glaucoma", "cup to disc 0.8"]
    ]
    assert ids["close"] not in table(restarted, "queue")["scan"].tolist()  # nobody's


def test_a_second_reader_adds_a_row_and_their_disagreement_is_shown(monkeypatch, queue_run) -> None:
    run, ids = queue_run
    scan = ids["early"]
    first = sign_in(open_review(monkeypatch, [run]), "dr.a")
    second = sign_in(open_review(monkeypatch, [run]), "dr.b")  # another browser session

    ok(record(first, scan, "normal"))
    ok(second.run())
    assert scan in table(second, "queue")["scan"].tolist()  # dr.b has not read it
    hidden = "1 read by others, hidden until you record yours"
    assert hidden in texts(second, "caption")  # dr.b reads blind
    assert "by dr.a" not in texts(second, "caption")
    assert table(second, "reads")["prediction"].tolist() == ["hidden until you read it"]
    assert table(first, "reads")["prediction"].tolist() == ["normal"]  # dr.a has read it
    ok(record(second, scan, "glaucoma"))

    reads = AuditLog(run).reads(scan)
    assert [(r.reader, r.read) for r in reads] == [("dr.a", "normal"), ("dr.b", "glaucoma")]
    shown = table(second, "disagreements")
    assert shown["scan"].tolist() == [scan]
    assert shown["reads (latest per reader)"].item() == "dr.a: normal; dr.b: glaucoma"
    assert len(table(second, "reads")) == 2  # dr.a's read too: nothing stale
    show(second, "every routed scan")
    assert "Readers disagree: dr.a: normal; dr.b: glaucoma" in texts(second, "warning")
    ok(first.run())  # the first session sees the second read at its next rerun
    assert len(table(first, "reads")) == 2 and len(table(first, "disagreements")) == 1


def test_the_same_reader_reading_again_adds_a_row(monkeypatch, queue_run) -> None:
    run, ids = queue_run
    at = show(sign_in(open_review(monkeypatch, [run]), "dr.a"), "every routed scan")
    ok(record(at, ids["odd"], "ungradable"))
    ok(record(at, ids["odd"], "normal", note="second look"))
    assert [(r.read, r.note) for r in AuditLog(run).reads(ids["odd"])] == [
        ("ungradable", None),
        ("normal", "second look"),
    ]


def test_no_read_is_recorded_without_a_name_or_a_choice(monkeypatch, queue_run) -> None:
    run, ids = queue_run
    at = open_review(monkeypatch, [run])
    record(at, ids["close"], "normal")
    assert "Give your name above first" in texts(at, "warning")
    sign_in(at, "dr.a")
    record(at, ids["close"], None)
    assert "Choose a read first" in texts(at, "warning")
    assert AuditLog(run).reads() == []


# ---------------------------------------------------------------------------- figures
@pytest.fixture
def read_run(tmp_path: Path) -> Path:
    """Five scans, routed on day 0, read on days 1 and 2 (the module's rules say which read
    counts): system agreement 2/3, sensitivity 1/2, specificity 1/1, 1 of 5 read scans
    ungradable, 1 of 5 scans abstained, too few scans two readers read for kappa (4, they
    disagree on one)."""
    run, scans = crafted_run(tmp_path), tmp_path / "scans"
    AuditLog(run).append(
        [
            decision(scan_file(scans, "a.png", 1), stamp(0), FIRM),  # glaucoma
            decision(scan_file(scans, "b.png", 2), stamp(0), FIRM, prediction="normal"),
            decision(scan_file(scans, "c.png", 3), stamp(0), FIRM_REFUGE, prediction="normal"),
            decision(scan_file(scans, "d.png", 4), stamp(0), FIRM_REFUGE),  # glaucoma
            decision(scan_file(scans, "e.png", 5), stamp(0), FIRM, status="abstained"),
        ]
    )
    review = Review(run)
    for scan, reader, read, day in [
        (1, "dr.a", "glaucoma", 1),
        (1, "dr.b", "glaucoma", 2),
        (2, "dr.a", "glaucoma", 1),
        (2, "dr.b", "normal", 1),
        (3, "dr.a", "normal", 1),
        (3, "dr.b", "normal", 2),
        (4, "dr.a", "ungradable", 1),
        (5, "dr.a", "normal", 1),
        (5, "dr.b", "normal", 2),
    ]:
        review.record(scan, reader, read, time=stamp(day))
    return run


def test_prospective_figures_show_each_rate_with_its_ci_and_n(monkeypatch, read_run) -> None:
    at = open_review(monkeypatch, [read_run])

    figures = at.table[0].value
    assert figures.index.tolist() == [*SITES, "system"]
    assert list(figures.columns) == [
        clinical.SCANS_READ,
        *clinical.REVIEW_FIGURES.values(),
        clinical.RELIABILITY,
    ]
    system = figures.loc["system"]
    assert system[clinical.SCANS_READ] == "5"
    assert system["agreement with the reader"] == wilson(2, 3).text()  # 0.667 (…) 2/3
    assert system["sensitivity"] == wilson(1, 2).text()
    assert system["specificity"] == wilson(1, 1).text()
    assert system["ungradable rate"] == wilson(1, 5).text()
    assert system["abstain rate"] == wilson(1, 5).text()
    kappa = "Cohen's kappa (two readers)"  # from 5 double-read scans on: 4 here
    assert system[kappa] == "too few double reads (n=4): kappa needs at least 5"
    assert figures.loc["refuge", kappa].startswith("too few double reads (n=1)")
    assert "fewer than 10 positives (2)" in system[clinical.RELIABILITY]
    assert figures.loc["rimone", clinical.SCANS_READ] == "0"
    assert figures.loc["acrima", "abstain rate"].startswith("n/a (system only")
    assert figures.equals(clinical.prospective_table(Review(read_run).figures()))
    assert "9 reads of 5 scans" in texts(at, "caption")


def test_the_figures_window_keeps_the_reads_made_in_it(monkeypatch, read_run) -> None:
    at = open_review(monkeypatch, [read_run])
    day2 = (DAY0 + timedelta(days=2)).date()
    at.date_input(key="review_from").set_value(day2).run()
    ok(at)
    assert "3 reads of 3 scans" in texts(at, "caption")  # dr.b's reads of scans 1, 3, 5
    assert at.table[0].value.loc["system", clinical.SCANS_READ] == "3"

    at.radio(key="review_by").set_value("routed").run()  # scans routed from day 2: none
    ok(at)
    assert "0 reads of 0 scans" in texts(at, "caption")
    assert at.table[0].value.loc["system", "abstain rate"] == "n/a (0 scans)"


def test_a_window_that_ends_before_it_starts_is_refused(monkeypatch, read_run) -> None:
    at = open_review(monkeypatch, [read_run])
    at.date_input(key="review_from").set_value(date.today())
    at.date_input(key="review_until").set_value(date.today() - timedelta(days=2)).run()
    assert not at.exception
    assert "is not before its end" in texts(at, "error")
    assert not at.table  # no figures for a window that holds nothing


def test_figures_and_reads_download_as_the_review_command_writes_them(read_run) -> None:
    review = Review(read_run)
    figures = reviewdata.review_csv(lambda path: write_figures_csv(review.figures(), path))
    lines = figures.splitlines()
    assert lines[0] == ",".join(FIGURE_COLUMNS)
    assert len(lines) == 1 + (len(SITES) + 1) * len(FIGURE_NAMES)
    reads = reviewdata.review_csv(review.export_reads).splitlines()
    assert reads[0] == ",".join(EXPORT_COLUMNS)
    assert len(reads) == 1 + 9  # every read (every scan has one)


# ---------------------------------------------------------------------------- the reader's name
def test_the_name_comes_from_the_proxy_header_when_present(
    monkeypatch, queue_run, proxy_headers
) -> None:
    run, ids = queue_run
    proxy_headers.append(("X-Forwarded-User", "dr.lee"))
    at = open_review(monkeypatch, [run])
    assert "Reading as **dr.lee**" in texts(at, "markdown")
    assert not has_widget(at, "text_input", "reviewer")  # the name cannot be typed over
    ok(record(at, ids["close"], "normal"))
    assert [r.reader for r in AuditLog(run).reads()] == ["dr.lee"]


def test_the_header_name_is_configurable(monkeypatch, queue_run, proxy_headers) -> None:
    run, ids = queue_run
    proxy_headers += [("X-Forwarded-User", "someone.else"), ("X-Remote-User", "dr.kim")]
    monkeypatch.setenv(rundata.REVIEWER_HEADER_ENV, "X-Remote-User")
    at = open_review(monkeypatch, [run])
    assert "Reading as **dr.kim**" in texts(at, "markdown")


def test_without_the_header_the_name_is_typed(monkeypatch, queue_run, proxy_headers) -> None:
    run, _ = queue_run
    proxy_headers.append(("Host", "127.0.0.1:8501"))
    at = open_review(monkeypatch, [run])
    assert has_widget(at, "text_input", "reviewer")
    assert "Reading as" not in texts(at, "markdown")


def test_a_header_with_two_names_turns_recording_off(monkeypatch, queue_run, proxy_headers):
    run, ids = queue_run
    proxy_headers += [("X-Forwarded-User", "mallory"), ("X-Forwarded-User", "dr.lee")]
    at = open_page(monkeypatch, [run])
    assert "names 2 readers (mallory, dr.lee)" in texts(at, "error")
    assert not has_widget(at, "text_input", "reviewer")
    record(at, ids["close"], "normal")
    assert "Give your name above first" in texts(at, "warning")
    assert AuditLog(run).reads() == []


def test_reviewer_from_headers() -> None:
    header = rundata.DEFAULT_REVIEWER_HEADER
    assert rundata.reviewer_from_headers({"x-forwarded-user": " dr.lee "}, header) == "dr.lee"
    assert rundata.reviewer_from_headers({"X-Forwarded-User": ""}, header) is None
    assert rundata.reviewer_from_headers({"Host": "x"}, header) is None
    assert rundata.reviewer_from_headers({"X-Forwarded-User": "dr.lee"}, None) is None
    same = StreamlitHeaders([("X-Forwarded-User", "dr.lee"), ("x-forwarded-user", "dr.lee")])
    assert rundata.reviewer_from_headers(same, header) == "dr.lee"
    two = StreamlitHeaders([("X-Forwarded-User", "a"), ("X-Forwarded-User", "b")])
    with pytest.raises(ConfigError, match="names 2 readers"):
        rundata.reviewer_from_headers(two, header)
    shown = rundata.reviewer_from_headers({"X-Forwarded-User": "dr\nlee"}, header)
    assert shown == "dr\\nlee"  # a control character never reaches the log as it is


def test_reviewer_header_setting() -> None:
    assert rundata.reviewer_header({}) == "X-Forwarded-User"
    assert rundata.reviewer_header({rundata.REVIEWER_HEADER_ENV: "X-Remote-User"}) == (
        "X-Remote-User"
    )
    assert rundata.reviewer_header({rundata.REVIEWER_HEADER_ENV: " "}) is None  # turned off
    with pytest.raises(ConfigError, match=rundata.REVIEWER_HEADER_ENV):
        rundata.reviewer_header({rundata.REVIEWER_HEADER_ENV: "X User"})


def test_a_bad_header_setting_is_named_on_the_page(monkeypatch, queue_run) -> None:
    run, _ = queue_run
    monkeypatch.setenv(rundata.REVIEWER_HEADER_ENV, "X User: me")
    at = open_page(monkeypatch, [run])
    assert rundata.REVIEWER_HEADER_ENV in plain(texts(at, "error"))
    assert not has_widget(at, "text_input", "reviewer")


# ---------------------------------------------------------------------------- empty and damaged
def test_an_empty_folder_and_a_half_written_run_are_explained(
    monkeypatch,
    dashboard_runs: DashboardRuns,  # noqa: F811
    tmp_path: Path,
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    at = open_review(monkeypatch, [empty])
    assert "No run directory found" in texts(at, "warning")
    assert "medfed dashboard demo_out" in texts(at, "info")

    at = open_review(monkeypatch, [dashboard_runs.half_written])
    shown = texts(at, "info")
    assert "no trained model yet" in shown and "2 of 3 rounds recorded" in shown


def test_a_run_with_nothing_routed_says_how_to_route(monkeypatch, tmp_path) -> None:
    run = crafted_run(tmp_path)
    at = open_review(monkeypatch, [run])
    assert "has no trained model yet, so nothing to read" in texts(at, "info")
    assert "no round recorded yet" in texts(at, "info")


def test_a_run_whose_config_names_no_classes_says_so(monkeypatch, tmp_path) -> None:
    run = tmp_path / "runs" / "bare"
    run.mkdir(parents=True)
    RunDir(run).write_config({"train": {"rounds": 3}})  # written without its sites
    AuditLog(run).append([decision(scan_file(tmp_path, "a.png", 1), stamp(0), FIRM)])
    at = open_page(monkeypatch, [run])
    shown = plain(texts(at, "error"))
    assert "config.toml: names no site labels" in shown and "reads cannot be checked" in shown
    assert not has_widget(at, "radio", "read_1")  # nothing to record a read with


def test_an_audit_log_from_a_newer_medfed_is_named(monkeypatch, queue_run) -> None:
    run, _ = queue_run
    with sqlite3.connect(run / "audit.sqlite") as db:
        db.execute("PRAGMA user_version = 99")
    at = open_page(monkeypatch, [run])
    shown = texts(at, "warning")
    assert "audit.sqlite" in shown and "newer medfed" in shown


# ---------------------------------------------------------------------------- a real run
def test_a_scan_routed_by_a_trained_run_is_read(
    monkeypatch,
    dashboard_runs: DashboardRuns,  # noqa: F811
    tmp_path: Path,
) -> None:
    run = tmp_path / "runs" / "feddrm"
    shutil.copytree(dashboard_runs.feddrm, run, ignore=shutil.ignore_patterns("checkpoints"))
    (run / "audit.sqlite").unlink(missing_ok=True)
    at = open_review(monkeypatch, [run])
    assert "No scan has been routed with" in texts(at, "info")

    fed = TrainedFederation.load(run, "cpu")
    photo = dashboard_runs.fundus_photo()
    entry = route_one(fed, make_router("auto", fed), photo)
    AuditLog(run).append([entry])
    at = sign_in(open_review(monkeypatch, [run]), "dr.a")

    assert table(at, "queue")["file"].tolist() == [str(photo)]
    assert len(at.image) == 1 and at.image[0].captions == ["the scan"]
    assert not [m for m in at.metric if m.label == "Chosen site"]  # not before the read
    assert at.radio(key="read_1").options == [*fed.class_names(), "ungradable"]
    ok(record(at, 1, fed.class_names()[1]))
    assert [(r.reader, r.read) for r in AuditLog(run).reads(1)] == [("dr.a", fed.class_names()[1])]
    if entry.status == "routed":
        show(at, "every routed scan")
        assert [m.value for m in at.metric if m.label == "Chosen site"] == [entry.chosen_site]


def test_the_review_page_never_imports_training_code(queue_run) -> None:
    run, _ = queue_run
    script = f"""
import os, sys
os.environ[{RUNS_ENV!r}] = {str(run)!r}
from streamlit import config
from streamlit.testing.v1 import AppTest
config.set_option("server.address", "127.0.0.1")
at = AppTest.from_file({str(APP)!r}, default_timeout={TIMEOUT}).run()
at.switch_page("views/review.py").run()
assert not at.exception, [e.value for e in at.exception]
assert len(at.image) == 3, "the pictures were drawn"
print(" ".join(sorted(m for m in sys.modules if m.startswith("medfed"))))
"""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop(rundata.REVIEWER_HEADER_ENV, None)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = set(done.stdout.split())
    assert "medfed.clinic.review" in loaded
    forbidden = ("medfed.federation", "medfed.algorithms", "medfed.experiments")
    assert not [m for m in loaded if m.startswith(forbidden)]


def test_a_dicom_scan_is_pictured_in_its_own_window(tmp_path) -> None:
    import pydicom
    from pydicom.data import get_testdata_file

    from medfed.dashboard import thumbnails

    ds = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
    ds.WindowCenter, ds.WindowWidth = 40, 400  # a soft-tissue window
    path = tmp_path / "ct.dcm"
    ds.save_as(path)
    scan = read_scan(path)
    assert thumbnails.dicom_window(scan.files) == (40.0, 400.0)
    windowed = thumbnails.scan_picture(path)
    stretched = thumbnails.picture(scan.decoded)
    middle = scan.decoded.array[scan.decoded.array.shape[0] // 2]
    expected = thumbnails.picture(scan.decoded, window=(40.0, 400.0))
    assert np.array_equal(windowed, expected) and not np.array_equal(windowed, stretched)
    assert (windowed == 255).mean() == pytest.approx((middle >= 240).mean(), abs=0.05)
