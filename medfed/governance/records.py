"""What a site keeps of its governance, in its SuperNode's state folder: the plans its operator
approved (``approvals.jsonl``) and its audit log (``audit.jsonl``: every message the node
received and sent, with the policy's decision). Both are append-only JSON lines, owner-only
(0600); a line that is not one of them is refused by name, never skipped."""

from __future__ import annotations

import getpass
import json
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from medfed.errors import RunDirError
from medfed.governance.plan import Plan

APPROVALS = "approvals.jsonl"
AUDIT = "audit.jsonl"
AUDIT_FIELDS = (
    "time", "direction", "kind", "run", "round", "bytes", "sha256", "decision", "rule", "reason",
)  # fmt: skip
"""The fields of one audit line (``direction``: received or sent; ``decision``: accepted,
refused or none, for a message the policy does not look at)."""


def _append(path: Path, record: Mapping[str, Any]) -> None:
    """One JSON line at the end of ``path`` (created owner-only), written whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, sort_keys=True, allow_nan=False) + "\n").encode("utf-8")
    handle = os.open(path, os.O_CREAT | os.O_APPEND | os.O_WRONLY, 0o600)
    try:
        os.write(handle, line)
    finally:
        os.close(handle)


def read_lines(path: Path) -> list[dict[str, Any]]:
    """Every record of a JSON-lines file ([] when there is none)."""
    if not path.is_file():
        return []
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict):
            raise RunDirError(
                f"{path}, line {number}: not a record medfed wrote; the file was edited or cut "
                "short; restore it from a backup (it is append-only)"
            )
        out.append(record)
    return out


def record_approval(state_dir: Path, plan: Plan, *, note: str = "") -> dict[str, Any]:
    """Record that this site's operator approved ``plan``; returns the record."""
    record = {
        "plan_sha256": plan.sha256,
        "run": plan.run_name,
        "algorithm": plan.train.get("algorithm", "statistics only"),
        "sites": plan.sites,
        "approved_by": getpass.getuser(),
        "time": time.time(),
        "note": note,
    }
    _append(state_dir / APPROVALS, record)
    return record


def approved_plans(state_dir: Path) -> set[str]:
    """The plan hashes this site's operator approved."""
    return {str(r.get("plan_sha256")) for r in read_lines(state_dir / APPROVALS)}


def approval_of(state_dir: Path, sha256: str) -> dict[str, Any] | None:
    """The (latest) approval record of plan ``sha256``, or None."""
    found = [r for r in read_lines(state_dir / APPROVALS) if r.get("plan_sha256") == sha256]
    return found[-1] if found else None


def log_message(state_dir: Path, **fields: Any) -> None:
    """One line of the site's audit log (see :data:`AUDIT_FIELDS`)."""
    unknown = set(fields) - set(AUDIT_FIELDS)
    if unknown:
        raise ValueError(f"not audit fields: {sorted(unknown)}")
    _append(state_dir / AUDIT, {**dict.fromkeys(AUDIT_FIELDS), "time": time.time(), **fields})


def read_audit(state_dir: Path) -> list[dict[str, Any]]:
    return read_lines(state_dir / AUDIT)


def audit_rows(records: Iterable[Mapping[str, Any]]) -> list[list[Any]]:
    """The audit log as table rows (time as UTC, the hash shortened)."""
    rows = []
    for r in records:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(r.get("time", 0))))
        sha = str(r.get("sha256") or "")
        rows.append(
            [
                when,
                r.get("direction", ""),
                r.get("kind", ""),
                r.get("run", ""),
                r.get("round", ""),
                r.get("bytes", ""),
                sha[:12],
                r.get("decision", ""),
                r.get("rule") or "",
            ]
        )
    return rows


AUDIT_HEADER = ["time (UTC)", "direction", "kind", "run", "round", "bytes", "sha256", "decision"]
AUDIT_HEADER.append("rule")
