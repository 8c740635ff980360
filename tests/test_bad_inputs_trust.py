"""The bad-input corpus, settings that would quietly mean something else than what was given:
output options naming a run's own files, privacy settings that mean no privacy, algorithm
parameters without bounds, a deployment that takes settings training refuses, reports over
unrelated runs, and a GPU check with nothing to compare (see tests/badinput.py for the policy).

Every row fails before anything is written or trained.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tests.badinput import Case, Shared, check


def _train(*options: str, algorithm: str = "fedavg"):
    """`medfed train` on two shared sites (read only) with ``options``; fails before training."""

    def make(tmp: Path, s: Shared) -> list:
        argv = ["train", "--sites", *s.manifests()[:2], "--device", "cpu", "--no-progress"]
        return [*argv, "--out", tmp / "run", "--algorithm", algorithm, *options]

    return make


# --- outputs that are a run's own files ----------------------------------------------------------
def _review(option: str, name: str):
    def make(tmp: Path, s: Shared) -> list:
        run = s.copy_run(tmp)
        return ["review", run, option, run / name]

    return make


def _report_into(name: str):
    def make(tmp: Path, s: Shared) -> list:
        run = s.copy_run(tmp)
        return ["report", run, "--out", run / name]

    return make


def _experiment_into(command: str, below: str = ""):
    def make(tmp: Path, s: Shared) -> list:
        run = s.copy_run(tmp)
        return [command, "--out", run / below if below else run, "--quick"]

    return make


def _train_into_model(tmp: Path, s: Shared) -> list:
    run = s.copy_run(tmp)
    argv = ["train", "--sites", *s.manifests()[:2], "--device", "cpu", "--no-progress"]
    return [*argv, "--out", run / "model", "--algorithm", "fedavg"]


OUTPUT_CASES = [
    Case("review --export over summary.json", _review("--export", "summary.json"), 2,
         ("--export", "summary.json", "run", "own files")),
    Case("review --export over the audit log", _review("--export", "audit.sqlite"), 2,
         ("--export", "audit.sqlite", "own files")),
    Case("review --figures over config.toml", _review("--figures", "config.toml"), 2,
         ("--figures", "config.toml", "own files")),
    Case("review --figures into the model folder", _review("--figures", "model/files.json"), 2,
         ("--figures", "model/files.json", "own files")),
    Case("report --out over summary.json", _report_into("summary.json"), 2,
         ("--out", "summary.json", "own files")),
    Case("compare --out is a run folder", _experiment_into("compare"), 2,
         ("--out", "is the run folder", "outside every run folder")),
    Case("bench --out inside a run folder", _experiment_into("bench", "bench"), 2,
         ("--out", "inside the run folder")),
    Case("demo --out inside a run folder", _experiment_into("demo", "checkpoints"), 2,
         ("--out", "inside the run folder")),
    Case("train --out inside another run's folder", _train_into_model, 2,
         ("--out", "model", "inside the run folder")),
]  # fmt: skip


# --- privacy settings that would mean no privacy, or another delta -------------------------------
PRIVACY_CASES = [
    Case("privacy budget of zero", _train("--dp-epsilon", "0"), 2,
         ("--dp-epsilon", "> 0", "no privacy budget")),
    Case("privacy budget that underflows to zero", _train("--dp-epsilon", "1e-400"), 2,
         ("--dp-epsilon", "no privacy budget")),
    Case("privacy budget below the search's precision", _train("--dp-epsilon", "0.001"), 2,
         ("dp_epsilon", "0.001", "below 0.01")),
    Case("privacy budget of infinity", _train("--dp-epsilon", "inf"), 2, ("--dp-epsilon", "inf")),
    Case("privacy delta of zero", _train("--dp-epsilon", "3", "--dp-delta", "0"), 2,
         ("--dp-delta", "default delta")),
    Case("privacy delta that underflows to zero",
         _train("--dp-epsilon", "3", "--dp-delta", "1e-400"), 2, ("--dp-delta", "default delta")),
    Case("privacy noise of zero", _train("--dp-noise", "0"), 2,
         ("--dp-noise", "no noise multiplier")),
    Case("privacy delta not below 1/n", _train("--dp-epsilon", "3", "--dp-delta", "0.5"), 2,
         ("--dp-delta 0.5", "not below 1/n", "site 'acrima'", "n = ")),
]  # fmt: skip


# --- algorithm parameters without bounds ---------------------------------------------------------
PARAM_CASES = [
    Case("fedprox mu is NaN", _train("--param", "mu=nan", algorithm="fedprox"), 2,
         ("mu", "nan", "finite number")),
    Case("fedprox mu is infinite", _train("--param", "mu=inf", algorithm="fedprox"), 2,
         ("mu", "finite number")),
    Case("ditto lambda is infinite", _train("--param", "lam=-inf", algorithm="ditto"), 2,
         ("lam", "finite number")),
    Case("pfedme lambda is NaN", _train("--param", "lam=nan", algorithm="pfedme"), 2,
         ("lam", "finite number")),
    Case("lora alpha of zero",
         _train("--param", "alpha=0", "--param", "warmup_rounds=1", algorithm="lora"), 2,
         ("lora", "alpha", "> 0")),
    Case("lora alpha below zero",
         _train("--param", "alpha=-8", "--param", "warmup_rounds=1", algorithm="lora"), 2,
         ("alpha", "> 0")),
    Case("lora rank that would exhaust memory",
         _train("--param", "rank=100000", "--param", "warmup_rounds=1", algorithm="lora"), 2,
         ("rank", "between 1 and 256", "memory")),
    Case("whole-number parameter given a fraction",
         _train("--param", "finetune_rounds=2.5", algorithm="fedavgft"), 2,
         ("finetune_rounds", "2.5", "whole number")),
    Case("whole-number parameter given true",
         _train("--param", "inner_steps=true", algorithm="pfedme"), 2,
         ("inner_steps", "whole number")),
]  # fmt: skip


# --- reports over runs of other federations; a GPU check with nothing to compare -----------------
def _summary_edited(edit):
    def make(tmp: Path, s: Shared) -> list:
        other = s.copy_run(tmp / "other")
        path = other / "summary.json"
        data = json.loads(path.read_text(encoding="utf-8"))
        edit(data)
        path.write_text(json.dumps(data), encoding="utf-8")
        return ["report", s.run, other, "--out", tmp / "report.html"]

    return make


def _other_modality(data: dict) -> None:
    data["modality"] = "ct"


def _other_sites(data: dict) -> None:
    data["sites"] = {f"elsewhere_{k}": v for k, v in data["sites"].items()}


OTHER_CASES = [
    Case("report over runs of different modalities", _summary_edited(_other_modality), 2,
         ("ct run", "fundus", "same sites", "one report per federation")),
    Case("report over runs of different sites", _summary_edited(_other_sites), 2,
         ("elsewhere_", "same sites", "one report per federation")),
    Case("gpu-check of the CPU against itself",
         lambda tmp, s: ["gpu-check", "--out", tmp / "g", "--short", "--device", "cpu"], 2,
         ("gpu-check", "CPU with itself", "cuda")),
]  # fmt: skip

CASES = OUTPUT_CASES + PRIVACY_CASES + PARAM_CASES + OTHER_CASES


@pytest.mark.parametrize("case", CASES, ids=str)
def test_bad_input_gets_a_clear_answer(case: Case, tmp_path, shared: Shared) -> None:
    check(case, tmp_path, shared)


def test_the_corpus_names_are_unique() -> None:
    names = [c.name for c in CASES + DEPLOY_CASES + WORKER_CASES]
    assert len(names) == len(set(names))


def test_a_refused_output_leaves_the_run_as_it_was(tmp_path, shared: Shared) -> None:
    check(OUTPUT_CASES[0], tmp_path, shared)
    written = (tmp_path / "run" / "summary.json").read_text(encoding="utf-8")
    assert written == (shared.run / "summary.json").read_text(encoding="utf-8")


# --- deploy app: every setting train refuses -----------------------------------------------------
def _deploy(*options: str, train: str = ""):
    """`deploy app` with ``options`` and, given ``train``, a settings file with that [train]
    table (privacy is set there: deploy app has no --dp-* options)."""

    def make(tmp: Path, s: Shared) -> list:
        argv = ["deploy", "app", tmp / "app", "--site", "acrima", "--site", "rimone"]
        if train:
            (tmp / "train.toml").write_text(f"[train]\n{train}\n", encoding="utf-8")
            argv += ["--train-config", tmp / "train.toml"]
        return [*argv, "--run-dir", tmp / "run", *options]

    return make


DEPLOY_CASES = [
    Case("deploy app with privacy on a BatchNorm backbone",
         _deploy(train='algorithm = "fedavg"\ndp_epsilon = 3.0\nbackbone = "cnn"'), 2,
         ("differential privacy", "'cnn'", "BatchNorm", "--backbone cnn-gn")),
    Case("deploy app with privacy on an algorithm it cannot wrap",
         _deploy(train='algorithm = "fedprox"\ndp_epsilon = 3.0'), 2,
         ("fedprox", "differential privacy")),
    Case("deploy app of lora without a base", _deploy("--algorithm", "lora"), 2,
         ("lora", "--init")),
    Case("deploy app of lora with a warm-up", _deploy("--algorithm", "lora", "--param",
                                                      "warmup_rounds=2"), 2,
         ("warmup_rounds", "deployment", "--init")),
    Case("deploy app with a privacy budget below the search's precision",
         _deploy(train='algorithm = "fedavg"\ndp_epsilon = 0.001'), 2,
         ("dp_epsilon", "below 0.01")),
    Case("deploy app with an infinite fedprox mu",
         _deploy("--algorithm", "fedprox", "--param", "mu=inf"), 2, ("mu", "finite number")),
]  # fmt: skip


@pytest.mark.parametrize("case", DEPLOY_CASES, ids=str)
def test_a_deployment_refuses_what_training_refuses(case: Case, tmp_path) -> None:
    pytest.importorskip("flwr")
    pytest.importorskip("cryptography")
    check(case, tmp_path, NOTHING_SHARED)
    assert not (tmp_path / "app").exists()


# --- the site worker's socket --------------------------------------------------------------------
def _worker_in_a_sticky_folder(tmp: Path, s: Shared) -> list:
    (tmp / "shared").mkdir()
    (tmp / "shared").chmod(0o1777)  # as /tmp: others may not remove, but may take a name first
    return ["deploy", "worker", tmp / "shared" / "w.sock"]


WORKER_CASES = [
    Case("deploy worker in a sticky folder everyone may write to", _worker_in_a_sticky_folder,
         2, ("worker socket", "others may write to", "take its name first")),
]  # fmt: skip

# The rows use no shared sites or run: a stand-in keeps the shared fixture (which trains) unbuilt.
NOTHING_SHARED = Shared(data=Path("/nonexistent/data"), run=Path("/nonexistent/run"))


@pytest.mark.parametrize("case", WORKER_CASES, ids=str)
def test_a_worker_socket_others_could_take_is_refused(case: Case, tmp_path) -> None:
    pytest.importorskip("flwr")
    check(case, tmp_path, NOTHING_SHARED)


def test_a_socket_another_process_listens_on_is_never_taken_over(tmp_path) -> None:
    pytest.importorskip("flwr")
    folder = tmp_path / "sock"
    folder.mkdir(mode=0o700)
    path = folder / "w.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listening:
        listening.bind(str(path))
        listening.listen(1)
        case = Case(
            "deploy worker on a socket in use",
            lambda tmp, s: ["deploy", "worker", path],
            2,
            ("worker socket", "another process is listening", "stop it first"),
        )
        check(case, tmp_path, NOTHING_SHARED)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(path))  # still the first process's socket
