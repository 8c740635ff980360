"""``medfed bench-throughput``: medfed's site worker and a plain torchvision loop measured side
by side (warm and cold) on tiny data, its table, its memory figure and its refusals."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from medfed.cli import app
from medfed.core.errors import ConfigError
from medfed.experiments.memory import fundus_site_memory
from medfed.experiments.throughput import MARKER, ThroughputPlan
from medfed.experiments.throughput_report import full_report, memory_markdown

TINY = ThroughputPlan(image_size=32, batch_size=2, steps=1, scans=16, repeats=3, workers=0)


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("throughput") / "out"
    text = full_report(out, TINY, 0, echo=lambda _: None)
    return out, text


def test_both_sides_are_measured_warm_and_cold_on_the_same_photos(measured):
    out, text = measured
    results = json.loads((out / "throughput.json").read_text(encoding="utf-8"))

    warm, cold = results["warm"], results["cold"]
    assert len(warm["runs"]["medfed"]) == len(warm["runs"]["plain"]) == TINY.repeats
    pairs = [a / b for a, b in zip(warm["runs"]["medfed"], warm["runs"]["plain"], strict=True)]
    assert warm["ratios"] == pytest.approx(pairs)
    assert warm["ratio"] == pytest.approx(sorted(pairs)[len(pairs) // 2])
    assert results["within_goal"] == (warm["ratio"] >= 0.95)
    assert results["input_shape"] == [3, 32, 32]
    # one epoch of whole batches on each side, the cold time split into its parts
    assert cold["medfed"]["images"] == cold["plain"]["images"] > 0
    for side in ("medfed", "plain"):
        c = cold[side]
        parts = c["decode_s"] + c["model_s"] + c["train_s"]
        assert c["total_s"] == pytest.approx(parts, rel=1e-6, abs=1e-6)
    assert cold["medfed"]["decode_s"] > 0
    assert "memory" not in results
    assert (out / "throughput.md").read_text(encoding="utf-8").strip() == text.strip()
    assert "| warm (cached tensors)" in text and "tv-resnet18 at 32 px" in text


def test_the_feature_pass_is_measured_on_every_photo_of_the_site(measured):
    out, text = measured
    features = json.loads((out / "throughput.json").read_text(encoding="utf-8"))["features"]

    runs = features["runs"]
    assert features["images"] == TINY.scans  # every split's photos, both sides
    assert len(runs["medfed"]) == len(runs["plain"]) == TINY.repeats
    pairs = [a / b for a, b in zip(runs["medfed"], runs["plain"], strict=True)]
    assert features["ratios"] == pytest.approx(pairs)
    assert features["ratio"] == pytest.approx(sorted(pairs)[len(pairs) // 2])
    assert "| frozen-encoder feature pass (nothing cached)" in text
    assert f"the same {TINY.scans} photos from disk to pooled MobileNetV2 features" in text


def test_the_memory_table_reports_a_large_sites_load_against_the_limit(tmp_path):
    memory = fundus_site_memory(8, 32, workdir=tmp_path).to_dict()

    assert memory["patients"] == 8 and memory["input_shape"] == [3, 32, 32]
    assert memory["warm"]["mapped"] and memory["warm"]["cache_misses"] == 0
    assert memory["cold"]["cache_misses"] == 8
    text = memory_markdown(memory)
    assert "within 4 GB" in text and "| cold (empty)" in text and "| yes" in text
    assert list(tmp_path.iterdir()) == []  # its photos and cache are removed afterwards


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"backbone": "cnn"}, "--backbone 'cnn'"),
        ({"image_size": 1024}, "--image-size must be 32..512"),
        ({"scans": 4}, "--scans must be at least 16"),
        ({"steps": 0}, "--steps must be at least 1"),
    ],
)
def test_a_bad_setting_is_refused_by_name(change, words):
    with pytest.raises(ConfigError, match=words):
        ThroughputPlan(**change)


def test_the_command_refuses_a_page_without_its_markers(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("no markers here\n", encoding="utf-8")

    result = CliRunner().invoke(
        app, ["bench-throughput", "--out", str(tmp_path / "o"), "--update-readme", str(page)]
    )

    assert result.exit_code != 0
    assert MARKER in result.output and "Traceback" not in result.output
    assert not (tmp_path / "o").exists()


def test_dp_cost_times_four_loops_on_one_group_norm_network(measured):
    from medfed.config import load_manifest
    from medfed.data.cache import TensorCache
    from medfed.data.sitedata import load_site
    from medfed.experiments.dpcost import dp_cost, dp_markdown
    from medfed.models.device import resolve_device

    out, _ = measured
    site = load_site(load_manifest(out / "data" / "site.toml"), TensorCache(out / "cache"))

    found = dp_cost(site, TINY, resolve_device("cpu"), 1, "tv-resnet18-gn")

    seconds = found["seconds_per_step"]
    assert set(seconds) == {"medfed", "medfed_dp", "plain", "opacus"}
    assert all(v > 0 for v in seconds.values())
    assert found["opacus_ratio"] == pytest.approx(seconds["opacus"] / seconds["plain"])
    assert found["medfed_dp_ratio"] == pytest.approx(seconds["medfed_dp"] / seconds["medfed"])
    text = dp_markdown(found, 32)
    assert "tv-resnet18-gn at 32 px" in text and "Opacus itself multiplies" in text


@pytest.mark.parametrize("backbone", ["tv-resnet18", "cnn-gn", "resnet18-gn"])
def test_dp_cost_refuses_a_backbone_that_is_not_a_group_norm_torchvision_twin(backbone):
    from medfed.experiments.dpcost import checked_backbone

    with pytest.raises(ConfigError, match=f"--dp-backbone '{backbone}'"):
        checked_backbone(backbone)


def test_the_compiled_row_measures_the_worker_with_compile_set(tmp_path, monkeypatch):
    def broken(*args, **kwargs):  # a compiler that fails when first run: eager, reason kept
        def call(*a, **k):
            raise RuntimeError("inductor failed: no C++ compiler")

        return call

    monkeypatch.setattr(torch, "compile", broken)
    plan = dataclasses.replace(TINY, repeats=2, compiled=True)

    text = full_report(tmp_path / "out", plan, 0, echo=lambda _: None)

    results = json.loads((tmp_path / "out" / "throughput.json").read_text(encoding="utf-8"))
    compiled = results["compile"]
    assert compiled["compiled"] is False
    assert compiled["fallback"] == "RuntimeError: inductor failed: no C++ compiler"
    runs = results["warm"]["runs"]
    assert len(runs["medfed_compiled"]) == len(runs["medfed"]) == 2
    gains = [a / b for a, b in zip(runs["medfed_compiled"], runs["medfed"], strict=True)]
    assert compiled["ratio"] == pytest.approx(sorted(gains)[1] / 2 + sorted(gains)[0] / 2)
    assert "| warm, compile fell back to eager" in text and "x the eager worker" in text
    assert "inductor failed" in text


def test_the_table_has_no_compiled_row_unless_asked(measured):
    out, text = measured
    results = json.loads((out / "throughput.json").read_text(encoding="utf-8"))
    assert results["compile"] is None and "compiled" not in text.lower()
