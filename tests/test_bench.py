"""``medfed bench``: the whole command on tiny settings, and its pure helpers."""

from __future__ import annotations

import json
import math
import statistics
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from medfed.algorithms import ALGORITHMS
from medfed.cli import app
from medfed.errors import ConfigError
from medfed.experiments.bench import (
    FIGURES,
    MARKER,
    PAPER_FEDDRM,
    RESULTS_VERSION,
    findings,
    findings_lines,
    parse_budget,
    stat,
)
from medfed.experiments.demo import MethodSpec

runner = CliRunner()
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# Tiny budgets: 12 fundus scans and 8 CT patients per site, 2 rounds of 1 local step.
TINY = ["--fundus-budget", "12x2x1", "--ct-budget", "8x2x1", "--image-size", "48"]
TINY += ["--speed-rounds", "2"]


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One quick bench over two seeds, with a README to update."""
    root = tmp_path_factory.mktemp("bench")
    readme = root / "README.md"
    readme.write_text(f"# x\n\n<!-- {MARKER}:start -->\nold\n<!-- {MARKER}:end -->\ntail\n")
    out = root / "out"
    args = ["bench", "--quick", "--seeds", "2", "--out", str(out), "--json"]
    result = runner.invoke(app, [*args, *TINY, "--update-readme", str(readme)])
    assert result.exit_code == 0, result.output
    return {"out": out, "readme": readme, "stdout": result.stdout, "root": root}


def _results(bench_run: dict[str, Any]) -> dict[str, Any]:
    return json.loads((bench_run["out"] / "results.json").read_text())


def test_bench_json_flag_prints_results_json(bench_run):
    printed = json.loads(bench_run["stdout"])

    assert printed == _results(bench_run)


def test_bench_runs_every_registered_method_on_both_federations(bench_run):
    results = _results(bench_run)

    assert results["schema_version"] == RESULTS_VERSION
    assert results["quick"] is True
    assert results["seeds"] == [0, 1]
    assert results["methods"] == [*ALGORITHMS, PAPER_FEDDRM]
    assert set(results["federations"]) == {"fundus", "ct"}
    for fed in results["federations"].values():
        assert set(fed["methods"]) == {*ALGORITHMS, PAPER_FEDDRM}
        assert fed["budget"]["rounds"] == 2
        # medfed's FedDRM keeps its backbone norms (BatchNorm); the paper's shares them.
        backbones = fed["backbones"]
        assert backbones["feddrm"] != backbones[PAPER_FEDDRM]
        assert backbones[PAPER_FEDDRM].endswith("-gn")


def test_bench_mean_and_std_match_the_per_seed_summaries(bench_run):
    results = _results(bench_run)

    for modality, fed in results["federations"].items():
        for method, row in fed["methods"].items():
            metrics = row["metrics"]
            stats = [metrics["site_auc"][s] for s in fed["sites"]]
            stats += [metrics[k] for k in FIGURES]
            for s in stats:
                assert len(s["values"]) == 2
                finite = [v for v in s["values"] if v is not None]
                assert s["n"] == len(finite)
                if finite:
                    assert s["mean"] == pytest.approx(np.mean(finite))
                if len(finite) == 2:
                    assert s["std"] == pytest.approx(np.std(finite, ddof=1))
            for seed in (0, 1):
                run = bench_run["out"] / "runs" / modality / f"seed{seed}"
                run /= MethodSpec.parse(method).dirname
                summary = json.loads((run / "summary.json").read_text())
                assert metrics["system_accuracy"]["values"][seed] == summary["system_accuracy"]
                assert metrics["bytes_per_round"]["values"][seed] == summary["bytes_per_round"]
                rounds = {
                    r["round"]: r["round_seconds"]
                    for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
                }
                median = metrics["median_seconds_per_round"]["values"][seed]
                assert median == pytest.approx(statistics.median(rounds.values()))


def test_bench_speed_section_has_positive_side_by_side_figures(bench_run):
    speed = _results(bench_run)["speed"]

    engine = speed["engine_overhead"]
    assert engine["engine_seconds_per_round"] > 0 and engine["plain_seconds_per_round"] > 0
    expected = engine["engine_seconds_per_round"] / engine["plain_seconds_per_round"]
    assert engine["ratio"] == pytest.approx(expected)
    assert "validation" in engine["definition"]
    for modality in ("fundus", "ct"):
        data = speed["data_path"][modality]
        assert data["cache_misses"] == 0
        for key in ("decode_images_per_s", "cached_images_per_s", "in_memory_images_per_s"):
            assert data[key] > 0
        routing = speed["routing_latency"][modality]
        assert routing["methods"]["feddrm"]["router"] == "density_ratio"
        assert routing["feddrm_density_ratio_ms_per_scan"] > 0
        assert routing["majority_vote_ms_per_scan"] > 0
        figures = speed["bytes"][modality]
        assert figures["baseline_bytes_per_round"] > 0
        assert figures["methods"]["fedavg"]["ratio_to_baseline"] == 1.0
        assert figures["methods"]["local"]["bytes_per_round"] == 0


def test_bench_records_the_device(bench_run):
    device = _results(bench_run)["device"]

    assert device["kind"] in ("cpu", "cuda")
    assert device["cpu"]
    assert (device["gpu"] is None) == (device["kind"] == "cpu")
    load = _results(bench_run)["load_average"]
    assert len(load["start"]) == 3 and len(load["end"]) == 3


def test_bench_writes_markdown_and_plots(bench_run):
    out = bench_run["out"]
    results = _results(bench_run)

    table = (out / "results.md").read_text()
    for method in [*ALGORITHMS, PAPER_FEDDRM]:
        assert f"| {method} " in table
    assert results["plots"] == ["fundus.png", "ct.png", "speed.png"]
    for name in results["plots"]:
        assert (out / name).read_bytes()[:8] == PNG_MAGIC
        assert f"]({name})" in table


def test_bench_update_readme_embeds_tables_and_committed_plots(bench_run):
    text = bench_run["readme"].read_text()

    assert "old" not in text and text.endswith("tail\n")
    assert "| feddrm " in text
    for name in ("fundus.png", "ct.png", "speed.png"):
        assert f"](docs/bench/{name})" in text
        assert (bench_run["root"] / "docs" / "bench" / name).read_bytes()[:8] == PNG_MAGIC


def test_parse_budget_reads_scans_rounds_steps_and_names_the_format():
    budget = parse_budget("240x60x3")

    assert (budget.n_per_site, budget.rounds, budget.local_steps) == (240, 60, 3)
    with pytest.raises(ConfigError, match="SCANSxROUNDSxSTEPS"):
        parse_budget("240x60")


def test_stat_skips_undefined_values():
    s = stat([0.5, None, 0.7])

    assert s["n"] == 2
    assert s["mean"] == pytest.approx(0.6)
    assert s["std"] == pytest.approx(math.sqrt(0.02))
    assert stat([None])["mean"] is None
    assert stat([0.4])["std"] == 0.0


def _row(router: str, system: list[float], worst: list[float]) -> dict[str, Any]:
    return {
        "routing_method": router,
        "metrics": {
            "system_accuracy": stat(system),
            "worst_site_auc": stat(worst),
            "mean_site_auc": stat([None] * len(system)),
        },
    }


def test_findings_state_what_the_results_show_and_against_the_seed_spread():
    fed = {
        "methods": {
            "fedavg": _row("majority_vote", [0.70, 0.70], [0.80, 0.80]),
            "fedbn": _row("majority_vote", [0.74, 0.76], [0.70, 0.94]),
            "feddrm": _row("density_ratio", [0.73, 0.73], [0.81, 0.81]),
            "lora": _row("density_ratio", [0.91, 0.89], [0.60, 0.60]),
        }
    }

    found = findings(fed)

    system = found["leads"]["system_accuracy"]
    assert (system["best"], system["runner_up"]) == ("lora", "fedbn")
    assert system["gap"] == pytest.approx(0.15) and system["gap_exceeds_spread"] is True
    worst = found["leads"]["worst_site_auc"]
    assert (worst["best"], worst["runner_up"]) == ("fedbn", "feddrm")
    assert worst["gap_exceeds_spread"] is False  # 0.01 apart, fedbn's seeds 0.17 apart
    assert "mean_site_auc" not in found["leads"]  # undefined everywhere: nothing to state
    assert found["best_by_router"]["majority_vote"]["method"] == "fedbn"
    assert found["best_by_router"]["density_ratio"]["method"] == "lora"
    lines = findings_lines({"federations": {"fundus": {"findings": found}}})
    assert lines[0].startswith("- fundus, highest system accuracy: lora 0.900 ± 0.014")
    assert "more than the spread between seeds" in lines[0]
    assert "within the spread between seeds" in lines[1]
    assert lines[2].endswith("density_ratio lora 0.900 ± 0.014; majority_vote fedbn 0.750 ± 0.014.")


def test_findings_with_one_seed_do_not_claim_a_spread():
    fed = {"methods": {m: _row("majority_vote", [v], [v]) for m, v in (("a", 0.6), ("b", 0.5))}}

    found = findings(fed)

    assert found["leads"]["system_accuracy"]["gap_exceeds_spread"] is None
    line = findings_lines({"federations": {"ct": {"findings": found}}})[0]
    assert line == (
        "- ct, highest system accuracy: a 0.600, ahead of b (0.500) by 0.100 "
        "(one seed: no spread to compare the gap with)."
    )


def test_findings_name_ties_instead_of_a_zero_lead():
    fed = {
        "methods": {
            m: _row("majority_vote", v, v) for m, v in (("a", [0.5, 0.7]), ("b", [0.7, 0.5]))
        }
    }

    (line, *_) = findings_lines({"federations": {"ct": {"findings": findings(fed)}}})

    assert line == "- ct, highest system accuracy: a 0.600 ± 0.141 (tied with b)."


def test_bench_refuses_a_zero_seed_count(tmp_path):
    result = runner.invoke(app, ["bench", "--seeds", "0", "--out", str(tmp_path)])

    assert result.exit_code != 0
    assert "--seeds" in result.output
