"""Flower deployments on loopback for tests: the federation itself lives in
:mod:`medfed.flower.loopback`; here, the test sites' ids, settings and SuperNodes."""

from __future__ import annotations

from medfed.config import TrainConfig
from medfed.flower.loopback import LoopbackFederation

SITES = ["acrima", "rimone", "refuge"]
CONFIG = TrainConfig(algorithm="feddrm", rounds=2, local_steps=2, batch_size=8, seed=3)


def start_nodes(fed: LoopbackFederation, sites, names, keys=None, *, workers=False) -> None:
    """A SuperNode for each site in ``names`` (with its resident worker where ``workers``)."""
    manifests, cache = sites
    for name in names:
        worker = fed.start_worker(name) if workers else None
        key = keys and keys.get(name)
        fed.start_supernode(name, manifests[name], cache=cache, key=key, worker=worker)
