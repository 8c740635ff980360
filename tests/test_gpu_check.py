"""``medfed gpu-check``: its short CPU form (the GPU path's bf16 autocast and channels-last on
the CPU, against float32), and the judging of its figures."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from medfed.experiments.gpucheck import (
    CLINICAL_TOLERANCE,
    SHORT,
    STEM,
    TOLERANCES,
    check_passed,
    compare_figures,
    run_gpu_check,
)
from medfed.models.device import cpu_bf16_supported, resolve_device

pytestmark = pytest.mark.skipif(not cpu_bf16_supported(), reason="no CPU bf16 autocast here")


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("gpu") / "out"
    budget = dataclasses.replace(SHORT, rounds=1)  # the comparison needs one round only
    results = run_gpu_check(out, budget=budget, algorithms=["fedavg"], echo=lambda _: None)
    return out, results


def test_the_short_check_runs_both_modalities_on_both_devices(checked) -> None:
    out, results = checked
    written = json.loads((out / f"{STEM}.json").read_text(encoding="utf-8"))
    assert written == json.loads(json.dumps(results))
    assert results["device"] == "cpu-bf16" and "bf16" in results["machine"]["device"]
    assert results["ok"] is True
    for modality in ("fundus", "ct"):
        row = results["modalities"][modality]["algorithms"]["fedavg"]
        assert row["cpu-bf16"]["ok"] and row["cpu"]["ok"]
        assert set(row["comparison"]) == set(TOLERANCES)
        loss = row["comparison"]["first_round_loss"]
        # bf16 really ran: the losses differ, a little
        assert loss["difference"] is not None and 0 < loss["difference"] <= 0.05
        speed = results["modalities"][modality]["throughput"]
        assert all(r["ok"] and r["images_per_second"] > 0 for r in speed.values())
        # Every site at once on the device gives the one-at-a-time figures (the same threads
        # per site here: the tests give PyTorch one).
        at_once = results["modalities"][modality]["sites_at_once"]
        assert at_once["one_by_one"]["ok"] and at_once["at_once"]["ok"]
        assert all(c["difference"] == 0 for c in at_once["comparison"].values() if c["within"])
    # the clinical-resolution path: 224 px, ResNet-50 and EfficientNet-B0 by the site worker
    clinical = results["clinical"]
    assert clinical["image_size"] == 224
    assert set(clinical["backbones"]) == {"tv-resnet50", "tv-efficientnet-b0"}
    for row in clinical["backbones"].values():
        assert row["ok"] and row["within"] and row["images_per_second"] > 0
        assert 0 < row["difference"] <= CLINICAL_TOLERANCE  # bf16 really ran
    # fp16 with a gradient scaler (a GPU without bf16): run on the CPU's fp16 autocast here
    fp16 = results["modalities"]["fundus"]["fp16"]
    assert fp16["ran"] and fp16["device"] == "cpu" and fp16["fp16"]["ok"]
    assert "fp16 autocast with a gradient scaler" in fp16["precision"]
    assert fp16["loss_scale"] and all(s > 0 for s in fp16["loss_scale"].values())
    assert fp16["cpu"] is row_fundus_cpu(results)  # the float32 run already trained
    assert all(c["within"] is not False for c in fp16["comparison"].values())
    assert "ct" not in results["modalities"] or "fp16" not in results["modalities"]["ct"]
    markdown = (out / f"{STEM}.md").read_text(encoding="utf-8")
    assert "fedavg in fp16 with a gradient scaler against float32" in markdown
    assert "Clinical resolution (224 px" in markdown
    assert "passed" in markdown and "images/s" in markdown and "ok" in markdown
    assert "every site at once against one at a time" in markdown


def row_fundus_cpu(results: dict[str, Any]) -> dict[str, Any]:
    return results["modalities"]["fundus"]["algorithms"]["fedavg"]["cpu"]


def test_a_figure_outside_its_tolerance_or_a_failed_run_fails_the_check(checked) -> None:
    _, results = checked
    far = compare_figures({"first_round_loss": 1.0}, {"first_round_loss": 0.5})
    assert far["first_round_loss"]["within"] is False
    assert far["worst_site_auc"]["within"] is None  # not measured: reported, not judged
    near = compare_figures({"worst_site_auc": 0.80}, {"worst_site_auc": 0.70})
    assert near["worst_site_auc"]["within"] is True
    broken = json.loads(json.dumps(results))
    row = broken["modalities"]["fundus"]["algorithms"]["fedavg"]
    row["comparison"]["first_round_loss"]["within"] = False
    assert not check_passed(broken)
    broken = json.loads(json.dumps(results))
    broken["modalities"]["ct"]["algorithms"]["fedavg"]["cpu-bf16"] = {"ok": False, "error": "x"}
    assert not check_passed(broken)
    broken = json.loads(json.dumps(results))
    broken["modalities"]["ct"]["sites_at_once"]["at_once"] = {"ok": False, "error": "x"}
    assert not check_passed(broken)
    broken = json.loads(json.dumps(results))
    broken["modalities"]["fundus"]["fp16"]["fp16"] = {"ok": False, "error": "x"}
    assert not check_passed(broken)
    broken = json.loads(json.dumps(results))
    broken["modalities"]["fundus"]["fp16"]["loss_scale"]["site_a"] = None  # no scaler ran
    assert not check_passed(broken)
    broken = json.loads(json.dumps(results))
    broken["modalities"]["fundus"]["fp16"] = {"ran": False, "note": "no fp16 here"}
    assert check_passed(broken)  # reported, not judged
    broken = json.loads(json.dumps(results))
    broken["clinical"]["backbones"]["tv-resnet50"]["within"] = False
    assert not check_passed(broken)
    broken = json.loads(json.dumps(results))
    broken["clinical"]["backbones"]["tv-efficientnet-b0"] = {"ok": False, "error": "x"}
    assert not check_passed(broken)


def test_the_bf16_device_runs_the_gpu_paths_numerics_on_the_cpu() -> None:
    setup = resolve_device("cpu-bf16")
    assert setup.channels_last and setup.autocast_dtype == torch.bfloat16
    with setup.autocast()():
        out = torch.nn.Linear(4, 4)(torch.ones(2, 4))
    assert out.dtype == torch.bfloat16
    assert resolve_device("cpu").autocast()()  # a plain context, no autocast


def test_python_dash_m_medfed_is_the_command_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "medfed", "gpu-check", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "--short" in result.stdout and "Usage: medfed gpu-check" in result.stdout
