"""Clinician review: the queue, reads that are never overwritten, disagreements, prospective
figures equal to the clinical-evaluation functions, time windows, the audit database's schema
version and migration, concurrent writers, and reads exchanged as CSV (``medfed review``)."""

from __future__ import annotations

import csv
import multiprocessing
import sqlite3
import threading
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from statsmodels.stats.inter_rater import cohens_kappa as sm_kappa
from typer.testing import CliRunner

from medfed.cli import app
from medfed.clinic.audit import AUDIT_SCHEMA_VERSION, AuditEntry, AuditError, AuditLog, ReadEntry
from medfed.clinic.review import (
    FIGURE_COLUMNS,
    OPERATING_RULE,
    SYSTEM,
    UNGRADABLE,
    Review,
    ReviewError,
    Window,
    cohens_kappa,
    write_figures_csv,
)
from medfed.metrics import operating_point, wilson
from medfed.runs import RunDir

runner = CliRunner()
LABELS = {"normal": 0, "glaucoma": 1}
SITES = ("acrima", "refuge")

# The routed table as medfed wrote it before reads existed (audit schema version 0).
OLD_SCHEMA = """
CREATE TABLE IF NOT EXISTS routed (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time TEXT NOT NULL,
    file TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    router TEXT NOT NULL,
    status TEXT NOT NULL,
    chosen_site TEXT,
    site_probs TEXT NOT NULL,
    prediction TEXT,
    prediction_prob REAL,
    ood_score REAL,
    reason TEXT
)
"""


def at(day: int, hour: int = 10) -> str:
    return datetime(2026, 11, day, hour, tzinfo=UTC).isoformat(timespec="seconds")


def entry(
    time: str,
    status: str = "routed",
    site: str | None = "acrima",
    probs: dict[str, float] | None = None,
    prediction: str | None = "glaucoma",
    name: str | None = None,
) -> AuditEntry:
    probs = probs or {"acrima": 0.9, "refuge": 0.1}
    digest = f"{abs(hash((time, name))) % 10**12:064d}"
    return AuditEntry(
        time, name or f"scan_{time}.jpg", digest, "density_ratio", status,
        site if status == "routed" else None, probs, prediction, 0.8, 1.0,
    )  # fmt: skip


def make_run(path: Path, entries: list[AuditEntry], labels: dict[str, int] = LABELS) -> Path:
    """A run directory with a config naming the sites and labels, and routed scans."""
    path.mkdir(parents=True, exist_ok=True)
    sites = [{"id": s, "labels": dict(labels)} for s in SITES]
    RunDir(path).write_config({"train": {"rounds": 1}, "sites": sites})
    if entries:
        AuditLog(path).append(entries)
    return path


# ---------------------------------------------------------------------------- the queue
def test_queue_puts_abstained_then_low_margin_scans_first_then_oldest(tmp_path) -> None:
    run = make_run(
        tmp_path / "run",
        [
            entry(at(3)),  # 1: routine, newest
            entry(at(1)),  # 2: routine, oldest
            entry(at(4), probs={"acrima": 0.55, "refuge": 0.45}),  # 3: low margin
            entry(at(5), status="abstained", probs={"acrima": 0.5, "refuge": 0.5}),  # 4
            entry(at(2), status="error", site=None, prediction=None),  # 5: no answer, no review
            entry(at(2), probs={"acrima": 0.3, "refuge": 0.7}),  # 6: routine (margin 0.4)
        ],
    )
    queue = Review(run).queue()
    assert [i.scan_id for i in queue] == [4, 3, 2, 6, 1]
    assert [i.priority for i in queue] == ["abstained", "low margin", *["routine"] * 3]
    first = queue[1]
    assert first.margin == pytest.approx(0.1)
    assert (first.time, first.prediction, first.prediction_prob) == (at(4), "glaucoma", 0.8)
    assert first.site_probs == {"acrima": 0.55, "refuge": 0.45} and len(first.sha256) == 64


def test_queue_leaves_out_read_scans_but_not_for_a_second_reader(tmp_path) -> None:
    run = make_run(tmp_path / "run", [entry(at(1)), entry(at(2))])
    review = Review(run)
    review.record(1, "Dr Ames", "glaucoma", time=at(6))
    assert [i.scan_id for i in review.queue()] == [2]
    assert [i.scan_id for i in review.queue(reader="Dr Ames")] == [2]
    assert [i.scan_id for i in review.queue(reader="Dr Baker")] == [1, 2]
    assert [len(i.reads) for i in review.queue(include_read=True)] == [1, 0]


