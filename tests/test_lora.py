"""LoRA: which keys each mode sends, private adapters diverge, a frozen base stays bit-identical."""

from __future__ import annotations

import torch

from medfed.algorithms import make_algorithm
from medfed.algorithms.lora import is_adapter_key
from medfed.config import TrainConfig
from medfed.federation.site import derive_seed
from medfed.federation.training import train
from medfed.models.fedmodel import ModelSpec, build_model
from medfed.runs import RunDir
from medfed.runs.weights import load_model_state
from medfed.serving.bundle import TrainedFederation
from tests.tensorsites import tensor_sites

SITES = ["site0", "site1", "site2"]


def lora_model(mode: str):
    algorithm = make_algorithm("lora", {"mode": mode})
    spec = algorithm.adapt_spec(ModelSpec(backbone="cnn-gn", n_sites=3, client_branch=True), SITES)
    torch.manual_seed(derive_seed(0, 0))  # the engine's initialization for seed 0
    return algorithm, build_model(spec)


def test_private_adapters_stay_home_and_only_heads_travel() -> None:
    algorithm, model = lora_model("private")
    shared = set(algorithm.shared_keys(model))
    assert shared and not any(is_adapter_key(k) for k in shared)
    assert all(k.startswith(("target_head.", "client_branch.", "client_head.")) for k in shared)
    adapters = {k for k in model.state_dict() if is_adapter_key(k)}
    assert {k.split(".lora_")[1].split(".")[1] for k in adapters} == set(SITES)


def test_shared_adapter_travels_and_the_head_stays() -> None:
    algorithm, model = lora_model("shared")
    shared = set(algorithm.shared_keys(model))
    assert any(".lora_A.shared." in k for k in shared)
    assert not any(k.startswith("target_head.") for k in shared)
    base = [k for k in shared if not is_adapter_key(k) and not k.startswith("client_")]
    assert base == []  # the frozen base never travels


def test_federated_base_travels_too() -> None:
    algorithm = make_algorithm("lora", {"base": "federated"})
    spec = algorithm.adapt_spec(ModelSpec(backbone="cnn-gn", n_sites=3, client_branch=True), SITES)
    shared = set(algorithm.shared_keys(build_model(spec)))
    assert any(k.endswith("base_layer.weight") for k in shared)


def test_training_personalizes_adapters_and_keeps_the_base_bit_identical(tmp_path) -> None:
    cfg = TrainConfig("lora", rounds=2, local_steps=3, batch_size=8, device="cpu")
    summary = train(tensor_sites(3), cfg, tmp_path / "run")
    run = RunDir(tmp_path / "run")
    states = [load_model_state(run, f"site_{s}") for s in SITES]
    _, init = lora_model("private")
    init_state = init.state_dict()
    for key, value in init_state.items():
        if key.endswith("base_layer.weight") or key.endswith("base_layer.bias"):
            assert all(torch.equal(s[key], value) for s in states), key
    own = "backbone.features.0.lora_B.{}.weight"
    b = [states[i][own.format(site)] for i, site in enumerate(SITES)]
    assert not torch.equal(b[0], b[1]) and not torch.equal(b[1], b[2])
    fed = TrainedFederation.load(tmp_path / "run", "cpu")
    assert fed.routes and not fed.shared_body  # each site answers with its own adapter
    assert summary["routing_method"] == "density_ratio"


def test_target_layer_kinds_are_configurable() -> None:
    algorithm = make_algorithm("lora", {"targets": "linear"})
    spec = algorithm.adapt_spec(ModelSpec(backbone="cnn-gn", n_sites=3, client_branch=True), SITES)
    adapted = {k.split(".lora_")[0] for k in build_model(spec).state_dict() if is_adapter_key(k)}
    assert adapted == {"target_branch.0"}  # the backbone's convolutions stay plain
