"""Faults of a deployed run that only a deployment has, through Flower's own messages in one
process (tests/flowergrid.py): a site's reply lost after it decoded a delta downlink, and a LoRA
site whose update (with its feature statistics) the server refused."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from flwr.app import Message, RecordDict  # noqa: E402

from medfed.config import TrainConfig  # noqa: E402
from medfed.federation.coordinator import Coordinator  # noqa: E402
from medfed.federation.training import load_sites, train  # noqa: E402
from medfed.flower.server_app import FlowerRun  # noqa: E402
from medfed.runs.checkpoints import CheckpointStore  # noqa: E402
from tests.flowergrid import BaseGrid, InProcessGrid, flower_run  # noqa: E402

LOST = "refuge"  # the site whose reply is lost, or whose update is refused


class LossyGrid(InProcessGrid):
    """The in-process grid, losing the replies named in ``lose`` (node, message type, round)
    once each on their way back: the site did the work, the server never hears of it."""

    def __init__(self, configs, lose: list[tuple[int, str, int]]) -> None:
        super().__init__(configs)
        self.lose = list(lose)

    def pull_messages(self, message_ids):
        sent = {m.metadata.message_id: m for m in self.sent}
        kept = []
        for reply in super().pull_messages(message_ids):
            asked = sent[reply.metadata.reply_to_message_id]
            step = asked.content.config_records.get("step")
            round_ = json.loads(str(step["json"])).get("round") if step is not None else None
            key = (asked.metadata.dst_node_id, asked.metadata.message_type, round_)
            if key in self.lose:
                self.lose.remove(key)
                continue
            kept.append(reply)
        return kept


def deploy(root: Path, manifests, cache, config: TrainConfig, lose=()) -> FlowerRun:
    node = 10 + list(manifests).index(LOST)
    run = flower_run(
        root, manifests, cache, config,
        reply_timeout_s=3.0,  # how long the server waits for the lost reply
        grid=lambda configs: LossyGrid(configs, [(node, kind, r) for kind, r in lose]),
    )  # fmt: skip
    run.run()
    return run


def test_a_lost_reply_leaves_the_next_delta_decoded_against_the_servers_reference(
    tiny_sites, tmp_path
) -> None:
    """refuge decodes round 2's delta and trains, but its replies are lost (the validation of
    round 1 that carried round 2's training, then round 2's training sent again): the server
    still holds round 1's reference for it. Round 3's delta must be decoded against that one,
    so refuge trains from exactly the weights the server sent."""
    manifests, cache = tiny_sites
    config = TrainConfig(
        algorithm="fedavg", rounds=3, local_steps=1, batch_size=8, seed=5,
        wire_precision="int8", wire_delta=True,
    )  # fmt: skip
    index = list(manifests).index(LOST)
    sent: dict[int, object] = {}
    original = Coordinator.downlink

    def downlink(self, i, plan):
        down = original(self, i, plan)
        if i == index:
            sent[plan.round] = down.held  # what the server means refuge to hold this round
        return down

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Coordinator, "downlink", downlink)
        run = deploy(
            tmp_path, manifests, cache, config, lose=[("evaluate.validate", 1), ("train", 2)]
        )

    records = [r for r in run.run_dir.read_metrics() if r.site == LOST]
    assert [r.status for r in records] == ["ok", "dropped", "ok"]  # round 2's replies were lost
    store = CheckpointStore(tmp_path / "run_nodes" / "run" / LOST, 3)
    for round_ in (1, 3):
        held = store.load(store.folder / f"round_{round_:04d}")[0]["held"]
        for key, value in sent[round_].items():
            assert held[key].equal(value), (round_, key)


def test_a_lora_site_whose_update_was_refused_sends_its_statistics_again(
    tiny_sites, tmp_path
) -> None:
    """refuge's first LoRA update (with its feature statistics) is refused by the server (a NaN
    drill); the server tells it it holds none of its statistics, so refuge sends them again
    and the client head is fitted from every site's."""
    manifests, cache = tiny_sites
    base = TrainConfig(algorithm="fedavg", rounds=1, local_steps=1, batch_size=8, seed=4)
    sites = load_sites(list(manifests.values()), cache)
    train(sites, dataclasses.replace(base, backbone="cnn-gn"), tmp_path / "base")
    config = dataclasses.replace(
        base, algorithm="lora", rounds=3, init=str(tmp_path / "base"), params={"rank": 2},
        faults=(f"1:{LOST}:nan",),
    )  # fmt: skip

    run = deploy(tmp_path, manifests, cache, config)

    records = [r for r in run.run_dir.read_metrics() if r.site == LOST]
    assert records[0].status == "dropped" and "NaN" in (records[0].reason or "")
    assert sorted(run.server.algorithm.moments) == [0, 1, 2]