# ---------------------------------------------------------------------------- reads
def test_a_second_read_is_a_new_row_and_reads_are_never_changed(tmp_path) -> None:
    run = make_run(tmp_path / "run", [entry(at(1))])
    review = Review(run)
    first = review.record(1, " Dr Ames ", "GLAUCOMA", "cup enlarged", time=at(2))
    second = review.record(1, "Dr Ames", "normal", time=at(3))
    reads = Review(run).reads(1)  # a new instance: what the database holds
    assert [(r.reader, r.read, r.note, r.time) for r in reads] == [
        ("Dr Ames", "glaucoma", "cup enlarged", at(2)),
        ("Dr Ames", "normal", None, at(3)),
    ]
    assert [r.id for r in reads] == [first.id, second.id] and first.id != second.id
    with sqlite3.connect(run / "audit.sqlite") as db, pytest.raises(sqlite3.DatabaseError):
        db.execute("UPDATE reads SET read = 'normal' WHERE id = ?", (first.id,))
    with sqlite3.connect(run / "audit.sqlite") as db, pytest.raises(sqlite3.DatabaseError):
        db.execute("DELETE FROM reads")
    assert len(Review(run).reads()) == 2


@pytest.mark.parametrize(
    ("scan", "reader", "read", "time", "words"),
    [
        (9, "Dr Ames", "normal", None, "no routed scan has id 9"),
        (1, "  ", "normal", None, "reader's name is empty"),
        (1, "Dr Ames", "cataract", None, "normal, glaucoma, ungradable"),
        (1, "Dr Ames", "normal", "yesterday", "ISO 8601"),
        (1, "Dr Ames", "normal", "2026-10-01", "before scan 1 was routed"),
        (1, "Dr Ames", "normal", "2999-01-01", "in the future"),
    ],
)
def test_a_bad_read_is_refused_and_nothing_written(tmp_path, scan, reader, read, time, words):
    run = make_run(tmp_path / "run", [entry(at(1))])
    with pytest.raises(ReviewError, match=words):
        Review(run).record(scan, reader, read, time=time)
    assert Review(run).reads() == []


def test_disagreements_name_each_readers_latest_read(tmp_path) -> None:
    run = make_run(tmp_path / "run", [entry(at(1)), entry(at(1)), entry(at(1))])
    review = Review(run)
    review.record(1, "Dr Ames", "normal", time=at(2))
    review.record(1, "Dr Baker", "glaucoma", time=at(3))
    review.record(2, "Dr Ames", "normal", time=at(2))
    review.record(2, "Dr Baker", "glaucoma", time=at(3))
    review.record(2, "Dr Ames", "glaucoma", time=at(4))  # changes her mind: now they agree
    review.record(3, "Dr Ames", "normal", time=at(2))
    (only,) = review.disagreements()
    assert only.scan_id == 1 and only.reads == {"Dr Ames": "normal", "Dr Baker": "glaucoma"}


# ---------------------------------------------------------------------------- figures
def _scenario(tmp_path: Path) -> tuple[Path, dict]:
    """24 routed scans over two sites with known reads, 2 abstained, 1 ungradable."""
    rng = np.random.default_rng(3)
    truth = rng.integers(0, 2, 24)
    called = np.where(rng.random(24) < 0.75, truth, 1 - truth)
    names = ("normal", "glaucoma")
    entries = [
        entry(at(1, h % 24), site=SITES[h % 2], prediction=names[called[h]]) for h in range(24)
    ]
    entries += [entry(at(1, 5), status="abstained", prediction="normal")] * 2
    run = make_run(tmp_path / "run", entries)
    review = Review(run)
    second = []
    for i in range(24):
        review.record(i + 1, "Dr Ames", names[truth[i]], time=at(2))
        if i % 3 == 0:  # a second reader on every third scan, disagreeing on some
            other = names[truth[i]] if i % 2 == 0 else names[1 - truth[i]]
            review.record(i + 1, "Dr Baker", other, time=at(3))
            second.append((names[truth[i]], other))
    review.record(25, "Dr Ames", UNGRADABLE, time=at(2))
    return run, {"truth": truth, "called": called, "second": second}


