"""The routing audit log: every routed scan, in SQLite inside the run directory, and the
clinicians' reads of those scans next to it.

Clinicians review past decisions from it (the dashboard's Routing and Review pages read it); it
stores a hash of each file, never the image.

Tables: ``routed`` (one row per routing decision), ``reads`` (one row per clinician's read of
a routed scan: who, when, what; a read is never changed or deleted: a changed read is a new row
that names the read it amends, so the history stays) and ``reveals`` (when a reader was shown
the model's answer for a scan: a read recorded before that is blinded to it).
Each routing decision names the model that gave it (``model``: the run's model id), so one log
stays one continuous trail when the served model is replaced by a newer run.
The database carries its schema version in ``PRAGMA user_version`` (:data:`AUDIT_SCHEMA_VERSION`):
a log written before reads existed (version 0, ``routed`` only) gains the new tables when first
opened; a log from a newer medfed is refused. The log runs in WAL mode, and every write is one
transaction, so several processes (``medfed route``, the dashboard, ``medfed review --import``)
can write to it at once without losing a row.
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from collections.abc import Sequence
from contextlib import closing
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from medfed.core.errors import MedfedError
from medfed.core.fileio import new_private_file
from medfed.core.names import printable

__all__ = [
    "AUDIT_FILE",
    "AUDIT_SCHEMA_VERSION",
    "AuditEntry",
    "AuditError",
    "AuditLog",
    "ReadEntry",
    "Reveal",
    "printable",
]

AUDIT_FILE = "audit.sqlite"
AUDIT_SCHEMA_VERSION = 3
"""The audit database's schema (``PRAGMA user_version``): 0 routed scans only, 1 adds reads,
2 adds amendments and blinding to reads, and the reveals of the model's answer, 3 the model
that gave each routing decision (empty in rows written before)."""
_NOT_A_DATABASE = "not a database"  # in SQLite's message for a file that is no database
_READ_ONLY = "readonly"  # in SQLite's message for a write to a read-only file
_TIMEOUT = 30.0  # seconds a statement waits for another writer before giving up


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
    reason TEXT,
    model TEXT
)
"""

# Version 1: the clinicians' reads. ``time``: when the read was made; ``recorded``: when it was
# written here (they differ for reads imported from a CSV); ``source``: how it came in.
# The triggers make reads append-only in the database itself, whoever opens it.
_READS_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS reads (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        routed_id INTEGER NOT NULL REFERENCES routed(id),
        reader TEXT NOT NULL CHECK (length(trim(reader)) > 0),
        read TEXT NOT NULL CHECK (length(trim(read)) > 0),
        note TEXT,
        time TEXT NOT NULL,
        recorded TEXT NOT NULL,
        source TEXT NOT NULL
    )
    """,
    "CREATE INDEX IF NOT EXISTS reads_by_scan ON reads (routed_id)",
    """
    CREATE TRIGGER IF NOT EXISTS reads_are_never_changed BEFORE UPDATE ON reads
    BEGIN SELECT RAISE(ABORT, 'a read is never changed; record a new read instead'); END
    """,
    """
    CREATE TRIGGER IF NOT EXISTS reads_are_never_deleted BEFORE DELETE ON reads
    BEGIN SELECT RAISE(ABORT, 'a read is never deleted; record a new read instead'); END
    """,
)
# Version 2: ``amends`` names the read a changed read replaces (its reader's earlier read of
# the scan); ``blinded`` is 1 when the reader had not seen the model's answer, 0 when they had,
# NULL when unknown (reads recorded before version 2).
_V2_COLUMNS = (
    ("amends", "INTEGER REFERENCES reads(id)"),
    ("blinded", "INTEGER CHECK (blinded IN (0, 1))"),
)
_REVEALS_SCHEMA = """
CREATE TABLE IF NOT EXISTS reveals (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    routed_id INTEGER NOT NULL REFERENCES routed(id),
    reader TEXT NOT NULL CHECK (length(trim(reader)) > 0),
    time TEXT NOT NULL
)
"""
_READ_COLUMNS = "id, routed_id, reader, read, note, time, recorded, source, amends, blinded"


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
    # every class's probability in the federation's answer (not kept in the audit log)
    class_probs: dict[str, float] | None = None
    # the rule that decided ``prediction``: argmax, or an operating threshold (not kept)
    decision_rule: str | None = None
    # an abstained scan's nearest site and what its model outputs: never an answer (not kept)
    nearest: dict[str, Any] | None = None
    # the row in the audit log holding this decision, once it is written
    audit_id: int | None = None
    # the model that gave it (the run's model id; None in rows an older medfed logged)
    model: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The entry as plain values; a NaN or infinite number (never valid) becomes None."""
        out = asdict(self)
        out["site_probs"] = {k: _finite(v) for k, v in self.site_probs.items()}
        if self.class_probs is not None:
            out["class_probs"] = {k: _finite(v) for k, v in self.class_probs.items()}
        for key in ("prediction_prob", "ood_score"):
            out[key] = _finite(out[key])
        if self.nearest is not None:
            out["nearest"] = {k: _finite_any(v) for k, v in self.nearest.items()}
        return out


