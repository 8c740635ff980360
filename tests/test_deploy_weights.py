"""What a deployed run sends, on the in-process Flower grid.

- One exchange a round, and the global weights once: round r's validation message carries
  them and round r+1's training, which names the weights it trains from by their hash (the
  site rebuilds the same bytes from the weights it just validated), as the finishing message
  does; the run is the in-process run all the same.
- The starting weights (--init) with each site's first message only.
- Whole weights as one array each: Flower fetches every array of a message with a request of
  its own.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("flwr")

from flwr.app import Error, Message, MessageType, RecordDict  # noqa: E402
from flwr.common.constant import ErrorCode  # noqa: E402

from medfed.config import TrainConfig  # noqa: E402
from medfed.federation import wire  # noqa: E402
from medfed.federation.training import load_sites, train  # noqa: E402
from medfed.flower.node import VALIDATED_GLOBAL  # noqa: E402
from medfed.flower.records import json_of, payload_of, state_of, state_record  # noqa: E402
from medfed.runs import RunDir  # noqa: E402
from tests.flowergrid import InProcessGrid, run_in_process  # noqa: E402

# FedBN: only the shared layers go down, a subset of the validated weights.
CONFIG = TrainConfig(algorithm="fedbn", rounds=3, local_steps=1, batch_size=8, seed=6)
VALIDATE = f"{MessageType.EVALUATE}.validate"


def _steps(grid: InProcessGrid, kind: str) -> list[tuple[dict, bytes]]:
    return [
        (json_of(m.content, "step"), payload_of(m.content))
        for m in grid.sent
        if m.metadata.message_type == kind
    ]


@pytest.fixture(scope="module")
def deployed(tiny_sites, tmp_path_factory) -> tuple[Path, InProcessGrid, Path]:
    manifests, cache = tiny_sites
    root = tmp_path_factory.mktemp("weights_once")
    run, grid = run_in_process(root, manifests, cache, CONFIG)
    return run, grid, root


def test_validation_carries_the_next_round_and_the_weights_go_once(deployed) -> None:
    run, grid, _ = deployed
    trains = _steps(grid, MessageType.TRAIN)
    assert len(trains) == 3  # round 1's; later rounds train with the validation before them
    assert all(payload and "reuse_validated" not in step for step, payload in trains)
    validations = [m for m in grid.sent if m.metadata.message_type == VALIDATE]
    assert len(validations) == 3 * 3 and all(payload_of(m.content) for m in validations)
    ahead = [m for m in validations if "next" in m.content.config_records]
    assert len(ahead) == 3 * 2  # rounds 1 and 2 carry rounds 2 and 3
    for message in ahead:
        step = json_of(message.content, "next")
        assert step["round"] == json_of(message.content, "step")["round"] + 1
        rebuilt = wire.lossless_subset(payload_of(message.content), step["keys"])
        assert step["reuse_validated"] == hashlib.sha256(rebuilt).hexdigest()
        assert payload_of(message.content, "next_payload") == b""
    # Finishing names the weights of the last validation.
    finishes = _steps(grid, f"{MessageType.EVALUATE}.finish")
    last = payload_of(validations[-1].content)
    assert [s["reuse_validated"] for s, p in finishes if not p] == [
        hashlib.sha256(last).hexdigest()
    ] * 3
    records = RunDir(run).read_metrics()
    for r in records:
        reused = r["bytes_down_reused"]
        assert reused == (0 if r["round"] == 1 else r["bytes_down"]) and r["bytes_down"] > 0
        # A round's time holds its sites' training, wherever the message that carried it went.
        assert r["round_seconds"] >= r["seconds"] > 0


def test_a_run_that_rebuilds_its_weights_is_the_in_process_run(deployed, tiny_sites, tmp_path):
    run, _, _ = deployed
    manifests, cache = tiny_sites
    local = train(load_sites(list(manifests.values()), cache), CONFIG, tmp_path / "local")
    remote = RunDir(run).read_summary()
    for site in manifests:
        assert remote["sites"][site]["auc"] == pytest.approx(local["sites"][site]["auc"], abs=1e-6)
    here = {(r["round"], r["site"]): r for r in RunDir(tmp_path / "local").read_metrics()}
    for r in RunDir(run).read_metrics():
        mine = here[(r["round"], r["site"])]
        assert r["train_loss"] == pytest.approx(mine["train_loss"], abs=1e-6)
        assert r["val_loss"] == pytest.approx(mine["val_loss"], abs=1e-6)
        assert r["bytes_down"] == mine["bytes_down"]  # what the algorithm's downlink holds


def test_a_site_whose_validation_went_unanswered_gets_a_training_message(tiny_sites, tmp_path):
    """rimone's answer to round 1's validation (and so to round 2's training) is lost: it has
    no round-1 figures, is sent round 2's training on its own, with the weights, and trains
    it as the in-process run does."""
    manifests, cache = tiny_sites
    gone = "rimone"
    node = 10 + list(manifests).index(gone)
    original = InProcessGrid._deliver

    def deliver(self, message):
        step = json_of(message.content, "step") if "step" in message.content.config_records else {}
        kind = message.metadata.message_type
        if (kind, step.get("round"), message.metadata.dst_node_id) == (VALIDATE, 1, node):
            error = Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason="node restarted")
            return Message(error, reply_to=message)
        return original(self, message)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(InProcessGrid, "_deliver", deliver)
        run, grid = run_in_process(tmp_path, manifests, cache, CONFIG)
    records = {(r["round"], r["site"]): r for r in RunDir(run).read_metrics()}
    assert "val_loss" not in records[(1, gone)] and "val_loss" in records[(2, gone)]
    assert all(r["status"] == "ok" for r in records.values())
    again = [
        (m.metadata.dst_node_id, payload_of(m.content))
        for m in grid.sent
        if m.metadata.message_type == MessageType.TRAIN and json_of(m.content, "step")["round"] == 2
    ]
    assert [(n, bool(p)) for n, p in again] == [(node, True)]
    assert records[(2, gone)]["bytes_down_reused"] == 0
    local = train(load_sites(list(manifests.values()), cache), CONFIG, tmp_path / "local")
    assert RunDir(run).read_summary()["sites"][gone]["auc"] == pytest.approx(
        local["sites"][gone]["auc"], abs=1e-6
    )


def test_a_site_whose_validated_weights_are_gone_is_sent_them_to_finish(tiny_sites, tmp_path):
    """The weights a site kept from the last validation are deleted before finishing: its
    finishing fails with the file named, and it is sent the weights themselves."""
    manifests, cache = tiny_sites
    gone = "rimone"
    original = InProcessGrid._deliver

    def deliver(self, message):
        if message.metadata.message_type == f"{MessageType.EVALUATE}.finish":
            for path in tmp_path.glob(f"run_nodes/*/{gone}/{VALIDATED_GLOBAL}"):
                path.unlink()
        return original(self, message)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(InProcessGrid, "_deliver", deliver)
        run, _ = run_in_process(tmp_path, manifests, cache, CONFIG)
    summary = RunDir(run).read_summary()
    assert set(summary["sites"]) == set(manifests) and summary["lost_sites"] == {}
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    resent = [e for e in events if e["event"] == "weights_resent"]
    assert [e["site"] for e in resent] == [gone] and VALIDATED_GLOBAL in resent[0]["reason"]
    assert events[-1]["event"] == "finish"


def test_a_deployed_lora_run_starts_from_the_weights_the_server_sends(tiny_sites, tmp_path):
    """The server loads --init, sends it with the first messages, each node checks its hash
    and keeps it: the deployed run is the in-process run from the same weights."""
    manifests, cache = tiny_sites
    sites = load_sites(list(manifests.values()), cache)
    base = TrainConfig(algorithm="fedavg", rounds=2, local_steps=1, batch_size=8, seed=4)
    train(sites, dataclasses.replace(base, backbone="cnn-gn"), tmp_path / "base")
    config = dataclasses.replace(
        base, algorithm="lora", init=str(tmp_path / "base"), params={"rank": 2}
    )
    run, grid = run_in_process(tmp_path, manifests, cache, config)
    local = train(sites, config, tmp_path / "local")
    remote = RunDir(run).read_summary()
    for site in manifests:
        assert remote["sites"][site]["auc"] == pytest.approx(local["sites"][site]["auc"], abs=1e-6)
    assert remote["routing_accuracy"] == pytest.approx(local["routing_accuracy"], abs=1e-6)
    init = RunDir(run).read_config()["init"]
    assert init["sha256"] == RunDir(tmp_path / "local").read_config()["init"]["sha256"]
    kept = sorted(p.parent.name for p in tmp_path.glob("run_nodes/*/*/init.safetensors"))
    assert kept == sorted(manifests)
    # The starting weights went to each site with its first message only, as one array.
    carrying = [m for m in grid.sent if "init" in m.content.array_records]
    assert len(carrying) == len(manifests)
    assert all(len(m.content.array_records["init"]) == 1 for m in carrying)


def test_every_message_carries_each_state_as_one_array(deployed) -> None:
    _, grid, _ = deployed
    tests = [m for m in grid.sent if m.metadata.message_type.endswith(".test")]
    weights = [sorted(n for n in m.content.array_records if n.startswith("w.")) for m in tests]
    every = sorted(["w.abstention", *(f"w.site_{site}" for site in ("acrima", "refuge", "rimone"))])
    assert len(tests) == 3 and all(names == every for names in weights)  # every site's model
    assert {len(r) for m in grid.sent for r in m.content.array_records.values()} == {1}


def test_a_state_comes_back_exactly_in_its_order() -> None:
    weight = torch.randn(4, 3)
    state = {
        "z.weight": weight,
        "a.tied": weight,  # two names for one tensor, as tied weights
        "m.view": torch.randn(6, 2).t(),  # not contiguous
        "b.half": torch.randn(2, 2).to(torch.bfloat16),
        "n.count": torch.tensor(7),
        "e.empty": torch.zeros(0, 5),
    }
    back = state_of(RecordDict({"w": state_record(state)}), "w")
    assert list(back) == list(state)
    for name, tensor in state.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor), name
