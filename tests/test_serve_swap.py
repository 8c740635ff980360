"""Replacing the served model by a newer run (``medfed ops promote``) and going back
(``medfed ops rollback``): a bounded load against ``medfed serve`` across the replacement loses
no scan, every answer names the model that gave it and is that model's answer, the audit log
stays one trail, and a PACS inbox answers with the new model too."""

from __future__ import annotations

import io
import json
import shutil
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from typer.testing import CliRunner

from medfed.cli import app as cli
from medfed.clinic.releases import LiveModel, history, kept_models, promote
from medfed.clinic.route import route_one
from medfed.runs.rundir import RunDir
from tests.badinput import Shared

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

REQUESTS = 36  # the bounded load: this many scans, 4 at a time
AFTER = 6  # scans sent once the replacement is done


@pytest.fixture(scope="module")
def newer(shared: Shared, tmp_path_factory) -> Path:
    """A second run over the same sites: another seed, one more round (another model)."""
    out = tmp_path_factory.mktemp("newer") / "run"
    argv = ["train", "--sites", *map(str, shared.manifests()), "--algorithm", "feddrm"]
    argv += ["--rounds", "3", "--local-steps", "1", "--seed", "7", "--device", "cpu"]
    argv += ["--out", str(out), "--no-progress"]
    done = CliRunner().invoke(cli, argv)
    assert done.exit_code == 0, done.output
    return out


def _photos(shared: Shared) -> list[Path]:
    return sorted((shared.data / "ACRIMA").glob("*.jpg"))[:6]


def _offline(run: Path, photos: list[Path]) -> dict[str, dict[str, dict[str, float]]]:
    """Each photo's site posterior as ``run``'s model gives it, by photo name."""
    live = LiveModel.open(run, "auto", "cpu")
    fed, router = live.current()
    return {p.name: route_one(fed, router, p).site_probs for p in photos}


def _models(run: Path) -> dict[int, str | None]:
    with sqlite3.connect(run / "audit.sqlite") as db:
        rows = db.execute("SELECT id, model FROM routed").fetchall()
    db.close()
    return dict(rows)


def test_a_load_across_a_replacement_loses_nothing_and_names_each_answers_model(
    shared: Shared, newer: Path, tmp_path: Path
) -> None:
    from medfed.clinic.pacs.uploads import Limits
    from medfed.clinic.serve import Served, create_app
    from medfed.ops.telemetry import EventLog

    live = shared.copy_run(tmp_path)
    old_id, new_id = RunDir(live).model_id(), RunDir(newer).model_id()
    assert old_id != new_id
    photos = _photos(shared)
    expected = {old_id: _offline(live, photos), new_id: _offline(newer, photos)}
    assert expected[old_id] != expected[new_id]  # the answers tell the two models apart

    lines = io.StringIO()
    log = EventLog("json", lines)
    fed, router = LiveModel.open(live, "auto", "cpu").current()
    client = TestClient(
        create_app({"live": Served("live", live, fed, router)}, Limits(), None, log)
    )

    half = threading.Event()
    sent = iter(range(REQUESTS))
    count = threading.Lock()
    done_count = [0]

    def ask(i: int) -> dict:
        photo = photos[i % len(photos)]
        answer = client.post("/route", params={"name": photo.name}, content=photo.read_bytes())
        with count:
            done_count[0] += 1
            if done_count[0] >= REQUESTS // 3:
                half.set()
        assert answer.status_code == 200, answer.text
        return answer.json()

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(ask, i) for i in sent]
        assert half.wait(120)
        promote(live, newer, "a newer run")  # while scans are being answered
        answers = [f.result(timeout=120) for f in futures]
    after = [ask(i) for i in range(AFTER)]

    # nothing lost: every scan answered once and logged once
    everything = answers + after
    assert len(everything) == REQUESTS + AFTER
    ids = [a["audit_id"] for a in everything]
    assert len(set(ids)) == len(ids)
    logged = _models(live)
    assert sorted(logged) == sorted(ids)
    # each answer names its model, as its audit row does, and is that model's answer
    for a in everything:
        assert a["model"] in (old_id, new_id)
        assert logged[a["audit_id"]] == a["model"]
        assert a["site_probs"] == pytest.approx(expected[a["model"]][a["file"]], abs=1e-5)
    assert {a["model"] for a in answers} >= {old_id}  # answered by the old model before
    assert {a["model"] for a in after} == {new_id}  # and only by the new one once replaced
    assert client.get("/health").json()["runs"]["live"]["model"] == new_id
    events = [json.loads(line) for line in lines.getvalue().splitlines()]
    assert any(e["event"] == "model.replaced" and e["model"] == new_id for e in events)
    metrics = client.get("/metrics").text
    assert 'medfed_serve_model_changes_total{result="replaced"} 1.0' in metrics

    # rollback is one command; the trail goes on in the same log
    back = CliRunner().invoke(cli, ["ops", "rollback", str(live), "--reason", "check"])
    assert back.exit_code == 0, back.output
    again = ask(0)
    assert again["model"] == old_id and again["audit_id"] > max(ids)
    assert [(r.action, r.model, r.replaced) for r in history(live)] == [
        ("promote", new_id, old_id),
        ("rollback", old_id, new_id),
    ]
    assert kept_models(live) == [new_id]
    listed = CliRunner().invoke(cli, ["ops", "releases", str(live)])
    assert listed.exit_code == 0 and f"serving: {old_id}" in listed.output, listed.output
    assert (live / "releases").stat().st_mode & 0o077 == 0  # owner-only, as the run's data


