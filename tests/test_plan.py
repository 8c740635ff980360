"""Run planning: the settings and sites of a run -> the resolved run, refused before training."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from medfed.algorithms import make_algorithm
from medfed.config import Modality, TrainConfig
from medfed.core.errors import ConfigError
from medfed.data.modality import modality_spec
from medfed.federation.plan import (
    RunPlan,
    SiteInfo,
    plan_run,
    resolved_settings,
    settle,
    settled_algorithm,
)

LABELS = {"normal": 0, "lesion": 1}


def infos(modality: str, n: int = 2) -> list[SiteInfo]:
    shape = (3, 32, 32) if modality == "fundus" else (1, 16, 32, 32)
    return [SiteInfo(f"s{i}", modality, LABELS, shape, 10 + i, {}) for i in range(n)]


@pytest.mark.parametrize(
    ("modality", "lr", "backbone"),
    [("fundus", 0.002, "cnn-gn"), ("ct", 3e-4, modality_spec("ct").default_backbone(False))],
)
def test_a_plan_fills_the_modality_defaults(modality, lr, backbone) -> None:
    config = TrainConfig(algorithm="fedavg")  # no learning rate chosen

    plan = plan_run(config, infos(modality))

    assert isinstance(plan, RunPlan)
    assert plan.modality == Modality(modality)
    assert plan.config.lr == lr == modality_spec(modality).lr
    assert plan.spec.backbone == backbone
    assert plan.config.backbone == "auto"  # config.toml records what was chosen
    assert plan.site_ids == ["s0", "s1"] and plan.spec.n_sites == 2
    assert plan.spec.in_channels == infos(modality)[0].input_shape[0]


def test_a_chosen_learning_rate_and_backbone_stay() -> None:
    config = TrainConfig(algorithm="fedbn", lr=0.05, backbone="cnn-gn")

    plan = plan_run(config, infos("fundus"))

    assert plan.config.lr == 0.05 and plan.spec.backbone == "cnn-gn"


def test_a_plan_spells_out_every_algorithm_parameter() -> None:
    config = TrainConfig(algorithm="feddrm")

    plan = plan_run(config, infos("fundus"))

    assert plan.config.params == make_algorithm("feddrm").resolved_params()
    assert resolved_settings(config) == dataclasses.replace(config, params=plan.config.params)
    assert plan.spec.client_branch  # FedDRM routes by its client head


def test_privacy_for_an_algorithm_that_cannot_have_it_is_refused() -> None:
    config = TrainConfig(algorithm="ditto", dp_epsilon=3.0)

    with pytest.raises(ConfigError, match=r"cannot train under differential privacy"):
        plan_run(config, infos("fundus"))
    with pytest.raises(ConfigError, match=r"cannot train under differential privacy"):
        settle(config, ["s0", "s1"])


def test_a_drill_of_a_site_outside_the_federation_is_refused() -> None:
    config = TrainConfig(algorithm="fedavg", rounds=2, faults=("1:elsewhere:raise",))

    with pytest.raises(ConfigError, match=r"'elsewhere', which is not in the federation"):
        plan_run(config, infos("fundus"))


def test_a_federation_that_cannot_train_is_refused_before_the_algorithms_settings() -> None:
    config = TrainConfig(algorithm="ditto", dp_epsilon=3.0)  # refused at any federation
    mixed = [infos("fundus")[0], dataclasses.replace(infos("ct")[1], input_shape=(3, 32, 32))]

    with pytest.raises(ConfigError, match=r"one modality"):
        plan_run(config, mixed)


def test_a_federation_of_two_modalities_is_refused() -> None:
    mixed = [infos("fundus")[0], dataclasses.replace(infos("ct")[1], input_shape=(3, 32, 32))]

    with pytest.raises(ConfigError, match=r"one modality"):
        plan_run(TrainConfig(algorithm="fedavg"), mixed)


def test_an_unknown_backbone_names_the_choices_and_the_file() -> None:
    config = TrainConfig(algorithm="fedavg", backbone="vit")

    with pytest.raises(ConfigError, match=r"^run\.toml: training setting: backbone.*'vit'.*auto"):
        resolved_settings(config, where="run.toml")
    with pytest.raises(ConfigError, match=r"^training setting: backbone \(--backbone\) 'vit'"):
        plan_run(config, infos("fundus"))


ENGINES = Path(__file__).resolve().parent.parent / "medfed"


def _calls(path: Path) -> set[str]:
    """The names of the functions ``path`` calls (``f(...)`` and ``module.f(...)``)."""
    calls = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            func = node.func
            calls.add(func.id if isinstance(func, ast.Name) else getattr(func, "attr", ""))
    return calls


def test_every_engine_builds_the_algorithm_from_the_plan_only() -> None:
    """The in-process engine, the ServerApp and each SuperNode take the algorithm from the plan
    or from the plan's settings (a SuperNode's RunSettings), never from make_algorithm."""
    engines = [ENGINES / "federation" / "engine.py", ENGINES / "federation" / "rounds.py"]
    engines += sorted((ENGINES / "flower").glob("*.py"))
    builders = {p.relative_to(ENGINES).as_posix() for p in engines if "make_algorithm" in _calls(p)}
    assert builders == set()
    assert "settled_algorithm" in _calls(ENGINES / "flower" / "node.py")


def test_a_settled_run_is_planned_with_the_algorithm_it_built() -> None:
    settled = settle(TrainConfig(algorithm="fedavg", faults=("1:s1:drop",)), ["s0", "s1"])

    plan = plan_run(settled, infos("fundus"))

    assert plan.algorithm is settled.algorithm  # built once, before the sites were known
    assert plan.config.lr == 0.002 and settled.config.lr is None  # the modality's, once known
    # A site that refused the run is gone: what it made possible is refused again.
    with pytest.raises(ConfigError, match=r"'s1', which is not in the federation"):
        plan_run(settled, infos("fundus", n=1))


def test_a_site_builds_from_the_plans_settings_the_algorithm_the_plan_built() -> None:
    plan = plan_run(TrainConfig(algorithm="feddrm"), infos("fundus"))

    at_site = settled_algorithm(plan.config)  # what a SuperNode does with RunSettings.config

    assert at_site.params == plan.algorithm.params
    assert at_site.params.client == "trained"  # settled for the run's start, as the plan did
    assert make_algorithm("feddrm", plan.config.params).params.client == "auto"  # on its own
