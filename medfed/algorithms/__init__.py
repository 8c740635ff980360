"""Federated algorithms, one small module each, looked up by name."""

from __future__ import annotations

from typing import Any

from medfed.algorithms.base import Algorithm
from medfed.algorithms.ditto import Ditto
from medfed.algorithms.fedals import FedALS
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
from medfed.errors import ConfigError

ALGORITHMS: dict[str, type[Algorithm]] = {
    cls.name: cls
    for cls in (
        *(LocalOnly, FedAvg, FedProx, FedAvgFT, FedBN, FedRep, Ditto, FedDRM, FedALS, LoRA),
        *(FedGMI, PFedMe),
    )
}


def make_algorithm(name: str, params: dict[str, Any] | None = None) -> Algorithm:
    """Build an algorithm by name with validated hyper-parameters."""
    key = name.lower()
    if key not in ALGORITHMS:
        raise ConfigError(f"unknown algorithm {name!r}; choose one of {sorted(ALGORITHMS)}")
    cls = ALGORITHMS[key]
    return cls(cls.params_class.parse(key, params or {}))
