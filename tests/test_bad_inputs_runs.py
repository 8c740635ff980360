"""The bad-input corpus, run directory cases: summaries, model files, checkpoints and resume,
and training whose every round was skipped (see tests/badinput.py for the policy).

Model rows route one scan (or evaluate) on a damaged copy of the shared run; resume rows run
``medfed train --resume`` on a damaged copy with the shared run's sites and settings, and fail
before any round trains."""

from __future__ import annotations

import inspect
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from medfed.cli import app
from medfed.core.progress import counter
from medfed.federation import rounds
from medfed.federation.rounds import round_postfix
from medfed.routing.bundle import TrainedFederation
from medfed.runs import RunDir
from medfed.runs.rundir import FILES, sha256, verify_folder, write_files_manifest
from tests.badinput import Case, Shared, check

SITE = "site_acrima.safetensors"
GLOBAL = "global.safetensors"
LAST = "checkpoints/round_0002"


# ---------------------------------------------------------------------- building bad inputs
def _scan(s: Shared) -> Path:
    return sorted(s.data.rglob("*.png"))[0]


def _route(run: Path, s: Shared) -> list:
    return ["route", run, _scan(s), "--device", "cpu", "--no-audit"]


def _resume(run: Path, s: Shared) -> list:
    argv = ["train", "--sites", *s.manifests(), "--algorithm", "feddrm", "--rounds", "2"]
    argv += ["--local-steps", "1", "--device", "cpu", "--out", run, "--no-progress"]
    return [*argv, "--resume"]


COMMANDS = {
    "route": _route,
    "evaluate": lambda run, s: ["evaluate", run],
    "report": lambda run, s: ["report", run, "--out", run.parent / "report.html"],
    "resume": _resume,
}


def _on_run(command: str, *edits):
    """``command`` on a copy of the shared run after ``edits`` (each ``edit(run)``)."""

    def make(tmp, s: Shared) -> list:
        run = s.copy_run(tmp)
        for edit in edits:
            edit(run)
        return COMMANDS[command](run, s)

    return make


def write(name: str, content: str | bytes):
    def edit(run: Path) -> None:
        data = content.encode() if isinstance(content, str) else content
        (run / name).write_bytes(data)

    return edit


def remove(name: str):
    return lambda run: (run / name).unlink()


def without_files_json(folder: str):
    """A folder as runs wrote it before files.json existed."""
    return lambda run: (run / folder / FILES).unlink()


def json_edit(name: str, change):
    def edit(run: Path) -> None:
        data = json.loads((run / name).read_text(encoding="utf-8"))
        data = change(data)
        (run / name).write_text(json.dumps(data), encoding="utf-8")

    return edit


def tensors(name: str, change, *, relist: bool = False):
    """Rewrite the weights in ``name`` with ``change(state)``; ``relist``: update files.json as
    if the run had written them so (a diverged run), so only the content checks can object."""

    def edit(run: Path) -> None:
        path = run / name
        state = load_file(str(path))
        change(state)
        save_file(state, str(path))
        if relist:
            listed = json.loads((path.parent / FILES).read_text())["files"]
            write_files_manifest(path.parent, list(listed))

    return edit


def first_key(state: dict, floating: bool = True) -> str:
    return next(k for k, v in state.items() if v.is_floating_point() or not floating)


def to_half(state):
    key = first_key(state)
    state[key] = state[key].half()


def reshape(state):
    key = first_key(state)
    state[key] = state[key].reshape(-1)


def drop_key(state):
    del state[first_key(state)]


def add_key(state):
    state["stray.weight"] = torch.zeros(2)


def make_nan(state):
    key = first_key(state)
    state[key] = state[key].clone()
    state[key].view(-1)[0] = float("nan")


def make_inf(state):
    key = first_key(state)
    state[key] = state[key].clone()
    state[key].view(-1)[0] = float("inf")


def empty(state):
    state.clear()


def flip_byte(name: str):
    def edit(run: Path) -> None:
        data = bytearray((run / name).read_bytes())
        data[-3] ^= 0xFF
        (run / name).write_bytes(bytes(data))

    return edit


def flip_header_byte(name: str):
    def edit(run: Path) -> None:
        data = bytearray((run / name).read_bytes())
        data[100] ^= 0xFF  # inside the safetensors header
        (run / name).write_bytes(bytes(data))

    return edit


