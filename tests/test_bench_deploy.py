"""medfed bench-deploy: a deployed round on loopback (a real SuperLink, SuperNodes and their
resident workers) timed side by side with the same round in one process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from medfed.cli import app
from medfed.runs import RunDir

pytestmark = pytest.mark.flower

runner = CliRunner()


def test_bench_deploy_times_both_rounds_of_the_same_training(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# x\n<!-- deploy-bench:start -->\nold\n<!-- deploy-bench:end -->\n")
    out = tmp_path / "out"
    argv = ["bench-deploy", "--out", str(out), "--rounds", "3", "--local-steps", "1"]
    argv += ["--backbone", "cnn-gn", "--image-size", "48", "--n-per-site", "24"]
    argv += ["--no-without-workers", "--update-readme", str(readme)]
    result = runner.invoke(app, argv)
    assert result.exit_code == 0, result.output
    results = json.loads((out / "deploy-bench.json").read_text())
    rows = results["rows"]
    assert list(rows) == ["in-process", "deployed, resident workers"]
    for row in rows.values():
        assert len(row["rounds_s"]) == 1 and row["round_s"] > 0 and row["site_training_s"] > 0
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
    assert "Goal: a deployed round" in result.output