def test_figures_equal_the_clinical_evaluation_functions_on_the_same_labels(tmp_path) -> None:
    run, known = _scenario(tmp_path)
    truth, called = known["truth"], known["called"]
    result = Review(run).figures()
    system = result.scope(SYSTEM)
    expected = operating_point(truth, called.astype(float), 0.5, OPERATING_RULE)
    assert system.operating == expected
    assert system.agreement == wilson(int((truth == called).sum()), 24)
    assert system.ungradable == wilson(1, 25)  # scan 25 (abstained) read as ungradable
    assert system.abstain == wilson(2, 26)
    first, second = zip(*known["second"], strict=True)
    cats = ["normal", "glaucoma", UNGRADABLE]
    table = np.zeros((3, 3))
    for a, b in known["second"]:
        table[cats.index(a), cats.index(b)] += 1
    kappa = sm_kappa(table)
    assert system.kappa.n == len(first) == 8
    assert system.kappa.value == pytest.approx(kappa.kappa)
    assert system.kappa.interval.low == pytest.approx(max(-1, kappa.kappa_low))
    for k, site in enumerate(SITES):
        mine = np.arange(24) % 2 == k
        op = operating_point(truth[mine], called[mine].astype(float), 0.5, OPERATING_RULE)
        assert result.scope(site).operating == op
        assert result.scope(site).abstain is None
    rows = result.rows()
    assert {r["figure"] for r in rows} == {
        "sensitivity", "specificity", "agreement", "kappa", "ungradable_rate", "abstain_rate"
    }  # fmt: skip
    sens = next(r for r in rows if r["scope"] == SYSTEM and r["figure"] == "sensitivity")
    assert (sens["k"], sens["n"]) == (expected.tp, expected.tp + expected.fn)
    assert sens["ci_low"] == expected.sensitivity.interval.low


def test_the_reference_read_is_the_first_gradable_one(tmp_path) -> None:
    run = make_run(tmp_path / "run", [entry(at(1), prediction="glaucoma")])
    review = Review(run)
    review.record(1, "Dr Ames", UNGRADABLE, time=at(2))
    review.record(1, "Dr Baker", "glaucoma", time=at(3))
    review.record(1, "Dr Cole", "normal", time=at(4))
    system = review.figures().scope(SYSTEM)
    assert system.operating.tp == 1 and system.operating.fn == 0
    assert system.ungradable == wilson(0, 1)


G, N = "glaucoma", "normal"


@pytest.mark.filterwarnings("ignore:invalid value encountered in sqrt:RuntimeWarning")
@pytest.mark.parametrize(
    ("pairs", "value", "words"),
    [
        ([(G, G), (G, N)], 0.0, "every scan's first read was 'glaucoma'"),
        ([(N, G), (G, G), (G, G)], 0.0, "every scan's second read was 'glaucoma'"),
        ([(G, G), (N, N), (G, G)], 1.0, "the readers agreed on every scan"),
        ([(G, N), (N, G)], -1.0, "the readers disagreed on every scan"),
    ],
)
def test_kappa_without_a_standard_error_says_why(pairs, value, words) -> None:
    first, second = (list(r) for r in zip(*pairs, strict=True))
    table = np.zeros((2, 2))
    for a, b in pairs:
        table[[G, N].index(a), [G, N].index(b)] += 1
    assert not sm_kappa(table).std_kappa > 1e-7  # 0 up to round-off (NaN when just below)
    kappa = cohens_kappa(first, second, [N, G])
    assert kappa.value == pytest.approx(value) and kappa.interval is None
    assert kappa.reason.startswith(f"no standard error on {len(pairs)} scan(s) (")
    assert words in kappa.reason and kappa.reason.endswith(": no CI")
    assert ("readers agreed" in kappa.reason) == all(a == b for a, b in pairs)


def test_kappa_with_disagreements_and_a_spread_has_an_interval() -> None:
    first, second = [G, G, N], [N, N, G]  # disagree on every scan, yet a spread: a CI
    kappa = cohens_kappa(first, second, [N, G])
    expected = sm_kappa(np.array([[0.0, 1.0], [2.0, 0.0]]))
    assert expected.std_kappa > 0.1 and kappa.reason is None
    assert kappa.value == pytest.approx(expected.kappa)
    assert kappa.interval.low == pytest.approx(max(-1.0, expected.kappa_low))


def test_a_window_by_read_time_or_routing_time_keeps_the_right_reads(tmp_path) -> None:
    run = make_run(tmp_path / "run", [entry(at(1)), entry(at(5)), entry(at(5), "abstained")])
    review = Review(run)
    review.record(1, "Dr Ames", "glaucoma", time=at(6))  # routed day 1, read day 6
    review.record(2, "Dr Ames", "normal", time=at(7))  # routed day 5, read day 7
    by_read = review.figures(Window(at(6), at(7), "read"))
    assert (by_read.n_reads, by_read.scope(SYSTEM).operating.tp) == (1, 1)
    assert by_read.scope(SYSTEM).abstain == wilson(0, 0)  # none was routed from day 6 to 7
    wider = review.figures(Window(at(5), at(8), "read"))
    assert wider.n_reads == 2 and wider.scope(SYSTEM).abstain == wilson(1, 2)  # routing time
    by_routing = review.figures(Window(at(4), None, "routed"))
    assert by_routing.n_reads == 1 and by_routing.scope(SYSTEM).operating.fp == 1
    assert by_routing.scope(SYSTEM).abstain == wilson(1, 2)
    assert review.figures().n_reads == 2
    with pytest.raises(ReviewError, match="not before its end"):
        Window(at(7), at(6))