class SlowGrid(BaseGrid):
    """A grid whose nodes answer at once, but those in ``asleep``, whose replies wait until
    the test wakes them; replies carry no content."""

    def __init__(self, nodes: list[int], asleep: set[int]) -> None:
        super().__init__(nodes)
        self.asleep = asleep
        self.held: dict[str, Message] = {}

    def answer(self, message: Message) -> Message:
        return Message(RecordDict(), reply_to=message)

    def keep(self, message: Message, reply: Message) -> None:
        if message.metadata.dst_node_id in self.asleep:
            self.held[message.metadata.message_id] = reply
        else:
            super().keep(message, reply)

    def wake(self) -> None:
        self.replies |= self.held
        self.held.clear()


def test_a_site_silent_past_the_others_reply_times_is_given_up_at_the_deadline() -> None:
    """The reply timeout is long; the silent site is given up at the exchange's deadline (the
    slowest reply plus the larger of the floor and factor x that), the reason saying so. In the
    next exchange it gets the floor only; its late reply, once it comes, counts as its reply
    time and it is waited for as any other again."""
    from medfed.flower.messenger import Deadline, Messenger

    grid = SlowGrid([10, 11, 12], asleep={12})
    messenger = Messenger(grid, ["a", "b", "c"], reply_timeout_s=600.0, wait_s=1.0)
    messenger.nodes = {"a": 10, "b": 11, "c": 12}
    messenger.deadline = Deadline(floor_s=0.3, factor=2.0)

    answers = messenger.send("train", {s: RecordDict() for s in "abc"})

    assert not isinstance(answers["a"], str) and not isinstance(answers["b"], str)
    assert "no reply within the exchange's deadline" in answers["c"]
    assert "slowest reply so far" in answers["c"] and messenger.silent == {"c"}
    answers = messenger.send("train", {"c": RecordDict()})
    assert "missed the last exchange's deadline too" in answers["c"]
    grid.wake()  # both late replies arrive while the next exchange waits
    grid.asleep = set()
    answers = messenger.send("train", {s: RecordDict() for s in "abc"})
    assert messenger.silent == set() and "c" in messenger.reply_s
    assert not isinstance(answers["c"], str)
    assert messenger.late == {}


def test_the_deadline_waits_without_a_reference_and_scales_with_the_slowest_reply() -> None:
    from medfed.flower.messenger import Deadline

    rule = Deadline(floor_s=10.0, factor=2.0)
    assert rule.reason(500.0, None, None, silent=False) is None  # nobody answered: no deadline
    assert rule.reason(13.9, 4.0, None, silent=False) is None  # 4 + max(10, 8)
    assert "deadline of 14.0 s" in (rule.reason(14.1, 4.0, None, silent=False) or "")
    assert rule.reason(59.0, 4.0, 20.0, silent=False) is None  # its own pace: 20 + 40
    assert "its own slowest reply 20.0 s" in (rule.reason(60.5, 4.0, 20.0, silent=False) or "")
    assert rule.reason(9.9, None, None, silent=True) is None
    assert rule.reason(10.1, None, None, silent=True) is not None
