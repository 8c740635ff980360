"""A site's policy, a run's plan and its hash, the checks naming each broken rule, the site's
approvals and audit log, and the commands an operator uses (medfed deploy policy check,
approve, audit). Deployed runs under a policy: tests/test_governance_deploy.py."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("flwr")

from flwr.app import ConfigRecord, RecordDict  # noqa: E402

from medfed.cli import app  # noqa: E402
from medfed.config import TrainConfig  # noqa: E402
from medfed.core.errors import ConfigError, RunDirError  # noqa: E402
from medfed.flower.deploy import write_app  # noqa: E402
from medfed.flower.gate import ACCEPTED, REFUSED, UNCHECKED, refusals  # noqa: E402
from medfed.flower.server_app import Deployment  # noqa: E402
from medfed.governance import PolicyError, check_plan, make_plan, parse_policy  # noqa: E402
from medfed.governance.plan import app_run_config  # noqa: E402
from medfed.governance.records import (  # noqa: E402
    APPROVALS,
    approved_plans,
    log_message,
    read_audit,
    record_approval,
)

runner = CliRunner()
SITES = ["acrima", "refuge", "rimone"]
CONFIG = TrainConfig(algorithm="fedavg", rounds=5, local_steps=10, batch_size=8)
RESNET = dataclasses.replace(CONFIG, backbone="resnet18")
EPSILON_10 = dataclasses.replace(CONFIG, dp_epsilon=10.0)
SECURE_RULE = "privacy.require_secure_aggregation"
OPEN = "[approval]\nrequired = false\n"


def plan(config: TrainConfig = CONFIG, **kw):
    args = dict(
        run_name="pilot", secure_aggregation=False, secure_bound=1.0,
        starting_sha256="",
    ) | kw  # fmt: skip
    return make_plan(config, SITES, **args)


def rules(policy_text: str, the_plan=None, **kw) -> list[str]:
    found = check_plan(parse_policy(policy_text, "policy.toml"), the_plan or plan(), **kw)
    return [r.rule for r in found]


# ---------------------------------------------------------------------------- the policy file
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("algorithms = 3", "unknown key or table 'algorithms'"),
        ("[allow]\nalgorithm = ['fedavg']", "unknown key allow.algorithm"),
        ("[allow]\nalgorithms = 'fedavg'", "allow.algorithms = 'fedavg'; expected a list"),
        ("[allow]\nmax_rounds = 0", "allow.max_rounds = 0; expected a whole number"),
        ("[allow]\nmax_local_steps = 2.5", "allow.max_local_steps"),
        ("[privacy]\nmax_epsilon = -1", "privacy.max_epsilon = -1; expected a number > 0"),
        ("[privacy]\nmax_epsilon = nan", "privacy.max_epsilon"),
        ("[privacy]\nrequire_dp = 'yes'", "privacy.require_dp = 'yes'; expected true or false"),
        ("[weights]\nstarting = ['abc']", "weights.starting"),
        ("[outputs]\npredictions = 0", "outputs.predictions = 0; expected true or false"),
        ("[approval]\nplans = ['x']", "approval.plans"),
        ("allow = 1", "'allow' must be a table"),
        ("site = ''", "site = ''"),
        ("[allow", "not valid TOML"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_file_and_the_key(text: str, message: str) -> None:
    with pytest.raises(PolicyError, match="site policy policy.toml: ") as caught:
        parse_policy(text, "policy.toml")
    assert message in str(caught.value)


def test_a_missing_or_folder_policy_file_is_named(tmp_path) -> None:
    result = runner.invoke(
        app, ["deploy", "policy", "check", str(tmp_path / "no.toml"), "--run", "x"]
    )
    assert result.exit_code == 2 and "no such file" in result.output
    result = runner.invoke(app, ["deploy", "policy", "check", str(tmp_path), "--run", "x"])
    assert result.exit_code == 2 and "a folder" in result.output


def test_an_empty_policy_leaves_every_rule_open_but_approval() -> None:
    assert rules("") == ["approval.required"]
    assert rules(OPEN) == []


# ---------------------------------------------------------------------------- the checks
@pytest.mark.parametrize(
    ("policy", "config", "rule"),
    [
        ("[allow]\nalgorithms = ['feddrm']", CONFIG, "allow.algorithms"),
        ("[allow]\nbackbones = ['cnn']", RESNET, "allow.backbones"),
        ("[allow]\nmax_rounds = 4", CONFIG, "allow.max_rounds"),
        ("[allow]\nmax_local_steps = 9", CONFIG, "allow.max_local_steps"),
        ("[privacy]\nrequire_dp = true", CONFIG, "privacy.require_dp"),
        ("[privacy]\nmax_epsilon = 8", CONFIG, "privacy.max_epsilon"),
        ("[privacy]\nmax_epsilon = 8", EPSILON_10, "privacy.max_epsilon"),
        ("[privacy]\nrequire_secure_aggregation = true", CONFIG, SECURE_RULE),
        ("[weights]\nstarting = ['" + "a" * 64 + "']", CONFIG, "weights.starting"),
        ("[outputs]\nupdates = false", CONFIG, "outputs.updates"),
    ],
)  # fmt: skip
def test_each_rule_a_run_breaks_is_named(policy: str, config: TrainConfig, rule: str) -> None:
    assert rules(f"{policy}\n{OPEN}", plan(config)) == [rule]


def test_predictions_leave_only_in_a_run_that_asks_for_them_and_a_policy_that_allows_it() -> None:
    forbids = f"[outputs]\npredictions = false\n{OPEN}"
    assert "predictions" not in plan().outputs
    assert rules(forbids) == []  # by default each site keeps its per-scan predictions
    asks = plan(predictions_to_coordinator=True)
    assert asks.outputs[-1] == "predictions" and asks.sha256 != plan().sha256
    assert rules(forbids, asks) == ["outputs.predictions"]
    assert rules(OPEN, asks) == []


def test_min_count_refuses_no_run_the_site_suppresses_small_cells_instead() -> None:
    assert rules(f"[outputs]\nmin_count = 10\n{OPEN}") == []
    assert parse_policy("[outputs]\nmin_count = 10", "policy.toml").min_count == 10


def test_a_run_within_the_policy_is_accepted() -> None:
    private = dataclasses.replace(CONFIG, dp_epsilon=4.0, backbone="cnn")
    policy = (
        "site = 'acrima'\n[allow]\nalgorithms = ['fedavg']\nbackbones = ['cnn']\nmax_rounds = 5\n"
        "max_local_steps = 10\n[privacy]\nrequire_dp = true\nmax_epsilon = 8\n"
        f"require_secure_aggregation = true\n[weights]\nstarting = ['{'b' * 64}']\n{OPEN}"
    )
    accepted = plan(private, secure_aggregation=True, starting_sha256="b" * 64)
    assert rules(policy, accepted, site="acrima") == []
    assert rules(policy, accepted, site="refuge") == ["site"]


def test_auto_backbone_is_checked_once_the_run_resolved_it() -> None:
    policy = f"[allow]\nbackbones = ['cnn']\n{OPEN}"
    assert rules(policy) == []  # 'auto': not yet known
    assert rules(policy, backbone="resnet18") == ["allow.backbones"]
    assert rules(policy, backbone="cnn") == []


def test_approval_by_the_operator_or_by_the_policys_list(tmp_path) -> None:
    the_plan = plan()
    assert rules("", the_plan, approved={the_plan.sha256}) == []
    assert rules(f"[approval]\nplans = ['{the_plan.sha256}']", the_plan) == []
    record_approval(tmp_path, the_plan, note="board")
    assert approved_plans(tmp_path) == {the_plan.sha256}
    assert stat.S_IMODE(os.stat(tmp_path / APPROVALS).st_mode) == 0o600


# ---------------------------------------------------------------------------- the plan's hash
def test_the_plan_hash_changes_with_what_runs_not_with_how_long_the_server_waits() -> None:
    base = plan().sha256
    assert plan().sha256 == base
    assert plan(dataclasses.replace(CONFIG, rounds=6)).sha256 != base
    assert plan(starting_sha256="c" * 64).sha256 != base
    assert plan(secure_aggregation=True).sha256 != base

    def hashed(**run_config) -> str:
        config = {"train": "[train]\nalgorithm = 'fedavg'\nrounds = 5\nlocal_steps = 10\n"}
        config |= {"sites": ",".join(SITES), "run-dir": "/srv/runs/pilot"} | run_config
        return Deployment.from_run_config(config).plan().sha256

    assert hashed(**{"wait-s": 10.0}) == hashed(**{"wait-s": 99.0, "reply-timeout-s": 5.0})
    assert hashed() != hashed(**{"secure-aggregation": True})
    assert hashed() == hashed(predictions="site")
    assert (
        "predictions"
        in Deployment.from_run_config(
            {"train": "[train]\nalgorithm = 'fedavg'\n", "sites": "a,b", "run-dir": "/srv/r"}
            | {"predictions": "coordinator"}
        )
        .plan()
        .outputs
    )


# ---------------------------------------------------------------------------- the gate
def message(plan_json=None, run=None) -> RecordDict:
    records = {}
    if plan_json is not None:
        records["plan"] = ConfigRecord({"json": json.dumps(plan_json)})
    if run is not None:
        records["run"] = ConfigRecord({"json": json.dumps(run)})
    return RecordDict(records)


def test_the_gate_checks_a_later_messages_settings_against_the_plan(tmp_path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(OPEN, encoding="utf-8")
    node = {"policy": str(policy), "state-dir": str(tmp_path)}
    the_plan = plan().to_json()
    run = {
        "name": "pilot",
        "train": CONFIG.to_dict(),
        "spec": {"backbone": "cnn"},
        "plan": the_plan,
    }

    assert refusals(message(the_plan), node)[0] == ACCEPTED
    assert refusals(message(run=run), node)[0] == ACCEPTED
    changed = run | {"train": CONFIG.to_dict() | {"rounds": 50}}
    decision, found = refusals(message(run=changed), node)
    assert decision == REFUSED and found[0].rule == "plan" and "rounds" in found[0].reason
    decision, found = refusals(message(run=run | {"plan": None}), node)
    assert decision == REFUSED and found[0].rule == "plan"
    assert refusals(message(the_plan), {"state-dir": str(tmp_path)})[0] == UNCHECKED
    assert refusals(RecordDict(), node)[0] == UNCHECKED  # SecAgg+'s key exchange


def test_an_unusable_policy_refuses_every_run(tmp_path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text("[allow]\nmax_rounds = 'many'\n", encoding="utf-8")
    decision, found = refusals(message(plan().to_json()), {"policy": str(policy)})
    assert (
        decision == REFUSED and found[0].rule == "policy" and "allow.max_rounds" in found[0].reason
    )


# ---------------------------------------------------------------------------- the commands
@pytest.fixture
def app_folder(tmp_path) -> Path:
    write_app(tmp_path / "app", CONFIG, SITES, "/srv/runs/pilot")
    return tmp_path / "app"


def test_policy_check_tells_the_operator_in_advance(app_folder, tmp_path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text("[allow]\nalgorithms = ['feddrm']\n[privacy]\nrequire_dp = true\n")
    result = runner.invoke(
        app, ["deploy", "policy", "check", str(policy), "--run", str(app_folder)]
    )
    assert result.exit_code == 1
    assert "refused: rule allow.algorithms" in result.output
    assert "refused: rule privacy.require_dp" in result.output
    assert "refused: rule approval.required" in result.output

    policy.write_text("[allow]\nalgorithms = ['fedavg']\n")
    state = tmp_path / "state"
    approve = ["deploy", "approve", "--run", str(app_folder), "--state-dir", str(state)]
    result = runner.invoke(app, approve)
    assert result.exit_code == 0, result.output
    sha = Deployment.from_run_config(app_run_config(app_folder)).plan().sha256
    assert f"approved plan {sha}" in result.output
    check = ["deploy", "policy", "check", str(policy), "--run", str(app_folder)]
    result = runner.invoke(app, [*check, "--state-dir", str(state)])
    assert result.exit_code == 0 and "accepted" in result.output


def test_predictions_leave_only_when_the_app_asks_and_the_policy_allows(tmp_path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text("[outputs]\npredictions = false\n[approval]\nrequired = false\n")
    check = ["deploy", "policy", "check", str(policy), "--run"]
    home = ["deploy", "app", str(tmp_path / "home"), "--site", "a", "--site", "b"]
    home += ["--run-dir", "/srv/runs/x", "--algorithm", "fedavg"]
    sent = [*home[:2], str(tmp_path / "sent"), *home[3:], "--predictions-to-coordinator"]

    assert runner.invoke(app, home).exit_code == 0
    assert runner.invoke(app, sent).exit_code == 0

    kept = Deployment.from_run_config(app_run_config(tmp_path / "home")).plan()
    asked = Deployment.from_run_config(app_run_config(tmp_path / "sent")).plan()
    assert "predictions" not in kept.outputs and "predictions" in asked.outputs
    assert runner.invoke(app, [*check, str(tmp_path / "home")]).exit_code == 0
    result = runner.invoke(app, [*check, str(tmp_path / "sent")])
    assert result.exit_code == 1 and "refused: rule outputs.predictions" in result.output


def test_not_an_app_folder_is_named(tmp_path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(OPEN)
    result = runner.invoke(app, ["deploy", "policy", "check", str(policy), "--run", str(tmp_path)])
    assert result.exit_code == 2 and "no pyproject.toml" in result.output


def test_the_audit_command_lists_the_sites_messages(tmp_path) -> None:
    log_message(tmp_path, direction="received", kind="train", run="pilot", round=1, bytes=10,
                sha256="d" * 64, decision=REFUSED, rule="allow.algorithms", reason="x")  # fmt: skip
    log_message(tmp_path, direction="received", kind="train", run="other", round=1, bytes=10)

    result = runner.invoke(app, ["deploy", "audit", str(tmp_path), "--run", "pilot"])

    assert result.exit_code == 0, result.output
    assert "allow.algorithms" in result.output and "1 record(s); 1 refused" in result.output
    assert stat.S_IMODE(os.stat(tmp_path / "audit.jsonl").st_mode) == 0o600
    missing = runner.invoke(app, ["deploy", "audit", str(tmp_path / "nothing")])
    assert missing.exit_code == 2 and "no audit log" in missing.output


def test_an_edited_audit_log_is_refused_by_line(tmp_path) -> None:
    log_message(tmp_path, direction="received", kind="train")
    with (tmp_path / "audit.jsonl").open("a") as out:
        out.write("not json\n")
    with pytest.raises(RunDirError, match="line 2"):
        read_audit(tmp_path)


def test_a_bad_on_refusal_setting_is_refused_by_name(tmp_path) -> None:
    app_args = ["deploy", "app", str(tmp_path / "app"), "--site", "a", "--site", "b"]
    app_args += ["--run-dir", "/srv/runs/x", "--on-refusal", "maybe"]
    result = runner.invoke(app, app_args)
    assert result.exit_code == 2 and "--on-refusal 'maybe'" in result.output
    config = {"train": "[train]\nalgorithm = 'fedavg'\n", "sites": "a,b", "run-dir": "/srv/r"}
    with pytest.raises(ConfigError, match="'on-refusal' must be one of stop, continue"):
        Deployment.from_run_config(config | {"on-refusal": "maybe"})


def test_the_gate_refuses_without_going_further_and_logs_what_it_answered(tmp_path) -> None:
    from flwr.app import Context, Message
    from flwr.supercore.task_identity import TaskIdentity

    from medfed.flower.gate import governance

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    policy = tmp_path / "policy.toml"
    policy.write_text("[allow]\nalgorithms = ['feddrm']\n", encoding="utf-8")
    node = {"policy": str(policy), "state-dir": str(tmp_path)}
    context = Context(run_id=1, node_id=2, node_config=node, state=RecordDict(), run_config={})
    asked = Message(message(plan().to_json()), dst_node_id=2, message_type="query.describe")

    def must_not_run(message, context):
        raise AssertionError("the refused message went further")

    reply = governance(asked, context, must_not_run)

    assert "refusal" in reply.content.config_records
    assert "allow.algorithms" in str(reply.content.config_records["failure"]["reason"])
    policy.write_text(OPEN, encoding="utf-8")

    def fails(message, context):
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        governance(asked, context, fails)
    lines = [(r["direction"], r["decision"]) for r in read_audit(tmp_path)]
    assert lines == [
        ("received", REFUSED), ("sent", REFUSED), ("received", ACCEPTED), ("decision", ACCEPTED),
        ("sent", ACCEPTED),
    ]  # fmt: skip
    assert "raised RuntimeError: disk full" in read_audit(tmp_path)[-1]["reason"]