def test_more_than_two_classes_give_agreement_but_no_sensitivity(tmp_path) -> None:
    labels = {"none": 0, "mild": 1, "severe": 2}
    run = make_run(tmp_path / "run", [entry(at(1), prediction="mild")], labels)
    review = Review(run)
    review.record(1, "Dr Ames", "Mild", time=at(2))
    system = review.figures().scope(SYSTEM)
    assert system.operating is None and system.agreement == wilson(1, 1)
    assert review.labels.choices() == ["none", "mild", "severe", UNGRADABLE]


# ---------------------------------------------------------------------------- the database
def _old_log(run: Path) -> None:
    with sqlite3.connect(run / "audit.sqlite") as db:
        db.execute(OLD_SCHEMA)
        db.execute(
            "INSERT INTO routed (time, file, sha256, router, status, chosen_site, site_probs,"
            " prediction, prediction_prob, ood_score) VALUES (?, 'old.jpg', ?, 'density_ratio',"
            " 'routed', 'acrima', '{\"acrima\": 0.9, \"refuge\": 0.1}', 'glaucoma', 0.8, 1.0)",
            (at(1), "a" * 64),
        )
    db.close()


def test_an_old_audit_log_gains_the_review_tables_and_keeps_its_scans(tmp_path) -> None:
    run = make_run(tmp_path / "run", [])
    _old_log(run)
    with sqlite3.connect(run / "audit.sqlite") as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 0
    db.close()
    assert AuditLog(run).read()[0].file == "old.jpg"  # the routing page's read still works
    assert AuditLog(run).version() == AUDIT_SCHEMA_VERSION
    Review(run).record(1, "Dr Ames", "glaucoma", time=at(2))
    AuditLog(run).append([entry(at(3))])  # routing still appends
    with sqlite3.connect(run / "audit.sqlite") as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"routed", "reads"} <= tables
        # each decision names its model from version 3 on; the old row has none recorded
        assert db.execute("SELECT model FROM routed ORDER BY id").fetchall()[0] == (None,)
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()
    again = Review(run)  # reopened: the reads survive
    assert [(r.routed_id, r.read) for r in again.reads()] == [(1, "glaucoma")]
    assert [i.scan_id for i in again.queue()] == [2]


V1_READS = """
CREATE TABLE reads (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    routed_id INTEGER NOT NULL REFERENCES routed(id),
    reader TEXT NOT NULL, read TEXT NOT NULL, note TEXT,
    time TEXT NOT NULL, recorded TEXT NOT NULL, source TEXT NOT NULL
)
"""


def test_a_version_1_log_gains_amendments_and_blinding_and_keeps_its_reads(tmp_path) -> None:
    run = make_run(tmp_path / "run", [])
    _old_log(run)
    with sqlite3.connect(run / "audit.sqlite") as db:
        db.execute(V1_READS)
        db.execute(
            "INSERT INTO reads (routed_id, reader, read, time, recorded, source)"
            " VALUES (1, 'Dr Ames', 'normal', ?, ?, 'dashboard')",
            (at(2), at(2)),
        )
        db.execute("PRAGMA user_version = 1")
    db.close()
    (old,) = Review(run).reads()
    assert (old.read, old.amends, old.blinded) == ("normal", None, None)  # unknown then
    assert AuditLog(run).version() == AUDIT_SCHEMA_VERSION == 3
    amended = Review(run).record(1, "Dr Ames", "glaucoma", time=at(3))
    assert (amended.amends, amended.blinded) == (old.id, True)
    assert Review(run).figures().scope(SYSTEM).operating.tp == 1


def test_an_audit_log_from_a_newer_medfed_is_refused(tmp_path) -> None:
    run = make_run(tmp_path / "run", [entry(at(1))])
    with sqlite3.connect(run / "audit.sqlite") as db:
        db.execute(f"PRAGMA user_version = {AUDIT_SCHEMA_VERSION + 1}")
    db.close()
    for action in (AuditLog(run).read, Review(run).queue, lambda: AuditLog(run).check()):
        with pytest.raises(AuditError, match="newer medfed") as info:
            action()
        assert str(run / "audit.sqlite") in str(info.value) and "upgrade medfed" in str(info.value)


