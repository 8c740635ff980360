"""Sharing rules (exactly which keys travel), FedDRM's loss and routing, aggregation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from medfed.algorithms import ALGORITHMS, make_algorithm
from medfed.algorithms.base import Update, weighted_average
from medfed.algorithms.feddrm import feddrm_loss
from medfed.core.errors import ConfigError
from medfed.federation.validate import UpdateRejected, validate_update
from medfed.models.fedmodel import ModelSpec, build_model, norm_state_keys
from medfed.routing.routers import route_density_ratio


@pytest.fixture(scope="module")
def model() -> nn.Module:
    torch.manual_seed(0)
    return build_model(ModelSpec(backbone="cnn", n_sites=3, client_branch=True))


HEAD = {"target_head.weight", "target_head.bias"}


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_registered_algorithm_builds_with_its_defaults_and_describes_itself(name) -> None:
    cls = ALGORITHMS[name]
    assert cls.name == name and cls.summary and "\n" not in cls.summary  # one line of help
    algorithm = make_algorithm(name)
    resolved = algorithm.resolved_params()
    # Every parameter is recorded, and the record rebuilds the same algorithm.
    assert make_algorithm(name, resolved).resolved_params() == resolved


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "fedavgft", "ditto"])
def test_global_model_algorithms_share_every_key(name: str, model: nn.Module) -> None:
    assert make_algorithm(name).shared_keys(model) == sorted(model.state_dict())


def test_local_only_shares_nothing(model: nn.Module) -> None:
    algorithm = make_algorithm("local")
    assert algorithm.shared_keys(model) == []
    assert algorithm.communicates is False


@pytest.mark.parametrize(
    ("name", "params"), [("feddrm", {"private_norms": "false"}), ("fedrep", {})]
)
def test_head_personalization_keeps_exactly_the_target_head(
    name: str, params: dict[str, str], model: nn.Module
) -> None:
    algorithm = make_algorithm(name, params)
    shared = set(algorithm.shared_keys(model))
    assert algorithm.private_keys(model) == HEAD
    assert shared == set(model.state_dict()) - HEAD
    # The target branch (transform) and the whole client branch travel, as in FedDRM's code.
    assert {"target_branch.0.weight", "client_branch.0.weight", "client_head.weight"} <= shared


def test_fedbn_keeps_norm_layers_found_by_type(model: nn.Module) -> None:
    private = make_algorithm("fedbn").private_keys(model)
    assert private == norm_state_keys(model)
    bn_stats = {k for k in model.state_dict() if k.endswith(("running_mean", "running_var"))}
    assert bn_stats and bn_stats <= private
    assert "target_branch.1.weight" in private  # LayerNorm is a normalization layer too
    conv_keys = {k for k, v in model.state_dict().items() if v.dim() == 4}
    assert conv_keys and not (conv_keys & private)


def test_feddrm_keeps_the_target_head_and_the_backbone_norms_by_default(model: nn.Module) -> None:
    algorithm = make_algorithm("feddrm")
    private = algorithm.private_keys(model)
    backbone_norms = {k for k in norm_state_keys(model) if k.startswith("backbone.")}
    assert backbone_norms and private == HEAD | backbone_norms
    shared = set(algorithm.shared_keys(model))
    # The branches' LayerNorms, the convolutions and the whole client branch still travel.
    assert {"target_branch.1.weight", "client_branch.1.weight", "client_head.weight"} <= shared
    conv_keys = {k for k, v in model.state_dict().items() if v.dim() == 4}
    assert conv_keys and conv_keys <= shared
    # BatchNorm by default (auto backbone); GroupNorm for the paper's FedDRM.
    assert algorithm.prefers_batch_norm()
    assert not make_algorithm("feddrm", {"private_norms": "false"}).prefers_batch_norm()
    with pytest.raises(ConfigError, match="private_norms=false"):
        make_algorithm("feddrm").private_keys(nn.Module())


def test_fedbn_refuses_a_model_without_norm_layers() -> None:
    with pytest.raises(ConfigError, match="no(ne)?"):
        make_algorithm("fedbn").private_keys(nn.Linear(2, 2))


def test_unknown_algorithm_and_parameter_are_named() -> None:
    with pytest.raises(ConfigError, match="unknown algorithm 'fedfoo'"):
        make_algorithm("fedfoo")
    with pytest.raises(ConfigError, match="no parameter"):
        make_algorithm("feddrm", {"mu": "1"})
    with pytest.raises(ConfigError, match="lam must be in"):
        make_algorithm("feddrm", {"lam": "1.5"})
    assert make_algorithm("feddrm", {"lam": "0.7"}).params.lam == pytest.approx(0.7)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_each_parameter_keeps_its_kind_as_given_and_recorded(name: str) -> None:
    """A whole-number parameter stays one (config.toml records ``finetune_rounds = 2``, not
    2.0), given as text, as a whole float (a TOML 2.0) or as an int; a float stays a float."""
    defaults = make_algorithm(name).resolved_params()
    for key, value in defaults.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or "." in key:
            continue
        for given in (str(value), value, float(value)):
            got = make_algorithm(name, {key: given}).resolved_params()[key]
            assert type(got) is type(value) and got == value, (name, key, given, got)


@pytest.mark.parametrize(
    ("name", "params", "words"),
    [
        ("fedavgft", {"finetune_rounds": "2.5"}, "finetune_rounds='2.5' must be a whole number"),
        ("fedavgft", {"finetune_rounds": 2.5}, "finetune_rounds=2.5 must be a whole number"),
        ("pfedme", {"inner_steps": True}, "inner_steps=True must be a whole number"),
        ("fedprox", {"mu": "nan"}, "mu='nan' must be a finite number"),
        ("fedprox", {"mu": math.inf}, "mu=inf must be a finite number"),
        ("ditto", {"lam": "-inf"}, "lam='-inf' must be a finite number"),
        ("feddrm", {"lam": math.nan}, "lam=nan must be a finite number"),
        ("lora", {"alpha": 0}, "alpha must be > 0"),
        ("lora", {"alpha": -1.5}, "alpha must be > 0"),
        ("lora", {"rank": 257}, "rank must be between 1 and 256"),
        ("lora", {"rank": 0}, "rank must be between 1 and 256"),
    ],
)
def test_a_parameter_out_of_bounds_is_refused_by_name(name: str, params: dict, words: str) -> None:
    with pytest.raises(ConfigError) as refused:
        make_algorithm(name, params)
    assert words in str(refused.value)


def test_feddrm_loss_matches_hand_computation() -> None:
    target = torch.tensor([[0.0, 0.0]])  # CE = log 2
    client = torch.tensor([[0.0, math.log(3.0)]])  # CE for site 0 = log 4
    loss = feddrm_loss(target, client, torch.tensor([0]), site_index=0, lam=0.9)
    assert float(loss) == pytest.approx(0.9 * math.log(2) + 0.1 * math.log(4))


def test_density_ratio_routing_divides_by_the_site_prior() -> None:
    # Equal client logits: the site with the smaller share of training data wins.
    probs, chosen = route_density_ratio(np.array([[1.0, 1.0]]), np.array([0.8, 0.2]))
    assert chosen.tolist() == [1]
    assert probs[0] == pytest.approx([0.2, 0.8])
    # A strong client logit overrides the prior.
    _, chosen = route_density_ratio(np.array([[3.0, 1.0]]), np.array([0.8, 0.2]))
    assert chosen.tolist() == [0]


def test_weighted_average_uses_sample_sizes_and_rounds_integer_buffers() -> None:
    a = {"w": torch.tensor([0.0, 4.0]), "n": torch.tensor(1)}
    b = {"w": torch.tensor([4.0, 0.0]), "n": torch.tensor(4)}
    out = weighted_average([Update(a, 1.0), Update(b, 3.0)])
    assert out["w"].tolist() == pytest.approx([3.0, 1.0])
    assert out["n"].dtype == torch.int64 and int(out["n"]) == 3  # 0.25*1 + 0.75*4 = 3.25


def test_update_validation_names_the_problem() -> None:
    ref = {"w": torch.zeros(2), "b": torch.zeros(1)}
    with pytest.raises(UpdateRejected, match="NaN"):
        validate_update("s", {"w": torch.tensor([float("nan"), 0.0]), "b": torch.zeros(1)}, ref)
    with pytest.raises(UpdateRejected, match="shape"):
        validate_update("s", {"w": torch.zeros(3), "b": torch.zeros(1)}, ref)
    with pytest.raises(UpdateRejected, match="wrong keys"):
        validate_update("s", {"w": torch.zeros(2)}, ref)
    validate_update("s", {"w": torch.ones(2), "b": torch.ones(1)}, ref)
