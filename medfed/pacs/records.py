"""What the PACS inboxes have done, in ``RUN/pacs.sqlite``: each scan answered or skipped (and
why), and each DICOMweb source's checkpoint.

A scan is answered once: its key (a CT series, or one photo) is recorded with its audit id and
the answer's file as soon as it is routed, before the answer is sent; a restart that finds a
scan routed but not yet confirmed as stored sends that same answer again (the same SOP
Instance UID: the PACS keeps one copy), and never routes it again.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from medfed.errors import MedfedError

__all__ = ["PACS_FILE", "PacsLog", "PacsLogError", "PacsScan"]

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
        time TEXT NOT NULL
    )
    """,
    "CREATE INDEX IF NOT EXISTS scans_by_audit ON scans (audit_id)",
    """
    CREATE TABLE IF NOT EXISTS checkpoints (
        source TEXT PRIMARY KEY,
        study_date TEXT NOT NULL,
        time TEXT NOT NULL
    )
    """,
)
_COLUMNS = (
    "key, source, study_uid, series_uid, instance_uid, modality, status, reason, audit_id, "
    "answer_uid, answer_file, time"
)


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


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class PacsLog:
    """``RUN/pacs.sqlite``: every scan the inboxes answered or skipped, and the checkpoints."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / PACS_FILE

    def _connect(self) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(self.path, timeout=30.0)
            db.execute("PRAGMA journal_mode = WAL")
            for statement in _SCHEMA:
                db.execute(statement)
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

    def checkpoint(self, source: str) -> str | None:
        """The study date (YYYYMMDD) from which ``source`` is searched again, or None."""
        with closing(self._connect()) as db:
            row = db.execute(
                "SELECT study_date FROM checkpoints WHERE source = ?", (source,)
            ).fetchone()
        return None if row is None else str(row[0])

    def set_checkpoint(self, source: str, study_date: str) -> None:
        with closing(self._connect()) as db, db:
            db.execute(
                "INSERT OR REPLACE INTO checkpoints (source, study_date, time) VALUES (?, ?, ?)",
                (source, study_date, now()),
            )