def test_a_read_only_old_log_is_still_read_and_a_read_refused_with_the_reason(
    tmp_path, monkeypatch
) -> None:
    # Root writes read-only files, so the log is opened read-only the way SQLite does it for a
    # file without write permission.
    run = make_run(tmp_path / "run", [])
    _old_log(run)
    read_only = f"file:{run / 'audit.sqlite'}?mode=ro"
    monkeypatch.setattr(AuditLog, "_open", lambda self: sqlite3.connect(read_only, uri=True))
    assert [e.file for e in AuditLog(run).read()] == ["old.jpg"]
    assert [i.scan_id for i in Review(run).queue()] == [1] and Review(run).reads() == []
    with pytest.raises(AuditError, match="reads cannot be recorded") as info:
        Review(run).record(1, "Dr Ames", "normal")
    assert "read-only" in str(info.value) and "writable" in str(info.value)


def test_a_log_whose_time_is_not_a_time_is_named_as_damaged(tmp_path) -> None:
    run = make_run(tmp_path / "run", [entry(at(1)), entry("yesterday")])
    with pytest.raises(ReviewError, match="scan 2 was logged with the time 'yesterday'") as info:
        Review(run).queue()
    assert str(run / "audit.sqlite") in str(info.value)


def test_a_read_that_is_no_answer_of_the_run_is_named_not_counted(tmp_path) -> None:
    run = make_run(tmp_path / "run", [entry(at(1))])
    AuditLog(run).add_reads([ReadEntry(1, "Dr Ames", "cataract", None, at(2), at(2), "test")])
    with pytest.raises(ReviewError, match="read 1 \\(scan 1, Dr Ames\\) says 'cataract'"):
        Review(run).figures()


def test_a_log_held_by_another_process_is_named_with_what_to_do(tmp_path, monkeypatch) -> None:
    run = make_run(tmp_path / "run", [entry(at(1))])
    monkeypatch.setattr("medfed.clinic.audit._TIMEOUT", 0.1)
    holder = sqlite3.connect(run / "audit.sqlite")
    holder.execute("BEGIN EXCLUSIVE")  # another writer, mid-transaction
    try:
        with pytest.raises(AuditError, match="another process kept the log locked") as info:
            Review(run).record(1, "Dr Ames", "normal")
    finally:
        holder.rollback()
        holder.close()
    assert str(run / "audit.sqlite") in str(info.value) and "try again" in str(info.value)
    assert Review(run).record(1, "Dr Ames", "normal").id == 1  # released: the read goes in


N_READS = 40


def _write_reads(run: str, reader: str, start=None) -> None:
    """``N_READS`` reads by ``reader``, each in a transaction of its own, on its own connection."""
    if start is not None:
        start.wait()
    for i in range(N_READS):
        read = ReadEntry(1, reader, "normal", f"read {i}", at(2), at(2), "test")
        AuditLog(run).add_reads([read])


