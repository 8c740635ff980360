"""``medfed bench`` and ``medfed demo``: the whole commands on tiny settings, and their pure
helpers (the paired statistics themselves are tested in test_bench_stats.py)."""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from medfed.algorithms import ALGORITHMS
from medfed.cli import app
from medfed.core.errors import ConfigError
from medfed.data.modality import modality_spec
from medfed.experiments import bench
from medfed.experiments.bench import (
    FEDERATION_NORM,
    FIGURES,
    LARGER_ROUND_STEPS,
    MARKER,
    PAPER_FEDDRM,
    RESULTS_VERSION,
    parse_budget,
    stat,
)
from medfed.experiments.bench_tables import findings_lines, methods_markdown, reading_note
from medfed.experiments.demo import Budget, MethodSpec, run_demo
from medfed.experiments.paired import FIGURES_BY_KEY
from medfed.metrics import Interval, verdict
from medfed.models.fedmodel import FedModel, ModelSpec
from medfed.reports.comparisons import VERDICTS
from medfed.runs import RunDir
from tests.test_report import assert_every_accuracy_column_names_its_rule

runner = CliRunner()
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# Tiny budgets: 12 fundus scans and 8 CT patients per site, 2 rounds of 1 local step.
TINY = ["--fundus-budget", "12x2x1", "--ct-budget", "8x2x1", "--image-size", "48"]
TINY += ["--speed-rounds", "2", "--backbone-rounds", "1", "--memory-patients", "6"]
# A CI cell: the mean and its 95% interval, ``0.84 (0.78–0.90)``.
CI_CELL = re.compile(r"\d\.\d\d \(\d\.\d\d\u2013\d\.\d\d\)")
ALL_METHODS = list(bench.bench_methods())
# What the fixture trains: every kind of row the bench has (a baseline, FedDRM and the paper's,
# the warm-up base pair, federation normalization, local training); every algorithm trains in
# test_engine.py, and the default plan's methods are checked without training.
METHODS = ["fedavg", "feddrm", "local", bench.LORA_FROM_BASE, bench.FT_FROM_BASE]
METHODS += [PAPER_FEDDRM, FEDERATION_NORM[0]]


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One quick bench over two seeds, with a README to update."""
    root = tmp_path_factory.mktemp("bench")
    readme = root / "README.md"
    readme.write_text(f"# x\n\n<!-- {MARKER}:start -->\nold\n<!-- {MARKER}:end -->\ntail\n")
    out = root / "out"
    args = ["bench", "--quick", "--seeds", "2", "--out", str(out), "--json"]
    args += [f"--method={m}" for m in METHODS]
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(bench.N_BOOT, "quick", 50)  # tiny data, few resamples
        result = runner.invoke(app, [*args, *TINY, "--update-readme", str(readme)])
    assert result.exit_code == 0, result.output
    return {"out": out, "readme": readme, "stdout": result.stdout, "root": root}


def _results(bench_run: dict[str, Any]) -> dict[str, Any]:
    return json.loads((bench_run["out"] / "results.json").read_text())


def test_bench_json_flag_prints_results_json(bench_run):
    printed = json.loads(bench_run["stdout"])

    assert printed == _results(bench_run)


def test_the_bench_trains_every_registered_method_unless_told_which():
    assert bench.BenchPlan.make().methods == bench.BenchPlan.make(quick=True).methods
    assert bench.BenchPlan.make().methods == bench.bench_methods() == tuple(ALL_METHODS)
    assert {bench.LORA_FROM_BASE, bench.FT_FROM_BASE, PAPER_FEDDRM} <= set(ALL_METHODS)
    assert not {"lora"} & set(ALL_METHODS) and set(ALGORITHMS) - {"lora"} <= set(ALL_METHODS)
    assert FEDERATION_NORM == ("fedavg [federation norm]", "fedbn [federation norm]")
    assert set(FEDERATION_NORM) <= set(ALL_METHODS)


def test_bench_runs_the_methods_it_is_given_on_both_federations(bench_run):
    results = _results(bench_run)

    assert results["schema_version"] == RESULTS_VERSION
    assert results["quick"] is True
    assert results["seeds"] == [0, 1]
    assert results["methods"] == METHODS
    assert set(results["federations"]) == {"fundus", "ct"}
    for fed in results["federations"].values():
        assert list(fed["methods"]) == METHODS
        assert fed["budget"]["rounds"] == 2
        for method, row in fed["methods"].items():
            norm = "federation" if method in FEDERATION_NORM else "site"
            assert row["normalization"] == norm, method
        # medfed's FedDRM keeps its backbone norms (BatchNorm); the paper's shares them.
        backbones = fed["backbones"]
        assert backbones["feddrm"] != backbones[PAPER_FEDDRM]
        assert backbones[PAPER_FEDDRM].endswith("-gn")


def test_lora_and_fedavg_ft_start_from_one_warm_up_base_per_seed(bench_run):
    results = _results(bench_run)
    for modality, fed in results["federations"].items():
        base = fed["warmup_base"]
        assert base == {
            "fedavg_rounds": 1,
            "method_rounds": 1,
            "methods": [bench.LORA_FROM_BASE, bench.FT_FROM_BASE],
        }
        found = fed["base_comparison"]
        assert found["reference"] == bench.LORA_FROM_BASE
        assert list(found["methods"]) == [bench.FT_FROM_BASE]
        for seed in (0, 1):
            folder = bench_run["out"] / "runs" / modality / f"seed{seed}"
            for method in (bench.LORA_FROM_BASE, bench.FT_FROM_BASE):
                config = RunDir(folder / MethodSpec.parse(method).dirname).read_config()
                assert config["train"]["init"] == str((folder / "warmup_base").resolve())
                assert config["train"]["rounds"] == 1
    text = bench_run["readme"].read_text()
    assert "from a FedAvg warm-up base" in text and "same base" in text


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
                operating = metrics["average_accuracy_operating"]["values"][seed]
                assert operating == summary["average_accuracy_operating"]
                known = summary["routers_origin_known"][summary["routing_method"]]
                assert (
                    metrics["system_accuracy_origin_known"]["values"][seed]
                    == known["system_accuracy"]
                )
                assert summary["normalization"] == row["normalization"]
                assert metrics["bytes_per_round"]["values"][seed] == summary["bytes_per_round"]
                rounds = {
                    r["round"]: r["round_seconds"]
                    for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
                }
                median = metrics["median_seconds_per_round"]["values"][seed]
                assert median == pytest.approx(statistics.median(rounds.values()))


def test_bench_intervals_hold_the_seed_means_of_the_per_scan_predictions(bench_run):
    results = _results(bench_run)

    assert results["n_boot"] == 50 and "(seed, site) stratum" in results["ci"]
    for fed in results["federations"].values():
        for method, row in fed["methods"].items():
            intervals, metrics = row["intervals"], row["metrics"]
            pairs = [(intervals["site_auc"][s], metrics["site_auc"][s]) for s in fed["sites"]]
            pairs += [(intervals[k], metrics[k]) for k in FIGURES_BY_KEY]
            for interval, seeds in pairs:
                # predictions.csv recomputes summary.json's figures, seed by seed.
                if seeds["mean"] is None or interval is None:
                    # A site of 2 test scans draws one class in nearly every resample: its
                    # AUC has no interval then.
                    assert seeds["mean"] is not None or interval is None, method
                    continue
                assert interval["estimate"] == pytest.approx(seeds["mean"]), method
                assert interval["low"] <= interval["high"]
                assert "50 resamples" in interval["method"]
            assert intervals["system_accuracy"] and intervals["system_accuracy_origin_known"]
            assert set(row["test_scans"]) == {"n", "positives", "unreliable"}
            assert all(len(v) == 2 for v in row["test_scans"]["n"].values())


def test_bench_compares_feddrm_with_every_method_by_paired_intervals(bench_run):
    results = _results(bench_run)

    for fed in results["federations"].values():
        found = fed["comparisons"]
        assert found["reference"] == "feddrm" and found["seeds"] == [0, 1]
        assert list(found["methods"]) == [m for m in METHODS if m != "feddrm"]
        assert found["figures"]["system_accuracy"]["protocol"] == "origin unknown"
        assert found["figures"]["system_accuracy_origin_known"]["protocol"] == "origin known"
        for figures in found["methods"].values():
            assert list(figures) == list(FIGURES_BY_KEY)
            for result in figures.values():
                interval = result["interval"] and Interval.from_dict(result["interval"])
                assert result["verdict"] in VERDICTS
                assert result["verdict"] == verdict(interval)


def test_bench_speed_section_has_positive_side_by_side_figures(bench_run):
    speed = _results(bench_run)["speed"]

    for key in ("engine_overhead", "engine_overhead_larger_rounds"):
        engine = speed[key]
        assert engine["engine_seconds_per_round"] > 0 and engine["plain_seconds_per_round"] > 0
        expected = engine["engine_seconds_per_round"] / engine["plain_seconds_per_round"]
        assert engine["ratio"] == pytest.approx(expected)
        assert "validation" in engine["definition"]
        # Every site at once, even on the one thread the tests give PyTorch.
        concurrent = engine["concurrent"]
        assert concurrent["workers"] == engine["sites"] and concurrent["threads_per_site"] == 1
        expected = concurrent["seconds_per_round"] / engine["plain_seconds_per_round"]
        assert concurrent["ratio"] == pytest.approx(expected)
    assert speed["engine_overhead_larger_rounds"]["local_steps"] == LARGER_ROUND_STEPS
    markdown = (bench_run["out"] / "results.md").read_text(encoding="utf-8")
    assert "every site at once" in markdown
    assert "| one_pass " in markdown and "density_ratio (default)" in markdown
    for modality in ("fundus", "ct"):
        data = speed["data_path"][modality]
        assert data["cache_misses"] == 0
        for key in ("decode_images_per_s", "cached_images_per_s", "in_memory_images_per_s"):
            assert data[key] > 0
        routing = speed["routing_latency"][modality]
        assert routing["methods"]["feddrm"]["router"] == "density_ratio"
        assert routing["feddrm_density_ratio_ms_per_scan"] > 0
        assert routing["majority_vote_ms_per_scan"] > 0
        # FedDRM's routers side by side: the m-pass default, the one-pass reading, the vote.
        feddrm = routing["methods"]["feddrm"]["routers"]
        assert {"density_ratio", "one_pass", "majority_vote"} <= set(feddrm)
        assert feddrm["one_pass"]["forward_passes"] == 2
        assert feddrm["density_ratio"]["forward_passes"] == (3 if modality == "fundus" else 2)
        for r in feddrm.values():
            assert 0 < r["ms_low"] <= r["ms_per_scan"] <= r["ms_high"]
            assert r["system_accuracy"]["n"] > 0
        assert feddrm["majority_vote"]["routing_accuracy"] is None  # a vote sends no scan anywhere
        assert feddrm["one_pass"]["routing_accuracy"]["n"] > 0
        figures = speed["bytes"][modality]
        assert figures["baseline_bytes_per_round"] > 0
        assert figures["methods"]["fedavg"]["ratio_to_baseline"] == 1.0
        assert figures["methods"]["local"]["bytes_per_round"] == 0


def test_bench_times_fedavg_on_the_3d_and_the_25d_ct_backbones(bench_run):
    found = _results(bench_run)["speed"]["ct_backbones"]
    ct = modality_spec("ct")

    assert found["auto"]["shared_norms"] == ct.default_backbone(False)
    assert found["auto"]["private_norms"] == ct.default_backbone(True)
    assert {"fedbn", "feddrm"} <= set(found["auto"]["private_norm_algorithms"])
    assert "fedavg" not in found["auto"]["private_norm_algorithms"]
    assert (found["algorithm"], found["rounds"], found["warmup_rounds"]) == ("fedavg", 1, 1)
    rows = found["backbones"]
    # The four backbones, then whichever `auto` picks when it is none of them, each once.
    picked = [ct.default_backbone(False), ct.default_backbone(True)]
    assert list(rows) == list(dict.fromkeys([*bench.CT_BACKBONES, *picked]))
    assert {r["path"] for r in rows.values()} == {"3-D", "2.5-D"}
    norms = {"monai3d-gn": "GroupNorm", "slices-cnn-gn": "GroupNorm"}
    norms |= {"monai3d": "BatchNorm3d", "slices-cnn": "BatchNorm2d"}
    channels = found["input_shape"][0]
    for name, row in rows.items():
        assert row["path"] == ("2.5-D" if name.startswith("slices-") else "3-D")
        assert row["norm"] == norms.get(name, row["norm"])
        assert len(row["round_seconds"]) == 1 and row["seconds_per_round"] > 0
        spec = ModelSpec(backbone=name, in_channels=channels, n_sites=found["sites"])
        assert row["parameters"] == sum(p.numel() for p in FedModel(spec).parameters())
        assert 0 < row["backbone_parameters"] < row["parameters"]
        # FedAvg in float32 sends every parameter down to and back from each site.
        assert row["bytes_per_round"] >= 4 * row["parameters"]
        run = bench_run["out"] / "speed" / "ct_backbones" / name
        # The warm-up round and the timed one.
        assert {r.round for r in RunDir(run).read_metrics()} == {1, 2}
    # The 2.5-D small CNN holds fewer weights than the MONAI 3-D ResNet.
    assert rows["slices-cnn-gn"]["parameters"] < rows["monai3d-gn"]["parameters"]


def test_bench_measures_the_memory_of_loading_a_ct_site(bench_run):
    memory = _results(bench_run)["memory"]

    assert memory["patients"] == 6 and memory["storage_dtype"] == "float16"
    assert memory["cold"]["cache_misses"] == 6 and memory["warm"]["cache_misses"] == 0
    assert memory["warm"]["cache_hits"] == 6
    # Each load holds the site's scans once, in float16 (half of one float32 copy), mapped.
    scan_bytes = 2 * math.prod(memory["input_shape"])
    for load in (memory["cold"], memory["warm"]):
        assert load["peak_rss_bytes"] >= load["import_rss_bytes"] > 0
        assert load["site_bytes"] == 6 * scan_bytes == memory["float32_bytes"] // 2
        assert load["mapped"] is True
    assert memory["peak_rss_bytes"] == max(
        memory["cold"]["peak_rss_bytes"], memory["warm"]["peak_rss_bytes"]
    )
    assert memory["limit_bytes"] == 2 * 10**9
    assert memory["under_limit"] == (memory["peak_rss_bytes"] < memory["limit_bytes"])


def test_bench_readme_shows_the_ct_backbones_and_the_memory(bench_run):
    text = bench_run["readme"].read_text()
    results = _results(bench_run)
    ct = modality_spec("ct")

    header = ["backbone", "path", "norm", "parameters", "MB/round", "s/round \\(median\\)"]
    assert re.search(r"\|\s+" + r"\s+\|\s+".join(header) + r"\s+\|", text)
    for name in results["speed"]["ct_backbones"]["backbones"]:
        assert re.search(rf"\| {re.escape(name)}\s+\| (3-D|2\.5-D)\s+\| ", text), name
    assert (
        f"With `backbone = auto`, ct trains **{ct.default_backbone(False)}** where every layer "
        f"is shared and **{ct.default_backbone(True)}** where normalization layers stay on "
        "each site"
    ) in text
    assert "### Memory" in text and "Loading one CT site of 6 patients" in text
    cell = r"\s+\|\s+"
    for load, counts in (("cold", "0 / 6"), ("warm", "6 / 0")):
        row = cell.join([load, r"\d+", r"\d+", r"\d+\.\d", "yes", counts, r"\d+\.\d"])
        assert re.search(rf"\|\s+{row}\s+\|", text), load
    limit = "under" if results["memory"]["under_limit"] else "OVER"
    assert f"MB: {limit} the 2 GB limit." in text


def test_bench_plan_refuses_a_memory_site_too_small_to_split():
    with pytest.raises(ConfigError, match="--memory-patients must be at least 4"):
        bench.BenchPlan.make(quick=True, memory_patients=3)
    with pytest.raises(ConfigError, match="--backbone-rounds"):
        bench.BenchPlan.make(quick=True, backbone_rounds=0)
    plan = bench.BenchPlan.make(quick=True, memory_patients=6)
    assert plan.memory_patients == 6 and "--memory-patients 6" in plan.command
    assert (
        bench.BenchPlan.make().memory_patients
        == bench.BenchPlan.make(quick=True).memory_patients
        == 500
    )


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
    for method in METHODS:
        assert f"| {method} " in table
    # System accuracy under both protocols on both federations at least (with 2 to 4 test
    # scans per site most AUCs have no interval: "(no CI)").
    assert len(CI_CELL.findall(table)) >= 2 * 2 * len(METHODS)
    assert re.search(r"\| \d\.\d\d \(no CI\) \u2020 ", table)
    for protocol in ("origin unknown", "origin known"):
        assert f"system acc. at op. point ({protocol})" in table
    assert_every_accuracy_column_names_its_rule(table)
    assert "AUC columns: each site's model on its own test scans (origin known)" in table
    assert "weights the sites by their test scans, or by their training scans" in table
    assert "Test scans per site on each seed: acrima " in table
    assert "\u2020 unreliable" in table  # a handful of scans per site: every figure is flagged
    assert "| feddrm \u2212 method: worst-site AUC (origin known) " in table
    lines = findings_lines(results)
    # Per federation: FedDRM against every method, and LoRA against FedAvg+FT from one base.
    assert len(lines) == 2 * 2 * len(FIGURES_BY_KEY)
    for line in lines:
        assert line in table
        reference = "lora [warm-up base] " if ", same base, " in line else "feddrm "
        assert f"(origin known): {reference}" in line or f"(origin unknown): {reference}" in line
    for claim in ("above every", "at least", "NOT above"):
        assert claim not in table
    assert results["plots"] == ["fundus.png", "ct.png", "speed.png"]
    for name in results["plots"]:
        assert (out / name).read_bytes()[:8] == PNG_MAGIC
        assert f"]({name})" in table


def test_bench_update_readme_embeds_tables_and_committed_plots(bench_run):
    text = bench_run["readme"].read_text()

    assert "\nold\n" not in text and text.endswith("tail\n")
    assert "| feddrm " in text
    assert CI_CELL.search(text) and "(origin unknown)" in text
    assert findings_lines(_results(bench_run))[0] in text
    for name in ("fundus.png", "ct.png", "speed.png"):
        assert f"](bench/{name})" in text
        assert (bench_run["root"] / "bench" / name).read_bytes()[:8] == PNG_MAGIC


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


def test_bench_refuses_a_zero_seed_count(tmp_path):
    result = runner.invoke(app, ["bench", "--seeds", "0", "--out", str(tmp_path)])

    assert result.exit_code != 0
    assert "--seeds" in result.output


def test_demo_table_shows_cis_counts_both_protocols_and_verdicts(tmp_path: Path):
    readme = tmp_path / "README.md"
    readme.write_text("<!-- demo-table:start -->\nold\n<!-- demo-table:end -->\n")
    lines: list[str] = []

    summaries = run_demo(
        tmp_path / "demo",
        methods=("feddrm", "fedavg"),
        budget=Budget(n_per_site=12, rounds=1, local_steps=1),
        image_size=48,
        n_boot=50,
        echo=lines.append,
        readme=readme,
    )

    table = (tmp_path / "demo" / "demo-table.md").read_text()
    assert table.rstrip() in readme.read_text().replace("<!-- demo-table:end -->", "").rstrip()
    header = next(line for line in table.splitlines() if line.startswith("| method"))
    site = next(iter(summaries["feddrm"].sites.values()))
    assert f"(n={site.n_test}, {site.n_pos} pos)" in header
    assert "system acc. at op. point (origin unknown)" in header
    assert "system acc. at op. point (origin known)" in header
    assert_every_accuracy_column_names_its_rule(table)
    row = next(line for line in table.splitlines() if line.startswith("| feddrm "))
    rate = summaries["feddrm"].routers["density_ratio"].rates["system_accuracy"]
    assert f" {rate.k}/{rate.n} " in row  # system accuracy with its Wilson CI and its counts
    assert "95% CIs: each site's AUC by " in table and "Wilson interval" in table
    assert "\u2020 unreliable" in table
    assert "| feddrm \u2212 method: system accuracy at op. point (origin unknown) " in table
    assert any(
        line.startswith("- seed 0, worst-site AUC (origin known): feddrm ")
        for line in table.splitlines()
    )
    assert "| bytes per round " in table  # fedavg ran: the communication table follows
    record = json.loads((tmp_path / "demo" / "demo-table.json").read_text())
    assert record["comparisons"]["reference"] == "feddrm"
    assert list(record["comparisons"]["methods"]) == ["fedavg"]
    with pytest.raises(ConfigError, match="reference 'lora'"):
        run_demo(tmp_path / "again", methods=("feddrm",), reference="lora", echo=lines.append)


def test_a_bench_of_some_methods_on_one_federation_has_its_own_readme_section():
    plan = bench.BenchPlan.make(modalities=("ct",), methods=("fedavg", "feddrm", "local"))

    assert plan.methods == ("fedavg", "feddrm", "local") and list(plan.budgets) == ["ct"]
    assert plan.marker == "bench-ct-table" and plan.plot_dir.as_posix() == "bench-ct-table"
    assert "--modality ct --method fedavg --method feddrm --method local" in plan.command
    lora = bench.BenchPlan.make(methods=("fedavg", "lora [warm-up base]"))
    assert "--method 'lora [warm-up base]'" in lora.command  # a command line that runs as shown
    both = bench.BenchPlan.make(quick=True)
    assert both.methods == bench.bench_methods() and "--method" not in both.command
    assert both.marker == MARKER and both.plot_dir.as_posix() == "bench"


def test_bench_table_takes_every_accuracy_at_one_rule_and_labels_argmax_apart():
    def figure(mean: float | None) -> dict[str, Any]:
        return {"mean": mean, "std": 0.0, "n": 1}

    metrics = {
        "site_auc": {"a": figure(0.8)},
        "mean_site_auc": figure(0.8),
        "worst_site_auc": figure(0.8),
        "average_accuracy_operating": figure(0.711),
        "average_accuracy_operating_by_train": figure(0.712),
        "average_accuracy": figure(0.772),
        "average_accuracy_by_train": figure(0.773),
        "system_accuracy": figure(0.701),
        "system_accuracy_origin_known": figure(0.702),
        "routing_accuracy": figure(0.97),
        "median_seconds_per_round": figure(1.0),
    }
    old = {k: v for k, v in metrics.items() if "operating" not in k}  # results.json before
    federation = {
        "sites": ["a"],
        "methods": {
            "feddrm": {"metrics": metrics, "routing_method": "density_ratio"},
            "fedavg": {"metrics": old, "routing_method": "majority_vote"},
        },
    }

    table = methods_markdown(federation)

    assert_every_accuracy_column_names_its_rule(table)
    header = [c.strip() for c in table.splitlines()[0].split("|")[1:-1]]
    row = [c.strip() for c in table.splitlines()[2].split("|")[1:-1]]
    cells = dict(zip(header, row, strict=True))
    assert cells["avg acc. at op. point (by test scans)"] == "0.711"
    assert cells["system acc. at op. point (origin unknown)"] == "0.701"
    assert cells["avg acc. at argmax (by test scans)"] == "0.772"
    assert header.index("avg acc. at argmax (by test scans)") > header.index("s/round (median)")
    old_row = [c.strip() for c in table.splitlines()[3].split("|")[1:-1]]
    assert dict(zip(header, old_row, strict=True))["avg acc. at op. point (by test scans)"] == "n/a"
    assert "at op. point: each site's model calls a scan positive" in reading_note(
        {"seeds": [0], "ci": "95% CI"}
    )
