"""Local training's precision: the device's capability in, bf16 / fp16 with a gradient scaler /
fp32 out; fp16 through the one optimizer step of every algorithm; DP-SGD's fp32 fallback.

CPU autocast runs float16 in this torch, so the fp16 + scaler path runs here for real (forced
with ``precision = "fp16"``); the CUDA choice is checked with the device's capability mocked.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from medfed.algorithms import ALGORITHMS
from medfed.algorithms.base import LocalTask, optimizer_step
from medfed.config import TrainConfig
from medfed.core.errors import ConfigError
from medfed.federation.training import train
from medfed.models import device as device_module
from medfed.models.device import DeviceSetup, resolve_device
from medfed.models.precision import DP_FP16_REASON, choose_precision, training_precision
from medfed.runs import RunDir
from tests.tensorsites import tensor_sites

NEEDS = {"lora": {"warmup_rounds": 1}}


def config(algorithm: str = "fedavg", **kw) -> TrainConfig:
    base = dict(algorithm=algorithm, rounds=2, local_steps=2, batch_size=8, device="cpu")
    base |= dict(optimizer="sgd", lr=0.05, params=dict(NEEDS.get(algorithm, {})))
    return TrainConfig(**(base | kw))


@pytest.mark.parametrize(
    ("device", "bf16", "asked", "private", "expected"),
    [
        ("cuda", True, "auto", False, "bf16"),
        ("cuda", False, "auto", False, "fp16"),
        ("cuda", False, "auto", True, "fp32"),  # DP-SGD cannot clip through a loss scale
        ("cuda", True, "auto", True, "bf16"),
        ("cpu", False, "auto", False, "fp32"),
        ("cpu", True, "auto", False, "fp32"),  # the plain CPU stays float32 unless asked
        ("cpu", False, "fp16", False, "fp16"),
        ("cpu", True, "bf16", False, "bf16"),
        ("cuda", True, "fp32", False, "fp32"),
    ],
)
def test_the_precision_follows_the_device_and_the_setting(
    device, bf16, asked, private, expected
) -> None:
    name, reason = choose_precision(device, bf16, asked, private=private)
    assert name == expected
    assert (reason == DP_FP16_REASON) == (private and expected == "fp32" and asked != "fp32")


def test_bf16_forced_where_the_device_lacks_it_is_refused_naming_the_setting() -> None:
    with pytest.raises(ConfigError, match=r"precision \(--precision\) bf16.*use auto, fp16"):
        choose_precision("cuda", False, "bf16")


def test_an_unknown_precision_setting_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"precision \(--precision\) must be one of"):
        TrainConfig(algorithm="fedavg", precision="fp8")


def test_a_gpu_without_bf16_evaluates_in_fp16_and_trains_with_a_scaler(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(device_module, "_cuda_bf16", lambda: False)
    setup = resolve_device("auto")
    assert setup.device.type == "cuda" and setup.autocast_dtype == torch.float16
    precision = training_precision(setup, "auto")
    assert precision.name == "fp16" and "gradient scaler" in precision.describe()
    assert training_precision(setup, "auto", private=True).name == "fp32"
    monkeypatch.setattr(device_module, "_cuda_bf16", lambda: True)
    assert training_precision(resolve_device("auto"), "auto").name == "bf16"


def test_fp16_on_the_cpu_autocasts_to_float16_and_scales_the_loss() -> None:
    precision = training_precision(DeviceSetup(torch.device("cpu"), None), "fp16")
    scaler = precision.scaler()
    assert scaler is not None and scaler.is_enabled()
    with precision.autocast()():
        out = torch.nn.Linear(3, 2)(torch.ones(2, 3))
    assert out.dtype == torch.float16
    assert training_precision(DeviceSetup(torch.device("cpu"), None), "fp32").scaler() is None


def _task(scaler) -> LocalTask:
    return LocalTask(None, {}, None, 1, None, 0, 1, "s", {}, autocast=lambda: None, scaler=scaler)  # type: ignore[arg-type]


def test_a_step_whose_scaled_gradients_overflow_is_skipped_and_the_scale_halved() -> None:
    layer = torch.nn.Linear(2, 1)
    before = layer.weight.detach().clone()
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    loss = layer(torch.tensor([[1e35, 1.0]])).sum()  # its scaled gradient is inf in float32
    optimizer_step(_task(scaler), loss, optimizer)
    assert torch.equal(layer.weight, before)
    assert scaler.get_scale() == 2.0**15
    optimizer.zero_grad()
    optimizer_step(_task(scaler), layer(torch.ones(1, 2)).sum(), optimizer)
    assert not torch.equal(layer.weight, before)  # a finite step goes through, unscaled
    assert torch.allclose(before - layer.weight, torch.full_like(before, 0.1))


def test_without_a_scaler_the_step_is_a_plain_backward_and_step() -> None:
    layer = torch.nn.Linear(2, 1)
    before = layer.weight.detach().clone()
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    optimizer_step(_task(None), layer(torch.ones(1, 2)).sum(), optimizer)
    assert torch.allclose(before - layer.weight, torch.full_like(before, 0.1))


class CountingScaler(torch.amp.GradScaler):
    """A CPU gradient scaler that counts its updates (one per optimizer step taken)."""

    updates = 0

    def update(self, new_scale=None) -> None:
        CountingScaler.updates += 1
        super().update(new_scale)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_every_algorithm_trains_in_fp16_through_the_scaler(algorithm, tmp_path, monkeypatch):
    from medfed.models import precision as precision_module

    monkeypatch.setattr(CountingScaler, "updates", 0)
    monkeypatch.setattr(
        precision_module.Precision,
        "scaler",
        lambda self: CountingScaler(self.device_type) if self.name == "fp16" else None,
    )
    rounds = 2 if algorithm in ("lora", "fedgmi") else 1  # a first round of their own
    cfg = config(algorithm, precision="fp16", rounds=rounds)
    summary = train(tensor_sites(2), cfg, tmp_path / "run")
    assert "local training in fp16 autocast with a gradient scaler" in summary.device
    records = [r for r in RunDir(tmp_path / "run").read_metrics() if r.status == "ok"]
    assert records and all(r.train_loss is not None for r in records)
    assert all("train_loss_scale" in r.extra for r in records)
    assert CountingScaler.updates >= 2 * 2  # each site's 2 steps went through the scaler


def test_dp_sgd_asked_for_fp16_trains_in_fp32_and_records_why(tmp_path) -> None:
    cfg = config("fedavg", precision="fp16", dp_epsilon=50.0, dp_noise=0.8)
    summary = train(tensor_sites(2), cfg, tmp_path / "run")
    assert "local training in float32 (DP-SGD trains in fp32" in summary.device
    run = RunDir(tmp_path / "run")
    start = next(e for e in run.read_events() if e["event"] == "start")
    assert "Opacus clips each scan's gradient" in start["device"]
    records = [r for r in run.read_metrics() if r.status == "ok"]
    assert records and not any("train_loss_scale" in r.extra for r in records)


def test_the_float32_cpu_run_records_its_device_as_before(tmp_path) -> None:
    summary = train(tensor_sites(2), replace(config(), rounds=1), tmp_path / "run")
    assert "local training" not in summary.device