def test_two_threads_writing_reads_at_once_lose_none(tmp_path) -> None:
    run = make_run(tmp_path / "run", [entry(at(1))])
    start = threading.Barrier(2)
    threads = [
        threading.Thread(target=_write_reads, args=(str(run), who, start)) for who in ("A", "B")
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    reads = Review(run).reads()
    assert len(reads) == 2 * N_READS
    assert {(r.reader, r.note) for r in reads} == {
        (who, f"read {i}") for who in ("A", "B") for i in range(N_READS)
    }


def test_two_processes_writing_reads_at_once_lose_none(tmp_path) -> None:
    run = make_run(tmp_path / "run", [])
    _old_log(run)  # both writers also race to migrate it
    # fork: the writers start at once, without re-importing the test session's modules
    context = multiprocessing.get_context("fork")
    start = context.Barrier(2)
    workers = [context.Process(target=_write_reads, args=(str(run), w, start)) for w in ("A", "B")]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert [w.exitcode for w in workers] == [0, 0]
    reads = AuditLog(run).reads()
    assert len(reads) == 2 * N_READS
    assert sorted(r.reader for r in reads) == ["A"] * N_READS + ["B"] * N_READS


# ---------------------------------------------------------------------------- CSV
def test_export_then_import_round_trips_every_read(tmp_path) -> None:
    entries = [entry(at(1)), entry(at(2)), entry(at(3), "abstained")]
    source = make_run(tmp_path / "a", entries)
    review = Review(source)
    review.record(1, "Dr Ames", "glaucoma", 'cup, rim; "notched"', time=at(4))
    review.record(1, "Dr Baker", "normal", time=at(5))
    sheet = tmp_path / "reads.csv"
    assert review.export_reads(sheet) == 4  # two reads, then the two unread scans
    rows = list(csv.DictReader(sheet.open(encoding="utf-8")))
    assert [r["scan_id"] for r in rows] == ["1", "1", "3", "2"]  # unread: queue order
    assert [r["read_id"] for r in rows] == ["1", "2", "", ""]
    for row in rows:  # read ids name reads of the run exported from, not of another run
        row["read_id"] = ""
    with sheet.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    target = make_run(tmp_path / "b", entries)
    done = Review(target).import_reads(sheet)
    assert (done.new, done.unchanged, done.amended, done.blank, done.refused) == (2, 0, 0, 2, ())

    def key(r: ReadEntry) -> tuple:
        return (r.routed_id, r.reader, r.read, r.note, r.time)

    assert [key(r) for r in Review(target).reads()] == [key(r) for r in review.reads()]
    assert {r.source for r in Review(target).reads()} == {"import"}
    again = Review(target).import_reads(sheet)  # the same file twice adds nothing
    assert (again.new, again.unchanged, again.amended, again.blank) == (0, 2, 0, 2)


def test_importing_a_filled_in_worksheet_twice_adds_nothing(tmp_path) -> None:
    # the normal path: the exported worksheet, filled in without a time (read "now")
    run = make_run(tmp_path / "run", [entry(at(1)), entry(at(2)), entry(at(3))])
    sheet = tmp_path / "reads.csv"
    Review(run).export_reads(sheet)
    rows = list(csv.DictReader(sheet.open(encoding="utf-8")))
    for row in rows:
        row |= {"reader": "Dr Ames", "read": "normal"}
    with sheet.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    first = Review(run).import_reads(sheet)
    before = Review(run).reads()
    second = Review(run).import_reads(sheet)
    assert (first.new, first.unchanged) == (3, 0)
    assert (second.new, second.unchanged, second.amended, second.refused) == (0, 3, 0, ())
    assert Review(run).reads() == before and len(before) == 3
    assert second.describe() == "0 new, 3 unchanged, 0 amended, 0 refused"


def test_a_changed_read_is_an_amendment_kept_with_its_history(tmp_path) -> None:
    run = make_run(tmp_path / "run", [entry(at(1)), entry(at(2))])
    review = Review(run)
    review.record(1, "Dr Ames", "normal", time=at(3))
    review.record(2, "Dr Ames", "normal", time=at(3))
    sheet = tmp_path / "reads.csv"
    review.export_reads(sheet)
    rows = list(csv.DictReader(sheet.open(encoding="utf-8")))
    rows[0] |= {"read": "glaucoma", "note": "rim notched on second look", "time": at(4)}
    with sheet.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    done = Review(run).import_reads(sheet)
    assert (done.new, done.unchanged, done.amended) == (0, 1, 1)
    history = Review(run).reads(1)
    assert [(r.read, r.amends) for r in history] == [("normal", None), ("glaucoma", history[0].id)]
    assert Review(run).figures().scope(SYSTEM).operating.tp == 1  # the amended read counts
    again = Review(run).import_reads(sheet)
    assert (again.new, again.unchanged, again.amended) == (0, 2, 0)
    assert len(Review(run).reads()) == 3


def test_an_old_worksheet_does_not_undo_a_later_amendment(tmp_path) -> None:
    run = make_run(tmp_path / "run", [entry(at(1))])
    review = Review(run)
    review.record(1, "Dr Ames", "normal", time=at(3))
    sheet = tmp_path / "reads.csv"
    review.export_reads(sheet)
    review.record(1, "Dr Ames", "glaucoma", time=at(4))  # amended on the dashboard since
    done = Review(run).import_reads(sheet)
    assert (done.unchanged, done.amended) == (1, 0)
    assert [r.read for r in Review(run).reads()] == ["normal", "glaucoma"]


def test_the_worksheet_is_blinded_and_holds_no_formula(tmp_path) -> None:
    run = make_run(tmp_path / "run", [entry(at(1), name="=HYPERLINK(1).jpg"), entry(at(2))])
    review = Review(run)
    review.record(1, "=cmd|' /C calc'!A0", "normal", "-2 cup", time=at(3))
    review.record(1, "+Dr Baker", "glaucoma", "@SUM(A1)", time=at(4))
    sheet = tmp_path / "reads.csv"
    review.export_reads(sheet)
    rows = list(csv.reader(sheet.open(encoding="utf-8")))
    assert "prediction" not in rows[0] and "prediction_prob" not in rows[0]
    assert "glaucoma" not in [c for row in rows for c in row[:6]]  # no model answer
    assert not any(c.startswith(("=", "+", "-", "@")) for row in rows for c in row)
    assert Review(run).import_reads(sheet).unchanged == 2  # the ids it wrote read back
    unblinded = tmp_path / "answers.csv"
    review.export_reads(unblinded, unblinded=True)
    header = next(csv.reader(unblinded.open(encoding="utf-8")))
    assert {"prediction", "prediction_prob"} <= set(header)


def test_reads_are_blinded_until_the_answer_is_revealed_and_figures_say_so(tmp_path) -> None:
    run = make_run(tmp_path / "run", [entry(at(1)), entry(at(2))])
    review = Review(run)
    assert review.record(1, "Dr Ames", "glaucoma", time=at(3)).blinded is True
    review.reveal(1, "Dr Ames")
    review.reveal(2, "Dr Ames")
    assert review.revealed(2, "Dr Ames") and not review.revealed(2, "Dr Baker")
    assert review.record(2, "Dr Ames", "normal", time=at(3)).blinded is False
    figures = review.figures()
    assert (figures.n_blinded, figures.n_reads) == (1, 2)
    assert figures.blinding().startswith("1 of 2 read(s) blinded")
    assert {r["reads_blinded"] for r in figures.rows() if r["scope"] == SYSTEM} == {"1 of 2"}


def test_kappa_from_too_few_double_reads_is_not_a_number(tmp_path) -> None:
    run = make_run(tmp_path / "run", [entry(at(1))])
    review = Review(run)
    review.record(1, "Dr Ames", "glaucoma", time=at(2))
    review.record(1, "Dr Baker", "glaucoma", time=at(3))
    kappa = review.figures().scope(SYSTEM).kappa
    assert kappa.value is None and kappa.n == 1
    assert kappa.reason.startswith("too few double reads (n=1)")


def test_a_filled_in_worksheet_adds_reads_with_or_without_a_time(tmp_path) -> None:
    run = make_run(tmp_path / "run", [entry(at(1)), entry(at(2))])
    sheet = tmp_path / "reads.csv"
    sheet.write_text(
        "scan_id,reader,read,note\n1,Dr Ames,Glaucoma,\n2,Dr Ames,ungradable,blurred\n",
        encoding="utf-8",
    )
    assert Review(run).import_reads(sheet).added == 2
    reads = Review(run).reads()
    assert [(r.read, r.note) for r in reads] == [("glaucoma", None), (UNGRADABLE, "blurred")]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("scan_id,read\n1,normal\n", "line 1: missing column(s) reader"),
        ("scan_id,reader,read,Notes\n1,A,normal,x\n", "unknown column(s) 'Notes'"),
        ("scan_id,reader,read\n1,A,normal,extra\n", "line 2: more cells than the header"),
        ("", "empty file"),
    ],
)
def test_a_file_that_is_no_reads_csv_is_refused_whole(tmp_path, text, words) -> None:
    run = make_run(tmp_path / "run", [entry(at(1)), entry(at(2))])
    sheet = tmp_path / "reads.csv"
    sheet.write_text(text, encoding="utf-8")
    with pytest.raises(ReviewError) as info:
        Review(run).import_reads(sheet)
    assert words in str(info.value) and str(sheet) in str(info.value)
    assert "nothing was imported" in str(info.value) or "empty" in str(info.value)
    assert Review(run).reads() == []


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("scan_id,reader,read\n1,A,normal\n7,A,normal\n", 3, "unknown scan_id 7"),
        ("scan_id,reader,read\n1,A,normal\n2,A,cataract\n", 3, "read 'cataract'"),
        ("scan_id,reader,read\n1,A,normal\n1,A,glaucoma\n", 3, "than on line 2"),
        ("scan_id,reader,read\n1,A,normal\n2,,normal\n", 3, "the reader's name is empty"),
        ("scan_id,reader,read,time\n1,A,normal,\n2,A,normal,noon\n", 3, "read time 'noon'"),
        ("scan_id,reader,read\n1,A,normal\nfirst,A,normal\n", 3, "scan_id 'first' is not a"),
        ("scan_id,reader,read,sha256\n1,A,normal,\n2,A,normal,abc\n", 3, "scan 2's sha256"),
        ("scan_id,read_id,reader,read\n1,,A,normal\n2,9,A,normal\n", 3, "read_id '9' is no"),
    ],
)
def test_a_bad_line_is_refused_with_its_number_and_the_others_imported(
    tmp_path, text, line, words
) -> None:
    run = make_run(tmp_path / "run", [entry(at(1)), entry(at(2))])
    sheet = tmp_path / "reads.csv"
    sheet.write_text(text, encoding="utf-8")
    done = Review(run).import_reads(sheet)
    ((number, why),) = done.refused
    assert number == line and words in why and f"{sheet}, line {line}" in why
    assert done.new == 1 and [(r.routed_id, r.read) for r in Review(run).reads()] == [(1, "normal")]
    assert done.describe().endswith(f"1 refused (line {line})")


