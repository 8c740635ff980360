"""Runs that start from loaded weights (``--init``): the starting model, the record of it, resume,
and the ImageNet normalization that comes with torchvision's weights."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from medfed.config import TrainConfig
from medfed.core.errors import ConfigError
from medfed.core.normalization import IMAGENET_MEAN, IMAGENET_STD
from medfed.federation.engine import Engine
from medfed.federation.plan import SiteInfo, plan_run
from medfed.federation.training import train
from medfed.runs import RunDir
from medfed.runs.checkpoints import CheckpointStore
from tests.tensorsites import tensor_sites

BASE = TrainConfig("fedavg", rounds=2, local_steps=2, batch_size=8, device="cpu", backbone="cnn-gn")


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("init") / "base"
    train(tensor_sites(3), BASE, out)
    return out


def global_weights(run_dir) -> dict[str, torch.Tensor]:
    store = CheckpointStore(RunDir(run_dir).checkpoints, 1)
    return store.load(store.latest())[0]["global"]


def test_a_run_folder_as_init_gives_its_global_weights_exactly(base_run, tmp_path) -> None:
    config = dataclasses.replace(BASE, algorithm="feddrm", init=str(base_run))
    sites = tensor_sites(3)
    plan = plan_run(config, [SiteInfo.of(s) for s in sites])
    engine = Engine(sites, plan, RunDir(tmp_path / "r"))
    start = engine.server.initial_state
    weights = global_weights(base_run)
    assert weights
    for key, value in weights.items():
        assert torch.equal(start[key].cpu(), value), key
    report = engine.server.init_report
    assert sorted(report.loaded) == sorted(weights)
    # FedAvg has no client branch: FedDRM's starts random, and says so.
    assert report.random and all(
        k.startswith(("client_branch.", "client_head.")) for k in report.random
    )


def test_a_resumed_run_refuses_starting_weights_that_changed(base_run, tmp_path) -> None:
    file = tmp_path / "start.safetensors"
    save_file({k: v.contiguous() for k, v in global_weights(base_run).items()}, str(file))
    config = dataclasses.replace(BASE, init=str(file))
    lines: list[str] = []
    train(tensor_sites(3), config, tmp_path / "run", echo=lines.append)
    assert any(str(file) in line for line in lines)
    run = RunDir(tmp_path / "run")
    init = run.read_config()["init"]
    assert init["kind"] == "safetensors" and init["file"] == str(file)
    # The same weights: the run resumes (nothing left to train).
    train(tensor_sites(3), config, tmp_path / "run", resume=True)
    changed = load_file(str(file))
    first = sorted(changed)[0]
    changed[first] = changed[first] + 1.0
    save_file(changed, str(file))
    with pytest.raises(ConfigError, match="starting weights") as err:
        train(tensor_sites(3), config, tmp_path / "run", resume=True)
    assert init["sha256"] in str(err.value)


def test_imagenet_normalization_is_applied_and_recorded(base_run, tmp_path) -> None:
    config = dataclasses.replace(BASE, rounds=1, init=str(base_run), normalization="imagenet")
    train(tensor_sites(3), config, tmp_path / "run")
    model = json.loads((tmp_path / "run" / "model" / "model.json").read_text())
    for site in model["sites"]:
        assert site["normalization"]["mean"] == pytest.approx(list(IMAGENET_MEAN))
        assert site["normalization"]["std"] == pytest.approx(list(IMAGENET_STD))
    assert RunDir(tmp_path / "run").read_config()["init"]["normalization"] == "imagenet"


def test_imagenet_normalization_needs_three_channels(tmp_path) -> None:
    sites = tensor_sites(2)
    sites = [dataclasses.replace(s, raw={k: v[:, :1] for k, v in s.raw.items()}) for s in sites]
    config = dataclasses.replace(BASE, normalization="imagenet")
    with pytest.raises(ConfigError, match="three-channel"):
        train(sites, config, tmp_path / "run")
