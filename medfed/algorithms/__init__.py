"""Federated algorithms, one small module each, looked up by name."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from medfed.algorithms.base import Algorithm
from medfed.algorithms.ditto import Ditto
from medfed.algorithms.fedals import FedALS, FedALSParams
from medfed.algorithms.fedavg import FedAvg
from medfed.algorithms.fedavgft import FedAvgFT
from medfed.algorithms.fedbn import FedBN
from medfed.algorithms.feddrm import FedDRM
from medfed.algorithms.fedgmi import FedGMI
from medfed.algorithms.fedprox import FedProx
from medfed.algorithms.fedrep import FedRep
from medfed.algorithms.local import LocalOnly
from medfed.algorithms.lora import LoRA
from medfed.algorithms.pfedme import PFedMe
from medfed.core.errors import ConfigError

ALGORITHMS: dict[str, type[Algorithm]] = {
    cls.name: cls
    for cls in (
        *(LocalOnly, FedAvg, FedProx, FedAvgFT, FedBN, FedRep, Ditto, FedDRM, FedALS, LoRA),
        *(FedGMI, PFedMe),
    )
}


def dp_algorithms() -> list[str]:
    """The algorithms that train under differential privacy (fedals, over any of them)."""
    return sorted(n for n, c in ALGORITHMS.items() if not c.dp_refusal and n != FedALS.name)


def make_algorithm(name: str, params: dict[str, Any] | None = None) -> Algorithm:
    """Build an algorithm by name with validated hyper-parameters.

    ``fedals`` is a base algorithm with the alternating schedule: its own parameters (base,
    alpha, representation) pick the schedule, every other parameter goes to the base; a base
    parameter whose name fedals uses too is written with the base's name in front
    (``lora.alpha=16``, ``lora.base=federated``).
    """
    key = name.lower()
    if key not in ALGORITHMS:
        raise ConfigError(f"unknown algorithm {name!r}; choose one of {sorted(ALGORITHMS)}")
    values = dict(params or {})
    if key == FedALS.name:
        return _with_alternating_schedule(values)
    cls = ALGORITHMS[key]
    return cls(cls.params_class.parse(key, values))


def recorded_params(
    name: str, params: dict[str, Any] | None = None, frozen_encoder: bool = False
) -> dict[str, Any]:
    """The parameters a run of ``name`` records in config.toml: every one with its value,
    defaults included, and those that depend on the run's start resolved (FedDRM's client
    head rule); what reusing a finished run compares against."""
    algorithm = make_algorithm(name, params)
    algorithm.settle(frozen_encoder)
    return algorithm.resolved_params()


def _with_alternating_schedule(values: dict[str, Any]) -> Algorithm:
    own = {f.name for f in fields(FedALSParams)}
    fedals = FedALSParams.parse(FedALS.name, {k: v for k, v in values.items() if k in own})
    if fedals.base not in ALGORITHMS or fedals.base == FedALS.name:
        raise ConfigError(
            f"fedals: unknown base algorithm {fedals.base!r}; choose one of "
            f"{sorted(set(ALGORITHMS) - {FedALS.name})}"
        )
    base = ALGORITHMS[fedals.base]
    if not base.communicates:
        raise ConfigError(f"fedals needs a base that communicates, not {fedals.base!r}")
    prefix = f"{fedals.base}."
    rest = {k.removeprefix(prefix): v for k, v in values.items() if k not in own}
    return base(base.params_class.parse(fedals.base, rest), fedals.schedule())