def test_figures_csv_has_a_row_per_scope_and_figure(tmp_path) -> None:
    run, _ = _scenario(tmp_path)
    result = Review(run).figures()
    out = tmp_path / "figures.csv"
    assert write_figures_csv(result, out) == 3 * 6
    rows = list(csv.DictReader(out.open(encoding="utf-8")))
    assert list(rows[0]) == list(FIGURE_COLUMNS)
    agreement = next(r for r in rows if (r["scope"], r["figure"]) == (SYSTEM, "agreement"))
    assert int(agreement["n"]) == result.scope(SYSTEM).agreement.n


# ---------------------------------------------------------------------------- the CLI
def test_medfed_review_prints_the_figures_and_the_disagreements(tmp_path) -> None:
    run, _ = _scenario(tmp_path)
    out = tmp_path / "figures.csv"
    result = runner.invoke(app, ["review", str(run), "--figures", str(out)])
    assert result.exit_code == 0, result.output
    assert "33 read(s) of 25 scan(s)" in result.output
    assert "; classes: normal, glaucoma (positive class: glaucoma)\n" in result.output
    assert "kappa between readers" in result.output
    assert "readers disagree on scan 4" in result.output  # i = 3: odd, disagrees
    assert "reads: all 33 read(s) blinded to the model's answer" in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("| ")]
    assert [line.split("|")[1].strip() for line in lines[2:]] == [*SITES, SYSTEM]
    assert out.is_file()


