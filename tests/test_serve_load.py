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


@pytest.mark.slow  # starts medfed serve three times (~45 s)
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


@pytest.mark.parametrize(
    ("page_text", "scan_name", "words"),
    [
        ("no markers\n", None, "serve-load:start"),
        (None, None, "no such file"),
        ("<!-- serve-load:start -->\n<!-- serve-load:end -->\n", "missing.jpg", "--scan"),
    ],
)
def test_bad_load_settings_are_refused_before_loading(
    shared: Shared, tmp_path, page_text, scan_name, words
) -> None:
    page = tmp_path / "page.md"
    if page_text is not None:
        page.write_text(page_text)
    scan = tmp_path / scan_name if scan_name else sorted((shared.data / "ACRIMA").glob("*.jpg"))[0]
    argv = ["pacs", "load", str(shared.run), "--scan", str(scan), "--update-docs", str(page)]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code != 0 and words in result.output, result.output
    assert "Traceback" not in result.output
