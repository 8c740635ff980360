"""The frozen-encoder mode and torchvision's MobileNetV2: the ImageNet file loads tensor for
tensor, the encoder runs once per scan (cached), every algorithm trains on its features, and a
run's model folder answers a photo exactly as the features it trained on."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision

from medfed.config import Modality, TrainConfig
from medfed.core.errors import ConfigError
from medfed.data.cache import TensorCache
from medfed.data.records import Split
from medfed.federation.features import encoded_site, encoder_for
from medfed.federation.pretrained import (
    HASH_MATCHES,
    apply_init,
    resolve_init,
    torchvision_hub_file,
)
from medfed.federation.training import train
from medfed.models.encoder import TRUNK_DIM, EncodedBackbone, FrozenEncoder
from medfed.models.fedmodel import ModelSpec, build_model
from medfed.routing.bundle import TrainedFederation
from tests.tensorsites import tensor_sites

REAL_WEIGHTS = Path(__file__).resolve().parents[2] / "shared" / "weights"
REAL_FILE = REAL_WEIGHTS / "mobilenet_v2-b0353104.pth"
NEEDS_REAL = pytest.mark.skipif(
    not REAL_FILE.is_file(),
    reason=f"torchvision's MobileNetV2 ImageNet file is not at {REAL_FILE} (a user's clone)",
)


@pytest.fixture(scope="module")
def fake_home(tmp_path_factory) -> Path:
    """A hub cache with a MobileNetV2 file under torchvision's name (seeded random values:
    its bytes do not match the hash in the name)."""
    home = tmp_path_factory.mktemp("torch_home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCH_HOME", str(home))
        torch.manual_seed(5)
        path = torchvision_hub_file("mobilenet_v2")
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(torchvision.models.mobilenet_v2().state_dict(), path)
    return home


def real_home(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TORCH_HOME at ``home``, its hub cache holding the real file (linked, never copied)."""
    monkeypatch.setenv("TORCH_HOME", str(home))
    hub = torchvision_hub_file("mobilenet_v2")
    hub.parent.mkdir(parents=True)
    hub.symlink_to(REAL_FILE)


@pytest.fixture
def home(fake_home, monkeypatch) -> Path:
    monkeypatch.setenv("TORCH_HOME", str(fake_home))
    return fake_home


def _config(algorithm: str, tmp_path: Path, **kw) -> TrainConfig:
    settings = dict(
        algorithm=algorithm,
        rounds=2,
        local_steps=2,
        batch_size=8,
        init="torchvision:mobilenet_v2",
        frozen_encoder=True,
        concurrency=1,
    )
    return TrainConfig(**(settings | kw))


# ---------------------------------------------------------------------------- MobileNetV2
@NEEDS_REAL
def test_the_real_imagenet_file_loads_every_backbone_tensor_and_its_hash_is_checked(
    tmp_path, monkeypatch
):
    real_home(tmp_path, monkeypatch)
    model = build_model(ModelSpec(backbone="tv-mobilenet-v2"))

    report = apply_init(model, resolve_init("torchvision:mobilenet_v2"), strict=True)

    backbone = [k for k in model.state_dict() if k.startswith("backbone.")]
    assert set(report.loaded) >= set(backbone) and not [k for k in report.random if "backbone" in k]
    assert {s["key"] for s in report.skipped} == {"classifier.1.weight", "classifier.1.bias"}
    assert report.hash_check.startswith(HASH_MATCHES)
    # ImageNet's own answer: the real network still recognises a photo of a cat
    net = torchvision.models.mobilenet_v2()
    net.load_state_dict(torch.load(REAL_FILE, weights_only=True))
    net.classifier = torch.nn.Identity()
    net.eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.allclose(model.eval().backbone(x), net(x), atol=1e-5)


def test_a_file_whose_bytes_do_not_match_its_name_is_reported(home):
    model = build_model(ModelSpec(backbone="tv-mobilenet-v2"))

    report = apply_init(model, resolve_init("torchvision:mobilenet_v2"), strict=True)

    assert "does not start with the b0353104" in report.hash_check
    assert any("not torchvision's published file" in line for line in report.lines())


def test_the_group_norm_twin_loads_every_convolution_and_starts_its_norms_fresh(home):
    model = build_model(ModelSpec(backbone="tv-mobilenet-v2-gn"))

    report = apply_init(model, resolve_init("torchvision:mobilenet_v2"))

    convs = [f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Conv2d)]
    norms = [n for n, m in model.named_modules() if isinstance(m, torch.nn.GroupNorm)]
    assert len(convs) == 52 and set(convs) <= set(report.loaded)
    assert norms and not any(k.startswith(tuple(f"{n}." for n in norms)) for k in report.loaded)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())


