"""The routing audit log: every routed scan, in SQLite inside the run directory.

Clinicians review past decisions from it (the dashboard's Routing page reads it); it stores a
hash of each file, never the image.
"""

from __future__ import annotations

import json
import math
import sqlite3
from contextlib import closing
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from medfed.errors import MedfedError
from medfed.names import printable

__all__ = ["AUDIT_FILE", "AuditEntry", "AuditError", "AuditLog", "printable"]

AUDIT_FILE = "audit.sqlite"
_NOT_A_DATABASE = "not a database"  # in SQLite's message for a file that is no database


class AuditError(MedfedError):
    """The audit log cannot be written or read."""


_SCHEMA = """
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


@dataclass(frozen=True)
class AuditEntry:
    """One routing decision. ``status`` is routed, abstained or error."""

    time: str
    file: str
    sha256: str
    router: str
    status: str
    chosen_site: str | None
    site_probs: dict[str, float]
    prediction: str | None
    prediction_prob: float | None
    ood_score: float | None
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The entry as plain values; a NaN or infinite number (never valid) becomes None."""
        out = asdict(self)
        out["site_probs"] = {k: _finite(v) for k, v in self.site_probs.items()}
        for key in ("prediction_prob", "ood_score"):
            out[key] = _finite(out[key])
        return out


def _finite(value: float | None) -> float | None:
    return value if value is None or math.isfinite(value) else None


class AuditLog:
    """Append-only log of routing decisions in ``RUN/audit.sqlite``."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / AUDIT_FILE

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(self.path, timeout=30)
        connection.execute(_SCHEMA)
        return connection

    def _failed(self, exc: Exception, doing: str) -> AuditError:
        """The error for a log that cannot be ``doing`` ("recorded" or "read")."""
        skip = ", or pass --no-audit to route without a record" if doing == "recorded" else ""
        if _NOT_A_DATABASE in str(exc):
            return AuditError(
                f"{self.path}: is not a SQLite database (damaged or overwritten), so routing "
                f"decisions cannot be {doing}; move the file aside to start a new log{skip}"
            )
        return AuditError(
            f"{self.path}: routing decisions cannot be {doing} ({exc}); make the file and the "
            f"run directory readable and writable{skip}"
        )

    def check(self) -> None:
        """Raise AuditError now, before any scan is routed, when the log cannot be written."""
        try:
            with closing(self._connect()) as db:
                try:  # a real write, undone: only writing shows a read-only file or folder
                    db.execute(
                        "INSERT INTO routed (time, file, sha256, router, status, site_probs)"
                        " VALUES ('', '', '', '', '', '{}')"
                    )
                finally:
                    db.rollback()
        except (sqlite3.Error, OSError) as exc:
            raise self._failed(exc, "recorded") from exc

    def append(self, entries: list[AuditEntry]) -> None:
        try:
            self._append(entries)
        except (sqlite3.Error, OSError) as exc:
            raise self._failed(exc, "recorded") from exc

    def _append(self, entries: list[AuditEntry]) -> None:
        with closing(self._connect()) as db, db:
            db.executemany(
                "INSERT INTO routed (time, file, sha256, router, status, chosen_site, site_probs,"
                " prediction, prediction_prob, ood_score, reason)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        e.time,
                        printable(e.file),
                        e.sha256,
                        e.router,
                        e.status,
                        e.chosen_site,
                        json.dumps(d["site_probs"], sort_keys=True, allow_nan=False),
                        e.prediction,
                        d["prediction_prob"],
                        d["ood_score"],
                        None if e.reason is None else printable(e.reason),
                    )
                    for e, d in ((e, e.to_dict()) for e in entries)
                ],
            )

    def read(
        self, *, site: str | None = None, status: str | None = None, limit: int | None = None
    ) -> list[AuditEntry]:
        """Entries, newest first, optionally only those routed to ``site`` or with ``status``."""
        if not self.path.is_file():
            return []
        query = "SELECT time, file, sha256, router, status, chosen_site, site_probs, prediction,"
        query += " prediction_prob, ood_score, reason FROM routed"
        clauses, args = [], []
        if site is not None:
            clauses.append("chosen_site = ?")
            args.append(site)
        if status is not None:
            clauses.append("status = ?")
            args.append(status)
        if clauses:
            query += " WHERE " + " AND ".join(clauses)
        query += " ORDER BY id DESC"
        if limit is not None:
            query += f" LIMIT {int(limit)}"
        try:
            with closing(self._connect()) as db:
                rows = db.execute(query, args).fetchall()
        except (sqlite3.Error, OSError) as exc:
            raise self._failed(exc, "read") from exc
        return [
            AuditEntry(*row[:6], json.loads(row[6]), *row[7:])  # type: ignore[arg-type]
            for row in rows
        ]