def _finite_any(value: Any) -> Any:
    if isinstance(value, float):
        return _finite(value)
    if isinstance(value, dict):
        return {k: _finite_any(v) for k, v in value.items()}
    return value


def _finite(value: float | None) -> float | None:
    return value if value is None or math.isfinite(value) else None


@dataclass(frozen=True)
class ReadEntry:
    """One clinician's read of one routed scan (``routed_id``: the scan's row in ``routed``).

    ``time``: when the read was made (ISO 8601, UTC); ``recorded``: when it was written to the
    log; ``source``: how it came in (``dashboard``, ``import``, ...). ``id`` is ``None`` until
    the read is written.
    """

    routed_id: int
    reader: str
    read: str
    note: str | None
    time: str
    recorded: str
    source: str
    id: int | None = None
    amends: int | None = None
    blinded: bool | None = None


@dataclass(frozen=True)
class Reveal:
    """``reader`` was shown the model's answer for scan ``routed_id`` at ``time``."""

    routed_id: int
    reader: str
    time: str


def _entry_of(row: Sequence[Any]) -> AuditEntry:
    """An entry from a ``routed`` row's columns time .. reason, then model.

    An abstained scan has no answer: a prediction an older medfed logged for one is dropped.
    """
    values = list(row)
    if values[4] == "abstained":
        values[7] = values[8] = None
    return AuditEntry(
        *values[:6],
        json.loads(values[6]),
        *values[7:11],
        model=values[11],  # type: ignore[arg-type]
    )