# ---------------------------------------------------------------------------- the encoder
@pytest.mark.parametrize("unfreeze", [0, 2])
def test_encoder_and_trained_part_together_are_the_whole_network(unfreeze):
    torch.manual_seed(0)
    full = torchvision.models.mobilenet_v2().eval()
    encoder = FrozenEncoder("tv-mobilenet-v2", unfreeze)
    encoder.load_torchvision(full.state_dict())
    tail = EncodedBackbone("tv-mobilenet-v2", unfreeze, in_width=1280).eval()
    tail.load_state_dict(
        {k: v for k, v in full.state_dict().items() if k in tail.state_dict()}, strict=False
    )
    x = torch.randn(2, 3, 64, 64)

    with torch.no_grad():
        features = encoder(x)
        pooled = full.features(x).mean(dim=(2, 3))
        inside = features if not unfreeze else _run_blocks(tail, features)

    assert not any(p.requires_grad for p in encoder.parameters())
    assert torch.allclose(inside, pooled, atol=1e-5)
    assert tail(features).shape == (2, TRUNK_DIM)


def _run_blocks(tail: EncodedBackbone, x: torch.Tensor) -> torch.Tensor:
    for name in tail._order:
        x = tail.features[int(name) - min(int(n) for n in tail._order)](x)
    return x.mean(dim=(2, 3))


def test_features_are_computed_once_then_read_from_the_cache_and_a_damaged_entry_rebuilt(
    home, tmp_path
):
    config = _config("fedavg", tmp_path)
    encoder = encoder_for(config, "tv-mobilenet-v2")
    site = tensor_sites(1, n=16, size=32)[0]
    site.raw = {s: t.clamp(0, 1) for s, t in site.raw.items()}
    cache = TensorCache(tmp_path / "cache")

    first = encoded_site(site, encoder, cache).raw[Split.TRAIN].clone()
    reader = TensorCache(tmp_path / "cache")
    again = encoded_site(site, encoder, reader).raw[Split.TRAIN].clone()
    for stack in (tmp_path / "cache").rglob("*"):
        if stack.is_file() and stack.stat().st_size > 4096:
            with open(stack, "r+b") as handle:  # flip bytes inside the first row
                handle.seek(4100)
                handle.write(b"\x00\x01\x02\x03")
    rebuilt = TensorCache(tmp_path / "cache")
    third = encoded_site(site, encoder, rebuilt)

    expected = encoder.module.encode(site.raw[Split.TRAIN])
    assert first.shape == (8, 1280) and torch.allclose(first, expected)
    assert torch.equal(first, again) and reader.stats.hits == 16 and reader.stats.misses == 0
    assert torch.equal(first, third.raw[Split.TRAIN]) and rebuilt.stats.hits < 16


# ---------------------------------------------------------------------------- training
# every algorithm (fedals over feddrm; lora after a warm-up) but FedGMI, whose mixture reads the
# scan itself and refuses the frozen encoder
ALGORITHMS = [
    ("feddrm", {}),
    ("fedavg", {}),
    ("fedavgft", {}),
    ("fedbn", {}),
    ("fedprox", {}),
    ("fedrep", {}),
    ("ditto", {}),
    ("local", {}),
    ("pfedme", {}),
    ("fedals", {"base": "feddrm"}),
    ("lora", {"warmup_rounds": "1"}),
]


@pytest.mark.parametrize(("algorithm", "params"), ALGORITHMS)
def test_every_algorithm_trains_on_the_frozen_features(home, tmp_path, algorithm, params):
    if algorithm == "lora":
        pytest.importorskip("peft")
    config = _config(algorithm, tmp_path, params=params)

    summary = train(
        tensor_sites(3, n=24, size=32), config, tmp_path / "run", cache_dir=tmp_path / "c"
    )

    stored = json.loads((tmp_path / "run" / "summary.json").read_text())
    info = json.loads((tmp_path / "run" / "model" / "model.json").read_text())
    assert summary.rounds == 2 and stored["backbone"] == "tv-mobilenet-v2"
    assert info["spec"]["frozen_encoder"] and info["encoder"]["backbone"] == "tv-mobilenet-v2"
    assert (tmp_path / "run" / "model" / "encoder.safetensors").is_file()
    # the weights that travel are the trunk's and heads', never the encoder's (round 2: after
    # FedDRM's and LoRA's one-time feature statistics; the encoder alone is 9 MB)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    second = [r for r in rows if r.get("round") == 2 and "bytes_up" in r]
    assert second and all(max(r["bytes_up"], r["bytes_down"]) < 5e6 for r in second)


