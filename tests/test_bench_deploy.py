"""medfed bench-deploy: a deployed round on loopback (a real SuperLink, SuperNodes and their
resident workers) timed side by side with the same round in one process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("flwr")

from medfed.cli import app  # noqa: E402
from medfed.runs import RunDir  # noqa: E402
from tests.flowergrid import BaseGrid  # noqa: E402

pytestmark = pytest.mark.flower

runner = CliRunner()


def test_bench_deploy_times_both_rounds_of_the_same_training(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# x\n<!-- deploy-bench:start -->\nold\n<!-- deploy-bench:end -->\n")
    out = tmp_path / "out"
    argv = ["bench-deploy", "--out", str(out), "--rounds", "3", "--local-steps", "1"]
    argv += ["--backbone", "cnn-gn", "--image-size", "48", "--n-per-site", "24"]
    argv += ["--no-without-workers", "--sheet-algorithm", "fedavg", "--update-readme", str(readme)]
    result = runner.invoke(app, argv)
    assert result.exit_code == 0, result.output
    results = json.loads((out / "deploy-bench.json").read_text())
    rows = results["rows"]
    floor = "Flower's floor: the same messages, no training"
    assert list(rows) == ["in-process", "deployed, resident workers", floor]
    for name, row in rows.items():
        assert row["round_s"] > 0 and (row["site_training_s"] > 0) == (name != floor)
        assert len(row["rounds_s"]) == 1  # as many rounds of each
    # The floor carried the deployed round's messages: its bytes are the deployed run's.
    assert (
        rows[floor]["bytes_per_site_round"]
        == rows["deployed, resident workers"]["bytes_per_site_round"]
    )
    share = results["medfed_share"]
    deployed = rows["deployed, resident workers"]
    assert share["median_s"] == pytest.approx(
        deployed["round_s"] - deployed["site_training_s"] - results["floor_s"]
    )
    assert results["superlink_cpu_per_message_s"] >= 0
    fedavg = results["algorithm_bytes"]["fedavg"]
    assert fedavg["down"] > 0 and fedavg["up"] > 0 and fedavg["eval"] >= fedavg["down"]
    assert [(r["sites"], r["algorithm"]) for r in results["sheet"]] == [
        (20, "fedavg"),
        (100, "fedavg"),
    ]
    big = results["sheet"][1]
    assert big["superlink_bytes"] == 100 * (fedavg["eval"] + fedavg["up"])
    assert big["round_s"] >= results["floor_s"] + results["training_s"]
    assert rows["in-process"]["ratio"] == 1.0
    assert rows["deployed, resident workers"]["overhead_s"] == pytest.approx(
        rows["deployed, resident workers"]["round_s"] - rows["in-process"]["round_s"]
    )
    assert results["clientapp_start_s"] > 0 and results["met"] in (True, False)
    # Like with like: the deployed run is the in-process run.
    here = RunDir(out / "inprocess").read_summary()["sites"]
    there = RunDir(out / "deployed_workers" / "run").read_summary()["sites"]
    assert {s: v["auc"] for s, v in there.items()} == pytest.approx(
        {s: v["auc"] for s, v in here.items()}, abs=1e-6
    )
    text = readme.read_text()
    assert "old" not in text and "| deployed, resident workers |" in text
    assert f"| {floor} |" in text and "| 100 | fedavg |" in text
    assert "Goal: a deployed round" in result.output


class FloorGrid(BaseGrid):
    """Delivers each message to the floor's ClientApp in this process, through Flower's wire
    format."""

    def __init__(self, nodes: list[int]) -> None:
        super().__init__(nodes)
        self.sizes: list[int] = []

    def answer(self, message):
        from flwr.app import Context, RecordDict
        from flwr.common.serde import message_from_proto, message_to_proto

        from medfed.flower.floor import client

        self.sizes.append(message.content.array_records["payload"]["payload"].numpy().size)
        wire = message_from_proto(message_to_proto(message))
        return client(wire, Context(1, message.metadata.dst_node_id, {}, RecordDict(), {}))


def test_the_floor_round_carries_the_asked_bytes_each_way() -> None:
    from medfed.flower.floor import exchange

    grid = FloorGrid([5, 6, 7])
    seconds = exchange(grid, [5, 6, 7], 0, down=1000, up=300, timeout=30.0)
    assert seconds > 0 and grid.sizes == [1000, 1000, 1000]
    with pytest.raises(RuntimeError, match="did not answer"):
        grid.push_messages = lambda messages: ["lost"]  # a reply that never comes
        exchange(grid, [5], 1, down=10, up=10, timeout=0.3)


def test_the_sheet_scales_bytes_and_cpu_with_the_sites_and_adds_the_training() -> None:
    from medfed.experiments.deploy_sheet import LINK_BANDWIDTH_BYTES_S, sheet
    from medfed.experiments.deploy_speed import medfed_share

    per = {"fedavg": {"down": 100, "up": 1_000_000, "eval": 2_000_000}}
    rows = sheet(per, floor_s=4.0, measured_sites=3, cpu_per_message_s=0.01, training_s=6.0)
    twenty, hundred = rows
    assert (twenty["sites"], hundred["sites"]) == (20, 100)
    assert hundred["superlink_bytes"] == 100 * 3_000_000
    assert hundred["superlink_cpu_s"] == pytest.approx(2 * 100 * 0.01)
    extra = 97 * 2 * 0.01 + 100 * 3_000_000 / LINK_BANDWIDTH_BYTES_S
    assert hundred["round_s"] == pytest.approx(4.0 + extra + 6.0)
    assert hundred["secure_round_s"] == pytest.approx(4 * (4.0 + extra) + 6.0)
    share = medfed_share([10.0, 11.0, 12.0], [5.0, 5.0, 5.0], floor_s=4.0)
    assert (share["median_s"], share["q1_s"], share["q3_s"]) == (2.0, 1.5, 2.5)
