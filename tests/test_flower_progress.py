"""A deployed run tells its rounds in the ServerApp's log: a line per round, as it goes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from medfed.config import TrainConfig
from medfed.flower.deploy import write_app
from medfed.flower.loopback import LoopbackFederation

pytestmark = pytest.mark.flower

SITES = ["acrima", "rimone", "refuge"]
CONFIG = TrainConfig(algorithm="fedavg", rounds=2, local_steps=1, batch_size=8, seed=5)


def test_the_serverapp_log_has_a_line_per_round(tiny_sites, tmp_path: Path) -> None:
    manifests, cache = tiny_sites
    run = tmp_path / "run"
    app = tmp_path / "app"
    write_app(app, CONFIG, SITES, str(run), wait_s=180, reply_timeout_s=300)
    fed = LoopbackFederation(tmp_path)  # loopback: --insecure
    try:
        fed.start_superlink()
        for site in SITES:
            fed.start_supernode(site, manifests[site], cache=cache)
        fed.submit(app)
        fed.wait_for_summary(run)
        nodes = "\n".join(fed.log(name) for name in list(fed.procs))
        run_id = re.search(r"\[RUN (\d+)\]", nodes)
        assert run_id, nodes[-3000:]
        shown = fed.flwr("log", run_id.group(1), "pilot", "--show")  # what --stream shows
        log = shown.stdout + shown.stderr
    finally:
        fed.close()
    for round_ in (1, 2):
        line = re.search(rf"medfed: fedavg round {round_}/2[^\n]*\((\d+\.\d) s\)", log)
        assert line, f"no line for round {round_} in the ServerApp's log:\n{log[-3000:]}"
