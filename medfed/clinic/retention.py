"""Retention: patient data a run keeps (kept scans, the structured reports written back to the
PACS) removed once older than a number of days, each removal logged.

The audit log is not touched: its rows keep each scan's SHA-256, the answer and who read it,
so the trail stays whole after the scan itself is gone. What was removed is appended to
``RUN/review/purged.jsonl`` (owner-only): when, what kind, the scan's SHA-256 or the report's
UID, its age in days and its path.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from medfed.clinic.kept import KEPT_FOLDER
from medfed.core.errors import ConfigError
from medfed.core.fileio import new_private_file, private_dir

ANSWERS = Path("pacs") / "answers"  # the structured reports written for the PACS
PURGE_LOG = Path("review") / "purged.jsonl"
DAY = 86400.0


@dataclass(frozen=True)
class Removal:
    kind: str  # "kept scan" or "answer"
    key: str  # the scan's SHA-256, or the report's SOP instance UID
    path: Path
    age_days: float


def check_days(days: float, option: str = "--purge-older-than") -> float:
    """A retention in days: a finite number, zero or more."""
    if isinstance(days, bool) or not isinstance(days, int | float) or not math.isfinite(days):
        raise ConfigError(f"{option} must be a number of days, got {days!r}")
    if days < 0:
        raise ConfigError(f"{option} must be zero or more days, got {days:g}")
    return float(days)


def _age_days(path: Path, now: float) -> float:
    return max(0.0, (now - path.stat().st_mtime) / DAY)


def expired(run: Path, days: float, now: float | None = None) -> list[Removal]:
    """What is older than ``days`` (by the time it was written): kept scans and answers."""
    check_days(days)
    now = time.time() if now is None else now
    found = []
    for folder, kind in ((run / KEPT_FOLDER, "kept scan"), (run / ANSWERS, "answer")):
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if path.name.startswith("."):
                continue  # a copy still being written
            age = _age_days(path, now)
            if age > days:
                found.append(Removal(kind, path.stem if kind == "answer" else path.name, path, age))
    return found


def purge(
    run: Path, days: float, *, dry_run: bool = False, now: float | None = None
) -> list[Removal]:
    """Remove what :func:`expired` finds (nothing with ``dry_run``), logging each removal in
    ``RUN/review/purged.jsonl`` before it is removed."""
    found = expired(run, days, now)
    if dry_run or not found:
        return found
    log = run / PURGE_LOG
    private_dir(log.parent)
    new_private_file(log)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now))
    with log.open("a", encoding="utf-8") as handle:
        for item in found:
            record = {
                "time": stamp,
                "kind": item.kind,
                "key": item.key,
                "age_days": round(item.age_days, 2),
                "path": str(item.path.relative_to(run)),
                "retention_days": days,
            }
            handle.write(json.dumps(record) + "\n")
            handle.flush()
            if item.path.is_dir():
                shutil.rmtree(item.path)
            else:
                item.path.unlink(missing_ok=True)
    return found
