"""Route one scan and record it in the run's audit log, returning the decision's audit id.

The routing service and the PACS inboxes answer one scan at a time and hand the answer on (an
HTTP reply, a report stored back to the PACS): the answer names its row in the audit log
(the scan id the Review page and ``medfed review`` use), and the row is committed before the
answer leaves, so a crash right after never loses a decision that was given.
"""

from __future__ import annotations

import sqlite3
import threading
from contextlib import closing
from pathlib import Path

from medfed.serving.audit import AUDIT_FILE, AuditEntry, AuditError, AuditLog
from medfed.serving.bundle import TrainedFederation
from medfed.serving.routers import Router
from medfed.serving.service import route_one

__all__ = ["Recorded", "record_scan"]

# One writer per process at a time, so that the row just written is the one looked up; the
# federation's forward passes are not shared between threads either.
_LOCK = threading.Lock()


class Recorded:
    """A routing decision and its id in the audit log."""

    def __init__(self, entry: AuditEntry, audit_id: int) -> None:
        self.entry = entry
        self.audit_id = audit_id

    def to_dict(self) -> dict[str, object]:
        """The entry as ``medfed route --json`` prints it, with ``audit_id`` added."""
        return {**self.entry.to_dict(), "audit_id": self.audit_id}


def _row_id(run_dir: Path, entry: AuditEntry) -> int:
    """The id of the newest row holding ``entry`` (just written under the lock)."""
    query = "SELECT max(id) FROM routed WHERE time = ? AND file = ? AND sha256 = ? AND status = ?"
    path = Path(run_dir) / AUDIT_FILE
    try:
        with closing(sqlite3.connect(path, timeout=30.0)) as db:
            row = db.execute(query, (entry.time, entry.file, entry.sha256, entry.status)).fetchone()
    except sqlite3.Error as exc:
        raise AuditError(f"{path}: the decision just recorded cannot be read back ({exc})") from exc
    if row is None or row[0] is None:
        raise AuditError(f"{path}: the decision just recorded is missing from the log")
    return int(row[0])


def record_scan(
    fed: TrainedFederation, router: Router, path: Path, run_dir: Path, name: str | None = None
) -> Recorded:
    """Route the scan at ``path`` (named ``name`` in the answer and the log) and commit the
    decision to ``run_dir``'s audit log; AuditError when it cannot be recorded (no answer)."""
    with _LOCK:
        entry = route_one(fed, router, Path(path), name)
        AuditLog(run_dir).append([entry])
        return Recorded(entry, _row_id(run_dir, entry))
