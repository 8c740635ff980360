"""Site governance in deployed runs, through Flower's own messages and medfed's real ClientApp
with its mods, in one process (tests/flowergrid.py): a site whose policy forbids the run is
refused by rule and recorded; an unapproved plan is refused before any data is read; the site's
audit log lists every message; a deployed run writes its model card."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import tomli_w

pytest.importorskip("flwr")

from medfed.config import TrainConfig  # noqa: E402
from medfed.core.errors import ConfigError, RunDirError  # noqa: E402
from medfed.federation.training import load_sites, train  # noqa: E402
from medfed.flower.server_app import Deployment, FlowerRun  # noqa: E402
from medfed.governance.records import read_audit, record_approval  # noqa: E402
from medfed.reports.model_card import MODEL_CARD  # noqa: E402
from medfed.runs import RunDir  # noqa: E402
from tests.flowergrid import InProcessGrid  # noqa: E402

CONFIG = TrainConfig(algorithm="fedavg", rounds=2, local_steps=1, batch_size=8, seed=4)
ONLY_FEDDRM = '[allow]\nalgorithms = ["feddrm"]\n'
APPROVAL_ONLY = "[approval]\nrequired = true\n"
# refuge's policy in the continued run: approval, no per-scan predictions, small cells withheld.
REFUGE = f"{APPROVAL_ONLY}[outputs]\npredictions = false\nmin_count = 3\n"


def run_config(sites: list[str], run_dir: Path, **extra) -> dict:
    return {
        "train": tomli_w.dumps({"train": CONFIG.to_dict()}),
        "sites": ",".join(sites),
        "run-dir": str(run_dir),
        "wait-s": 30.0,
        "reply-timeout-s": 30.0,
        **extra,
    }


def node_configs(root: Path, manifests: dict[str, Path], cache: Path, policies: dict[str, str]):
    """One node per site, each with its own state folder; ``policies``: a site's policy text."""
    configs = {}
    for i, (site, manifest) in enumerate(manifests.items()):
        config = {
            "manifest": str(manifest),
            "state-dir": str(root / f"state_{site}"),
            "cache-dir": str(cache),
        }
        if site in policies:
            path = root / f"policy_{site}.toml"
            path.write_text(policies[site], encoding="utf-8")
            config["policy"] = str(path)
        configs[10 + i] = config
    return configs


@pytest.fixture(scope="module")
def continued(tiny_sites, tmp_path_factory):
    """acrima's policy allows FedDRM only (the run is FedAvg); refuge's asks for approval and
    its operator approved the plan, lets no per-scan prediction out and sets min_count 3;
    rimone has no policy. The run goes on without acrima."""
    manifests, cache = tiny_sites
    root = tmp_path_factory.mktemp("governed")
    sites = list(manifests)
    configs = node_configs(root, manifests, cache, {"acrima": ONLY_FEDDRM, "refuge": REFUGE})
    deployment = Deployment.from_run_config(
        run_config(sites, root / "run", **{"on-refusal": "continue"})
    )
    record_approval(root / "state_refuge", deployment.plan(), note="ethics board 2026-11")
    grid = InProcessGrid(configs)
    FlowerRun(grid, deployment).run()
    return root, grid, deployment


def test_a_site_whose_policy_forbids_the_algorithm_is_refused_by_rule_and_recorded(
    continued,
) -> None:
    root, _, deployment = continued
    run = RunDir(root / "run")

    start = next(e for e in run.read_events() if e["event"] == "start")
    summary = run.read_summary()

    assert start["refused_sites"]["acrima"][0]["rule"] == "allow.algorithms"
    assert "'fedavg'" in start["refused_sites"]["acrima"][0]["reason"]
    assert start["plan_sha256"] == deployment.plan().sha256
    assert set(summary.sites) == {"refuge", "rimone"}  # the run went on without acrima
    audit = read_audit(root / "state_acrima")
    assert [(r["direction"], r["decision"], r["rule"]) for r in audit][:1] == [
        ("received", "refused", "allow.algorithms")
    ]
    assert not (root / "state_acrima" / "run").exists()  # it kept no state of the run


