"""The bad-input corpus, the newer surfaces: `medfed scenarios` counts, `medfed deploy stats`
numbers that are not numbers, a site's audit log (`medfed deploy audit`) with a line that
was edited or is not UTF-8, and experiment tracking (`medfed track`, `--track`, a settings
file's [tracking] table) given what it cannot use (see tests/badinput.py for the policy). No
row trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from medfed.governance.records import log_message
from tests.badinput import Case, Shared, check

# The rows use no shared sites or run: a stand-in keeps the shared fixture (which trains) unbuilt.
STAND_IN = Shared(data=Path("/nonexistent"), run=Path("/nonexistent"))


def _scenarios(*options: str):
    def make(tmp: Path, s: Shared) -> list:
        return ["scenarios", "--ablation", "covariate", "--quick", "--out", tmp / "out", *options]

    return make


def _stats(*options: str):
    def make(tmp: Path, s: Shared) -> list:
        argv: list = ["deploy", "stats", tmp / "app", "--site", "acrima", "--site", "rimone"]
        return argv + ["--run-dir", tmp / "run", *options]

    return make


def _audit(line: bytes):
    """``deploy audit`` of a state folder whose audit log's second line is ``line``."""

    def make(tmp: Path, s: Shared) -> list:
        state = tmp / "state"
        log_message(state, direction="received", kind="train", run="r", decision="accepted")
        with (state / "audit.jsonl").open("ab") as handle:
            handle.write(line + b"\n")
        return ["deploy", "audit", state]

    return make


def _record(**fields) -> bytes:
    record = {"time": 1.0, "direction": "sent", "kind": "train", "run": "r", **fields}
    return json.dumps(record).encode("utf-8")


def _run_folder(tmp: Path, finished: bool = True) -> Path:
    """A run folder's files as far as tracking reads them before logging anything."""
    run = tmp / "run"
    run.mkdir()
    (run / "config.toml").write_text('[train]\nalgorithm = "fedavg"\n', encoding="utf-8")
    (run / "model").mkdir()
    if finished:
        (run / "summary.json").write_text("{}", encoding="utf-8")
    return run


def _track(folder, *options: str, finished: bool = True):
    def make(tmp: Path, s: Shared) -> list:
        where = folder(tmp, finished) if folder is _run_folder else folder(tmp)
        return ["track", where, *options]

    return make


def _down() -> str:
    """A loopback URL nothing listens on (a tracking server that is down)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _train_tracking(tmp: Path, s: Shared) -> list:
    settings = tmp / "settings.toml"
    settings.write_text('[train]\nrounds = 1\n\n[tracking]\nurl = "local"\n', encoding="utf-8")
    return ["train", "--config", settings, "--sites", tmp / "a.toml", "--out", tmp / "run"]


# fmt: off
CASES = [
    Case("scenarios with zero seeds", _scenarios("--seeds", "0"), 2, ("--seeds", "1..100")),
    Case("scenarios with a million seeds", _scenarios("--seeds", "1000000"), 2,
         ("--seeds", "1..100", "1000000")),
    Case("scenarios with zero resamples", _scenarios("--n-boot", "0"), 2, ("--n-boot", "got 0")),
    Case("scenarios with negative resamples", _scenarios("--n-boot", "-5"), 2,
         ("--n-boot", "-5")),
    Case("scenarios with endless resamples", _scenarios("--n-boot", "99999999999999999999"), 2,
         ("--n-boot", "1..100000")),
    Case("deploy stats epsilon NaN", _stats("--noise", "laplace", "--epsilon", "nan"), 2,
         ("--epsilon", "nan")),
    Case("deploy stats epsilon infinite", _stats("--noise", "laplace", "--epsilon", "inf"), 2,
         ("--epsilon", "inf")),
    Case("deploy stats delta NaN",
         _stats("--noise", "gaussian", "--epsilon", "0.5", "--delta", "nan"), 2,
         ("--delta", "nan")),
    Case("deploy stats min count past any count", _stats("--min-count", str(2**64)), 2,
         ("--min-count", "2**63")),
    Case("deploy stats wait NaN", _stats("--wait", "nan"), 2, ("--wait", "nan")),
    Case("deploy audit line that is not UTF-8", _audit(b'{"time": 1.0}\xff\xfe'), 2,
         ("audit.jsonl, line 2", "not UTF-8", "restore it from a backup")),
    Case("deploy audit line with an edited time", _audit(_record(time="yesterday")), 2,
         ("audit.jsonl, line 2", "'time'", "yesterday")),
    Case("deploy audit line with a NaN time", _audit(b'{"time": NaN}'), 2,
         ("audit.jsonl, line 2", "'time'", "nan")),
    Case("deploy audit line with a time past any date", _audit(_record(time=1e300)), 2,
         ("audit.jsonl, line 2", "'time'", "not a time")),
    Case("deploy audit line with a round in words", _audit(_record(round="two")), 2,
         ("audit.jsonl, line 2", "'round'", "whole number")),
    Case("deploy audit line that is a list", _audit(b"[1, 2]"), 2,
         ("audit.jsonl, line 2", "not a JSON record")),
    Case("track a folder that holds no run", _track(lambda tmp: tmp), 2,
         ("holds no finished run", "config.toml and summary.json")),
    Case("track a folder that does not exist", _track(lambda tmp: tmp / "nowhere"), 2,
         ("nowhere", "no such folder")),
    Case("track to a garbage tracking URI", _track(_run_folder, "--track", "mlflow-server"), 2,
         ("--track", "'mlflow-server'", "not a tracking URI", "http://host:5000")),
    Case("track to a server URI without a host", _track(_run_folder, "--track", "http://"), 2,
         ("--track", "host is missing")),
    Case("track to a relative SQLite path", _track(_run_folder, "--track", "sqlite://x.db"), 2,
         ("sqlite:////absolute/path.db",)),
    Case("track to a tracking server that is down", _track(_run_folder, "--track", _down()), 2,
         ("cannot be reached", "start the server or fix the uri")),
    Case("track an unfinished run", _track(_run_folder, "--track", "local", finished=False), 2,
         ("no summary.json", "medfed train --resume")),
    Case("train with a [tracking] table of unknown settings", _train_tracking, 2,
         ("[tracking] has no setting(s)", "'url'", "uri, experiment, register")),
]
# fmt: on


@pytest.mark.parametrize("case", CASES, ids=str)
def test_bad_input_gets_a_clear_answer(case: Case, tmp_path) -> None:
    if case.name.startswith("deploy stats"):
        pytest.importorskip("flwr")
    if "track" in case.name:
        pytest.importorskip("mlflow")
    check(case, tmp_path, STAND_IN)


def test_the_corpus_names_are_unique() -> None:
    names = [c.name for c in CASES]
    assert len(names) == len(set(names))
