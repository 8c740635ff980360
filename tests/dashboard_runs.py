"""Small real runs for the dashboard tests: tiny synthetic fundus sites, a few rounds.

``build(base)`` writes, under ``base``:

- ``runs/feddrm``: FedDRM with a dropout in round 2, killed after round 2 and resumed;
- ``runs/fedavg``: FedAvg, uninterrupted;
- ``half_written``: the FedDRM run as the kill left it (config, 2 rounds, no summary, no model);
- ``data``: the synthetic sites (JPEG/PNG files to route).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from medfed.config import TrainConfig
from medfed.data.synth import synthesize
from medfed.federation.coordinator import Coordinator
from medfed.federation.training import load_sites, train

ROUNDS = 3
DROPPED_SITE = "rimone"


class Killed(Exception):
    """Stands in for the process being killed right after a checkpoint."""


@dataclass(frozen=True)
class DashboardRuns:
    base: Path
    runs: Path
    feddrm: Path
    fedavg: Path
    half_written: Path
    data: Path

    def fundus_photo(self) -> Path:
        return sorted((self.data / "ACRIMA").glob("*.jpg"))[0]


def _config(algorithm: str, **extra) -> TrainConfig:
    return TrainConfig(algorithm, rounds=ROUNDS, local_steps=2, batch_size=8, device="cpu", **extra)


def build(base: Path) -> DashboardRuns:
    data = base / "data"
    manifests = synthesize(data, modality="fundus", n_per_site=24, seed=1, image_size=64)
    sites = load_sites(manifests, base / "cache")
    runs = base / "runs"
    feddrm = runs / "feddrm"
    config = _config("feddrm", faults=(f"2:{DROPPED_SITE}:drop",))
    original = Coordinator.checkpoint

    def die_after_round_2(self: Coordinator, round_: int, site_states=None) -> None:
        original(self, round_, site_states)
        if round_ == 2:
            raise Killed

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Coordinator, "checkpoint", die_after_round_2)
        with pytest.raises(Killed):
            train(sites, config, feddrm)
    half_written = base / "half_written"
    shutil.copytree(feddrm, half_written)
    train(sites, config, feddrm, resume=True)
    train(sites, _config("fedavg"), runs / "fedavg")
    return DashboardRuns(base, runs, feddrm, runs / "fedavg", half_written, data)
