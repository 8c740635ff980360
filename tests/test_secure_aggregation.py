"""Secure aggregation (SecAgg+) of deployed rounds, through Flower's own messages in one process
(tests/flowergrid.py): the server's result, what it received, dropouts and refusals."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")

from flwr.common import bytes_to_ndarray  # noqa: E402
from flwr.common.secure_aggregation.secaggplus_constants import (  # noqa: E402
    RECORD_KEY_CONFIGS,
    Key,
)

from medfed.config import TrainConfig  # noqa: E402
from medfed.core.errors import ConfigError  # noqa: E402
from medfed.federation import wire  # noqa: E402
from medfed.flower import secure  # noqa: E402
from medfed.flower.records import json_of, payload_of  # noqa: E402
from medfed.flower.server_app import Deployment  # noqa: E402
from medfed.runs import RunDir  # noqa: E402
from medfed.runs.weights import load_state  # noqa: E402
from tests.flowergrid import run_in_process  # noqa: E402

CONFIG = TrainConfig(algorithm="fedavg", rounds=2, local_steps=2, batch_size=8, seed=3)


@pytest.fixture(scope="module")
def sites(tiny_sites, tmp_path_factory) -> tuple[dict[str, Path], Path, Path]:
    """The conftest's three small sites, and a folder for this module's runs."""
    manifests, cache = tiny_sites
    return manifests, cache, tmp_path_factory.mktemp("secure_runs")


@pytest.fixture(scope="module")
def plain_and_secure(sites):
    manifests, cache, root = sites
    plain = run_in_process(root, manifests, cache, CONFIG, name="plain")
    secured = run_in_process(root, manifests, cache, CONFIG, secure=True, name="secure")
    return plain, secured


def _global(run: Path, round_: int) -> dict[str, torch.Tensor]:
    return load_state(run / "checkpoints" / f"round_{round_:04d}" / "global.safetensors")


def _n_train(run: Path) -> list[float]:
    return [float(s["n_train"]) for s in RunDir(run).read_summary()["sites"].values()]


def _within_quantization(plain: dict, secured: dict, weights: list[float], bound: float) -> float:
    """The largest difference, after checking each is within SecAgg+'s quantization error plus
    the float32 rounding both sides do."""
    allowed = secure.error_bound(weights, bound)
    worst = 0.0
    for key, a in plain.items():
        b = secured[key]
        diff = (a.double() - b.double()).abs()
        rounding = 2.0**-23 * torch.maximum(a.double().abs(), b.double().abs())
        assert bool((diff <= allowed + rounding).all()), (key, float(diff.max()), allowed)
        worst = max(worst, float(diff.max()))
    return worst


def test_the_secure_sum_is_the_plain_mean_within_its_quantization(plain_and_secure) -> None:
    (plain, _), (secured, _) = plain_and_secure
    weights = _n_train(plain)
    # Round 1 starts from the same weights on both sides: the aggregates differ by SecAgg+'s
    # quantization only.
    worst = _within_quantization(_global(plain, 1), _global(secured, 1), weights, 1.0)
    assert 0 < worst < 1e-7
    # After that the sites train from slightly different weights; the runs stay together.
    final_plain, final_secure = _global(plain, 2), _global(secured, 2)
    assert max(float((final_plain[k] - final_secure[k]).abs().max()) for k in final_plain) < 1e-4
    records = RunDir(secured).read_metrics()
    assert all(r["status"] == "ok" and r["aggregated"] for r in records)
    assert all(r["secure_clipped"] == 0 and r["bytes_up"] > 0 for r in records)
    start = RunDir(secured).read_events()[0]
    assert start["secure_aggregation"] == "secagg+" and start["secure_bound"] == 1.0
    summary = RunDir(secured).read_summary()
    assert summary["lost_sites"] == {} and summary["dropouts"] == 0


def _site_updates(grid, round_: int) -> dict[int, dict[str, np.ndarray]]:
    """Each node's update in a plain run's round: the weights it sent, and their difference to
    the global state it was sent (what a secure round would hide)."""
    sent = {
        m.metadata.message_id: m
        for m in grid.sent
        if m.metadata.message_type == "train" and json_of(m.content, "step")["round"] == round_
    }
    out = {}
    for reply in grid.received:
        request = sent.get(reply.metadata.reply_to_message_id)
        if request is None:
            continue
        keys = json_of(request.content, "step")["keys"]
        before = wire.decode(payload_of(request.content))
        after = wire.decode(payload_of(reply.content))
        out[reply.metadata.src_node_id] = {
            "weights": {k: after[k].double().numpy() for k in keys},
            "delta": {k: (after[k].double() - before[k].double()).numpy() for k in keys},
        }
    return out


def _arrays_received(grid) -> list[np.ndarray]:
    """Every array in every reply the server received, masked vectors included."""
    out = []
    for reply in grid.received:
        if reply.has_error():
            continue
        for name, record in reply.content.array_records.items():
            out += [a.numpy() for a in record.values()]
            if name == "payload" and len(record):  # medfed's wire format: its tensors too
                out += [t.double().numpy() for t in wire.decode(payload_of(reply.content)).values()]
        configs = reply.content.config_records.get(RECORD_KEY_CONFIGS)
        if configs is not None and Key.MASKED_PARAMETERS in configs:
            out += [bytes_to_ndarray(b) for b in configs[Key.MASKED_PARAMETERS]]
    return out


def _found(update: dict[str, np.ndarray], received: list[np.ndarray]) -> bool:
    """Whether any received array is one of ``update``'s tensors."""
    return any(
        array.shape == value.shape and np.allclose(array.astype(np.float64), value, atol=1e-6)
        for value in update.values()
        for array in received
    )


