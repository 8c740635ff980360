"""A deployed run on Flower 1.42 that stops and goes on: a real SuperLink and SuperNodes on
loopback (run beside tests/test_flower.py by make test)."""

from __future__ import annotations

import time

import pytest

from medfed.config import TrainConfig
from medfed.federation.training import load_sites, train
from medfed.flower.deploy import write_app
from medfed.runs import RunDir
from medfed.runs.checkpoints import CheckpointStore
from tests.flowerfed import SITES, LoopbackFederation

pytestmark = pytest.mark.flower


def test_a_deployed_run_resumes_from_the_server_checkpoint(tiny_sites, tmp_path) -> None:
    manifests, cache = tiny_sites
    run_dir = tmp_path / "run"
    config = TrainConfig(algorithm="feddrm", rounds=2, local_steps=1, batch_size=8, seed=2)
    write_app(tmp_path / "app", config, SITES, str(run_dir), wait_s=180, reply_timeout_s=240)
    fed = LoopbackFederation(tmp_path)
    try:
        fed.start_superlink()
        for site in SITES:  # hospital nodes keep trying while the SuperLink is down
            worker = fed.start_worker(site)
            fed.start_supernode(site, manifests[site], cache=cache, retries=None, worker=worker)
        fed.submit(tmp_path / "app")
        first = run_dir / "checkpoints" / "round_0001"
        deadline = time.monotonic() + 300
        while not first.exists():
            assert time.monotonic() < deadline, fed.log("superlink")[-3000:]
            time.sleep(0.3)
        fed.kill("superlink")  # the coordinator's machine goes down mid-run
        stopped_at = len(CheckpointStore(RunDir(run_dir).checkpoints, 2).rounds())
        assert not (run_dir / "summary.json").exists()
        fed.start_superlink()
        write_app(
            tmp_path / "app",
            config,
            SITES,
            str(run_dir),
            wait_s=180,
            reply_timeout_s=240,
            resume=True,
        )
        fed.submit(tmp_path / "app")
        resumed = fed.wait_for_summary(run_dir)
    finally:
        fed.close()
    run = RunDir(run_dir)
    events = [e for e in run.read_events() if e["event"] == "resume"]
    assert [e["from_round"] for e in events] == [stopped_at] and resumed["resumes"] == 1
    records = run.read_metrics()
    assert sorted((r["round"], r["site"]) for r in records) == sorted(
        (r, s) for r in (1, 2) for s in SITES
    )
    # The resumed run is the run that was never interrupted.
    local = train(load_sites([manifests[s] for s in SITES], cache), config, tmp_path / "local")
    for site in SITES:
        assert resumed["sites"][site]["auc"] == pytest.approx(local["sites"][site]["auc"], abs=1e-6)
    here = {(r["round"], r["site"]): r for r in RunDir(tmp_path / "local").read_metrics()}
    for r in records:
        assert r["val_loss"] == pytest.approx(here[(r["round"], r["site"])]["val_loss"], abs=1e-5)
