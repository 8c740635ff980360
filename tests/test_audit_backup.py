"""The audit log's online backup: a consistent, owner-only copy while a writer is active."""

from __future__ import annotations

import sqlite3
import threading
from contextlib import closing

import pytest

from medfed.clinic.audit import AuditEntry, AuditError, AuditLog


def _entry(i: int) -> AuditEntry:
    return AuditEntry(f"t{i}", f"{i}.jpg", "0" * 64, "density_ratio", "routed", "acrima",
                      {"acrima": 1.0}, "glaucoma", 0.9, 1.0)  # fmt: skip


def test_a_backup_holds_every_row_while_a_writer_is_active(tmp_path):
    log = AuditLog(tmp_path)
    log.append([_entry(i) for i in range(50)])
    stop = threading.Event()

    def write() -> None:
        i = 50
        while not stop.is_set():
            log.append([_entry(i)])
            i += 1

    writer = threading.Thread(target=write)
    writer.start()
    try:
        copy = log.backup(tmp_path / "backup.sqlite")
    finally:
        stop.set()
        writer.join()

    with closing(sqlite3.connect(copy)) as db:
        ids = [row[0] for row in db.execute("SELECT id FROM routed ORDER BY id")]
    assert ids == list(range(1, len(ids) + 1)) and len(ids) >= 50
    assert copy.stat().st_mode & 0o777 == 0o600


def test_a_backup_into_a_missing_folder_is_refused(tmp_path):
    log = AuditLog(tmp_path)
    log.append([_entry(0)])

    with pytest.raises(AuditError, match="folder that exists"):
        log.backup(tmp_path / "nowhere" / "backup.sqlite")