class AuditLog:
    """Append-only log of routing decisions and clinicians' reads in ``RUN/audit.sqlite``."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / AUDIT_FILE

    def _connect(self) -> sqlite3.Connection:
        """A connection to the log, migrated to :data:`AUDIT_SCHEMA_VERSION` (refused when newer).

        A log that cannot be written (a read-only file or folder) and is older is left as it is:
        it can still be read (with no reads), and writing to it fails with SQLite's words.
        """
        connection = self._open()
        try:
            connection.execute("PRAGMA foreign_keys = ON")
            if self._version(connection) < AUDIT_SCHEMA_VERSION:
                self._migrate(connection)
        except BaseException:
            connection.close()
            raise
        return connection

    def _open(self) -> sqlite3.Connection:
        if self.path.parent.is_dir():
            new_private_file(self.path)  # patient data: owner-only, its WAL files too
        return sqlite3.connect(self.path, timeout=_TIMEOUT)

    def _version(self, db: sqlite3.Connection) -> int:
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        if version > AUDIT_SCHEMA_VERSION:
            raise AuditError(
                f"{self.path}: written by a newer medfed (audit schema version {version}; this "
                f"medfed reads up to {AUDIT_SCHEMA_VERSION}); upgrade medfed (pip install -U "
                "medfed) to read or write this log, and do not open it with this version"
            )
        return version

    def _migrate(self, db: sqlite3.Connection) -> None:
        """Bring an older (or new, empty) log to the current schema in one transaction.

        WAL is set first (it cannot change inside a transaction and stays set in the file); the
        version is read again inside the transaction, since another process may have migrated
        the log in between.
        """
        try:
            _set_wal(db)
            db.execute("BEGIN IMMEDIATE")
            try:
                if self._version(db) < AUDIT_SCHEMA_VERSION:
                    db.execute(_SCHEMA)
                    for statement in _READS_SCHEMA:
                        db.execute(statement)
                    have = {row[1] for row in db.execute("PRAGMA table_info(reads)")}
                    for name, kind in _V2_COLUMNS:
                        if name not in have:
                            db.execute(f"ALTER TABLE reads ADD COLUMN {name} {kind}")
                    db.execute(_REVEALS_SCHEMA)
                    if "model" not in {row[1] for row in db.execute("PRAGMA table_info(routed)")}:
                        db.execute("ALTER TABLE routed ADD COLUMN model TEXT")
                    db.execute(f"PRAGMA user_version = {AUDIT_SCHEMA_VERSION}")
                db.commit()
            except BaseException:
                db.rollback()
                raise
        except sqlite3.OperationalError as exc:
            if _READ_ONLY not in str(exc):
                raise
            # read-only: readable as it is (without reads); a write will say why it fails

    def version(self) -> int:
        """The log's schema version once opened (0 for a log that does not exist yet)."""
        if not self.path.is_file():
            return 0
        try:
            with closing(self._connect()) as db:
                return self._version(db)
        except (sqlite3.Error, OSError) as exc:
            raise self._failed(exc, "read") from exc

    def _failed(self, exc: Exception, doing: str, what: str = "routing decisions") -> AuditError:
        """The error for a log whose ``what`` cannot be ``doing`` ("recorded" or "read")."""
        routing = doing == "recorded" and what == "routing decisions"
        skip = ", or pass --no-audit to route without a record" if routing else ""
        if _NOT_A_DATABASE in str(exc):
            return AuditError(
                f"{self.path}: is not a SQLite database (damaged or overwritten), so {what} "
                f"cannot be {doing}; move the file aside to start a new log{skip}"
            )
        if "locked" in str(exc):
            return AuditError(
                f"{self.path}: {what} cannot be {doing}: another process kept the log locked "
                f"for over {_TIMEOUT:.0f} s; try again, and check that no stuck process holds "
                f"it (the log must be on a local disk, not a network share){skip}"
            )
        return AuditError(
            f"{self.path}: {what} cannot be {doing} ({exc}); make the file and the "
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

    def append(self, entries: list[AuditEntry]) -> list[int]:
        """Write ``entries`` in one transaction; their row ids (audit ids), in order."""
        try:
            return self._append(entries)
        except (sqlite3.Error, OSError) as exc:
            raise self._failed(exc, "recorded") from exc

    def _append(self, entries: list[AuditEntry]) -> list[int]:
        ids: list[int] = []
        with closing(self._connect()) as db, db:
            for row in [
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
                    e.model,
                )
                for e, d in ((e, e.to_dict()) for e in entries)
            ]:
                cursor = db.execute(
                    "INSERT INTO routed (time, file, sha256, router, status, chosen_site,"
                    " site_probs, prediction, prediction_prob, ood_score, reason, model)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    row,
                )
                ids.append(int(cursor.lastrowid or 0))
        return ids

    def backup(self, target: str | Path) -> Path:
        """Copy the log to ``target`` with SQLite's online backup (a consistent copy while
        others write to it), owner-only; the copy, or AuditError naming what to do."""
        target = Path(target)
        if not self.path.is_file():
            raise AuditError(f"{self.path}: there is no audit log to back up")
        if target.is_dir() or not target.parent.is_dir():
            raise AuditError(
                f"{target}: give the backup's file name in a folder that exists (not a folder)"
            )
        if target.exists():
            raise AuditError(f"{target}: already exists; give a new file name for the backup")
        try:
            with closing(self._connect()) as source, closing(sqlite3.connect(target)) as copy:
                source.backup(copy)
            target.chmod(0o600)
        except (sqlite3.Error, OSError) as exc:
            raise self._failed(exc, "read", what="the log's rows") from exc
        return target

    def read(
        self, *, site: str | None = None, status: str | None = None, limit: int | None = None
    ) -> list[AuditEntry]:
        """Entries, newest first, optionally only those routed to ``site`` or with ``status``."""
        if not self.path.is_file():
            return []
        query = "SELECT time, file, sha256, router, status, chosen_site, site_probs, prediction,"
        query += " prediction_prob, ood_score, reason, {model} FROM routed"
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
                rows = db.execute(query.format(model=_model_column(db)), args).fetchall()
        except (sqlite3.Error, OSError) as exc:
            raise self._failed(exc, "read") from exc
        return [_entry_of(row) for row in rows]

    def records(self) -> list[tuple[int, AuditEntry]]:
        """Every routing decision with its row id (the scan id reads refer to), oldest first."""
        if not self.path.is_file():
            return []
        query = "SELECT id, time, file, sha256, router, status, chosen_site, site_probs,"
        query += " prediction, prediction_prob, ood_score, reason, {model} FROM routed ORDER BY id"
        try:
            with closing(self._connect()) as db:
                rows = db.execute(query.format(model=_model_column(db))).fetchall()
        except (sqlite3.Error, OSError) as exc:
            raise self._failed(exc, "read") from exc
        return [(int(row[0]), _entry_of(row[1:])) for row in rows]

    def add_reads(self, reads: Sequence[ReadEntry]) -> list[ReadEntry]:
        """Write ``reads`` in one transaction (all or none) and return them with their ids.

        Every ``routed_id`` must name a routed scan (AuditError otherwise, nothing written).
        """
        try:
            return self._add_reads(reads)
        except (sqlite3.Error, OSError) as exc:
            if isinstance(exc, sqlite3.IntegrityError):
                raise AuditError(
                    f"{self.path}: the reads were not recorded ({exc}); every read must name a "
                    "routed scan by its id and give a reader and a read"
                ) from exc
            raise self._failed(exc, "recorded", what="reads") from exc

    def _add_reads(self, reads: Sequence[ReadEntry]) -> list[ReadEntry]:
        written: list[ReadEntry] = []
        with closing(self._connect()) as db:
            if not _has_table(db, "reads"):  # an old log that could not be migrated
                raise AuditError(
                    f"{self.path}: reads cannot be recorded: the log predates reads and cannot "
                    "be written to add them (read-only); make the file and the run directory "
                    "readable and writable"
                )
            db.execute("BEGIN IMMEDIATE")  # take the write lock before reading: no lost update
            try:
                for r in reads:
                    cursor = db.execute(
                        f"INSERT INTO reads ({_READ_COLUMNS.removeprefix('id, ')})"
                        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (
                            int(r.routed_id),
                            printable(r.reader),
                            printable(r.read),
                            None if r.note is None else printable(r.note),
                            r.time,
                            r.recorded,
                            r.source,
                            r.amends,
                            None if r.blinded is None else int(r.blinded),
                        ),
                    )
                    written.append(_with_id(r, cursor.lastrowid))
                db.commit()
            except BaseException:
                db.rollback()
                raise
        return written

    def reads(self, routed_id: int | None = None) -> list[ReadEntry]:
        """Every read (of one scan when ``routed_id`` is given), in the order recorded."""
        if not self.path.is_file():
            return []
        where, args = ("", []) if routed_id is None else (" WHERE routed_id = ?", [int(routed_id)])
        try:
            with closing(self._connect()) as db:
                if not _has_table(db, "reads"):  # an old log that could not be migrated
                    return []
                have = {row[1] for row in db.execute("PRAGMA table_info(reads)")}
                columns = _READ_COLUMNS  # a read-only version 1 log: amends and blinded unknown
                if "amends" not in have:
                    columns = columns.replace(", amends, blinded", ", NULL, NULL")
                query = f"SELECT {columns} FROM reads{where} ORDER BY id"
                rows = db.execute(query, args).fetchall()
        except (sqlite3.Error, OSError) as exc:
            raise self._failed(exc, "read", what="reads") from exc
        return [
            ReadEntry(
                routed_id=int(row[1]),
                reader=row[2],
                read=row[3],
                note=row[4],
                time=row[5],
                recorded=row[6],
                source=row[7],
                id=int(row[0]),
                amends=None if row[8] is None else int(row[8]),
                blinded=None if row[9] is None else bool(row[9]),
            )
            for row in rows
        ]

    def add_reveal(self, routed_id: int, reader: str, time: str) -> None:
        """Record that ``reader`` was shown the model's answer for scan ``routed_id``."""
        try:
            with closing(self._connect()) as db, db:
                db.execute(
                    "INSERT INTO reveals (routed_id, reader, time) VALUES (?, ?, ?)",
                    (int(routed_id), printable(reader), time),
                )
        except (sqlite3.Error, OSError) as exc:
            raise self._failed(exc, "recorded", what="reveals of the model's answer") from exc

    def reveals(self, routed_id: int | None = None) -> list[Reveal]:
        """When readers were shown the model's answer (for one scan when given), in order."""
        if not self.path.is_file():
            return []
        query = "SELECT routed_id, reader, time FROM reveals"
        args: list[Any] = []
        if routed_id is not None:
            query += " WHERE routed_id = ?"
            args.append(int(routed_id))
        try:
            with closing(self._connect()) as db:
                if not _has_table(db, "reveals"):
                    return []
                rows = db.execute(query + " ORDER BY id", args).fetchall()
        except (sqlite3.Error, OSError) as exc:
            raise self._failed(exc, "read", what="reveals of the model's answer") from exc
        return [Reveal(int(a), str(b), str(c)) for a, b, c in rows]


def _with_id(read: ReadEntry, row_id: int | None) -> ReadEntry:
    return ReadEntry(**{**asdict(read), "id": row_id})


def _set_wal(db: sqlite3.Connection) -> None:
    """Switch the log to WAL. The switch needs the database to itself and, unlike other
    statements, does not wait for it: another process opening the log at the same moment makes
    it fail at once, so it is tried again for as long as any statement would wait."""
    deadline = time.monotonic() + _TIMEOUT
    while True:
        try:
            db.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _model_column(db: sqlite3.Connection) -> str:
    """The ``routed`` column naming each decision's model: absent (NULL) in a read-only log an
    older medfed wrote, which cannot gain it."""
    have = {row[1] for row in db.execute("PRAGMA table_info(routed)")}
    return "model" if "model" in have else "NULL AS model"


def _has_table(db: sqlite3.Connection, name: str) -> bool:
    query = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
    return db.execute(query, (name,)).fetchone() is not None