def test_promote_keeps_the_clinic_record_and_the_replaced_model_whole(
    shared: Shared, newer: Path, tmp_path: Path
) -> None:
    live = shared.copy_run(tmp_path)
    old_id = RunDir(live).model_id()
    (live / "review").mkdir()
    (live / "review" / "note.txt").write_text("kept", encoding="utf-8")
    before = {p.name for p in (live / "model").iterdir()}

    done = CliRunner().invoke(cli, ["ops", "promote", str(live), str(newer), "--reason", "v2"])

    assert done.exit_code == 0, done.output
    assert RunDir(live).model_id() == RunDir(newer).model_id()
    assert (live / "summary.json").read_bytes() == (newer / "summary.json").read_bytes()
    assert (live / "review" / "note.txt").read_text(encoding="utf-8") == "kept"
    kept = live / "releases" / old_id
    assert {p.name for p in (kept / "model").iterdir()} == before
    assert RunDir(kept).model_id() == old_id
    assert newer.is_dir() and (newer / "model").is_dir()  # the source run is left as it was


def test_a_pacs_inbox_answers_with_the_promoted_model(
    shared: Shared, newer: Path, tmp_path: Path
) -> None:
    from medfed.clinic.pacs.handling import Inbox
    from tests.pacs_studies import fundus_photo

    live = shared.copy_run(tmp_path)
    old_id = RunDir(live).model_id()
    model = LiveModel.open(live, "auto", "cpu")
    inbox = Inbox(live, *model.current(), "test", live=model)
    photo = _photos(shared)[0]
    first = inbox.handle([fundus_photo(photo, "P1")], send=lambda report: None)
    promote(live, newer, "")
    second = inbox.handle([fundus_photo(photo, "P2")], send=lambda report: None)
    logged = _models(live)
    assert logged[first.scan.audit_id] == old_id
    assert logged[second.scan.audit_id] == RunDir(newer).model_id()


def test_a_replacement_that_cannot_load_leaves_the_old_model_answering(
    shared: Shared, tmp_path: Path
) -> None:
    live = shared.copy_run(tmp_path / "live")
    model = LiveModel.open(live, "auto", "cpu")
    told: list = []
    model.on_swap = lambda before, after, problem: told.append((before, after, problem))
    old_id = model.current()[0].model_id
    # the history changed (by hand) while a model file is missing: the reload fails
    shutil.move(live / "model" / "model.json", tmp_path / "model.json")
    (live / "releases").mkdir(exist_ok=True)
    (live / "releases" / "history.jsonl").write_text("\n", encoding="utf-8")

    fed, _ = model.current()

    assert fed.model_id == old_id
    assert told and told[0][0] == told[0][1] == old_id and "model.json" in told[0][2]
    assert model.problem is not None
