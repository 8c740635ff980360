"""The dashboard's bad-input corpus: one row per damaged run file.

Each row copies a good trained run (fedavg), damages one file, and opens every page over it and
a second, untouched run (feddrm). Every page must show no traceback; the pages a row names must
warn about the damaged run, naming its file; the untouched run must still be shown on every
page. No row trains: the runs are built once per session (tests/dashboard_runs.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from streamlit import config as streamlit_config
from streamlit.testing.v1 import AppTest

from medfed.clinic.audit import AUDIT_SCHEMA_VERSION
from medfed.dashboard import APP, RUNS_ENV
from tests.dashboard_runs import DashboardRuns, dashboard_runs  # noqa: F401 - session fixture

PAGES = ("federation", "training", "sites", "routing", "review", "communication")
EVERY_PAGE = PAGES
TIMEOUT = 120
DAMAGED, GOOD = "fedavg", "feddrm"
NOT_UTF8 = b"\xff\xfe\x00garbage\x80\x81"


@dataclass(frozen=True)
class Damage:
    """One damaged file: how to damage it, where the warning must show, and what it says."""

    name: str
    file: str  # relative to the run directory
    damage: Callable[[Path], None]  # (the file's path) -> None
    words: tuple[str, ...]  # each must be in the warning (besides the run's name)
    pages: tuple[str, ...] = EVERY_PAGE  # the pages that must warn
    absent: tuple[str, ...] = ()  # words the warning must not hold

    def __str__(self) -> str:
        return self.name


def text(content: str) -> Callable[[Path], None]:
    return lambda path: path.write_text(content, encoding="utf-8")


def raw(content: bytes) -> Callable[[Path], None]:
    return lambda path: path.write_bytes(content)


def edit_json(change: Callable[[dict], object]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        data = json.loads(path.read_text(encoding="utf-8"))
        changed = change(data)
        path.write_text(json.dumps(data if changed is None else changed), encoding="utf-8")

    return damage


def middle_line(replacement: str) -> Callable[[Path], None]:
    """Replace the first line of a JSON-lines file (the last one may be cut short by a kill)."""

    def damage(path: Path) -> None:
        lines = path.read_text(encoding="utf-8").splitlines()
        path.write_text("\n".join([replacement, *lines[1:]]) + "\n", encoding="utf-8")

    return damage


def replace_with_folder(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
    path.mkdir()
    (path / "junk").write_text("x")


def replace_with_file(path: Path) -> None:
    shutil.rmtree(path)
    path.write_text("not a model folder")


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()


def sqlite_garbage(path: Path) -> None:
    path.write_bytes(b"this is not an SQLite database " * 100)


def from_newer_medfed(path: Path) -> None:
    """An audit log as a later medfed writes it: its schema version one ahead."""
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {AUDIT_SCHEMA_VERSION + 1}")
    db.close()


def first_card(run: Path) -> Path:
    return sorted((run / "site_overview" / "cards").glob("*.md"))[0]


CASES = [
    Damage("summary.json holds an empty object", "summary.json", text("{}"), ("summary.json",)),
    Damage("summary.json holds a list", "summary.json", text("[]"), ("summary.json",)),
    Damage("summary.json is not JSON", "summary.json", text("{not json"), ("summary.json", "JSON")),
    Damage(
        "summary.json is not UTF-8 text", "summary.json", raw(NOT_UTF8), ("summary.json", "UTF-8")
    ),
    Damage(
        "summary.json lists its sites as a list",
        "summary.json",
        edit_json(lambda d: d.update(sites=[1, 2])),
        ("summary.json", "sites"),
    ),
    Damage(
        "summary.json holds a word for a number",
        "summary.json",
        edit_json(lambda d: d.update(mean_site_auc="high")),
        ("summary.json", "mean_site_auc"),
    ),
    Damage(
        "config.toml is not TOML", "config.toml", text("[train\nrounds = "), ("config.toml", "TOML")
    ),
    Damage(
        "config.toml has train as a string",
        "config.toml",
        text('train = "fast"\n'),
        ("config.toml", "[train]"),
    ),
    Damage(
        "config.toml has rounds as a word",
        "config.toml",
        text('[train]\nrounds = "three"\n'),
        ("config.toml", "rounds"),
    ),
    Damage(
        "config.toml lists sites without ids",
        "config.toml",
        text('[train]\nrounds = 3\n[[sites]]\nname = "x"\n'),
        ("config.toml", "sites"),
    ),
    Damage("config.toml is not UTF-8 text", "config.toml", raw(NOT_UTF8), ("config.toml",)),
    Damage(
        "a metrics.jsonl line is not JSON",
        "metrics.jsonl",
        middle_line("{cut short"),
        ("metrics.jsonl:1", "not valid JSON"),
    ),
    Damage(
        "a metrics.jsonl line is a list",
        "metrics.jsonl",
        middle_line("[1, 2]"),
        ("metrics.jsonl:1", "not a JSON object"),
    ),
    Damage(
        "a metrics.jsonl record has a word for its round",
        "metrics.jsonl",
        middle_line('{"round": "first", "site": "acrima", "status": "ok"}'),
        ("metrics.jsonl",),
    ),
    Damage("metrics.jsonl is not UTF-8 text", "metrics.jsonl", raw(NOT_UTF8), ("metrics.jsonl",)),
    Damage(
        "an events.jsonl line is not JSON",
        "events.jsonl",
        middle_line("{cut short"),
        ("events.jsonl:1", "not valid JSON"),
    ),
    Damage(
        "an events.jsonl event has no kind",
        "events.jsonl",
        middle_line('{"time": 1.0}'),
        ("events.jsonl:1", "without its kind"),
    ),
    Damage(
        "an events.jsonl line is a list",
        "events.jsonl",
        middle_line('["resume"]'),
        ("events.jsonl:1", "not a JSON object"),
    ),
    Damage("events.jsonl is not UTF-8 text", "events.jsonl", raw(NOT_UTF8), ("events.jsonl",)),
    Damage(
        "predictions.csv is not UTF-8 text",
        "predictions.csv",
        raw(NOT_UTF8),
        ("predictions.csv",),
    ),
    Damage(
        "predictions.csv has the wrong columns",
        "predictions.csv",
        text("a,b\n1,2\n"),
        ("predictions.csv",),
    ),
    Damage(
        "predictions.csv is a folder",
        "predictions.csv",
        replace_with_folder,
        ("predictions.csv", "folder"),
    ),
    Damage(
        "audit.sqlite is not an SQLite database",
        "audit.sqlite",
        sqlite_garbage,
        ("audit.sqlite",),
    ),
    Damage(
        "audit.sqlite was written by a newer medfed",
        "audit.sqlite",
        from_newer_medfed,
        ("audit.sqlite", "newer medfed", "upgrade medfed"),
        absent=("the file is damaged", "retrain"),
    ),
    Damage(
        "the model folder is a file",
        "model",
        replace_with_file,
        ("model", "not a folder"),
    ),
    Damage("model.json is not JSON", "model/model.json", text("{oops"), ("model.json", "JSON")),
    Damage("model.json holds a list", "model/model.json", text("[]"), ("model.json",)),
    Damage(
        "model.json is missing from a finished run",
        "model/model.json",
        remove,
        ("model.json", "missing"),
    ),
    Damage(
        "the model folder is missing from a finished run",
        "model",
        remove,
        ("model.json", "missing"),
        ("routing",),
    ),
    Damage(
        "a site's weights file is garbage",
        "model/site_acrima.safetensors",
        raw(b"\x00" * 64),
        ("model",),
        ("routing",),
    ),
    Damage(
        "overview.json is not JSON",
        "site_overview/overview.json",
        text("{nope"),
        ("overview.json", "JSON"),
    ),
    Damage(
        "overview.json lists its sites as a list",
        "site_overview/overview.json",
        edit_json(lambda d: d.update(sites=["acrima"])),
        ("overview.json", "sites"),
    ),
    Damage(
        "overview.json counts hold words",
        "site_overview/overview.json",
        edit_json(lambda d: d["sites"]["acrima"].update(counts={"train": {"normal": "many"}})),
        ("overview.json", "acrima", "counts"),
    ),
    Damage(
        "overview.json distances are not square",
        "site_overview/overview.json",
        edit_json(lambda d: d["distances"].update(matrix=[[0.0]])),
        ("overview.json", "distances"),
    ),
    Damage(
        "overview.json embedding lists differ in length",
        "site_overview/overview.json",
        edit_json(lambda d: d["embedding"].update(x=[0.0])),
        ("overview.json", "embedding"),
    ),
    Damage("a data card is not UTF-8 text", "CARD", raw(NOT_UTF8), ("acrima.md", "UTF-8")),
    Damage("a data card is a folder", "CARD", replace_with_folder, ("acrima.md",)),
]


def plain(shown: str) -> str:
    """Markdown as it reads on the page (escapes and bold marks dropped)."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", shown).replace("**", "")


