"""Deployed runs on Flower 1.42: one real federation on loopback (a SuperLink on TLS that admits
registered SuperNodes only, three SuperNodes with their resident workers) serves every run."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import pytest

from medfed.config import TrainConfig
from medfed.federation.training import load_sites, train
from medfed.flower.deploy import write_app, write_pki
from medfed.flower.loopback import LoopbackFederation
from medfed.flower.node import NOISE_KEY, PLANNED_NOISE
from medfed.routing.bundle import TrainedFederation
from medfed.runs import RunDir
from medfed.runs.checkpoints import CheckpointStore

# Real SuperLink and SuperNode processes: needs medfed[flower]; make test-fast leaves them out.
pytestmark = pytest.mark.flower

SITES = ["acrima", "rimone", "refuge"]
CONFIG = TrainConfig(algorithm="feddrm", rounds=2, local_steps=2, batch_size=8, seed=3)


# The run in which one SuperNode is killed, after round 1 (round 2 trained with round 1's
# validation, so the node is missed from round 2's validation on); as a pilot would run it,
# under differential privacy too, each node's noise its own secret.
KILLED = TrainConfig(
    algorithm="feddrm", rounds=3, local_steps=1, batch_size=8, seed=1, dp_epsilon=8.0
)
# The run whose SuperLink goes down after round 1 and is started again.
RESUMED = TrainConfig(algorithm="feddrm", rounds=2, local_steps=1, batch_size=8, seed=2)
INTRUDER = "intruder"  # a key pair the CA issued, never registered with the SuperLink


@dataclasses.dataclass(frozen=True)
class Deployed:
    """What the runs one loopback federation served, one after another, left behind."""

    plain: Path
    secure: Path
    resumed: Path
    killed: Path
    stopped_at: int  # checkpoints the resumed run had when its SuperLink went down
    intruder_rc: int | None  # the unregistered SuperNode's exit code
    intruder_log: str
    listed: str  # flwr supernode list, as JSON

    @property
    def node_state(self) -> Path:
        return self.plain.parent / "node_state"


@pytest.fixture(scope="module")
def deployed_runs(tiny_sites, tmp_path_factory) -> Deployed:
    """One federation as a pilot runs it: a SuperLink on TLS that admits registered SuperNodes
    only, and three SuperNodes, each with its resident worker (medfed deploy worker) and
    reconnecting when the SuperLink is away. Starting them is most of what a run costs here,
    so they serve every run in turn:

    - plain: FedDRM, two rounds;
    - secure: the same under secure aggregation (SecAgg+), its second round with a drop drill
      (one site leaves after the key exchange; two leaving, which halts SecAgg+, is drilled on
      the in-process grid of test_secure_aggregation.py);
    - resumed: the SuperLink is killed after round 1, started again, and the run resumed;
    - killed: under DP; refuge's SuperNode is killed after round 1 (last: its node is gone
      after it).
    """
    root = tmp_path_factory.mktemp("flower_tls")
    names = ("plain", "secure", "resumed", "killed")
    runs = {name: root / name for name in names}
    configs = {
        "plain": CONFIG,
        "secure": dataclasses.replace(CONFIG, faults=("2:rimone:drop",)),
        "resumed": RESUMED,
        "killed": KILLED,
    }

    def app(name: str, *, resume: bool = False) -> Path:
        folder = root / f"{name}_app"
        write_app(
            folder,
            configs[name],
            SITES,
            str(runs[name]),
            wait_s=180,
            reply_timeout_s=240 if name == "killed" else 300,
            secure_aggregation=name == "secure",
            resume=resume,
        )
        return folder

    keys = write_pki(root / "pki", ["127.0.0.1", "localhost"], [*SITES, INTRUDER]).node_keys
    manifests, cache = tiny_sites
    fed = LoopbackFederation(root, pki=root / "pki")
    try:
        fed.start_superlink(auth=True)
        for site in SITES:  # the hospitals the coordinator registered
            done = fed.flwr("supernode", "register", str(keys[site][1]), "pilot")
            assert done.returncode == 0, done.stdout + done.stderr
        for site in SITES:  # hospital nodes keep trying while the SuperLink is away
            worker = fed.start_worker(site)
            fed.start_supernode(
                site, manifests[site], cache=cache, key=keys[site][0], retries=None, worker=worker
            )
        intruder = fed.start_supernode(
            INTRUDER, manifests["refuge"], cache=cache, key=keys[INTRUDER][0]
        )
        intruder_rc = intruder.wait(timeout=120)
        intruder_log = fed.log(f"node_{INTRUDER}")
        for name in ("plain", "secure"):
            fed.submit(app(name))
            fed.wait_for_summary(runs[name])
        listed = fed.flwr("supernode", "list", "pilot", "--format", "json").stdout

        fed.submit(app("resumed"))
        wait_for(runs["resumed"] / "checkpoints" / "round_0001", fed)
        fed.kill("superlink")  # the coordinator's machine goes down mid-run
        stopped_at = len(CheckpointStore(RunDir(runs["resumed"]).checkpoints, 2).rounds())
        assert not (runs["resumed"] / "summary.json").exists()
        fed.start_superlink(auth=True)
        fed.submit(app("resumed", resume=True))
        fed.wait_for_summary(runs["resumed"])

        fed.submit(app("killed"))
        wait_for(runs["killed"] / "checkpoints" / "round_0001", fed)
        fed.kill("node_refuge")  # after round 1, mid-run
        fed.wait_for_summary(runs["killed"])
    finally:
        fed.close()
    return Deployed(*(runs[name] for name in names), stopped_at, intruder_rc, intruder_log, listed)


def wait_for(path: Path, fed: LoopbackFederation, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, fed.log("superlink")[-3000:]
        time.sleep(0.3)


@pytest.fixture(scope="module")
def deployed(deployed_runs) -> Path:
    return deployed_runs.plain


def test_deployed_run_writes_the_run_directory(deployed: Path) -> None:
    run = RunDir(deployed).require()
    summary = run.read_summary()
    assert summary["engine"] == "flower" and summary["algorithm"] == "feddrm"
    assert set(summary["sites"]) == set(SITES) and summary["lost_sites"] == {}
    assert summary["routing_method"] == "density_ratio"
    assert summary["dropouts"] == 0 and summary["bytes_per_round"] > 0
    records = run.read_metrics()
    assert sorted((r["round"], r["site"]) for r in records) == sorted(
        (r, s) for r in (1, 2) for s in SITES
    )
    assert all(r["status"] == "ok" and r["bytes_up"] > 0 and "val_auc" in r for r in records)
    store = CheckpointStore(run.checkpoints, CONFIG.keep_checkpoints)
    assert [p.name for _, p in store.rounds()] == ["round_0001", "round_0002"]
    # Readers work unchanged: the published models answer scans.
    fed = TrainedFederation.load(deployed, device="cpu")
    assert [s.id for s in fed.sites] == SITES and fed.abstention is not None
    # Private state stayed on the nodes: each node kept its own round files.
    node_files = sorted(p.parent.name for p in deployed.parent.glob("node_state/*/*/round_*"))
    assert set(node_files) == set(SITES)


def test_deployed_run_equals_the_in_process_engine(deployed: Path, tiny_sites, tmp_path) -> None:
    manifests, cache = tiny_sites
    local = train(load_sites([manifests[s] for s in SITES], cache), CONFIG, tmp_path / "local")
    remote = RunDir(deployed).read_summary()
    for site in SITES:
        for key in ("auc", "accuracy", "balanced_accuracy", "n_test"):
            assert remote["sites"][site][key] == pytest.approx(local["sites"][site][key], abs=1e-6)
    for key in ("mean_site_auc", "worst_site_auc", "system_accuracy", "routing_accuracy"):
        assert remote[key] == pytest.approx(local[key], abs=1e-6)
    assert remote["bytes_per_round"] == local["bytes_per_round"]
    # The routing posterior's temperature is fitted on the same validation scores.
    routed, here_routed = remote.routing_calibration, local.routing_calibration
    assert routed.temperature == pytest.approx(here_routed.temperature, rel=1e-3)
    assert routed.ece == pytest.approx(here_routed.ece, abs=1e-3)
    # The same operating points, intervals and per-scan predictions, wherever the sites are.
    for site in SITES:
        mine, theirs = local.sites[site], remote.sites[site]
        assert theirs.operating_point.threshold == pytest.approx(mine.operating_point.threshold)
        if mine.auc_ci is not None:
            assert theirs.auc_ci.low == pytest.approx(mine.auc_ci.low, abs=1e-6)
    # The pooled and system figures come from the sites' counts and sums, as in one process.
    assert remote.pooled_auc.estimate == pytest.approx(local.pooled_auc.estimate, abs=1e-6)
    assert remote.pooled_auc.i2 == pytest.approx(local.pooled_auc.i2, abs=1e-6)
    for key in ("n", "ece", "brier", "accuracy", "mean_chosen"):
        assert getattr(routed, key) == pytest.approx(getattr(here_routed, key), abs=1e-3), key
    assert [b["n"] for b in routed.bins] == [b["n"] for b in here_routed.bins]
    for name, figures in local.routers.items():
        assert remote.routers[name].n_pooled == figures.n_pooled
        for rate, value in figures.rates.items():
            assert remote.routers[name].rates[rate].k == value.k, (name, rate)
    # By default no per-scan prediction reached the coordinator: each site kept its own, in
    # its state folder, and they are the in-process run's rows.
    assert local.predictions == "run" and remote.predictions == "sites"
    assert not (deployed / "predictions.csv").exists()
    node_state = deployed.parent / "node_state" / deployed.name
    here_scans = RunDir(tmp_path / "local").read_predictions()
    there_scans = [r for s in SITES for r in RunDir(node_state / s).read_predictions()]
    assert [r["scan_id"] for r in there_scans] == [r["scan_id"] for r in here_scans]
    for mine, theirs in zip(here_scans, there_scans, strict=True):
        assert theirs["score"] == pytest.approx(mine["score"], abs=1e-5)
        assert theirs["routed_site"] == mine["routed_site"]
    scan_ids = {r["scan_id"] for r in here_scans}
    for path in deployed.rglob("*"):  # no scan id in any file the coordinator wrote
        if path.is_file() and path.suffix in (".json", ".jsonl", ".csv", ".toml", ".md"):
            text = path.read_text(encoding="utf-8")
            assert not any(scan in text for scan in scan_ids), path
    # One round loop: the same records, field for field, but for the wall clock, what the
    # deployed engine's evaluation messages cost and the downlink bytes a site rebuilt from
    # the weights it validated (in one process nothing is sent).
    aside = {"seconds", "round_seconds", "bytes_eval", "bytes_down_reused"}
    here = [_as_dict(r) for r in RunDir(tmp_path / "local").read_metrics()]
    there = [_as_dict(r) for r in RunDir(deployed).read_metrics()]
    assert len(here) == len(there) == 2 * len(SITES)
    for mine, theirs in zip(here, there, strict=True):
        assert set(theirs) - aside == set(mine) - aside
        for key in set(mine) - aside:
            if isinstance(mine[key], float):
                assert theirs[key] == pytest.approx(mine[key], abs=1e-5), key
            else:
                assert theirs[key] == mine[key], key
    assert all(r["bytes_eval"] > 0 for r in there)


def _as_dict(record) -> dict:
    return record if isinstance(record, dict) else record.to_dict()


def test_tls_admits_the_registered_supernodes_only(deployed_runs) -> None:
    assert deployed_runs.intruder_rc not in (0, None)
    assert "Failed to activate SuperNode" in deployed_runs.intruder_log
    listed = deployed_runs.listed
    assert len(json.loads(listed[listed.index("{") :]).get("nodes", [])) == len(SITES)


def test_a_deployed_run_resumes_from_the_server_checkpoint(deployed_runs, tiny_sites, tmp_path):
    run = RunDir(deployed_runs.resumed).require()
    resumed = run.read_summary()
    events = [e for e in run.read_events() if e["event"] == "resume"]
    assert [e["from_round"] for e in events] == [deployed_runs.stopped_at]
    assert resumed["resumes"] == 1
    records = run.read_metrics()
    assert sorted((r["round"], r["site"]) for r in records) == sorted(
        (r, s) for r in (1, 2) for s in SITES
    )
    # The resumed run is the run that was never interrupted.
    manifests, cache = tiny_sites
    local = train(load_sites([manifests[s] for s in SITES], cache), RESUMED, tmp_path / "local")
    for site in SITES:
        assert resumed["sites"][site]["auc"] == pytest.approx(local["sites"][site]["auc"], abs=1e-6)
    here = {(r["round"], r["site"]): r for r in RunDir(tmp_path / "local").read_metrics()}
    for r in records:
        assert r["val_loss"] == pytest.approx(here[(r["round"], r["site"])]["val_loss"], abs=1e-5)


def test_a_killed_supernode_is_counted_and_the_run_finishes(deployed_runs) -> None:
    run_dir = deployed_runs.killed
    summary = RunDir(run_dir).require().read_summary()
    assert summary["dropouts"] >= 1
    assert {d["site"] for d in summary["dropped"]} == {"refuge"}, summary["dropped"]
    assert "refuge" in summary["lost_sites"]
    assert set(summary["sites"]) == {"acrima", "rimone"}
    records = RunDir(run_dir).read_metrics()
    later = [r for r in records if r["round"] > 1 and r["site"] != "refuge"]
    assert later and all(r["status"] == "ok" for r in later)
    # Noticed well before Flower's own 60 s (two missed heartbeats): by the exchange's deadline
    # from the other sites' reply times, or by the node's overdue heartbeat.
    dropped = [r for r in records if r["site"] == "refuge" and r["status"] == "dropped"]
    assert dropped and all(
        "deadline" in r["reason"] or "heartbeat" in r["reason"] for r in dropped
    ), dropped
    assert all(r["round_seconds"] < 50 for r in records if r["round"] == dropped[0]["round"])
    events = [e["event"] for e in RunDir(run_dir).read_events()]
    assert "dropout" in events and "site_lost" in events and events[-1] == "finish"


def test_each_node_draws_its_dp_noise_from_a_secret_of_its_own(deployed_runs) -> None:
    run_dir = deployed_runs.killed
    summary = RunDir(run_dir).read_summary()
    survivors = {"acrima", "rimone"}
    assert set(summary["privacy"]) == survivors
    for spent in summary["privacy"].values():
        assert spent["steps"] == KILLED.rounds * KILLED.local_steps
        assert 0 < spent["epsilon"] <= KILLED.dp_epsilon
    keys = {p.parent.name: p for p in deployed_runs.node_state.glob(f"killed/*/{NOISE_KEY}")}
    assert set(keys) == set(SITES)  # one secret per site, on that site's node only
    assert all(p.stat().st_mode & 0o077 == 0 for p in keys.values())
    assert len({p.read_bytes() for p in keys.values()}) == len(SITES)
    for site in survivors:  # the noise the budget allows, searched once per node
        planned = json.loads((keys[site].parent / PLANNED_NOISE).read_text())
        assert planned["noise"] == pytest.approx(summary["privacy"][site]["noise_multiplier"])
    records = RunDir(run_dir).read_metrics()
    assert {r["site"] for r in records if r.get("train_dp_epsilon")} == set(SITES)


def test_a_secure_deployed_run_matches_the_plain_one(deployed_runs) -> None:
    """SecAgg+ across real SuperNode processes: the server's aggregate of round 1 (both runs
    start from the same weights) is the plain run's within the protocol's quantization error
    plus float32 rounding; a site leaving after the key exchange is left out of the sum, and
    the run finishes like any other."""
    from medfed.flower.secure import error_bound
    from medfed.runs.weights import load_state

    secured = deployed_runs.secure
    summary = RunDir(secured).require().read_summary()
    assert summary["engine"] == "flower" and summary["lost_sites"] == {}
    weights = [float(s["n_train"]) for s in summary["sites"].values()]
    allowed = error_bound(weights, 1.0)
    plain, secure = (
        load_state(r / "checkpoints" / "round_0001" / "global.safetensors")
        for r in (deployed_runs.plain, deployed_runs.secure)
    )
    assert plain.keys() == secure.keys()
    for key, a in plain.items():
        b = secure[key]
        rounding = 2.0**-23 * np.maximum(a.abs().numpy(), b.abs().numpy())
        assert ((a - b).abs().numpy() <= allowed + rounding).all(), key
    records = {(r["round"], r["site"]): r for r in RunDir(secured).read_metrics()}
    first = [records[(1, site)] for site in SITES]
    assert all(r["status"] == "ok" and r["aggregated"] for r in first)
    assert all(r["secure_clipped"] == 0 and r["bytes_up"] > r["bytes_down"] for r in first)
    # Round 2: rimone left after the key exchange; the other two sites' sum went on.
    assert records[(2, "rimone")]["status"] == "dropped"
    assert "masked update collection" in records[(2, "rimone")]["reason"]
    assert all(records[(2, s)]["status"] == "ok" for s in ("acrima", "refuge"))
    assert all(records[(2, s)]["aggregated"] for s in ("acrima", "refuge"))
    events = RunDir(secured).read_events()
    assert not [e for e in events if e["event"] == "round_skipped"]
    assert events[0]["secure_aggregation"] == "secagg+" and events[-1]["event"] == "finish"
    assert TrainedFederation.load(secured, device="cpu").abstention is not None
