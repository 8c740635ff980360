"""``medfed transfer``: a FedAvg base from federation A as the start of LoRA and FedDRM on
federation B, against random weights, on a tiny budget."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from medfed.cli import app
from medfed.experiments.transfer import (
    MARKER,
    PAIRS,
    PLOT_DIR,
    TARGET_SEED,
    TransferBudget,
    rounds_to,
    run_transfer,
    target_seeds,
    worst_site_curve,
)
from medfed.runs import RunDir

runner = CliRunner()
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = TransferBudget(
    n_per_site=24, base_rounds=2, rounds=2, local_steps=1, image_size=48, early_rounds=1, seeds=2
)
SEEDS = target_seeds(TINY)
MARKED = f"<!-- {MARKER}:start -->\nold text\n<!-- {MARKER}:end -->"
README = f"# medfed\n\nbefore\n\n{MARKED}\n\nafter\n"


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("transfer")
    readme = root / "README.md"
    readme.write_text(README, encoding="utf-8")
    out = root / "out"
    results = run_transfer(out, budget=TINY, n_boot=50, echo=lambda _: None, readme=readme)
    return out, readme, results


def test_writes_the_results_the_plot_and_the_readme_section(finished) -> None:
    out, readme, results = finished
    assert json.loads((out / "transfer.json").read_text(encoding="utf-8")) == results
    assert (out / "transfer.png").read_bytes().startswith(PNG_MAGIC)
    assert (readme.parent / PLOT_DIR / "transfer.png").read_bytes().startswith(PNG_MAGIC)
    text = readme.read_text(encoding="utf-8")
    assert "old text" not in text and text.startswith("# medfed\n\nbefore")
    assert text.endswith(f"<!-- {MARKER}:end -->\n\nafter\n")
    assert f"]({PLOT_DIR.as_posix()}/transfer.png)" in text
    markdown = (out / "transfer.md").read_text(encoding="utf-8")
    assert "](transfer.png)" in markdown
    for section in (markdown, text):
        assert "worst-site test AUC (95% CI)" in section
        assert "95% percentile interval of a paired bootstrap" in section
        assert "medfed transfer" in section  # the caption names the command


def test_every_pair_has_both_curves_one_point_per_round(finished) -> None:
    _, _, results = finished
    assert list(results["pairs"]) == [p.name for p in PAIRS]
    for pair in PAIRS:
        found = results["pairs"][pair.name]
        assert set(found["curves"]) == {pair.pretrained.label, pair.random.label}
        for curve in found["curves"].values():
            assert [p["round"] for p in curve] == list(range(1, TINY.rounds + 1))
        for stage in ("comparisons", "early_comparisons"):
            comparisons = found[stage]
            assert comparisons["reference"] == pair.pretrained.label
            assert set(comparisons["methods"]) == {pair.random.label}
            assert comparisons["seeds"] == SEEDS == [TARGET_SEED, TARGET_SEED + 1]


def test_the_short_budget_runs_are_their_own_runs(finished) -> None:
    out, readme, results = finished
    for pair in PAIRS:
        for arm in (pair.pretrained, pair.random):
            short = RunDir(out / "runs" / f"seed{SEEDS[-1]}" / f"{arm.dirname}_early")
            assert short.read_config()["train"]["rounds"] == TINY.early_rounds
            assert ("init" in short.read_config()) == arm.pretrained
            # Its own test figures (an interval may be undefined on a handful of scans).
            assert set(results["runs"][arm.label]["early_test"]) == {
                "worst_site_auc",
                "mean_site_auc",
            }
    assert f"After {TINY.early_rounds} rounds" in readme.read_text(encoding="utf-8")


def test_the_curve_is_the_lowest_site_validation_auc_of_metrics_jsonl(finished) -> None:
    _, _, results = finished
    for found in results["runs"].values():
        means: dict[int, list[float]] = {}
        for seed, run in found["runs"].items():
            lines = Path(run, "metrics.jsonl").read_text(encoding="utf-8").splitlines()
            by_round: dict[int, list[float]] = {}
            for record in map(json.loads, lines):
                if record.get("val_auc") is not None:
                    by_round.setdefault(record["round"], []).append(record["val_auc"])
            expected = {r: min(v) for r, v in by_round.items()}
            curve = found["seed_curves"][seed]
            got = {p["round"]: p["worst_site_val_auc"] for p in curve}
            assert {r: v for r, v in got.items() if v is not None} == pytest.approx(expected)
            for r, v in expected.items():
                means.setdefault(r, []).append(v)
        # The curve shown is the mean over the seeds.
        mean = {p["round"]: p["worst_site_val_auc"] for p in found["curve"]}
        assert {r: v for r, v in mean.items() if v is not None} == pytest.approx(
            {r: sum(v) / len(v) for r, v in means.items()}
        )


def test_pretrained_runs_start_from_the_base_and_random_runs_do_not(finished) -> None:
    out, _, results = finished
    base = (out / "runs" / "base").resolve()
    for pair, seed in ((p, s) for p in PAIRS for s in SEEDS):
        for arm in (pair.pretrained, pair.random):
            folder = out / "runs" / f"seed{seed}" / arm.dirname
            config = tomllib.loads((folder / "config.toml").read_text())
            assert config["train"]["algorithm"] == arm.algorithm
            assert config["train"]["seed"] == seed
            if arm.pretrained:
                assert Path(config["init"]["source"]) == base
                assert config["train"]["init"] == str(base)
                assert config["init"]["loaded"]  # the base's tensors were loaded
                assert results["runs"][arm.label]["init"] == str(base)
            else:
                assert "init" not in config and not config["train"].get("init")
                assert results["runs"][arm.label]["init"] is None
    lora_random = out / "runs" / f"seed{SEEDS[0]}" / "lora_random" / "config.toml"
    lora_random = tomllib.loads(lora_random.read_text())
    assert lora_random["train"]["params"]["base"] == "federated"


def test_curve_and_threshold_helpers(tmp_path: Path) -> None:
    def record(round_: int, site: str, auc: float | None) -> dict[str, Any]:
        figures = {"val_loss": 1.0, "val_accuracy": 0.5, "val_auc": auc}
        return {"round": round_, "site": site, "status": "ok", **figures}

    # Site b's validation AUC is undefined in round 2 (one class): left out of the minimum.
    RunDir(tmp_path).append_metrics(
        [record(1, "a", 0.7), record(1, "b", 0.6), record(2, "a", 0.9), record(2, "b", None)]
    )
    curve = worst_site_curve(tmp_path)
    assert curve == [
        {"round": 1, "worst_site_val_auc": 0.6},
        {"round": 2, "worst_site_val_auc": 0.9},
    ]
    assert rounds_to(curve, 0.6) == 1
    assert rounds_to(curve, 0.75) == 2
    assert rounds_to(curve, 0.95) is None


def test_cli_refuses_a_readme_without_the_markers_before_training(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# no markers\n", encoding="utf-8")
    out = tmp_path / "out"
    result = runner.invoke(
        app, ["transfer", "--quick", "--out", str(out), "--update-readme", str(readme)]
    )
    assert result.exit_code == 2
    assert f"<!-- {MARKER}:start -->" in result.output
    assert not out.exists()