def everything(at: AppTest) -> str:
    """All a page shows in words: texts, table cells and headers, choices offered."""
    parts = [
        str(e.value)
        for kind in ("markdown", "caption", "info", "warning", "error", "title", "subheader")
        for e in at.get(kind)
    ]
    for table in [*at.table, *at.dataframe]:
        frame = table.value
        parts += [str(frame.index.tolist()), str(frame.columns.tolist())]
    for widget in [*at.selectbox, *at.multiselect]:
        parts.append(str(list(widget.options)))
    return plain("\n".join(parts))


@pytest.fixture
def damaged_run(request, dashboard_runs: DashboardRuns, tmp_path: Path) -> Path:  # noqa: F811
    case: Damage = request.param
    run = tmp_path / DAMAGED
    shutil.copytree(dashboard_runs.fedavg, run, ignore=shutil.ignore_patterns("checkpoints"))
    target = first_card(run) if case.file == "CARD" else run / case.file
    assert target.exists() or case.file == "audit.sqlite", f"the good run has no {case.file}"
    case.damage(target)
    return run


@pytest.mark.parametrize(
    ("case", "damaged_run"),
    [pytest.param(c, c, id=c.name) for c in CASES],
    indirect=["damaged_run"],
)
def test_a_damaged_run_is_named_and_left_out_on_every_page(
    case: Damage,
    damaged_run: Path,
    dashboard_runs: DashboardRuns,  # noqa: F811
    monkeypatch,
) -> None:
    monkeypatch.setenv(RUNS_ENV, os.pathsep.join([str(damaged_run), str(dashboard_runs.feddrm)]))
    streamlit_config.set_option("server.address", "127.0.0.1")
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT).run()
    for page in PAGES:
        at.switch_page(f"views/{page}.py").run()
        if page in case.pages and page in ("routing", "review"):
            # the run is picked on this page: pick the damaged one
            box = next((s for s in at.selectbox if s.key == f"{page}_run"), None)
            if box is not None and DAMAGED in box.options:
                box.set_value(DAMAGED).run()
        assert not at.exception, (page, [e.value for e in at.exception])
        warning = plain("\n".join(str(w.value) for w in at.warning))
        if page in case.pages:
            assert DAMAGED in warning, (page, warning)
            for word in case.words:
                assert word.lower() in warning.lower(), (page, word, warning)
            for word in case.absent:
                assert word.lower() not in warning.lower(), (page, word, warning)
        assert GOOD in everything(at), (page, "the good run is no longer shown")


def test_every_row_damages_a_different_way() -> None:
    assert len({c.name for c in CASES}) == len(CASES) >= 20
