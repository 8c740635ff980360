"""``medfed pacs load``: a small bounded load test of a real ``medfed serve`` process, steady
and across a kill and restart; every accepted request has its audit row (lost = 0), and the
table is written between the page's markers."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from medfed.cli import app
from tests.badinput import Shared

pytest.importorskip("fastapi")
pytestmark = pytest.mark.slow  # starts medfed serve three times (~30 s)


def test_load_then_kill_and_restart_loses_no_answer(shared: Shared, tmp_path: Path) -> None:
    page = tmp_path / "pacs.md"
    page.write_text("# x\n<!-- serve-load:start -->\nold\n<!-- serve-load:end -->\nafter\n")
    scan = sorted((shared.data / "ACRIMA").glob("*.jpg"))[0]
    argv = ["pacs", "load", str(shared.run), "--scan", str(scan), "--clients", "3"]
    argv += ["--requests", "12", "--update-docs", str(page)]

    result = CliRunner().invoke(app, argv)

    assert result.exit_code == 0, result.output
    assert "kill: 12/12 answered" in result.output and "1 kill and restart" in result.output
    text = page.read_text()
    rows = [line for line in text.splitlines() if line.startswith(("| steady", "| kill"))]
    assert len(rows) == 2 and all(row.endswith("| 0 |") for row in rows)
    assert "old" not in text and text.endswith("after\n")
    assert not (shared.run / "audit.sqlite").exists()  # served from a copy


def test_a_page_without_the_markers_is_refused_before_loading(shared: Shared, tmp_path) -> None:
    page = tmp_path / "page.md"
    page.write_text("no markers\n")
    scan = sorted((shared.data / "ACRIMA").glob("*.jpg"))[0]
    argv = ["pacs", "load", str(shared.run), "--scan", str(scan), "--update-docs", str(page)]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code != 0 and "serve-load:start" in result.output