def test_feddrm_sets_its_client_head_in_closed_form_from_the_encoders_features(home, tmp_path):
    from medfed.algorithms.discriminant import COUNT, SCATTER, SUM, discriminant

    sites = tensor_sites(3, n=24, size=32)
    for i, site in enumerate(sites):  # each site a different exposure: routing has a signal
        site.raw = {s: (t * 0.2 + 0.3 * i).clamp(0, 1) for s, t in site.raw.items()}
    config = _config("feddrm", tmp_path)
    encoder = encoder_for(config, "tv-mobilenet-v2")

    train(sites, config, tmp_path / "run", cache_dir=tmp_path / "c")

    fed = TrainedFederation.load(tmp_path / "run")
    assert 'client = "discriminant"' in (tmp_path / "run" / "config.toml").read_text()
    assert fed.spec.client_kind == "encoder"
    stats = []
    for site in sites:  # what each site reports: moments of sign(f) sqrt|f| of its features
        f = encoder.module.encode(site.raw[Split.TRAIN]).double().sqrt()
        centred = (f - f.mean(0)).T @ (f - f.mean(0))
        rows, cols = torch.triu_indices(f.shape[1], f.shape[1])
        stats.append(
            {COUNT: [f.shape[0]], SUM: f.sum(0).tolist(), SCATTER: centred[rows, cols].tolist()}
        )
    weight, bias = discriminant(stats, 0.1)
    head = fed.models[0].client_head
    for got, want in ((head.weight, weight), (head.bias, bias)):  # statistics travel as float32
        assert float((got - want).abs().max()) <= 1e-4 * float(want.abs().max())
    # the head routes each site's own test photos home
    test = [encoder.module.encode(s.raw[Split.TEST]) for s in sites]
    routed = [fed.models[0](x).client_logits.argmax(1) for x in test]
    assert all(bool((r == i).float().mean() > 0.9) for i, r in enumerate(routed))


def test_feddrm_keeps_the_papers_trained_client_head_when_asked(home, tmp_path):
    config = _config("feddrm", tmp_path, params={"client": "trained"})

    train(tensor_sites(2, n=16, size=32), config, tmp_path / "run", cache_dir=tmp_path / "c")

    fed = TrainedFederation.load(tmp_path / "run")
    assert fed.spec.client_kind == "mlp"
    assert 'client = "trained"' in (tmp_path / "run" / "config.toml").read_text()


def test_unfrozen_blocks_start_from_the_file_and_train(home, tmp_path):
    config = _config("fedavg", tmp_path, unfreeze_blocks=2)

    train(tensor_sites(2, n=16, size=32), config, tmp_path / "run", cache_dir=tmp_path / "c")

    init = (tmp_path / "run" / "config.toml").read_text()
    assert "encoder = " in init
    fed = TrainedFederation.load(tmp_path / "run")
    assert fed.spec.unfreeze_blocks == 2 and fed.encoder is not None
    assert fed.encoder(torch.zeros(1, 3, 32, 32)).dim() == 4  # feature maps before the blocks


def test_the_model_folder_answers_a_photo_as_the_features_it_trained_on(home, tmp_path):
    from medfed.clinic.route import views_for
    from medfed.routing.scans import Scan

    sites = tensor_sites(2, n=16, size=32)
    for site in sites:
        site.raw = {s: t.clamp(0, 1) for s, t in site.raw.items()}
    config = _config("feddrm", tmp_path)
    train(sites, config, tmp_path / "run", cache_dir=tmp_path / "c")
    fed = TrainedFederation.load(tmp_path / "run")
    photo = sites[0].raw[Split.TEST][0]
    # what the site's pipeline gives back for this photo (tensor sites have no pipeline)
    scan = Scan(Path("p.png"), Modality.FUNDUS, np.zeros((4, 4, 3)), ())

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("medfed.clinic.route.apply_pipeline", lambda *a: photo)
        patch.setattr("medfed.clinic.route._require_camera_field", lambda *a: None)
        views = views_for(fed, scan)
    direct = fed.encoder.encode(photo[None])

    assert all(torch.allclose(v, direct) for v in views)
    probs = fed.outputs(views).class_probs
    assert np.isfinite(probs).all() and probs.shape == (2, 1, 2)


