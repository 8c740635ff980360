"""Site governance on a real loopback federation (a SuperLink and three SuperNodes, each with
its resident worker, as processes): one site's policy forbids the run's algorithm and the run
goes on without it, another trains only on the plan its operator approved, and each site's
audit log lists every message its SuperNode received and sent."""

from __future__ import annotations

from collections import Counter

import pytest

from medfed.config import TrainConfig
from medfed.flower.deploy import write_app
from medfed.flower.loopback import LoopbackFederation
from medfed.flower.server_app import Deployment
from medfed.governance.plan import app_run_config
from medfed.governance.records import read_audit, record_approval
from medfed.reports.model_card import MODEL_CARD
from medfed.runs import RunDir

# Real SuperLink and SuperNode processes: needs medfed[flower]; make test-fast leaves them out.
pytestmark = [pytest.mark.flower, pytest.mark.slow]

SITES = ["acrima", "rimone", "refuge"]
CONFIG = TrainConfig(algorithm="fedavg", rounds=2, local_steps=1, batch_size=8, seed=6)
POLICIES = {
    "acrima": '[allow]\nalgorithms = ["feddrm"]\n',
    "refuge": "[approval]\nrequired = true\n",
}


def test_policies_refuse_by_rule_approve_by_plan_and_audit_every_message(
    tiny_sites, tmp_path
) -> None:
    manifests, cache = tiny_sites
    app = tmp_path / "app"
    run_dir = tmp_path / "run"
    write_app(app, CONFIG, SITES, str(run_dir), wait_s=120, reply_timeout_s=240,
              on_refusal="continue")  # fmt: skip
    plan = Deployment.from_run_config(app_run_config(app)).plan()
    record_approval(tmp_path / "state_refuge", plan)  # refuge's operator approved this plan
    fed = LoopbackFederation(tmp_path, task_poll_s=0.1)
    try:
        fed.start_superlink()
        for site in SITES:
            policy = None
            if site in POLICIES:
                policy = tmp_path / f"{site}.policy.toml"
                policy.write_text(POLICIES[site], encoding="utf-8")
            fed.start_supernode(
                site, manifests[site], cache=cache, worker=fed.start_worker(site),
                policy=policy, state_dir=tmp_path / f"state_{site}",
            )  # fmt: skip
        fed.submit(app)
        summary = fed.wait_for_summary(run_dir)
    finally:
        fed.close()

    assert set(summary["sites"]) == {"rimone", "refuge"}
    start = next(e for e in RunDir(run_dir).read_events() if e["event"] == "start")
    assert start["refused_sites"]["acrima"][0]["rule"] == "allow.algorithms"
    assert start["plan_sha256"] == plan.sha256
    refused = read_audit(tmp_path / "state_acrima")
    assert refused[0]["kind"] == "query.describe" and refused[0]["decision"] == "refused"
    audit = read_audit(tmp_path / "state_refuge")
    received = Counter(r["kind"] for r in audit if r["direction"] == "received")
    assert received == Counter(r["kind"] for r in audit if r["direction"] == "sent")
    assert {"query.describe", "train", "evaluate.validate", "evaluate.finish"} <= set(received)
    assert {"evaluate.calibrate", "evaluate.test"} <= set(received)
    assert all(r["decision"] == "accepted" for r in audit if r["direction"] == "received")
    assert (RunDir(run_dir).model_dir / MODEL_CARD).is_file()
