"""FedALS: the head travels every round, the representation only every alpha rounds."""

from __future__ import annotations

import pytest
import torch

from medfed.algorithms import make_algorithm
from medfed.config import TrainConfig
from medfed.core.errors import ConfigError
from medfed.federation.training import train
from medfed.models.fedmodel import ModelSpec, build_model, norm_state_keys
from medfed.runs import RunDir
from medfed.runs.checkpoints import CheckpointStore
from tests.tensorsites import tensor_sites


def test_schedule_sends_the_backbone_every_alpha_rounds_and_in_the_last() -> None:
    model = build_model(ModelSpec(backbone="cnn-gn", n_sites=3, client_branch=True))
    algorithm = make_algorithm("fedals", {"base": "feddrm", "alpha": "3"})
    assert algorithm.needs_client_branch and algorithm.prefers_batch_norm()
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
    with pytest.raises(ConfigError, match="unknown base"):
        make_algorithm("fedals", {"base": "nope"})
    with pytest.raises(ConfigError, match="'feddrm' has no parameter"):
        make_algorithm("fedals", {"base": "feddrm", "mu": "0.1"})
    model = build_model(ModelSpec(backbone="cnn-gn"))
    algorithm = make_algorithm("fedals", {"representation": "encoder"})
    with pytest.raises(ConfigError, match="encoder"):
        algorithm.check(model)


def test_the_base_gets_its_own_parameters_and_the_run_records_them() -> None:
    algorithm = make_algorithm("fedals", {"base": "feddrm", "alpha": "4", "lam": "0.9"})
    assert algorithm.name == "feddrm" and algorithm.run_name == "fedals"
    assert algorithm.params.lam == 0.9
    resolved = algorithm.resolved_params()
    assert resolved["base"] == "feddrm" and resolved["alpha"] == 4
    assert resolved["feddrm.lam"] == 0.9
    assert resolved["feddrm.private_norms"] is True  # the base's defaults are recorded too
    # A base parameter named like one of fedals's own is written with the base's name.
    lora = make_algorithm("fedals", {"base": "lora", "alpha": "3", "lora.alpha": "16"})
    assert lora.schedule.alpha == 3 and lora.params.alpha == 16.0
    again = make_algorithm("fedals", resolved)  # config.toml's params rebuild the same thing
    assert again.resolved_params() == resolved


def test_an_unsupported_combination_is_refused_before_training(tmp_path) -> None:
    # Private LoRA adapters never travel and the base is frozen: no representation is shared,
    # so there is nothing for the schedule to send less often.
    params = {"base": "lora", "lora.warmup_rounds": 1}
    cfg = TrainConfig("fedals", params=params, rounds=2, local_steps=1,
                      batch_size=8, device="cpu")  # fmt: skip
    with pytest.raises(ConfigError, match="no shared key starts with"):
        train(tensor_sites(3), cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.parametrize(
    ("params", "trained_prefix"),
    [
        ({"base": "feddrm", "lam": "0.9", "alpha": "2"}, "backbone."),
        (
            {"base": "lora", "mode": "shared", "alpha": "2", "lora.warmup_rounds": "1"},
            "backbone.",
        ),
        ({"base": "fedgmi", "alpha": "2"}, "backbone."),
    ],
    ids=["feddrm-lam", "lora-shared", "fedgmi"],
)
def test_the_schedule_composes_with_every_kind_of_base(params, trained_prefix, tmp_path) -> None:
    cfg = TrainConfig("fedals", params=params, rounds=4, local_steps=2, batch_size=8,
                      device="cpu", keep_checkpoints=4)  # fmt: skip
    summary = train(tensor_sites(3), cfg, tmp_path / "run")
    run = RunDir(tmp_path / "run")
    records = run.read_metrics()
    assert all(r["status"] == "ok" for r in records)  # no site failed (fedgmi used to)
    assert summary["algorithm"] == "fedals" and summary["params"]["base"] == params["base"]
    store = CheckpointStore(run.checkpoints, keep=4)
    states = {r: store.load(p)[0] for r, p in store.rounds()}
    shared = [k for k in states[4]["global"] if k.startswith(trained_prefix)]
    assert shared, "the base shares part of its representation"
    key = shared[0]
    # The representation moves in rounds 2 and 4 only.
    assert torch.equal(states[2]["global"][key], states[3]["global"][key])
    assert not torch.equal(states[3]["global"][key], states[4]["global"][key])
    if params["base"] == "lora":
        # Adapters exist and learn (the old wrapper trained heads on a bare frozen base).
        site = next(v for k, v in states[4].items() if k.startswith("site_"))
        adapters = [k for k in site if ".lora_B." in k]
        assert adapters and any(float(site[k].abs().max()) > 0 for k in adapters)
    if params["base"] == "feddrm":
        assert summary["params"]["feddrm.lam"] == 0.9


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
    store = CheckpointStore(run.checkpoints, keep=4)
    states = {p.name: store.load(p)[0]["global"] for _, p in store.rounds()}
    key = next(k for k in states["round_0001"] if k.startswith("backbone."))
    assert not torch.equal(states["round_0001"][key], states["round_0002"][key])
    assert torch.equal(states["round_0002"][key], states["round_0003"][key])
    assert not torch.equal(states["round_0003"][key], states["round_0004"][key])
    assert summary["routing_method"] == "density_ratio"
