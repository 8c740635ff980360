"""FedALS: the head travels every round, the representation only every alpha rounds."""

from __future__ import annotations

import pytest
import torch

from medfed.algorithms import make_algorithm
from medfed.config import TrainConfig
from medfed.errors import ConfigError
from medfed.federation.training import train
from medfed.models.fedmodel import ModelSpec, build_model, norm_state_keys
from medfed.runs import RunDir
from tests.tensorsites import tensor_sites


def test_schedule_sends_the_backbone_every_alpha_rounds_and_in_the_last() -> None:
    model = build_model(ModelSpec(backbone="cnn-gn", n_sites=3, client_branch=True))
    algorithm = make_algorithm("fedals", {"base": "feddrm", "alpha": "3"})
    assert algorithm.needs_client_branch
    sent = {r: set(algorithm.round_keys(model, r, rounds=7)) for r in range(1, 8)}
    # The backbone's norm layers are FedDRM's too: they never travel.
    norms = {k for k in norm_state_keys(model) if k.startswith("backbone.")}
    backbone = {k for k in model.state_dict() if k.startswith("backbone.")} - norms
    for r, keys in sent.items():
        assert not any(k.startswith("target_head.") for k in keys)  # FedDRM's private head
        assert not keys & norms
        assert {"client_head.weight", "client_branch.0.weight", "target_branch.0.weight"} <= keys
        assert (backbone <= keys) == (r in {3, 6, 7})
        assert not (keys & backbone) or backbone <= keys


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="alpha"):
        make_algorithm("fedals", {"alpha": "0"})
    with pytest.raises(ConfigError, match="communicates"):
        make_algorithm("fedals", {"base": "local"})
    model = build_model(ModelSpec(backbone="cnn-gn"))
    algorithm = make_algorithm("fedals", {"representation": "encoder"})
    with pytest.raises(ConfigError, match="encoder"):
        algorithm.round_keys(model, 1, rounds=4)


def test_engine_sends_the_representation_only_on_schedule(tmp_path) -> None:
    cfg = TrainConfig("fedals", params={"base": "feddrm", "alpha": 2}, rounds=4, local_steps=2,
                      batch_size=8, device="cpu", keep_checkpoints=4)  # fmt: skip
    summary = train(tensor_sites(3), cfg, tmp_path / "run")
    run = RunDir(tmp_path / "run")
    by_round = {}
    for r in run.read_metrics():
        by_round.setdefault(r["round"], set()).add(r["bytes_up"])
    assert all(len(v) == 1 for v in by_round.values())  # every site sends the same amount
    small, large = by_round[1].pop(), by_round[2].pop()
    assert small < large / 2 and by_round[3] == {small} and by_round[4] == {large}

    # The global backbone moves only in sync rounds (2 and 4), never in rounds 1 and 3.
    states = {p.name: run.load_checkpoint(p)[0]["global"] for p in run.list_checkpoints()}
    key = next(k for k in states["round_0001"] if k.startswith("backbone."))
    assert not torch.equal(states["round_0001"][key], states["round_0002"][key])
    assert torch.equal(states["round_0002"][key], states["round_0003"][key])
    assert not torch.equal(states["round_0003"][key], states["round_0004"][key])
    assert summary["routing_method"] == "density_ratio"