def test_the_site_audit_log_lists_every_message_received_and_sent(continued) -> None:
    root, grid, _ = continued
    node = next(
        n for n, c in grid.contexts.items() if c.node_config["state-dir"].endswith("refuge")
    )
    sent_to_node = Counter(
        m.metadata.message_type for m in grid.sent if m.metadata.dst_node_id == node
    )

    audit = read_audit(root / "state_refuge")

    received = Counter(r["kind"] for r in audit if r["direction"] == "received")
    replied = Counter(r["kind"] for r in audit if r["direction"] == "sent")
    assert received == sent_to_node == replied
    assert {"query.describe", "train", "evaluate.validate", "evaluate.test"} <= set(received)
    assert all(r["decision"] == "accepted" for r in audit if r["direction"] == "received")
    assert all(r["bytes"] > 0 and len(r["sha256"]) == 64 for r in audit if r["kind"] == "train")
    approval = [r for r in audit if r["direction"] == "decision"]
    assert len(approval) == 1 and "approved by" in approval[0]["reason"]
    # Round 2's training rides with round 1's validation (a message of kind evaluate.validate).
    rounds = {r["round"] for r in audit if r["kind"] in ("train", "evaluate.validate")}
    assert rounds == {1, 2}


def test_a_deployed_run_writes_its_model_card(continued) -> None:
    root, _, _ = continued
    card = (RunDir(root / "run").model_dir / MODEL_CARD).read_text(encoding="utf-8")
    assert "engine: Flower deployment" in card
    assert "| refuge " in card and "| rimone " in card and "| acrima " not in card


def test_an_unapproved_plan_is_refused_before_any_data_is_read(tiny_sites, tmp_path) -> None:
    manifests, cache = tiny_sites
    # refuge's scans are out of reach: reading any of them would fail with a data error.
    moved = tmp_path / "refuge.toml"
    text = manifests["refuge"].read_text(encoding="utf-8")
    moved.write_text(text.replace('root = "', f'root = "{tmp_path}/gone/'), encoding="utf-8")
    nodes = {**manifests, "refuge": moved}
    configs = node_configs(tmp_path, nodes, cache, {"refuge": APPROVAL_ONLY})
    refuge = next(c for c in configs.values() if c["manifest"] == str(moved))
    refuge["cache-dir"] = str(tmp_path / "empty_cache")
    deployment = Deployment.from_run_config(run_config(list(manifests), tmp_path / "run"))

    with pytest.raises(ConfigError, match="refuge: approval.required"):
        FlowerRun(InProcessGrid(configs), deployment).run()

    events = RunDir(tmp_path / "run").read_events()
    refused = next(e for e in events if e["event"] == "site_refused")
    assert refused["site"] == "refuge" and refused["refusals"][0]["rule"] == "approval.required"
    assert events[-1]["event"] == "failed" and "approval.required" in events[-1]["reason"]
    assert not (tmp_path / "empty_cache").exists()  # refuge read nothing, cached nothing
    assert not (tmp_path / "state_refuge" / "run").exists()
    assert not (tmp_path / "run" / "config.toml").exists()  # nothing trained
    audit = read_audit(tmp_path / "state_refuge")
    assert [
        (r["kind"], r["decision"], r["rule"]) for r in audit if r["direction"] == "received"
    ] == [("query.describe", "refused", "approval.required")]


def _test_replies(grid: InProcessGrid) -> list[dict]:
    """The evaluation part of every answer to ``evaluate.test`` the server received."""
    return [
        json.loads(str(m.content.config_records["evaluation"]["json"]))
        for m in grid.received
        if m.metadata.message_type == "evaluate.test" and m.has_content()
        and "evaluation" in m.content.config_records
    ]  # fmt: skip


