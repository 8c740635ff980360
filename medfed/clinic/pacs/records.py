"""What the PACS inboxes have done, in ``RUN/pacs.sqlite``: each scan answered or skipped (and
why), and how far each DICOMweb source was read: the position in Orthanc's change feed, or the
studies a sweep has examined (with their instance counts then).

A scan is answered once: its key (a CT series, or one photo) is recorded with its audit id and
the answer's file as soon as it is routed, before the answer is sent; a restart that finds a
scan routed but not yet confirmed as stored sends that same answer again (the same SOP
Instance UID: the PACS keeps one copy), and never routes it again.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from medfed.core.errors import ConfigError, MedfedError
from medfed.core.fileio import new_private_file

__all__ = ["PACS_FILE", "PacsLog", "PacsLogError", "PacsScan", "watch_lock"]

PACS_FILE = "pacs.sqlite"
_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS scans (
        key TEXT PRIMARY KEY,
        source TEXT NOT NULL,
        study_uid TEXT NOT NULL,
        series_uid TEXT NOT NULL,
        instance_uid TEXT,
        modality TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('pending', 'answered', 'skipped')),
        reason TEXT,
        audit_id INTEGER,
        answer_uid TEXT,
        answer_file TEXT,
        time TEXT NOT NULL,
        accession TEXT NOT NULL DEFAULT '',
        patient TEXT NOT NULL DEFAULT '',
        study_date TEXT NOT NULL DEFAULT ''
    )
    """,
    "CREATE INDEX IF NOT EXISTS scans_by_audit ON scans (audit_id)",
    """
    CREATE TABLE IF NOT EXISTS feeds (
        source TEXT PRIMARY KEY,
        seq INTEGER NOT NULL,
        time TEXT NOT NULL
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS seen_studies (
        source TEXT NOT NULL,
        study_uid TEXT NOT NULL,
        instances INTEGER NOT NULL,
        time TEXT NOT NULL,
        PRIMARY KEY (source, study_uid)
    )
    """,
)
LOCK_FILE = Path("pacs") / "watch.lock"
_COLUMNS = (
    "key, source, study_uid, series_uid, instance_uid, modality, status, reason, audit_id, "
    "answer_uid, answer_file, time, accession, patient, study_date"
)
# Columns added since the first schema, given to an older log when it is opened.
_ADDED = ("accession", "patient", "study_date")


class PacsLogError(MedfedError):
    """The PACS log cannot be read or written."""


@dataclass(frozen=True)
class PacsScan:
    """One scan an inbox handled: where it came from, and what was done."""

    key: str
    source: str
    study_uid: str
    series_uid: str
    instance_uid: str | None
    modality: str
    status: str  # pending (routed, answer not yet stored), answered, skipped
    reason: str | None = None
    audit_id: int | None = None
    answer_uid: str | None = None
    answer_file: str | None = None
    time: str = ""
    accession: str = ""  # how the review lists it (medfed.clinic.pacs.visits)
    patient: str = ""
    study_date: str = ""


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class PacsLog:
    """``RUN/pacs.sqlite``: every scan the inboxes answered or skipped, and how far each
    DICOMweb source was read."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / PACS_FILE

    def _connect(self) -> sqlite3.Connection:
        try:
            new_private_file(self.path)
            db = sqlite3.connect(self.path, timeout=30.0)
            db.execute("PRAGMA journal_mode = WAL")
            for statement in _SCHEMA:
                db.execute(statement)
            have = {row[1] for row in db.execute("PRAGMA table_info(scans)")}
            for column in (c for c in _ADDED if c not in have):  # a log of an older medfed
                db.execute(f"ALTER TABLE scans ADD COLUMN {column} TEXT NOT NULL DEFAULT ''")
            db.commit()
        except sqlite3.Error as exc:
            raise PacsLogError(
                f"{self.path}: the PACS log cannot be opened ({exc}); make the run directory "
                "writable, or move a damaged file aside"
            ) from exc
        return db

    def get(self, key: str) -> PacsScan | None:
        with closing(self._connect()) as db:
            row = db.execute(f"SELECT {_COLUMNS} FROM scans WHERE key = ?", (key,)).fetchone()
        return None if row is None else PacsScan(*row)

    def put(self, scan: PacsScan) -> None:
        """Record ``scan`` (replacing the row of its key: pending becomes answered)."""
        values = tuple(getattr(scan, c.strip()) for c in _COLUMNS.split(","))
        marks = ", ".join("?" * len(values))
        try:
            with closing(self._connect()) as db, db:
                db.execute(f"INSERT OR REPLACE INTO scans ({_COLUMNS}) VALUES ({marks})", values)
        except sqlite3.Error as exc:
            raise PacsLogError(f"{self.path}: the scan cannot be recorded ({exc})") from exc

    def scans(self, status: str | None = None) -> list[PacsScan]:
        if not self.path.is_file():
            return []
        where, args = ("", ()) if status is None else (" WHERE status = ?", (status,))
        with closing(self._connect()) as db:
            rows = db.execute(f"SELECT {_COLUMNS} FROM scans{where} ORDER BY time, key", args)
            return [PacsScan(*row) for row in rows.fetchall()]

    def feed_seq(self, source: str) -> int | None:
        """The last change of ``source``'s change feed whose studies were all handled."""
        with closing(self._connect()) as db:
            row = db.execute("SELECT seq FROM feeds WHERE source = ?", (source,)).fetchone()
        return None if row is None else int(row[0])

    def set_feed_seq(self, source: str, seq: int) -> None:
        self._write(
            "INSERT OR REPLACE INTO feeds (source, seq, time) VALUES (?, ?, ?)",
            [(source, seq, now())],
        )

    def seen_counts(self, source: str, studies: list[str]) -> dict[str, int]:
        """Study UID -> its instance count when a sweep of ``source`` last examined it whole,
        for those of ``studies`` it examined."""
        found: dict[str, int] = {}
        with closing(self._connect()) as db:
            for at in range(0, len(studies), 500):  # well under SQLite's variable limit
                part = studies[at : at + 500]
                rows = db.execute(
                    "SELECT study_uid, instances FROM seen_studies WHERE source = ? AND "
                    f"study_uid IN ({', '.join('?' * len(part))})",
                    (source, *part),
                ).fetchall()
                found.update({str(uid): int(count) for uid, count in rows})
        return found

    def mark_seen(self, source: str, counts: dict[str, int]) -> None:
        self._write(
            "INSERT OR REPLACE INTO seen_studies (source, study_uid, instances, time) "
            "VALUES (?, ?, ?, ?)",
            [(source, uid, count, now()) for uid, count in counts.items()],
        )

    def _write(self, statement: str, rows: list[tuple[object, ...]]) -> None:
        try:
            with closing(self._connect()) as db, db:
                db.executemany(statement, rows)
        except sqlite3.Error as exc:
            raise PacsLogError(f"{self.path}: cannot be written ({exc})") from exc


@contextlib.contextmanager
def watch_lock(run_dir: str | Path) -> Iterator[None]:
    """Held while a watcher (or a backfill that answers) works on the run: two at once could
    route the same new scan twice. ConfigError when another holds it."""
    import fcntl

    path = Path(run_dir) / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise ConfigError(
                f"{path}: another 'medfed pacs watch' or 'pacs backfill --answer' is answering "
                "for this run; stop it first (one at a time, so no scan is answered twice)"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