# ---------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"unfreeze_blocks": 2}, "is for the frozen encoder"),
        ({"frozen_encoder": True}, "pass them with --init"),
    ],
)
def test_settings_the_frozen_encoder_cannot_run_with_are_refused(settings, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(algorithm="fedavg", **settings)


def test_a_group_norm_backbone_or_too_many_blocks_are_refused_before_training(home, tmp_path):
    sites = tensor_sites(2, n=16, size=32)

    with pytest.raises(ConfigError, match="ImageNet BatchNorm"):
        train(sites, _config("fedavg", tmp_path, backbone="tv-mobilenet-v2-gn"), tmp_path / "a")
    with pytest.raises(ConfigError, match="between 0 and 18"):
        train(sites, _config("fedavg", tmp_path, unfreeze_blocks=30), tmp_path / "b")


def test_lora_on_a_fresh_trunk_is_refused(home, tmp_path):
    pytest.importorskip("peft")

    with pytest.raises(ConfigError, match="warmup_rounds"):
        train(tensor_sites(2, n=16, size=32), _config("lora", tmp_path), tmp_path / "run")


def test_lora_adapts_the_whole_mobilenet_started_from_the_file(home, tmp_path):
    pytest.importorskip("peft")
    config = TrainConfig(
        algorithm="lora",
        rounds=1,
        local_steps=2,
        batch_size=8,
        backbone="tv-mobilenet-v2",
        init="torchvision:mobilenet_v2",
        concurrency=1,
    )

    summary = train(tensor_sites(2, n=16, size=32), config, tmp_path / "run")

    model = build_model(ModelSpec(backbone="tv-mobilenet-v2", lora_rank=4, lora_adapters=("a",)))
    grouped = [n for n, m in model.named_modules() if getattr(m, "groups", 1) > 1]
    assert summary.rounds == 1 and grouped  # depthwise convolutions carry no adapter
    assert not any(f"{n}.lora_A" in k for n in grouped for k in model.state_dict())


def test_feddrms_closed_form_head_is_refused_where_its_statistics_would_leak(home, tmp_path):
    sites = tensor_sites(2, n=16, size=32)
    private = _config("feddrm", tmp_path, rounds=1, dp_noise=1.0, dp_delta=1e-3)

    with pytest.raises(ConfigError, match="client=trained"):
        train(sites, private, tmp_path / "a", cache_dir=tmp_path)
    trained = dataclasses.replace(private, params={"client": "trained"})
    assert train(sites, trained, tmp_path / "b", cache_dir=tmp_path).rounds == 1


def test_dp_sgd_trains_the_frozen_encoders_trunk(home, tmp_path):
    config = _config("fedavg", tmp_path, rounds=1, dp_noise=1.0, dp_delta=1e-3)

    summary = train(tensor_sites(2, n=16, size=32), config, tmp_path / "run", cache_dir=tmp_path)

    assert summary.rounds == 1


# ---------------------------------------------------------------------------- on Flower
@NEEDS_REAL
def test_a_deployed_frozen_run_is_the_in_process_run(tiny_sites, tmp_path, monkeypatch):
    pytest.importorskip("flwr")
    from medfed.federation.training import load_sites
    from medfed.runs import RunDir
    from tests.flowergrid import run_in_process

    real_home(tmp_path / "home", monkeypatch)
    manifests, cache = tiny_sites
    config = _config("feddrm", tmp_path, rounds=2, seed=3)

    run, _ = run_in_process(tmp_path, manifests, cache, config)
    local = train(load_sites(list(manifests.values()), cache), config, tmp_path / "local")

    remote = RunDir(run).read_summary()
    for site in manifests:
        assert remote["sites"][site]["auc"] == pytest.approx(local["sites"][site]["auc"], abs=1e-6)
    assert (run / "model" / "encoder.safetensors").is_file()


def test_a_node_refuses_to_encode_with_a_file_that_is_not_torchvisions(home, tiny_sites, tmp_path):
    pytest.importorskip("flwr")
    from medfed.flower.node import RunSettings, node_encoded

    manifests, cache = tiny_sites
    config = _config("feddrm", tmp_path)
    run = RunSettings("r", config, ModelSpec(), list(manifests))
    node_config = {"manifest": str(next(iter(manifests.values()))), "cache-dir": str(cache)}

    with pytest.raises(ConfigError, match="not torchvision's published file"):
        node_encoded(node_config, run)
