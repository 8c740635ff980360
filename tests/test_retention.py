"""Retention: kept scans and written-back reports older than the retention are removed, each
removal logged (owner-only), the audit log untouched; a dry run removes nothing."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from typer.testing import CliRunner

from medfed.cli import app
from medfed.clinic.retention import PURGE_LOG, expired, purge
from tests.badinput import Shared

DAY = 86400
SHA_OLD, SHA_NEW = "a" * 64, "b" * 64


def _aged(path: Path, days: float) -> Path:
    when = time.time() - days * DAY
    os.utime(path, (when, when))
    return path


def _data(run: Path) -> dict[str, Path]:
    scans = run / "review" / "scans"
    answers = run / "pacs" / "answers"
    made = {}
    for sha, days in ((SHA_OLD, 40), (SHA_NEW, 2)):
        folder = scans / sha
        folder.mkdir(parents=True)
        (folder / "photo.jpg").write_bytes(b"jpeg")
        made[sha] = _aged(folder, days)
    answers.mkdir(parents=True)
    for uid, days in (("1.2.3", 31), ("1.2.4", 1)):
        (answers / f"{uid}.dcm").write_bytes(b"sr")
        made[uid] = _aged(answers / f"{uid}.dcm", days)
    (run / "audit.sqlite").write_bytes(b"the audit log")
    return made


def test_what_is_older_than_the_retention_is_removed_and_logged(tmp_path) -> None:
    made = _data(tmp_path)

    listed = purge(tmp_path, 30, dry_run=True)
    assert {(r.kind, r.key) for r in listed} == {("kept scan", SHA_OLD), ("answer", "1.2.3")}
    assert all(p.exists() for p in made.values())  # a dry run removes nothing
    assert not (tmp_path / PURGE_LOG).exists()

    removed = purge(tmp_path, 30)

    assert {r.key for r in removed} == {SHA_OLD, "1.2.3"}
    assert not made[SHA_OLD].exists() and not made["1.2.3"].exists()
    assert made[SHA_NEW].exists() and made["1.2.4"].exists()
    log = [json.loads(line) for line in (tmp_path / PURGE_LOG).read_text().splitlines()]
    assert {(r["kind"], r["key"]) for r in log} == {("kept scan", SHA_OLD), ("answer", "1.2.3")}
    assert all(r["retention_days"] == 30 and r["age_days"] > 30 for r in log)
    assert (tmp_path / PURGE_LOG).stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "audit.sqlite").read_bytes() == b"the audit log"
    assert expired(tmp_path, 30) == []


def test_review_purges_a_run_from_the_command_line(shared: Shared, tmp_path) -> None:
    run = shared.copy_run(tmp_path)
    made = _data(run)

    dry = CliRunner().invoke(app, ["review", str(run), "--purge-older-than", "30", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "would remove 2 item(s) older than 30 days" in dry.output
    assert made[SHA_OLD].exists()
    done = CliRunner().invoke(app, ["review", str(run), "--purge-older-than", "30"])
    assert done.exit_code == 0, done.output
    assert f"removed kept scan {SHA_OLD}" in done.output and "logged in" in done.output
    assert not made[SHA_OLD].exists() and made[SHA_NEW].exists()
