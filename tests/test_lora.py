"""LoRA: which keys each mode sends, a warm-up base stays bit-identical and at home, private
adapters diverge, and the client branch never sees an adapter."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

from medfed.algorithms import make_algorithm
from medfed.algorithms.base import Update
from medfed.algorithms.discriminant import discriminant
from medfed.algorithms.lora import is_adapter_key
from medfed.config import TrainConfig
from medfed.core.errors import ConfigError
from medfed.federation.shared import derive_seed
from medfed.federation.training import train
from medfed.models.fedmodel import ModelSpec, build_model
from medfed.routing.bundle import TrainedFederation
from medfed.runs import RunDir
from medfed.runs.checkpoints import CheckpointStore
from medfed.runs.weights import load_model_state
from tests.tensorsites import tensor_sites

SITES = ["site0", "site1", "site2"]


def lora_model(mode: str):
    algorithm = make_algorithm("lora", {"mode": mode})
    spec = algorithm.adapt_spec(ModelSpec(backbone="cnn-gn", n_sites=3, client_branch=True), SITES)
    torch.manual_seed(derive_seed(0, 0))  # the engine's initialization for seed 0
    return algorithm, build_model(spec)


def routing_only(key: str) -> bool:
    """What private LoRA sends: the client head (set by the server from feature statistics)."""
    return key.startswith("client_head.")


def test_private_adapters_and_heads_stay_home_and_only_routing_travels() -> None:
    algorithm, model = lora_model("private")
    shared = set(algorithm.shared_keys(model))
    assert shared == {"client_head.weight", "client_head.bias"}
    adapters = {k for k in model.state_dict() if is_adapter_key(k)}
    assert {k.split(".lora_")[1].split(".")[1] for k in adapters} == set(SITES)


def test_the_client_head_is_fishers_discriminant_of_the_sites_feature_statistics() -> None:
    rng = np.random.default_rng(0)
    d, sizes = 6, (80, 120, 60)
    means = rng.normal(0, 2.0, size=(3, d))
    mix = rng.normal(size=(d, d)) * 0.3 + np.eye(d)
    xs = [rng.normal(size=(n, d)) @ mix + m for n, m in zip(sizes, means, strict=True)]
    stats = []
    for i, x in enumerate(xs):
        f = torch.tensor(x)
        c = f - f.mean(0)
        rows, cols = torch.triu_indices(d, d)
        stats.append(
            {
                "feature_site": [float(i)],
                "feature_count": [float(len(x))],
                "feature_sum": f.sum(0).tolist(),
                "feature_scatter": (c.T @ c)[rows, cols].tolist(),
            }
        )
    weight, bias = discriminant(stats, shrinkage=0.1)
    x_all, y_all = np.concatenate(xs), np.repeat(np.arange(3), sizes)
    ours = (torch.tensor(x_all, dtype=torch.float32) @ weight.T + bias).argmax(1).numpy()
    lda = LinearDiscriminantAnalysis(solver="lsqr", shrinkage=0.1).fit(x_all, y_all)
    assert (ours == lda.predict(x_all)).mean() > 0.97
    assert (ours == y_all).mean() > 0.9
    # The server keeps each site's latest statistics: a site missing from a round still counts.
    algorithm = make_algorithm("lora", {})
    head = {"client_head.weight": torch.zeros(3, d), "client_head.bias": torch.zeros(3)}
    out = algorithm.aggregate([Update(head, 1.0, stats[0]), Update(head, 1.0, stats[1])])
    assert torch.equal(out["client_head.bias"], head["client_head.bias"])  # not yet defined
    out = algorithm.aggregate([Update(head, 1.0, stats[2])])
    assert torch.allclose(out["client_head.weight"], weight)


def test_shared_adapter_travels_and_the_head_stays() -> None:
    algorithm, model = lora_model("shared")
    shared = set(algorithm.shared_keys(model))
    assert any(".lora_A.shared." in k for k in shared)
    assert not any(k.startswith("target_head.") for k in shared)
    base = [k for k in shared if not is_adapter_key(k) and not k.startswith("client_")]
    assert base == []  # the frozen base never travels


def test_ffa_lora_shares_only_b() -> None:
    algorithm = make_algorithm("lora", {"mode": "shared", "freeze_a": "true"})
    spec = algorithm.adapt_spec(ModelSpec(backbone="cnn-gn", n_sites=3, client_branch=True), SITES)
    shared = set(algorithm.shared_keys(build_model(spec)))
    assert any(".lora_B.shared." in k for k in shared)
    assert not any(".lora_A." in k for k in shared)


def test_federated_base_travels_too() -> None:
    algorithm = make_algorithm("lora", {"base": "federated"})
    spec = algorithm.adapt_spec(ModelSpec(backbone="cnn-gn", n_sites=3, client_branch=True), SITES)
    shared = set(algorithm.shared_keys(build_model(spec)))
    assert any(k.endswith("base_layer.weight") for k in shared)


def test_lora_on_random_weights_is_refused_with_the_warm_up_recipe(tmp_path) -> None:
    cfg = TrainConfig("lora", rounds=1, local_steps=1, batch_size=8, device="cpu")
    with pytest.raises(ConfigError, match="warmup_rounds=N") as err:
        train(tensor_sites(3), cfg, tmp_path / "run")
    assert "--init" in str(err.value)
    assert not (tmp_path / "run").exists()


def test_the_client_branch_reads_the_base_whatever_adapter_is_on() -> None:
    _, model = lora_model("private")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_()  # adapters that change the features
    model.eval()
    x = torch.randn(4, 3, 32, 32)
    outs = []
    for site in SITES:
        model.select_adapter(site)
        outs.append(model(x))
    assert all(torch.allclose(o.client_logits, outs[0].client_logits) for o in outs)
    assert not torch.allclose(outs[0].target_logits, outs[1].target_logits)


@pytest.fixture(scope="module")
def warm_lora(tmp_path_factory):
    """LoRA with private adapters from a 2-round FedAvg warm-up base, then 2 rounds."""
    root = tmp_path_factory.mktemp("lora")
    params = {"warmup_rounds": "2"}
    cfg = TrainConfig("lora", params=params, rounds=2, local_steps=3, batch_size=8, device="cpu")
    lines: list[str] = []
    summary = train(tensor_sites(3), cfg, root / "run", echo=lines.append)
    return root / "run", summary, lines


def test_warm_up_base_is_frozen_and_never_leaves_a_site(warm_lora) -> None:
    run_dir, summary, lines = warm_lora
    run = RunDir(run_dir)
    base_run = RunDir(run_dir / "warmup")
    base = CheckpointStore(base_run.checkpoints, 1).load(
        CheckpointStore(base_run.checkpoints, 1).latest()
    )[0]["global"]
    states = [load_model_state(run, f"site_{s}") for s in SITES]
    frozen = 0
    for key, value in base.items():
        if key.startswith("target_head."):
            continue  # each site trains its own head from the base's
        own = key.replace(".weight", ".base_layer.weight").replace(".bias", ".base_layer.bias")
        for state in states:
            # The warm-up's global weights, bit for bit, in every site's final model.
            found = state[key] if key in state else state[own]
            assert torch.equal(found, value), key
        frozen += 1
    assert frozen and any("loaded" in line for line in lines)
    # Only the routing part travelled: every round sent exactly its keys, and its bytes.
    algorithm, model = lora_model("private")
    travel = algorithm.shared_keys(model)
    assert all(routing_only(k) for k in travel)
    records = run.read_metrics()
    assert records and all(r["status"] == "ok" for r in records)  # no update was refused
    assert all(r["keys_sent"] == len(travel) for r in records)
    fedavg = base_run.read_summary()["bytes_per_round"]
    assert summary["bytes_per_round"] * 10 <= fedavg
    # Adapters personalized: each site's own adapter moved away from the others.
    own = "backbone.features.0.lora_B.{}.weight"
    b = [states[i][own.format(site)] for i, site in enumerate(SITES)]
    assert not torch.equal(b[0], b[1]) and not torch.equal(b[1], b[2])
    fed = TrainedFederation.load(run_dir, "cpu")
    assert fed.routes and not fed.shared_body  # each site answers with its own adapter
    assert summary["routing_method"] == "density_ratio"


def test_the_run_records_where_its_starting_weights_came_from(warm_lora) -> None:
    run_dir, _, _ = warm_lora
    run = RunDir(run_dir)
    config = run.read_config()
    init = config["init"]
    assert init["source"] == str((run_dir / "warmup").resolve())
    assert init["loaded"] and init["sha256"] and init["adapters"] > 0
    assert all(k.startswith("client_head.") for k in init["random"])
    # The setting is recorded, not the folder it produced: the config trains again elsewhere.
    assert config["train"]["params"]["warmup_rounds"] == 2 and config["train"]["init"] == ""
    events = [e for e in run.read_events() if e["event"] == "init"]
    assert len(events) == 1 and events[0]["sha256"] == init["sha256"]


def test_target_layer_kinds_are_configurable() -> None:
    algorithm = make_algorithm("lora", {"targets": "linear"})
    spec = algorithm.adapt_spec(ModelSpec(backbone="cnn-gn", n_sites=3, client_branch=True), SITES)
    adapted = {k.split(".lora_")[0] for k in build_model(spec).state_dict() if is_adapter_key(k)}
    assert adapted == {"target_branch.0"}  # the backbone's convolutions stay plain


def test_a_warm_up_run_resumes_on_its_own_base(tmp_path) -> None:
    params = {"warmup_rounds": "1"}
    cfg = TrainConfig("lora", params=params, rounds=2, local_steps=1, batch_size=8, device="cpu")
    first = train(tensor_sites(3), cfg, tmp_path / "run")
    lines: list[str] = []
    again = train(tensor_sites(3), cfg, tmp_path / "run", resume=True, echo=lines.append)
    assert any("finished" in line for line in lines)  # the base is reused, not trained again
    assert again["sites"]["site0"]["auc"] == first["sites"]["site0"]["auc"]
    events = [e["event"] for e in RunDir(tmp_path / "run" / "warmup").read_events()]
    assert events.count("start") == 1 and "resume" not in events
