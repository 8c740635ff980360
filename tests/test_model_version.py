"""model.json carries the model version; a run written before it had one still loads, and a
model this medfed cannot build is refused with what to do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from medfed.routing.bundle import MODEL_VERSION, TrainedFederation
from tests.badinput import Case, Shared, check


def _edited(change):
    def make(tmp: Path, s: Shared) -> list:
        run = s.copy_run(tmp)
        path = run / "model" / "model.json"
        path.write_text(json.dumps(change(json.loads(path.read_text()))), encoding="utf-8")
        scan = sorted(s.data.rglob("*.png"))[0]
        return ["route", run, scan, "--device", "cpu", "--no-audit"]

    return make


def _with(**fields):
    return _edited(lambda model: {**model, **fields})


def _backbone(name: str):
    def change(model: dict) -> dict:
        model["spec"]["backbone"] = name
        return model

    return _edited(change)


CASES = [
    Case("model.json of a newer model version", _with(model_version=MODEL_VERSION + 1), 2,
         ("model.json", f"model version {MODEL_VERSION + 1}", "upgrade medfed")),
    Case("model.json's model version is text", _with(model_version="2"), 2,
         ("model.json", "model_version", "whole number")),
    Case("model.json names a backbone this version does not build", _backbone("vit-huge"), 2,
         ("model.json", "'vit-huge'", "retrain")),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=str)
def test_a_model_this_medfed_cannot_load_is_refused_by_name(case, tmp_path, shared):
    check(case, tmp_path, shared)


def test_a_run_records_its_model_version_and_one_without_it_still_loads(tmp_path, shared):
    run = shared.copy_run(tmp_path)
    path = run / "model" / "model.json"
    info = json.loads(path.read_text(encoding="utf-8"))
    assert info["model_version"] == MODEL_VERSION

    del info["model_version"]  # as runs were written before the version was recorded
    path.write_text(json.dumps(info), encoding="utf-8")
    federation = TrainedFederation.load(run, device="cpu")

    assert [s.id for s in federation.sites] == [s["id"] for s in info["sites"]]
