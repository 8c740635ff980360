"""The routing audit log: every routed scan, in SQLite inside the run directory.

Clinicians review past decisions from it (the dashboard's Routing page reads it); it stores a
hash of each file, never the image.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from medfed.errors import MedfedError

AUDIT_FILE = "audit.sqlite"


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
        return asdict(self)


class AuditLog:
    """Append-only log of routing decisions in ``RUN/audit.sqlite``."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / AUDIT_FILE

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(self.path, timeout=30)
        connection.execute(_SCHEMA)
        return connection

    def append(self, entries: list[AuditEntry]) -> None:
        try:
            self._append(entries)
        except (sqlite3.Error, OSError) as exc:
            raise AuditError(
                f"{self.path}: cannot record routing decisions ({exc}); make the run directory "
                "writable, or pass --no-audit to route without a record"
            ) from exc

    def _append(self, entries: list[AuditEntry]) -> None:
        with closing(self._connect()) as db, db:
            db.executemany(
                "INSERT INTO routed (time, file, sha256, router, status, chosen_site, site_probs,"
                " prediction, prediction_prob, ood_score, reason)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        e.time,
                        e.file,
                        e.sha256,
                        e.router,
                        e.status,
                        e.chosen_site,
                        json.dumps(e.site_probs, sort_keys=True),
                        e.prediction,
                        e.prediction_prob,
                        e.ood_score,
                        e.reason,
                    )
                    for e in entries
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
        with closing(self._connect()) as db:
            rows = db.execute(query, args).fetchall()
        return [
            AuditEntry(*row[:6], json.loads(row[6]), *row[7:])  # type: ignore[arg-type]
            for row in rows
        ]
