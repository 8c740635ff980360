"""The in-process engine: training, dropouts and bad updates, resume equality, run directory."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from medfed.algorithms import ALGORITHMS, make_algorithm
from medfed.config import TrainConfig
from medfed.core.errors import ConfigError
from medfed.data.records import Split
from medfed.federation.coordinator import Coordinator
from medfed.federation.training import train
from medfed.routing.bundle import TrainedFederation
from medfed.runs import RunDir
from tests.tensorsites import tensor_sites

VOLATILE = {"seconds_per_round", "seconds_total", "resumes"}  # wall clock, resume count


# What an algorithm needs besides its defaults to train here: LoRA adapts a trained base, so it
# builds one first (one FedAvg round).
NEEDS = {"lora": {"warmup_rounds": 1}}


def config(algorithm: str = "feddrm", **kw) -> TrainConfig:
    base = dict(algorithm=algorithm, rounds=3, local_steps=3, batch_size=8, device="cpu")
    base |= dict(optimizer="sgd", lr=0.05, params=dict(NEEDS.get(algorithm, {})))
    return TrainConfig(**(base | kw))


def stable(summary: dict) -> dict:
    """The summary without wall-clock figures (they differ between any two runs)."""
    out = {k: v for k, v in summary.items() if k not in VOLATILE}
    for key in ("routers", "routers_origin_known"):
        out[key] = {
            name: {k: v for k, v in fig.items() if not k.startswith("latency_ms")}
            for name, fig in summary[key].items()
        }
    return out


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_every_algorithm_trains_and_writes_the_run_directory(algorithm, tmp_path) -> None:
    summary = train(tensor_sites(3), config(algorithm), tmp_path / "run")
    run = RunDir(tmp_path / "run")
    assert run.config_path.is_file() and run.summary_path.is_file()
    assert (run.model_dir / "model.json").is_file()
    assert len(run.read_metrics()) == 3 * 3  # one record per round per site
    assert set(summary["sites"]) == {"site0", "site1", "site2"}
    for figures in summary["sites"].values():
        assert 0.0 <= figures["accuracy"] <= 1.0 and figures["n_test"] == 12
    assert summary["system_accuracy"] is not None
    routes = make_algorithm(algorithm).needs_client_branch
    assert summary["routing_method"] == ("density_ratio" if routes else "majority_vote")
    if not ALGORITHMS[algorithm].communicates:
        assert summary["bytes_per_round"] == 0
    else:
        assert summary["bytes_per_round"] > 0


def test_feddrm_learns_to_route_scans_to_their_site(tmp_path) -> None:
    # Sites that differ by a band of rows: each site's own norms keep it visible. Its private
    # running statistics lag the shared weights, so the default, gentler AdamW steps are used.
    cfg = config("feddrm", rounds=16, local_steps=3, optimizer="adam", lr=0.002)
    summary = train(tensor_sites(3, camera="band"), cfg, tmp_path / "r")
    assert summary["backbone"] == "cnn"  # BatchNorm: its norms stay on each site
    assert summary["routing_accuracy"] >= 0.85
    # Sites that differ only by a colour cast, which a site's own norms remove: the paper's
    # FedDRM (all norms shared, GroupNorm) routes them.
    paper = config("feddrm", rounds=8, local_steps=3, lr=0.02, params={"private_norms": False})
    summary = train(tensor_sites(3), paper, tmp_path / "p")
    assert summary["backbone"] == "cnn-gn"
    assert summary["routing_accuracy"] >= 0.85


def test_private_batch_norm_statistics_are_measured_again_with_the_final_weights(tmp_path):
    # 24 training scans per site in batches of 8: the cumulative average of the batch means is
    # exactly the mean over the site's training split.
    sites = tensor_sites(3)
    train(sites, config("fedbn", rounds=2, backbone="cnn"), tmp_path / "bn")
    fed = TrainedFederation.load(tmp_path / "bn", "cpu")
    for site, model in zip(sites, fed.models, strict=True):
        conv, norm = model.backbone.features[0], model.backbone.features[1]
        assert isinstance(norm, torch.nn.BatchNorm2d)
        with torch.no_grad():
            expected = conv(site.x[Split.TRAIN]).mean(dim=(0, 2, 3))
        assert torch.allclose(norm.running_mean, expected, atol=1e-5)
    # Shared statistics (FedAvg on the same backbone) stay the averaged ones, equal everywhere.
    train(sites, config("fedavg", rounds=2, backbone="cnn"), tmp_path / "avg")
    shared = TrainedFederation.load(tmp_path / "avg", "cpu")
    means = [m.backbone.features[1].running_mean for m in shared.models]
    assert all(torch.equal(means[0], m) for m in means[1:])


def test_same_seed_same_summary(tmp_path) -> None:
    a = train(tensor_sites(2), config("fedavg"), tmp_path / "a")
    b = train(tensor_sites(2), config("fedavg"), tmp_path / "b")
    c = train(tensor_sites(2), config("fedavg", seed=1), tmp_path / "c")
    assert stable(a) == stable(b)
    assert stable(a) != stable(c)


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("nan", "NaN"),
        ("shape", "shape"),
        ("raise", "failed during local training"),
        ("timeout", "time limit"),
        ("drop", "did not answer"),
    ],
)
def test_a_failing_site_is_excluded_counted_and_logged(kind, reason, tmp_path) -> None:
    cfg = config("fedavg", faults=(f"2:site1:{kind}",))
    summary = train(tensor_sites(3), cfg, tmp_path / "run")
    run = RunDir(tmp_path / "run")
    dropped = [r for r in run.read_metrics() if r["status"] == "dropped"]
    assert [(r["round"], r["site"]) for r in dropped] == [(2, "site1")]
    assert reason in dropped[0]["reason"]
    assert summary["dropouts"] == 1 and summary["dropped"][0]["site"] == "site1"
    assert any(e["event"] == "dropout" for e in run.read_events())
    round2 = [r for r in run.read_metrics() if r["round"] == 2]
    assert all(r["aggregated"] for r in round2)  # the round completed with the other two


def test_a_round_below_min_sites_keeps_the_global_model(tmp_path) -> None:
    cfg = config("fedavg", min_sites=3, faults=("2:site0:nan",))
    train(tensor_sites(3), cfg, tmp_path / "run")
    run = RunDir(tmp_path / "run")
    skipped = [e for e in run.read_events() if e["event"] == "round_skipped"]
    assert [e["round"] for e in skipped] == [2]
    assert not any(r["aggregated"] for r in run.read_metrics() if r["round"] == 2)


class Killed(Exception):
    pass


def kill_and_resume(cfg: TrainConfig, tmp_path, monkeypatch, kill_after: int = 2):
    """(uninterrupted summary, summary after a kill following round ``kill_after`` + resume)."""
    whole = train(tensor_sites(3), cfg, tmp_path / "whole")
    original = Coordinator.checkpoint

    def die(self, round_, site_states=None):
        original(self, round_, site_states)
        if round_ == kill_after:
            raise Killed

    monkeypatch.setattr(Coordinator, "checkpoint", die)
    with pytest.raises(Killed):
        train(tensor_sites(3), cfg, tmp_path / "cut")
    monkeypatch.setattr(Coordinator, "checkpoint", original)
    return whole, train(tensor_sites(3), cfg, tmp_path / "cut", resume=True)


@pytest.mark.parametrize("algorithm", ["feddrm", "ditto", "fedavgft", "lora"])
def test_resume_after_a_kill_ends_exactly_like_an_uninterrupted_run(
    algorithm, tmp_path, monkeypatch
) -> None:
    whole, resumed = kill_and_resume(config(algorithm, rounds=4), tmp_path, monkeypatch)
    assert stable(resumed) == stable(whole)
    assert resumed["resumes"] == 1
    rounds = [r["round"] for r in RunDir(tmp_path / "cut").read_metrics()]
    assert rounds == sorted(rounds) and len(rounds) == 4 * 3


def test_resume_refuses_changed_settings_and_new_runs_refuse_old_folders(tmp_path) -> None:
    train(tensor_sites(2), config("fedavg"), tmp_path / "run")
    with pytest.raises(ConfigError, match="already holds a run"):
        train(tensor_sites(2), config("fedavg"), tmp_path / "run")
    with pytest.raises(ConfigError, match="settings differ"):
        train(tensor_sites(2), config("fedavg", lr=0.1), tmp_path / "run", resume=True)


def test_summary_holds_the_documented_fields(tmp_path) -> None:
    train(tensor_sites(3), config("feddrm"), tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    for key in (
        "algorithm", "rounds", "seed", "sites", "mean_site_auc", "worst_site_auc", "worst_site",
        "average_accuracy", "system_accuracy", "routing_accuracy", "bytes_per_round",
        "seconds_per_round",
    ):  # fmt: skip
        assert key in summary
    for figures in summary["sites"].values():
        assert {"auc", "accuracy", "balanced_accuracy", "n_test"} <= set(figures)


def test_sigkill_mid_run_then_resume_matches_an_uninterrupted_run(tmp_path) -> None:
    """A real process killed with SIGKILL after a checkpoint, resumed from the command line."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from medfed.data.synth import synthesize

    manifests = synthesize(tmp_path / "data", modality="fundus", n_per_site=12, seed=2)
    env = os.environ | {"MEDFED_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}

    def command(out: str, *extra: str) -> list[str]:
        args = ["-m", "medfed.cli", "train", "--sites", *map(str, manifests)]
        args += ["--algorithm", "feddrm", "--rounds", "6", "--local-steps", "2"]
        args += ["--batch-size", "8", "--device", "cpu", "--no-progress", "--out", out]
        return [sys.executable, *args, *extra]

    whole = subprocess.run(command(str(tmp_path / "whole")), env=env, capture_output=True)
    assert whole.returncode == 0, whole.stderr.decode()

    cut = tmp_path / "cut"
    process = subprocess.Popen(command(str(cut)), env=env, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (cut / "checkpoints" / "round_0002").exists():
            assert process.poll() is None, "training ended before it could be killed"
            assert time.monotonic() < deadline, "no checkpoint for round 2 within 120 s"
            time.sleep(0.05)
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
    assert not (cut / "summary.json").exists()

    resumed = subprocess.run(command(str(cut), "--resume"), env=env, capture_output=True)
    assert resumed.returncode == 0, resumed.stderr.decode()
    a = json.loads((tmp_path / "whole" / "summary.json").read_text())
    b = json.loads((cut / "summary.json").read_text())
    assert stable(a) == stable(b)
    assert b["resumes"] == 1


def test_settings_that_cannot_work_are_refused_up_front(tmp_path) -> None:

    with pytest.raises(ConfigError, match="min_sites=4"):
        train(tensor_sites(3), config("fedavg", min_sites=4), tmp_path / "a")
    with pytest.raises(ConfigError, match="outside 1..3"):
        train(tensor_sites(3), config("fedavg", faults=("9:site0:nan",)), tmp_path / "b")
    sites = tensor_sites(2)
    sites[1].manifest = replace(sites[1].manifest, labels={"normal": 1, "glaucoma": 0})
    with pytest.raises(ConfigError, match="different \\[labels\\]"):
        train(sites, config("fedavg"), tmp_path / "c")


def test_fedrep_thaws_the_model_after_a_failing_site(tmp_path) -> None:
    cfg = config("fedrep", faults=("2:site0:timeout",))
    summary = train(tensor_sites(3), cfg, tmp_path / "run")
    assert summary["dropouts"] == 1  # only the failing site, not every site after it


def final_weights(run_dir) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    weights = {}
    for path in sorted((run_dir / "model").glob("*.safetensors")):
        weights |= {f"{path.stem}/{k}": v for k, v in load_file(path).items()}
    return weights


# Every algorithm, and DP-SGD (Opacus' hooks on each site's own model copy).
SIDE_BY_SIDE = [(name, {}) for name in sorted(ALGORITHMS)] + [("feddrm", {"dp_epsilon": 3.0})]


@pytest.mark.parametrize(("algorithm", "extra"), SIDE_BY_SIDE)
def test_sites_trained_side_by_side_equal_sites_trained_one_by_one(
    algorithm, extra, tmp_path
) -> None:
    # Both at one intra-op thread per site (conftest): the lanes change only when work runs.
    assert torch.get_num_threads() == 1
    cfg = config(algorithm, rounds=2, **extra)
    one = train(tensor_sites(3), replace(cfg, concurrency=1), tmp_path / "one")
    side = train(tensor_sites(3), replace(cfg, concurrency=3), tmp_path / "side")
    assert one["device"] == "cpu (1 threads)"
    assert side["device"] == "cpu (1 threads); 3 sites at a time, each on 1 thread(s)"
    assert stable({**side, "device": ""}) == stable({**one, "device": ""})
    a, b = final_weights(tmp_path / "one"), final_weights(tmp_path / "side")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    per_site = [
        [{k: v for k, v in r.items() if "seconds" not in k} for r in RunDir(d).read_metrics()]
        for d in (tmp_path / "one", tmp_path / "side")
    ]
    assert per_site[0] == per_site[1]
    assert torch.get_num_threads() == 1  # the lanes' thread settings stay in their threads
