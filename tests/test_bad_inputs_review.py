"""The bad-input corpus, ``medfed review`` cases (see tests/badinput.py for the policy).

Every row works on a private copy of the shared run whose audit log holds three routed scans
(ids 1-3, written as ``medfed route`` writes them). A file that is no reads CSV is refused as a
whole, naming the file and what to do, and nothing is written; a bad line of a reads file is
refused by its line number, saying why, and the good lines are still imported (importing the
corrected file again adds only what changed).
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from medfed.cli import app
from medfed.clinic.audit import AUDIT_SCHEMA_VERSION, AuditEntry, AuditLog
from medfed.clinic.review import Review, run_labels
from tests.badinput import Case, Shared, check

ROUTED = datetime(2026, 11, 1, 10, tzinfo=UTC).isoformat(timespec="seconds")
HEADER = "scan_id,reader,read,note,time\n"
GOOD = "1,Dr Ames,normal,,2026-11-02T09:00:00+00:00\n"


def _run(tmp: Path, s: Shared) -> Path:
    """A copy of the shared run with three routed scans in its audit log."""
    run = s.copy_run(tmp)
    (run / "audit.sqlite").unlink(missing_ok=True)
    classes = run_labels(run).classes
    sites = ["acrima", "refuge", "rimone"]
    probs = {site: 1 / 3 for site in sites}

    def scan(i: int) -> AuditEntry:
        name, digest, site = f"scan_{i}.jpg", f"{i:064d}", sites[i % 3]
        return AuditEntry(
            ROUTED, name, digest, "density_ratio", "routed", site, probs, classes[i % 2], 0.8, 1.0
        )

    AuditLog(run).append([scan(i) for i in range(3)])
    return run


def _import(rows: str, header: str = HEADER, encoding: str = "utf-8", read: bool = False):
    """``review --import`` of a reads file holding ``header`` then ``rows``; ``read``: Dr Ames
    has read scan 1 (read 1) first."""

    def make(tmp: Path, s: Shared) -> list:
        run = _run(tmp, s)
        if read:
            Review(run).record(1, "Dr Ames", "normal", time="2026-11-02T09:00:00+00:00")
        sheet = tmp / "reads.csv"
        sheet.write_bytes((header + rows).encode(encoding, "replace"))
        return ["review", run, "--import", sheet]

    return make


def _review(*extra: str, log: str | None = None):
    """``review RUN`` with ``extra`` options; ``log`` damages the audit log first."""

    def make(tmp: Path, s: Shared) -> list:
        run = _run(tmp, s)
        if log == "newer":
            with sqlite3.connect(run / "audit.sqlite") as db:
                db.execute(f"PRAGMA user_version = {AUDIT_SCHEMA_VERSION + 1}")
            db.close()
        elif log == "garbage":
            (run / "audit.sqlite").write_bytes(b"not a database at all\n" * 50)
            for extra_file in ("audit.sqlite-wal", "audit.sqlite-shm"):
                (run / extra_file).unlink(missing_ok=True)
        return ["review", run, *(str(e).replace("TMP", str(tmp)) for e in extra)]

    return make


def _import_path(kind: str):
    def make(tmp: Path, s: Shared) -> list:
        run = _run(tmp, s)
        target = tmp / "reads.csv"
        if kind == "folder":
            target.mkdir()
        return ["review", run, "--import", target]

    return make


def _not_a_run(tmp: Path, s: Shared) -> list:
    return ["review", tmp / "no_such_run"]


IMPORT_FIX = ("reads.csv", "nothing was imported")
LINE_FIX = ("reads.csv", "refused", "correct the line and import the file again")

# fmt: off
IMPORT_CASES = [
    Case("a reads file naming a scan id the log does not hold",
         _import(GOOD + "9,Dr Ames,normal,,\n"), 2,
         (*LINE_FIX, "line 3", "unknown scan_id 9", "exported from this run")),
    Case("a reads file with a read that is not a class of the run",
         _import(GOOD + "2,Dr Ames,cataract,,\n"), 2,
         (*LINE_FIX, "line 3", "'cataract'", "ungradable")),
    Case("a reads file with the same scan and reader twice",
         _import(GOOD + "1,Dr Ames,glaucoma,,\n"), 2,
         (*LINE_FIX, "line 3", "than on line 2", "one line per scan and reader")),
    Case("a reads file whose read_id names no read of the log",
         _import("1,7,Dr Ames,normal\n", header="scan_id,read_id,reader,read\n"), 2,
         (*LINE_FIX, "line 2", "read_id '7' is no read of", "leave read_id empty")),
    Case("a reads file whose read_id is another reader's read",
         _import("1,1,Dr Baker,normal\n", header="scan_id,read_id,reader,read\n", read=True),
         2, (*LINE_FIX, "line 2", "read_id 1 is Dr Ames's read of scan 1", "as exported")),
    Case("a reads file without a reader column",
         _import("1,normal\n", header="scan_id,read\n"), 2,
         (*IMPORT_FIX, "line 1", "missing column(s) reader")),
    Case("a reads file with a misspelt column",
         _import("1,Dr Ames,normal,x\n", header="scan_id,reader,read,notes\n"), 2,
         (*IMPORT_FIX, "unknown column(s) 'notes'", "accepted columns")),
    Case("a reads file with an empty reader",
         _import(GOOD + "2,,normal,,\n"), 2, (*LINE_FIX, "line 3", "reader's name is empty")),
    Case("a reads file with a time that is not a time",
         _import(GOOD + "2,Dr Ames,normal,,last tuesday\n"), 2,
         (*LINE_FIX, "line 3", "'last tuesday' is not a time", "ISO 8601")),
    Case("a reads file with a read made before the scan was routed",
         _import("1,Dr Ames,normal,,2026-10-01\n"), 2,
         (*LINE_FIX, "line 2", "before scan 1 was routed")),
    Case("a reads file with a read in the future",
         _import("1,Dr Ames,normal,,2999-01-01\n"), 2, (*LINE_FIX, "line 2", "in the future")),
    Case("a reads file whose scan id is not a number",
         _import("one,Dr Ames,normal,,\n"), 2, (*LINE_FIX, "line 2", "'one' is not a number")),
    Case("a reads file whose sha256 is another file's",
         _import("1,Dr Ames,normal,ab12\n", header="scan_id,reader,read,sha256\n"), 2,
         (*LINE_FIX, "line 2", "about another file")),
    Case("a reads file with more cells than columns",
         _import("1,Dr Ames,normal,a, b,2026-11-02\n"), 2,
         (*IMPORT_FIX, "line 2", "more cells than the header", "quote")),
    Case("a reads file that is empty", _import("", header=""), 2, ("reads.csv", "empty file")),
    Case("a reads file that is not UTF-8",
         _import("1,Dr Ames,normal,caf\u00e9,\n", encoding="latin-1"), 2,
         ("reads.csv", "not UTF-8", "save the file as UTF-8")),
]

CASES = [
    *IMPORT_CASES,
    Case("an import file that does not exist", _import_path("missing"), 2,
         ("reads.csv", "no such file")),
    Case("an import path that is a folder", _import_path("folder"), 2,
         ("reads.csv", "is a folder", "CSV file to import")),
    Case("a retention that is negative", _review("--purge-older-than", "-3"), 2,
         ("--purge-older-than", "zero or more days", "-3")),
    Case("a retention that is not a number", _review("--purge-older-than", "a month"), 2,
         ("--purge-older-than", "a month")),
    Case("a retention that is not finite", _review("--purge-older-than", "inf"), 2,
         ("--purge-older-than", "number of days")),
    Case("a dry run without a retention", _review("--dry-run"), 2,
         ("--dry-run", "--purge-older-than")),
    Case("an audit log from a newer medfed", _review(log="newer"), 2,
         ("audit.sqlite", "newer medfed", "upgrade medfed")),
    Case("an audit log that is not a database", _review(log="garbage"), 2,
         ("audit.sqlite", "not a SQLite database", "move the file aside")),
    Case("a window on neither read nor routing time", _review("--by", "scan"), 2,
         ("'scan'", "'read' or 'routed'")),
    Case("a window start that is not a time", _review("--since", "soon"), 2,
         ("window start 'soon' is not a time", "ISO 8601")),
    Case("a window that ends before it starts",
         _review("--since", "2026-12-01", "--until", "2026-11-01"), 2,
         ("is not before its end",)),
    Case("export and import at once", _review("--export", "a.csv", "--import", "b.csv"), 2,
         ("--export or --import, not both",)),
    Case("figures written onto a folder", _review("--figures", "TMP"), 2,
         ("is a folder", "CSV file to write")),
    Case("a backup into a folder that does not exist",
         _review("--backup", "TMP/nowhere/audit-backup.sqlite"), 2,
         ("nowhere", "folder that exists")),
    Case("a backup onto a file that exists", _review("--backup", "TMP/run/audit.sqlite"), 2,
         ("audit.sqlite", "already exists", "new file name")),
    Case("a run directory that does not exist", _not_a_run, 2,
         ("no_such_run", "no such run directory")),
]
# fmt: on


@pytest.mark.parametrize("case", CASES, ids=str)
def test_bad_review_input_gets_a_clear_answer(case: Case, tmp_path, shared: Shared) -> None:
    check(case, tmp_path, shared)


@pytest.mark.parametrize("case", IMPORT_CASES[:3], ids=str)
def test_a_refused_line_writes_only_the_good_lines(case: Case, tmp_path, shared: Shared) -> None:
    argv = case.make(tmp_path, shared)
    result = CliRunner().invoke(app, [str(a) for a in argv])
    assert result.exit_code == 2
    assert [r.routed_id for r in AuditLog(argv[1]).reads()] == [1]  # the good line 2