def test_medfed_review_exports_and_imports_reads(tmp_path) -> None:
    run = make_run(tmp_path / "run", [entry(at(1)), entry(at(2))])
    sheet = tmp_path / "out" / "reads.csv"
    exported = runner.invoke(app, ["review", str(run), "--export", str(sheet)])
    assert exported.exit_code == 0, exported.output
    rows = list(csv.DictReader(sheet.open(encoding="utf-8")))
    for row in rows:
        row |= {"reader": "Dr Ames", "read": "normal", "time": at(3)}
    with sheet.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    imported = runner.invoke(app, ["review", str(run), "--import", str(sheet)])
    assert imported.exit_code == 0, imported.output
    assert "2 new, 0 unchanged, 0 amended, 0 refused" in imported.output
    assert "2 read(s) of 2 scan(s)" in imported.output
    again = runner.invoke(app, ["review", str(run), "--import", str(sheet)])
    assert again.exit_code == 0 and "0 new, 2 unchanged, 0 amended, 0 refused" in again.output
    assert "2 read(s) of 2 scan(s)" in again.output
    windowed = runner.invoke(app, ["review", str(run), "--since", at(4)])
    assert windowed.exit_code == 0 and "0 read(s) of 0 scan(s)" in windowed.output


def test_medfed_review_refuses_a_bad_window_and_both_directions(tmp_path) -> None:
    run = make_run(tmp_path / "run", [entry(at(1))])
    both = runner.invoke(app, ["review", str(run), "--export", "a.csv", "--import", "b.csv"])
    assert both.exit_code == 2 and "not both" in both.output
    bad = runner.invoke(app, ["review", str(run), "--by", "scan"])
    assert bad.exit_code == 2 and "'read' or 'routed'" in bad.output


def test_medfed_review_of_a_run_nothing_was_routed_with_says_how_to_route(tmp_path) -> None:
    run = make_run(tmp_path / "run", [])
    result = runner.invoke(app, ["review", str(run)])
    assert result.exit_code == 0 and "no scan has been routed" in result.output
    assert "medfed route" in result.output and not (run / "audit.sqlite").exists()


def test_medfed_review_prints_the_queue_and_refuses_bad_lines_by_number(tmp_path) -> None:
    run = make_run(tmp_path / "run", [entry(at(1)), entry(at(2), status="abstained")])
    listed = runner.invoke(app, ["review", str(run)])
    assert listed.exit_code == 0, listed.output
    assert "queue: 2 scan(s) not read by anyone: 1 abstained" in listed.output
    assert listed.output.index("scan 2 [abstained]") < listed.output.index("scan 1 [routine]")
    sheet = tmp_path / "reads.csv"
    sheet.write_text("scan_id,reader,read\n1,A,normal\n2,A,cataract\n", encoding="utf-8")
    result = runner.invoke(app, ["review", str(run), "--import", str(sheet)])
    assert result.exit_code == 2
    assert "1 new, 0 unchanged, 0 amended, 1 refused (line 3)" in result.output
    assert "line 3: read 'cataract'" in result.output and "1 line(s) refused" in result.output
    assert "queue: 1 scan(s) not read by anyone" in result.output
