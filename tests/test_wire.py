"""The wire format: round-trip error of each option, and byte counts that are the real sizes."""

from __future__ import annotations

import pytest
import torch

from medfed.algorithms import make_algorithm
from medfed.config import TrainConfig
from medfed.core.errors import ConfigError
from medfed.federation.training import train
from medfed.federation.wire import WireError, WireFormat, decode, encode, lossless_subset
from medfed.models.fedmodel import ModelSpec, build_model
from medfed.runs import RunDir
from tests.tensorsites import tensor_sites


@pytest.fixture
def state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(64, 32, generator=g) * torch.logspace(-3, 0, 64)[:, None]  # rows differ
    return {"w": rows, "b": torch.randn(64, generator=g), "n": torch.tensor(7)}


def test_float32_is_exact_and_integers_always_travel_as_they_are(state) -> None:
    out = decode(encode(state), dtypes=state)
    assert all(torch.equal(out[k], state[k]) for k in state)
    for precision in ("float16", "int8", "int8-channel"):
        out = decode(encode(state, WireFormat(precision)), dtypes=state)
        assert out["n"].dtype == torch.int64 and int(out["n"]) == 7


def test_float16_relative_error_is_bounded(state) -> None:
    out = decode(encode(state, WireFormat("float16")))
    error = (out["w"] - state["w"]).abs() / state["w"].abs().clamp_min(1e-4)
    assert float(error.max()) <= 2**-11 + 1e-6


def test_int8_error_is_at_most_half_a_step(state) -> None:
    out = decode(encode(state, WireFormat("int8")))
    step = float(state["w"].abs().max()) / 127
    assert float((out["w"] - state["w"]).abs().max()) <= step / 2 + 1e-7


def test_per_channel_int8_follows_each_rows_range(state) -> None:
    per_tensor = decode(encode(state, WireFormat("int8")))["w"]
    per_channel = decode(encode(state, WireFormat("int8-channel")))["w"]
    steps = state["w"].abs().amax(dim=1, keepdim=True) / 127
    assert bool(((per_channel - state["w"]).abs() <= steps / 2 + 1e-7).all())
    small_rows = slice(0, 16)  # rows 1000x smaller than the largest: per-tensor rounds them away
    err_tensor = (per_tensor - state["w"])[small_rows].abs().mean()
    err_channel = (per_channel - state["w"])[small_rows].abs().mean()
    assert err_channel < err_tensor / 10


def test_delta_encoding_quantizes_the_update_not_the_weights(state) -> None:
    g = torch.Generator().manual_seed(1)
    new = {k: (v + 1e-3 * torch.randn(v.shape, generator=g)) if v.is_floating_point() else v
           for k, v in state.items()}  # fmt: skip
    fmt = WireFormat("int8", delta=True)
    out = decode(encode(new, fmt, reference=state), reference=state)
    plain = decode(encode(new, WireFormat("int8")))
    assert (out["w"] - new["w"]).abs().max() < (plain["w"] - new["w"]).abs().max() / 50
    with pytest.raises(WireError, match="reference"):
        decode(encode(new, fmt, reference=state))


def test_sizes_shrink_as_expected(state) -> None:
    big = {"w": torch.randn(256, 256)}
    f32 = len(encode(big))
    assert len(encode(big, WireFormat("float16"))) < 0.52 * f32
    assert len(encode(big, WireFormat("int8"))) < 0.27 * f32
    assert len(encode(big, WireFormat("int8-channel"))) < 0.28 * f32


def test_bad_payloads_and_settings_are_named() -> None:
    with pytest.raises(WireError, match="could not decode"):
        decode(b"\x10\x00\x00\x00\x00\x00\x00\x00not a payload")
    with pytest.raises(ConfigError, match="int4"):
        WireFormat("int4")


@pytest.mark.parametrize(("precision", "delta"), [("float32", False), ("int8", True)])
def test_engine_byte_counts_equal_the_serialized_sizes(precision, delta, tmp_path) -> None:
    cfg = TrainConfig("fedavg", rounds=2, local_steps=2, batch_size=8, device="cpu",
                      wire_precision=precision, wire_delta=delta)  # fmt: skip
    train(tensor_sites(2), cfg, tmp_path / "run")
    torch.manual_seed(0)
    model = build_model(ModelSpec(backbone="cnn-gn", n_sites=2))
    keys = make_algorithm("fedavg").shared_keys(model)
    shared = {k: model.state_dict()[k] for k in keys}
    fmt = WireFormat(precision, delta)
    expected = len(encode(shared, fmt, reference=shared if delta else None))
    for record in RunDir(tmp_path / "run").read_metrics():
        assert record["bytes_up"] == expected and record["bytes_down"] == expected


def test_int8_delta_training_resumes_exactly(tmp_path, monkeypatch) -> None:
    from tests.test_engine import kill_and_resume, stable

    cfg = TrainConfig("feddrm", rounds=4, local_steps=2, batch_size=8, device="cpu",
                      wire_precision="int8", wire_delta=True)  # fmt: skip
    whole, resumed = kill_and_resume(cfg, tmp_path, monkeypatch)
    assert stable(resumed) == stable(whole)


def test_a_lossless_subset_is_what_encoding_those_keys_gives(state) -> None:
    keys = sorted(state)[:1]
    whole = encode(dict(reversed(list(state.items()))))  # the order of the keys does not matter

    assert lossless_subset(whole, keys) == encode({k: state[k] for k in keys})
    assert lossless_subset(whole, sorted(state)) == encode(state)
    with pytest.raises(WireError, match="holds no"):
        lossless_subset(whole, ["nosuch.weight"])
    with pytest.raises(WireError, match="not a lossless state"):
        lossless_subset(encode(state, WireFormat("int8")), keys)
