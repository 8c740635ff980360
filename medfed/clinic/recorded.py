"""Route one scan and record it in the run's audit log, returning the decision's audit id.

The routing service and the PACS inboxes answer one scan at a time and hand the answer on (an
HTTP reply, a report stored back to the PACS): the answer names its row in the audit log
(the scan id the Review page and ``medfed review`` use), and the row is committed before the
answer leaves, so a crash right after never loses a decision that was given.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

from medfed.clinic.audit import AuditEntry, AuditLog
from medfed.clinic.route import route_one
from medfed.routing.bundle import TrainedFederation
from medfed.routing.routers import Router

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
        out = {**self.entry.to_dict(), "audit_id": self.audit_id}
        if out.get("nearest") is None:
            out.pop("nearest", None)
        return out


def record_scan(
    fed: TrainedFederation, router: Router, path: Path, run_dir: Path, name: str | None = None
) -> Recorded:
    """Route the scan at ``path`` (named ``name`` in the answer and the log) and commit the
    decision to ``run_dir``'s audit log; AuditError when it cannot be recorded (no answer)."""
    with _LOCK:
        entry = route_one(fed, router, Path(path), name)
        (audit_id,) = AuditLog(run_dir).append([entry])
        return Recorded(replace(entry, audit_id=audit_id), audit_id)
