"""What a deployed run sends, on the in-process Flower grid.

- The global weights once a round: validation carries them, and the next round's training
  message (and the finishing one) names their hash for a site that validated them, which
  rebuilds the same bytes; the run is the in-process run all the same.
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

from flwr.app import MessageType, RecordDict  # noqa: E402

from medfed.config import TrainConfig  # noqa: E402
from medfed.federation.training import load_sites, train  # noqa: E402
from medfed.flower.node import VALIDATED_GLOBAL  # noqa: E402
from medfed.flower.records import json_of, payload_of, state_of, state_record  # noqa: E402
from medfed.runs import RunDir  # noqa: E402
from tests.flowergrid import InProcessGrid, run_in_process  # noqa: E402

# FedBN: only the shared layers go down, a subset of the validated weights.
CONFIG = TrainConfig(algorithm="fedbn", rounds=3, local_steps=1, batch_size=8, seed=6)


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


def test_training_after_a_validation_names_the_weights_instead_of_sending_them(deployed) -> None:
    run, grid, _ = deployed
    trains = _steps(grid, MessageType.TRAIN)
    assert len(trains) == 3 * 3
    first, later = trains[:3], trains[3:]
    assert all(payload and "reuse_validated" not in step for step, payload in first)
    assert all(payload == b"" and step["reuse_validated"] for step, payload in later)
    # Validation still sends the weights; finishing names those of the last validation.
    validations = _steps(grid, f"{MessageType.EVALUATE}.validate")
    assert len(validations) == 3 * 3 and all(payload for _, payload in validations)
    finishes = _steps(grid, f"{MessageType.EVALUATE}.finish")
    last = validations[-1][1]
    assert [s["reuse_validated"] for s, p in finishes if not p] == [
        hashlib.sha256(last).hexdigest()
    ] * 3
    records = RunDir(run).read_metrics()
    for r in records:
        reused = r["bytes_down_reused"]
        assert reused == (0 if r["round"] == 1 else r["bytes_down"]) and r["bytes_down"] > 0


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


def test_a_site_whose_validated_weights_are_gone_sits_the_round_out(tiny_sites, tmp_path):
    """The weights a site kept from validation are deleted before round 2: that site's round
    fails with the file named, the others train, and the next validation sends the weights
    again, so the site is back in round 3."""
    manifests, cache = tiny_sites
    gone = "rimone"
    original = InProcessGrid._deliver

    def deliver(self, message):
        step = json_of(message.content, "step") if "step" in message.content.config_records else {}
        if message.metadata.message_type == MessageType.TRAIN and step.get("round") == 2:
            for path in tmp_path.glob(f"run_nodes/*/{gone}/{VALIDATED_GLOBAL}"):
                path.unlink()
        return original(self, message)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(InProcessGrid, "_deliver", deliver)
        run, _ = run_in_process(tmp_path, manifests, cache, CONFIG)
    records = {(r["round"], r["site"]): r for r in RunDir(run).read_metrics()}
    dropped = records[(2, gone)]
    assert dropped["status"] == "dropped"
    assert VALIDATED_GLOBAL in dropped["reason"] and "sits this round out" in dropped["reason"]
    assert all(records[(2, s)]["status"] == "ok" for s in manifests if s != gone)
    assert records[(3, gone)]["status"] == "ok"
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
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