def test_the_server_never_receives_a_sites_update(plain_and_secure) -> None:
    (_, plain_grid), (_, secure_grid) = plain_and_secure
    updates = _site_updates(plain_grid, 1)  # the same in both runs: same start, same seed
    assert len(updates) == 3
    # The search can find an update: the plain server holds every site's weights.
    plain_received = _arrays_received(plain_grid)
    assert all(_found(u["weights"], plain_received) for u in updates.values())
    received = _arrays_received(secure_grid)
    masked = [a for a in received if a.dtype == np.int64 and a.size > 1000]
    assert len(masked) >= 3  # each site's masked vectors came
    for update in updates.values():
        scaled = {k: v / secure.DEFAULT_BOUND for k, v in update["delta"].items()}
        for kind in (update["weights"], update["delta"], scaled):
            assert not _found(kind, received)
    # The masked vectors carry nothing of any site's update: read as if unmasked, they do not
    # even correlate with one.
    for array in masked:
        for update in updates.values():
            for value in update["delta"].values():
                if value.size == array.size:
                    r = np.corrcoef(array.ravel().astype(np.float64), value.ravel())[0, 1]
                    assert abs(r) < 0.1
    # A training reply under SecAgg+ holds no weights at all: only the masked vector.
    for reply in secure_grid.received:
        if not reply.has_error() and "fitres.parameters" in reply.content.array_records:
            assert len(reply.content.array_records["fitres.parameters"]) == 0


def test_a_site_that_drops_after_the_key_exchange_is_left_out_of_the_sum(sites) -> None:
    manifests, cache, root = sites
    config = replace(CONFIG, faults=("1:rimone:drop",))
    plain, _ = run_in_process(root, manifests, cache, config, name="drop_plain")
    secured, _ = run_in_process(root, manifests, cache, config, secure=True, name="drop_secure")
    records = {(r["round"], r["site"]): r for r in RunDir(secured).read_metrics()}
    dropped = records[(1, "rimone")]
    assert dropped["status"] == "dropped"
    assert "masked update collection" in dropped["reason"] and "did not answer" in dropped["reason"]
    assert records[(1, "acrima")]["aggregated"] is True
    # The other two sites' mean, as the plain run (which drops the same site) has it.
    weights = [w for site, w in zip(manifests, _n_train(plain), strict=True) if site != "rimone"]
    _within_quantization(_global(plain, 1), _global(secured, 1), weights, 1.0)


