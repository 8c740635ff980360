"""The bad-input corpus, statistics-run and site-audit cases: `medfed deploy stats` settings,
a statistics app folder with a damaged run config, `medfed dashboard --state-dir` on a missing
folder (see tests/badinput.py for the policy), then a damaged statistics.json and an
unreadable audit log line as their readers and the dashboard meet them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit import config as streamlit_config
from streamlit.testing.v1 import AppTest

from medfed.core.errors import RunDirError
from medfed.dashboard import APP, RUNS_ENV, STATE_ENV
from medfed.governance.records import log_message
from medfed.governance.statistics import StatisticsSettings
from medfed.runs.schema import FederationStatistics, SiteStatistics
from medfed.runs.statistics import read_statistics, write_statistics
from tests.badinput import Case, Shared, check

pytest.importorskip("flwr")


def _stats(*options: str, out: str = "app"):
    def make(tmp: Path, s: Shared) -> list:
        argv: list = ["deploy", "stats", tmp / out, "--site", "acrima", "--site", "rimone"]
        return argv + ["--run-dir", tmp / "run", *options]

    return make


def _damaged_stats_app(tmp: Path, s: Shared) -> list:
    from medfed.flower.deploy import write_statistics_app

    app = tmp / "app"
    write_statistics_app(app, StatisticsSettings(), ["acrima"], str(tmp / "run"))
    path = app / "pyproject.toml"
    path.write_text(path.read_text().replace("min-count = 0", 'min-count = "ten"'))
    policy = tmp / "policy.toml"
    policy.write_text("[outputs]\ndata_card = true\n", encoding="utf-8")
    return ["deploy", "policy", "check", policy, "--run", app]


CASES = [
    Case(
        "deploy stats gaussian with epsilon 1 or more",
        _stats("--noise", "gaussian", "--epsilon", "2"),
        2,
        ("epsilon < 1", "laplace"),
    ),  # fmt: skip
    Case("deploy stats epsilon without noise", _stats("--epsilon", "1"), 2, ("without noise",)),
    Case(
        "deploy stats noise without epsilon",
        _stats("--noise", "laplace"),
        2,
        ("needs an epsilon", "--epsilon"),
    ),  # fmt: skip
    Case("deploy stats unknown noise", _stats("--noise", "poisson"), 2, ("poisson", "laplace")),
    Case("deploy stats negative min count", _stats("--min-count", "-1"), 2, ("min_count",)),
    Case(
        "deploy stats delta without gaussian",
        _stats("--noise", "laplace", "--epsilon", "1", "--delta", "0.1"),
        2,
        ("delta is for gaussian",),
    ),  # fmt: skip
    Case(
        "policy check on a statistics app with a damaged min-count",
        _damaged_stats_app,
        2,
        ("min_count", "'ten'"),
    ),  # fmt: skip
    Case(
        "dashboard --state-dir on a missing folder",
        lambda tmp, s: ["dashboard", "--state-dir", tmp / "nowhere"],
        2,
        ("--state-dir", "no such folder", "state-dir"),
    ),  # fmt: skip
]

# The rows use no shared sites or run: a stand-in keeps the shared fixture (which trains) unbuilt.
STAND_IN = Shared(data=Path("/nonexistent"), run=Path("/nonexistent"))


@pytest.mark.parametrize("case", CASES, ids=str)
def test_bad_input_gets_a_clear_answer(case: Case, tmp_path) -> None:
    check(case, tmp_path, STAND_IN)


# ---------------------------------------------------------------------------- statistics.json
def good_statistics() -> FederationStatistics:
    site = SiteStatistics(status="released", modality="fundus", min_count=3,
                          counts={"train": {"neg": 5.0, "pos": None}})  # fmt: skip
    return FederationStatistics(
        run_name="s", plan_sha256="a" * 64, engine="flower", time=1.0, min_count=3,
        noise="none", epsilon=0.0, delta=0.0, sites={"a": site},
    )  # fmt: skip


def _not_json(path: Path) -> None:
    path.write_text("{ not json", encoding="utf-8")


def _newer(path: Path) -> None:
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "schema_version": 99}))


def _negative_count(path: Path) -> None:
    data = json.loads(path.read_text())
    data["sites"]["a"]["counts"]["train"]["neg"] = -4
    path.write_text(json.dumps(data))


def _no_sites(path: Path) -> None:
    data = json.loads(path.read_text())
    del data["sites"]
    path.write_text(json.dumps(data))


def _not_utf8(path: Path) -> None:
    path.write_bytes(b"\xff\xfe\x00garbage")


DAMAGES = {
    "not JSON": (_not_json, "not valid JSON"),
    "newer schema": (_newer, "newer than this medfed reads"),
    "negative count": (_negative_count, "sites.a.counts.train.neg"),
    "no sites": (_no_sites, "missing required field 'sites'"),
    "not UTF-8": (_not_utf8, "not valid JSON"),
}


@pytest.mark.parametrize("name", list(DAMAGES))
def test_a_damaged_statistics_file_is_refused_by_name(name: str, tmp_path) -> None:
    damage, words = DAMAGES[name]
    path = write_statistics(tmp_path / "run", good_statistics())
    damage(path)

    with pytest.raises(RunDirError) as raised:
        read_statistics(tmp_path / "run")

    assert str(path) in str(raised.value) and words in str(raised.value)


def open_app(monkeypatch, runs: str, state: Path | None = None) -> AppTest:
    monkeypatch.setenv(RUNS_ENV, runs)
    if state is None:
        monkeypatch.delenv(STATE_ENV, raising=False)
    else:
        monkeypatch.setenv(STATE_ENV, str(state))
    streamlit_config.set_option("server.address", "127.0.0.1")
    return AppTest.from_file(str(APP), default_timeout=120).run()


def test_the_sites_page_names_a_damaged_statistics_file(monkeypatch, tmp_path) -> None:
    good, bad = tmp_path / "runs" / "good", tmp_path / "runs" / "bad"
    write_statistics(good, good_statistics())
    _negative_count(write_statistics(bad, good_statistics()))

    at = open_app(monkeypatch, str(tmp_path / "runs"))
    at.switch_page("views/sites.py").run()

    assert not at.exception, [e.value for e in at.exception]
    warnings = " ".join(str(w.value) for w in at.warning).replace("\\_", "_")
    assert "Run **bad** is left out" in warnings and "statistics.json" in warnings
    assert "Federation overview (statistics run)" in [s.value for s in at.subheader]


def test_the_site_audit_page_names_an_unreadable_audit_line(monkeypatch, tmp_path) -> None:
    state = tmp_path / "state"
    log_message(state, direction="received", kind="query.statistics", decision="accepted")
    with (state / "audit.jsonl").open("a", encoding="utf-8") as handle:
        handle.write('{"cut short\n')

    at = open_app(monkeypatch, "", state)

    assert not at.exception, [e.value for e in at.exception]
    errors = " ".join(str(e.value) for e in at.error).replace("\\_", "_")
    assert "audit.jsonl, line 2" in errors and "restore it from a backup" in errors


def test_malformed_statistics_from_a_site_become_its_failure() -> None:
    from medfed.governance.disclosure import site_entry

    with pytest.raises(RunDirError, match="counts.train.neg"):
        site_entry({"site": "a", "counts": {"train": {"neg": -1}}})


def test_a_statistics_message_with_a_malformed_plan_is_refused_by_the_gate(tmp_path) -> None:
    from flwr.app import ConfigRecord, RecordDict

    from medfed.flower.gate import refusals
    from medfed.governance.statistics import make_statistics_plan

    plan = make_statistics_plan(StatisticsSettings(), ["a"], run_name="s").to_json()
    plan["train"] = {"statistics": {"noise": "loud"}}
    policy = tmp_path / "policy.toml"
    policy.write_text("[approval]\nrequired = false\n", encoding="utf-8")
    content = RecordDict({"plan": ConfigRecord({"json": json.dumps(plan)})})

    decision, found = refusals(content, {"policy": str(policy), "state-dir": str(tmp_path)})

    assert decision == "refused" and found[0].rule == "plan" and "loud" in found[0].reason
