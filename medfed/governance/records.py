"""What a site keeps of its governance, in its SuperNode's state folder: the plans its operator
approved (``approvals.jsonl``) and its audit log (``audit.jsonl``: every message the node
received and sent, with the policy's decision). Both are append-only JSON lines, owner-only
(0600); a line that is not one of them is refused by name, never skipped."""

from __future__ import annotations

import getpass
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from medfed.core.errors import RunDirError
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


def read_lines(
    path: Path, check: Callable[[dict[str, Any]], str] | None = None
) -> list[dict[str, Any]]:
    """Every record of a JSON-lines file ([] when there is none); ``check`` says what is wrong
    with a record ("" when nothing is)."""
    if not path.is_file():
        return []
    out = []
    for number, raw in enumerate(path.read_bytes().splitlines(), 1):
        problem = ""
        try:
            line = raw.decode("utf-8")
            record = json.loads(line) if line.strip() else {}
        except UnicodeDecodeError:
            line, record, problem = "", None, "not UTF-8 text"
        except (json.JSONDecodeError, RecursionError):
            record = None
        if not line.strip() and not problem:
            continue
        if not isinstance(record, dict):
            problem = problem or "not a JSON record"
        elif check is not None:
            problem = check(record)
        if problem:
            raise RunDirError(
                f"{path}, line {number}: not a record medfed wrote ({problem}); the file was "
                "edited or cut short; restore it from a backup (it is append-only)"
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


def _audit_problem(record: dict[str, Any]) -> str:
    """What is wrong with one audit record ("" when nothing is)."""
    when = record.get("time")
    if isinstance(when, bool) or not isinstance(when, int | float):
        return f"'time' is {when!r}, not a number of seconds"
    if not 0 <= when < 1e11:  # NaN fails too; 1e11 s is past the year 5000
        return f"'time' {when!r} is not a time"
    for key in ("round", "bytes"):
        value = record.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            return f"{key!r} is {value!r}, not a whole number"
    for key in ("direction", "kind", "run", "sha256", "decision", "rule", "reason"):
        value = record.get(key)
        if value is not None and not isinstance(value, str):
            return f"{key!r} is {value!r}, not text"
    return ""


def read_audit(state_dir: Path) -> list[dict[str, Any]]:
    """The site's audit log, each line checked (a line that is not one is refused by number)."""
    return read_lines(state_dir / AUDIT, _audit_problem)


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