def cut_short(name: str):
    def edit(run: Path) -> None:
        data = (run / name).read_bytes()
        (run / name).write_bytes(data[: len(data) // 2])

    return edit


def copy_file(src: str, dst: str):
    return lambda run: shutil.copyfile(run / src, run / dst)


def normalization(key: str, value):
    def change(model: dict) -> dict:
        model["sites"][0]["normalization"][key] = value
        return model

    return json_edit("model/model.json", change)


def summary_field(change):
    return json_edit("summary.json", change)


def _set(data: dict, path: tuple[str, ...], value) -> dict:
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


def state_round(n) -> object:
    return json_edit(f"{LAST}/state.json", lambda d: d | {"round": n})


def move(src: str, dst: str):
    return lambda run: (run / src).rename(run / dst)


def config_text(text: bytes):
    return write("config.toml", text)


def to_folder(name: str):
    """``name`` replaced by an empty folder."""

    def edit(run: Path) -> None:
        path = run / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
        path.mkdir()

    return edit


def to_link(name: str, target: str):
    """``name`` replaced by a link to ``target`` (a device such as /dev/zero: endless bytes)."""

    def edit(run: Path) -> None:
        path = run / name
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        path.symlink_to(target)

    return edit


def sparse(name: str, size: int):
    """``name`` grown to ``size`` bytes without writing them (a sparse file)."""

    def edit(run: Path) -> None:
        with open(run / name, "r+b") as handle:
            handle.truncate(size)

    return edit


def emptied(folder: str):
    def edit(run: Path) -> None:
        for path in (run / folder).iterdir():
            path.unlink()

    return edit


def rmtree(folder: str):
    return lambda run: shutil.rmtree(run / folder)


def _twice(tmp, s: Shared) -> list:
    run = s.copy_run(tmp)
    return ["report", run, run.parent / "." / "run", "--out", tmp / "report.html"]


def _a_file(tmp, s: Shared) -> list:
    (tmp / "afile").write_text("not a run\n")
    return ["evaluate", tmp / "afile"]


def _evaluate_json(*edits):
    make = _on_run("evaluate", *edits)
    return lambda tmp, s: [*make(tmp, s), "--json"]


def site_value(key: str, value):
    return summary_field(lambda d: _set(d, ("sites", "acrima", key), value))


NOT_UTF8 = b"\xff\xfe\x00{"
M, C = "model/", f"{LAST}/"

CASES = [
    # --- summary.json, read by evaluate and report
    Case("summary.json is an empty object", _on_run("evaluate", write("summary.json", "{}")), 2,
         ("summary.json", "missing required field")),
    Case("summary.json is a list", _on_run("evaluate", write("summary.json", "[]")), 2,
         ("summary.json", "expected a JSON object")),
    Case("summary.json sites is a number",
         _on_run("evaluate", summary_field(lambda d: d | {"sites": 3})), 2,
         ("summary.json", "'sites'", "train the run again")),
    Case("summary.json a site's figures are a string",
         _on_run("evaluate", summary_field(lambda d: _set(d, ("sites", "acrima"), "good"))), 2,
         ("summary.json", "sites.acrima")),
    Case("summary.json a site's accuracy is text",
         _on_run("evaluate", summary_field(lambda d: _set(d, ("sites", "acrima", "accuracy"),
                                                           "high"))), 2,
         ("summary.json", "sites.acrima.accuracy", "a number")),
    Case("summary.json is not UTF-8", _on_run("evaluate", write("summary.json", NOT_UTF8)), 2,
         ("summary.json", "UTF-8")),
    Case("summary.json is empty", _on_run("evaluate", write("summary.json", "")), 2,
         ("summary.json", "not valid JSON")),
    Case("summary.json is missing", _on_run("evaluate", remove("summary.json")), 2,
         ("summary.json", "missing", "--resume")),
    Case("report on a summary.json that is an empty object",
         _on_run("report", write("summary.json", "{}")), 2, ("summary.json", "missing")),
    Case("report on a summary.json that is not UTF-8",
         _on_run("report", write("summary.json", NOT_UTF8)), 2, ("summary.json", "UTF-8")),
    Case("config.toml is missing", _on_run("evaluate", remove("config.toml")), 2,
         ("config.toml", "--out")),
    # --- figures out of their range: refused by name, never printed
    Case("summary.json mean site AUC is NaN",
         _on_run("evaluate", summary_field(lambda d: d | {"mean_site_auc": float("nan")})), 2,
         ("summary.json", "'mean_site_auc'", "from 0 to 1", "nan")),
    Case("summary.json a site's AUC is NaN", _on_run("evaluate", site_value("auc", float("nan"))),
         2, ("summary.json", "sites.acrima.auc", "nan")),
    Case("summary.json a site's accuracy is infinite",
         _on_run("evaluate", site_value("accuracy", float("inf"))), 2,
         ("summary.json", "sites.acrima.accuracy", "inf")),
    Case("summary.json a site's AUC is 7.5", _on_run("evaluate", site_value("auc", 7.5)), 2,
         ("summary.json", "sites.acrima.auc", "from 0 to 1", "7.5")),
    Case("summary.json a test count is negative", _on_run("evaluate", site_value("n_test", -6)),
         2, ("summary.json", "sites.acrima.n_test", "0 or more")),
    Case("summary.json bytes per round are negative",
         _on_run("evaluate", summary_field(lambda d: d | {"bytes_per_round": -1.0})), 2,
         ("summary.json", "'bytes_per_round'", "0 or more")),
    Case("summary.json seconds per round are infinite",
         _on_run("evaluate", summary_field(lambda d: d | {"seconds_per_round": float("inf")})),
         2, ("summary.json", "'seconds_per_round'")),
    Case("summary.json an AUC interval bound is NaN",
         _on_run("evaluate", summary_field(lambda d: _set(
             d, ("sites", "acrima", "auc_ci", "low"), float("nan")))), 2,
         ("summary.json", "sites.acrima.auc_ci.low")),
    Case("summary.json a calibration figure is NaN",
         _on_run("evaluate", summary_field(lambda d: _set(
             d, ("sites", "acrima", "calibration", "brier"), float("nan")))), 2,
         ("summary.json", "sites.acrima.calibration.brier")),
    Case("evaluate --json on a NaN AUC", _evaluate_json(site_value("auc", float("nan"))), 2,
         ("summary.json", "sites.acrima.auc")),
    # --- files that are not regular files, or far too large
    Case("summary.json is a folder", _on_run("evaluate", to_folder("summary.json")), 2,
         ("summary.json", "is a folder")),
    Case("summary.json is a link to /dev/zero",
         _on_run("evaluate", to_link("summary.json", "/dev/zero")), 2,
         ("summary.json", "not a regular file")),
    Case("summary.json is a 30 GB sparse file",
         _on_run("evaluate", sparse("summary.json", 30 * 10**9)), 2,
         ("summary.json", "30.00 GB", "64.00 MB")),
    Case("report on a summary.json linked to /dev/zero",
         _on_run("report", to_link("summary.json", "/dev/zero")), 2,
         ("summary.json", "not a regular file")),
    Case("model.json is a link to /dev/zero",
         _on_run("evaluate", to_link(M + "model.json", "/dev/zero")), 2,
         ("model.json", "not a regular file")),
    Case("route on a model.json linked to /dev/zero",
         _on_run("route", to_link(M + "model.json", "/dev/zero")), 2,
         ("model.json", "not a regular file")),
    Case("resume: metrics.jsonl is a folder", _on_run("resume", to_folder("metrics.jsonl")), 2,
         ("metrics.jsonl", "is a folder")),
    Case("config.toml is a folder", _on_run("evaluate", to_folder("config.toml")), 2,
         ("config.toml", "is a folder")),
    Case("config.toml is a link to /dev/zero",
         _on_run("evaluate", to_link("config.toml", "/dev/zero")), 2,
         ("config.toml", "not a regular file")),
    Case("evaluate an ordinary file", _a_file, 2, ("afile", "is a file, not a run directory")),
    Case("report the same run twice", _twice, 2, ("run", "given twice")),
    # --- a finished run's model/
    Case("evaluate a run whose model folder was deleted", _on_run("evaluate", rmtree("model")),
         2, ("model", "missing", "retrain")),
    Case("evaluate a run whose model folder was emptied", _on_run("evaluate", emptied("model")),
         2, ("model.json", "missing")),
    Case("evaluate a run whose model folder is a link to /dev/null",
         _on_run("evaluate", to_link("model", "/dev/null")), 2, ("model", "not a folder")),
    Case("report on a run whose model folder was deleted", _on_run("report", rmtree("model")), 2,
         ("model", "missing")),
    Case("a site's weight file is a folder", _on_run("evaluate", to_folder(M + SITE)), 2,
         (SITE, "is a folder", "files.json")),
    Case("a site's weight file is a link to /dev/zero",
         _on_run("route", to_link(M + SITE, "/dev/zero")), 2, (SITE, "not a regular file")),
    # --- model/model.json, read by route
    Case("model.json is an empty object", _on_run("route", write(M + "model.json", "{}")), 2,
         ("model.json", "'algorithm'", "retrain")),
    Case("model.json is a list", _on_run("route", write(M + "model.json", "[]")), 2,
         ("model.json", "expected a JSON object")),
    Case("model.json is not UTF-8", _on_run("route", write(M + "model.json", NOT_UTF8)), 2,
         ("model.json", "UTF-8")),
    Case("model.json sites is a number",
         _on_run("route", json_edit(M + "model.json", lambda d: d | {"sites": 3})), 2,
         ("model.json", "'sites'")),
    Case("model.json is missing", _on_run("route", remove(M + "model.json")), 2,
         ("model.json", "missing")),
    Case("normalization mean has one value for three channels",
         _on_run("route", normalization("mean", [0.5])), 2,
         ("model.json", "normalization mean", "3 channel")),
    Case("normalization std has four values",
         _on_run("route", normalization("std", [0.2, 0.2, 0.2, 0.2])), 2,
         ("model.json", "normalization std", "4 value")),
    Case("normalization std is zero", _on_run("route", normalization("std", [0.0, 0.2, 0.2])), 2,
         ("model.json", "normalization std", "unusable")),
    Case("normalization mean is text", _on_run("route", normalization("mean", "0.5")), 2,
         ("model.json", "normalization mean", "numbers")),
    # --- model/ weight files, checked against files.json
    Case("a site's weight file is missing", _on_run("route", remove(M + SITE)), 2,
         (SITE, "missing", "restore")),
    Case("a site's weight file has an edited byte", _on_run("route", flip_byte(M + SITE)), 2,
         (SITE, "sha256", "retrain")),
    Case("a site's weight file is cut short", _on_run("route", cut_short(M + SITE)), 2,
         (SITE, "retrain")),
    Case("a weight tensor was converted to float16",
         _on_run("route", tensors(M + SITE, to_half)), 2, (SITE, "dtype F16", "expected F32")),
    Case("a weight tensor was reshaped", _on_run("route", tensors(M + SITE, reshape)), 2,
         (SITE, "shape")),
    Case("a weight tensor is missing", _on_run("route", tensors(M + SITE, drop_key)), 2,
         (SITE, "missing tensor")),
    Case("a weight file holds an unexpected tensor", _on_run("route", tensors(M + SITE, add_key)),
         2, (SITE, "unexpected tensor", "stray.weight")),
    Case("model weights hold NaN", _on_run("route", tensors(M + SITE, make_nan, relist=True)), 2,
         (SITE, "NaN", "backbone.")),
    Case("the abstention file is missing", _on_run("route", remove(M + "abstention.safetensors")),
         2, ("abstention.safetensors", "missing")),
    Case("an unlisted weight file in model",
         _on_run("route", copy_file(M + SITE, M + "x.safetensors")), 2,
         ("x.safetensors", "not listed", "files.json")),
    Case("files.json is not JSON", _on_run("route", write(M + FILES, "{")), 2,
         ("files.json", "not valid JSON")),
    Case("files.json lists no files", _on_run("route", write(M + FILES, '{"files": []}')), 2,
         ("files.json", "weight manifest")),
    Case("files.json records another sha256",
         _on_run("route", json_edit(M + FILES, lambda d: _set(d, ("files", SITE, "sha256"),
                                                              "0" * 64))), 2,
         (SITE, "sha256")),
    Case("evaluate a run whose weights were edited", _on_run("evaluate", flip_byte(M + SITE)), 2,
         (SITE, "sha256")),
    Case("report on a run whose weight file is missing", _on_run("report", remove(M + SITE)), 2,
         (SITE, "missing")),
    # --- model/ of runs written before files.json: checked against the model and for NaN
    Case("old run: model weights hold infinity",
         _on_run("route", without_files_json("model"), tensors(M + SITE, make_inf)), 2,
         (SITE, "infinite")),
    Case("old run: a weight tensor in float16",
         _on_run("route", without_files_json("model"), tensors(M + SITE, to_half)), 2,
         (SITE, "dtype F16", "model.json")),
    Case("old run: a weight tensor reshaped",
         _on_run("route", without_files_json("model"), tensors(M + SITE, reshape)), 2,
         (SITE, "shape", "model.json")),
    Case("old run: a weight tensor is missing",
         _on_run("route", without_files_json("model"), tensors(M + SITE, drop_key)), 2,
         (SITE, "missing tensor")),
    Case("old run: an unexpected tensor",
         _on_run("route", without_files_json("model"), tensors(M + SITE, add_key)), 2,
         (SITE, "unexpected tensor")),
    Case("old run: the abstention file holds the wrong tensors",
         _on_run("route", without_files_json("model"),
                 tensors(M + "abstention.safetensors", add_key)), 2,
         ("abstention.safetensors", "stray.weight")),
    # --- resume: checkpoints and config.toml (fails before any round trains)
    Case("resume: the global checkpoint file is missing", _on_run("resume", remove(C + GLOBAL)),
         2, (GLOBAL, "missing", "round_0002", "delete")),
    Case("resume: an old checkpoint without its global file",
         _on_run("resume", without_files_json(LAST), remove(C + GLOBAL)), 2,
         (GLOBAL, "missing", "checkpoint is incomplete")),
    Case("resume: the global state is empty",
         _on_run("resume", without_files_json(LAST), tensors(C + GLOBAL, empty)), 2,
         (GLOBAL, "missing tensor", "config.toml")),
    Case("resume: the global state has a wrong shape",
         _on_run("resume", without_files_json(LAST), tensors(C + GLOBAL, reshape)), 2,
         (GLOBAL, "shape")),
    Case("resume: a site's checkpoint file is missing",
         _on_run("resume", without_files_json(LAST), remove(C + SITE)), 2,
         (SITE, "missing", "'acrima'", "round_0002")),
    Case("resume: a listed site checkpoint file is missing", _on_run("resume", remove(C + SITE)),
         2, (SITE, "missing", "files.json")),
    Case("resume: a site's checkpoint in float16",
         _on_run("resume", without_files_json(LAST), tensors(C + SITE, to_half)), 2,
         (SITE, "dtype F16")),
    Case("resume: a checkpoint holds NaN",
         _on_run("resume", without_files_json(LAST), tensors(C + SITE, make_nan)), 2,
         (SITE, "NaN", "round_0002")),
    Case("resume: a checkpoint file has an edited byte", _on_run("resume", flip_byte(C + GLOBAL)),
         2, (GLOBAL, "sha256", "delete")),
    Case("resume: a checkpoint file's header bytes were changed",
         _on_run("resume", flip_header_byte(C + GLOBAL)), 2,
         (GLOBAL, "checkpoint", "round_0002 is damaged", "delete", "new --out")),
    Case("resume: an unlisted file in a checkpoint",
         _on_run("resume", copy_file(C + SITE, C + "site_other.safetensors")), 2,
         ("site_other.safetensors", "not listed")),
    Case("resume: the round counter is past the last round",
         _on_run("resume", state_round(5), move(LAST, "checkpoints/round_0005")), 2,
         ("state.json", "round 5", "past the run's last round")),
    Case("resume: the round counter disagrees with its folder", _on_run("resume", state_round(1)),
         2, ("state.json", "round_0002")),
    Case("resume: the round counter is text", _on_run("resume", state_round("two")), 2,
         ("state.json", "not a round number")),
    Case("resume: state.json is not JSON", _on_run("resume", write(C + "state.json", "{")), 2,
         ("state.json", "not valid JSON")),
    Case("resume: config.toml is not UTF-8", _on_run("resume", config_text(NOT_UTF8)), 2,
         ("config.toml", "UTF-8")),
    Case("resume: config.toml is not TOML", _on_run("resume", config_text(b"[train")), 2,
         ("config.toml", "TOML")),
    Case("resume: config.toml has no train table",
         _on_run("resume", config_text(b"schema_version = 1\ntrain = 3\nsites = []\n")), 2,
         ("config.toml", "'train'")),
    Case("resume: config.toml is empty", _on_run("resume", config_text(b"")), 2,
         ("config.toml", "'train'")),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=str)
def test_bad_run_input_gets_a_clear_answer(case: Case, tmp_path, shared: Shared) -> None:
    check(case, tmp_path, shared)


def _all_dropped(tmp, s: Shared) -> list:
    """One round in which every site drops (trains nothing: each site's fault fires first)."""
    argv = ["train", "--sites", *s.manifests(), "--algorithm", "feddrm", "--rounds", "1"]
    argv += ["--local-steps", "1", "--device", "cpu", "--out", tmp / "failed", "--no-progress"]
    for path, kind in zip(s.manifests(), ("drop", "raise", "drop"), strict=True):
        argv += ["--inject-fault", f"1:{path.stem}:{kind}"]
    return argv


def test_training_in_which_every_round_was_skipped_fails_loudly(tmp_path, shared) -> None:
    case = Case("every round was skipped", _all_dropped, 1,
                ("no round aggregated", "did not answer", "injected", "summary.json",
                 "events.jsonl"))  # fmt: skip
    check(case, tmp_path, shared)
    run = RunDir(tmp_path / "failed")
    # The folder tells what happened, but it is no finished run.
    assert run.config_path.is_file() and run.metrics_path.is_file()
    assert run.read_events()[-1]["event"] == "failed"
    assert not run.summary_path.exists() and not run.model_dir.exists()
    result = CliRunner().invoke(app, ["evaluate", str(run.path)])
    assert result.exit_code == 2 and "training failed" in result.output, result.output


# ---------------------------------------------------------------------- the manifests
def test_a_finished_run_lists_every_weight_file(shared: Shared) -> None:
    model = shared.run / "model"
    listed = json.loads((model / FILES).read_text())["files"]
    assert set(listed) == {p.name for p in model.glob("*.safetensors")}
    assert "abstention.safetensors" in listed
    for name, entry in listed.items():
        assert entry["sha256"] == sha256(model / name)
        assert entry["size"] == (model / name).stat().st_size
        state = load_file(str(model / name))
        assert set(entry["tensors"]) == set(state)
        key = next(iter(state))
        assert entry["tensors"][key]["shape"] == list(state[key].shape)
    verify_folder(model, "fix")
    checkpoints = sorted((shared.run / "checkpoints").glob("round_*"))
    assert [c.name for c in checkpoints] == ["round_0001", "round_0002"]
    for folder in checkpoints:
        files = json.loads((folder / FILES).read_text())["files"]
        assert set(files) == {p.name for p in folder.glob("*.safetensors")}
        verify_folder(folder, "fix")


def test_a_run_written_before_files_json_still_loads(tmp_path, shared: Shared) -> None:
    run = shared.copy_run(tmp_path)
    for manifest in run.rglob(FILES):
        manifest.unlink()
    fed = TrainedFederation.load(run, "cpu")
    assert [s.id for s in fed.sites] == ["acrima", "refuge", "rimone"]
    result = CliRunner().invoke(app, [str(a) for a in _route(run, shared)])
    assert result.exit_code == 0, result.output
    assert CliRunner().invoke(app, ["evaluate", str(run)]).exit_code == 0


def test_resuming_a_finished_run_finishes_it_again_with_its_manifests(tmp_path, shared) -> None:
    """Resume reads every checkpoint file (checked), runs no round, rewrites model/ and prints
    the closing line (from the train command, not a bar)."""
    run = shared.copy_run(tmp_path)
    result = CliRunner().invoke(app, [str(a) for a in _resume(run, shared)])
    assert result.exit_code == 0, result.output
    assert "trained 2 rounds in" in result.output and "mean val AUC" in result.output
    verify_folder(run / "model", "fix")
    assert TrainedFederation.load(run, "cpu").algorithm == "feddrm"


# ---------------------------------------------------------------------- progress
def test_the_rounds_bar_shows_loss_and_validation_auc() -> None:
    records = [
        {"status": "ok", "train_loss": 0.5, "val_auc": 0.8},
        {"status": "ok", "train_loss": 0.7, "val_auc": None},
        {"status": "dropped", "val_auc": 0.6},
    ]
    assert round_postfix(records) == {"loss": "0.600", "val AUC": "0.700"}
    assert round_postfix([{"status": "dropped"}]) == {}


def test_medfed_no_progress_turns_the_rounds_bar_off(monkeypatch) -> None:
    monkeypatch.setattr("sys.stderr.isatty", lambda: True, raising=False)
    monkeypatch.setenv("MEDFED_NO_PROGRESS", "1")
    assert counter("feddrm rounds", 3).disable
    monkeypatch.delenv("MEDFED_NO_PROGRESS")
    assert not counter("feddrm rounds", 3).disable
    assert counter("feddrm rounds", 3, show=False).disable
    assert "tqdm" not in inspect.getsource(rounds)  # the rounds bar is medfed.core.progress's