def test_losing_too_many_sites_skips_the_round_with_its_reason(sites) -> None:
    manifests, cache, root = sites
    config = replace(CONFIG, faults=("1:rimone:drop", "1:refuge:drop"))
    secured, _ = run_in_process(root, manifests, cache, config, secure=True, name="halt")
    run = RunDir(secured)
    skipped = [e for e in run.read_events() if e["event"] == "round_skipped"]
    assert [e["round"] for e in skipped] == [1]
    assert "SecAgg+ halted" in skipped[0]["reason"] and "needs 2" in skipped[0]["reason"]
    records = {(r["round"], r["site"]): r for r in run.read_metrics()}
    # The site that stayed sent its masked update, which no sum could take: not its failure.
    assert records[(1, "acrima")]["status"] == "ok" and not records[(1, "acrima")]["aggregated"]
    assert records[(2, "acrima")]["aggregated"]
    assert run.read_summary()["rounds"] == 2  # the next round aggregated; the run finished


def test_clipped_values_are_counted_and_logged(sites) -> None:
    manifests, cache, root = sites
    secured, _ = run_in_process(
        root, manifests, cache, CONFIG, secure=True, secure_bound=1e-5, name="clipped"
    )
    run = RunDir(secured)
    records = run.read_metrics()
    assert all(r["secure_clipped"] > 0 for r in records)
    events = [e for e in run.read_events() if e["event"] == "secure_clipped"]
    assert len(events) == len(records) and "raise --secure-bound" in events[0]["reason"]


def test_a_scaled_update_is_clipped_counted_and_scaled_back() -> None:
    received = {"w": torch.zeros(4), "n": torch.tensor(5)}
    sent = {"w": torch.tensor([0.5, -0.25, 3.0, -2.0]), "n": torch.tensor(8)}
    vectors, clipped = secure.scaled_update(received, sent, ["n", "w"], 1.0)
    assert clipped == 2
    np.testing.assert_allclose(vectors[1], [0.5, -0.25, 1.0, -1.0])
    back = secure.mean_state(vectors, ["n", "w"], received, 1.0)
    assert back["n"].dtype == torch.int64 and int(back["n"]) == 8
    torch.testing.assert_close(back["w"], torch.tensor([0.5, -0.25, 1.0, -1.0]))
    with pytest.raises(ValueError, match="shape"):
        secure.mean_state([vectors[0], np.zeros(3)], ["n", "w"], received, 1.0)


def test_quantization_uses_the_modulus_without_wrapping() -> None:
    for n in (2, 3, 7, 100, 1000):
        q = secure.quantization_range(n)
        assert (n + 1) * q <= secure.MODULUS and q <= 2**30
    assert secure.threshold(2) == 2 and secure.threshold(3) == 2 and secure.threshold(5) == 3


def _run_config(**train) -> dict:
    import tomli_w

    config = TrainConfig(algorithm=train.pop("algorithm", "fedavg"), **train)
    return {
        "train": tomli_w.dumps({"train": config.to_dict()}),
        "sites": "a,b,c",
        "run-dir": "/tmp/secure-run",
        "secure-aggregation": True,
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"sites": "a"}, "at least 2 sites"),
        ({"train": {"algorithm": "lora"}}, "feature statistics"),
        ({"train": {"algorithm": "fedgmi"}}, "weighting=site"),
        ({"train": {"algorithm": "local"}}, "nothing to aggregate"),
        ({"train": {"wire_precision": "int8"}}, "float32 wire"),
        ({"train": {"wire_delta": True}}, "float32 wire"),
        ({"train": {"client_fraction": 0.3}}, "--min-sites to 2"),
        ({"secure-bound": 0.0}, "> 0"),
        ({"secure-bound": "wide"}, "must be a number"),
    ],
)
def test_settings_secure_aggregation_cannot_run_are_refused(change, message) -> None:
    run_config = _run_config(**change.pop("train", {}))
    run_config |= change
    with pytest.raises(ConfigError, match=message):
        Deployment.from_run_config(run_config)


def test_settings_it_can_run_are_read() -> None:
    d = Deployment.from_run_config(_run_config(algorithm="feddrm") | {"secure-bound": 0.5})
    assert d.secure_aggregation and d.secure_bound == 0.5
    fedgmi = _run_config(algorithm="fedgmi", params={"weighting": "site"})
    assert Deployment.from_run_config(fedgmi).secure_aggregation