def test_by_default_no_per_scan_prediction_reaches_the_coordinator(continued) -> None:
    root, grid, deployment = continued
    parts = _test_replies(grid)
    summary = RunDir(root / "run").read_summary()

    assert sorted(p["id"] for p in parts) == ["refuge", "rimone"]
    assert all("scans" not in p and "routing_scores" not in p for p in parts)
    assert "predictions" not in deployment.plan().outputs
    assert not (root / "run" / "predictions.csv").exists()
    assert summary.predictions == "sites"
    with pytest.raises(RunDirError, match="kept each test scan's prediction at its site"):
        RunDir(root / "run").read_predictions()
    for site in ("refuge", "rimone"):  # each site kept its own rows, next to its run state
        rows = RunDir(root / f"state_{site}" / "run" / site).read_predictions()
        assert {r["site"] for r in rows} == {site}
        assert len(rows) == summary.sites[site].n_test


def test_a_sites_min_count_withholds_its_small_cells_and_the_run_goes_on(continued) -> None:
    root, grid, _ = continued
    parts = {p["id"]: p for p in _test_replies(grid)}
    summary = RunDir(root / "run").read_summary()

    refuge, rimone = parts["refuge"], parts["rimone"]
    assert refuge["roc"]["fpr"] is None and "roc" in refuge["suppressed"]
    assert "suppressed" not in rimone and rimone["roc"]["fpr"] is not None
    assert summary.sites["refuge"].roc.fpr is None
    assert "refuge: roc" in summary.suppressed
    assert all(k.startswith("refuge: ") for k in summary.suppressed)
    assert all("outputs.min_count" in why for why in summary.suppressed.values())
    for counts in refuge["routers"].values():
        assert all(v is None or v == 0 or v >= 3 for k, v in counts.items() if k != "latency_ms")


def test_a_run_that_asks_for_predictions_is_refused_where_the_policy_forbids_them(
    tiny_sites, tmp_path
) -> None:
    manifests, cache = tiny_sites
    forbids = "[approval]\nrequired = false\n[outputs]\npredictions = false\n"
    configs = node_configs(tmp_path, manifests, cache, {"rimone": forbids})
    deployment = Deployment.from_run_config(
        run_config(list(manifests), tmp_path / "run", predictions="coordinator")
    )

    with pytest.raises(ConfigError, match="rimone: outputs.predictions"):
        FlowerRun(InProcessGrid(configs), deployment).run()

    assert not (tmp_path / "state_rimone" / "run").exists()  # refused before any data was read


def test_asked_for_and_allowed_the_predictions_are_pooled_as_in_one_process(
    tiny_sites, tmp_path
) -> None:
    manifests, cache = tiny_sites
    config = TrainConfig(algorithm="feddrm", rounds=1, local_steps=1, batch_size=8, seed=6)
    sites = list(manifests)
    configs = node_configs(tmp_path, manifests, cache, {})
    deployment = Deployment.from_run_config(
        run_config(sites, tmp_path / "run", predictions="coordinator")
        | {"train": tomli_w.dumps({"train": config.to_dict()})}
    )
    grid = InProcessGrid(configs)

    FlowerRun(grid, deployment).run()
    local = train(load_sites([manifests[s] for s in sites], cache), config, tmp_path / "local")

    remote = RunDir(tmp_path / "run").read_summary()
    assert "predictions" in deployment.plan().outputs and remote.predictions == "run"
    assert all("scans" in p for p in _test_replies(grid))
    here = RunDir(tmp_path / "local").read_predictions()
    there = RunDir(tmp_path / "run").read_predictions()
    assert [r["scan_id"] for r in there] == [r["scan_id"] for r in here]
    assert [r["routed_site"] for r in there] == [r["routed_site"] for r in here]
    routed, here_routed = remote.routing_calibration, local.routing_calibration
    for key in ("n", "ece", "brier", "accuracy", "mean_chosen", "temperature"):
        assert getattr(routed, key) == pytest.approx(getattr(here_routed, key), abs=1e-6), key
    assert [b["n"] for b in routed.bins] == [b["n"] for b in here_routed.bins]
    assert remote.pooled_auc.estimate == pytest.approx(local.pooled_auc.estimate, abs=1e-6)
