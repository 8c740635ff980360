"""``compile = true``: the model local training runs compiled with torch.compile where that
works, eager with the reason logged where it does not (never a failed run)."""

from __future__ import annotations

import contextlib
import logging

import pytest
import torch

from medfed.config import TrainConfig
from medfed.federation.training import train
from medfed.models import compiling
from medfed.models.compiling import DP_REASON, compile_for_training, is_compiled
from medfed.models.fedmodel import ModelSpec, build_model
from medfed.runs import RunDir
from tests.tensorsites import tensor_sites


def config(**kw) -> TrainConfig:
    base = dict(algorithm="fedavg", rounds=2, local_steps=2, batch_size=8, device="cpu")
    return TrainConfig(**(base | dict(optimizer="sgd", lr=0.05) | kw))


def tiny_model():
    torch.manual_seed(0)
    model = build_model(ModelSpec("cnn-gn", 3, 2, 2))
    sample = (torch.randn(4, 3, 16, 16), torch.tensor([0, 1, 0, 1]))
    return model, sample


def failing_compile(*args, **kwargs):
    """torch.compile as a broken compiler gives it: the compiled call fails when first run."""

    def call(*a, **k):
        raise RuntimeError("backend compiler failed: no C++ compiler found")

    return call


def test_compile_is_off_by_default_and_set_by_its_option() -> None:
    assert TrainConfig(algorithm="fedavg").compile is False
    assert TrainConfig(algorithm="fedavg", compile=True).compile is True


def test_a_compiler_failure_leaves_the_model_eager_and_unchanged(monkeypatch, caplog) -> None:
    monkeypatch.setattr(torch, "compile", failing_compile)
    model, sample = tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with caplog.at_level(logging.WARNING, logger=compiling.__name__):
        reason = compile_for_training(model, sample, contextlib.nullcontext)
    assert reason == "RuntimeError: backend compiler failed: no C++ compiler found"
    assert reason in caplog.text and "trains eagerly" in caplog.text
    assert not is_compiled(model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    model(sample[0])  # the eager forward still runs
    # the shared model is tried once: the second site hears the same answer
    assert compile_for_training(model, sample, contextlib.nullcontext) == reason


def test_a_compile_that_raises_at_once_falls_back_too(monkeypatch) -> None:
    def refuse(self, *a, **k):
        raise TypeError("compile is not supported on this Python")

    monkeypatch.setattr(torch.nn.Module, "compile", refuse)
    model, sample = tiny_model()
    reason = compile_for_training(model, sample, contextlib.nullcontext)
    assert reason.startswith("TypeError: compile is not supported") and not is_compiled(model)


def test_dp_sgd_trains_the_eager_model(monkeypatch) -> None:
    monkeypatch.setattr(torch, "compile", lambda *a, **k: pytest.fail("compiled under DP"))
    model, sample = tiny_model()
    assert compile_for_training(model, sample, contextlib.nullcontext, private=True) == DP_REASON


def test_a_run_whose_compile_fails_trains_as_the_eager_run_does(tmp_path, monkeypatch) -> None:
    sites = tensor_sites(2)
    eager = train(sites, config(), tmp_path / "eager")
    monkeypatch.setattr(torch, "compile", failing_compile)
    fallback = train(sites, config(compile=True), tmp_path / "fallback")
    records = [r for r in RunDir(tmp_path / "fallback").read_metrics() if r.status == "ok"]
    assert len(records) == 4 and all(r.extra["train_compiled"] == 0.0 for r in records)
    plain = RunDir(tmp_path / "eager").read_metrics()
    assert [r.train_loss for r in records] == [r.train_loss for r in plain]
    assert fallback.federation.worst_site_auc == eager.federation.worst_site_auc


@pytest.mark.slow  # compiling even this small network takes about two minutes on 2 cores
def test_a_compiled_run_trains_like_the_eager_run(tmp_path) -> None:
    sites = tensor_sites(2)
    train(sites, config(rounds=1), tmp_path / "eager")
    train(sites, config(rounds=1, compile=True), tmp_path / "compiled")
    got = [r for r in RunDir(tmp_path / "compiled").read_metrics() if r.status == "ok"]
    plain = RunDir(tmp_path / "eager").read_metrics()
    assert len(got) == 2 and all(r.extra["train_compiled"] == 1.0 for r in got)
    for a, b in zip(got, plain, strict=True):
        assert a.train_loss == pytest.approx(b.train_loss, rel=1e-3)
