"""A small real-data case: a few dozen real photos per site, the frozen ImageNet encoder, a
couple of rounds. The photos and weights are read from the shared folders (never copied into
the repository); where they are absent (a user's clone) these tests skip and say why."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from medfed.cli import app
from medfed.experiments.realdata import CENTRAL, StudyPlan
from medfed.experiments.realstudy import run_real_study
from medfed.federation.pretrained import torchvision_hub_file
from tests.test_frozen_encoder import ALGORITHMS

SHARED = Path(__file__).resolve().parents[2] / "shared"
REALDATA = SHARED / "realdata"
WEIGHTS = SHARED / "weights" / "mobilenet_v2-b0353104.pth"
MANIFESTS = [
    Path(__file__).resolve().parents[1] / "sites" / "real" / f"{s}.toml"
    for s in ("odir", "sjchoi86", "eyepacs")
]
PER_CLASS = 14

pytestmark = pytest.mark.skipif(
    not (REALDATA / "MANIFEST.csv").is_file() or not WEIGHTS.is_file(),
    reason=f"the real photos ({REALDATA}) or the ImageNet weights ({WEIGHTS}) are not here "
    "(research-use data, read from the shared folder only)",
)


@pytest.fixture(scope="module")
def real_env(tmp_path_factory) -> dict[str, str]:
    """A few real photos per class, linked (not copied) in the sources' own layout, and a hub
    cache holding torchvision's MobileNetV2 file."""
    root = tmp_path_factory.mktemp("realdata")
    for source in REALDATA.iterdir():
        if not source.is_dir():
            continue
        for label in source.iterdir():
            folder = root / source.name / label.name
            folder.mkdir(parents=True)
            for photo in sorted(label.iterdir())[:PER_CLASS]:
                (folder / photo.name).symlink_to(photo)
    home = tmp_path_factory.mktemp("torch_home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCH_HOME", str(home))
        hub = torchvision_hub_file("mobilenet_v2")
    hub.parent.mkdir(parents=True)
    hub.symlink_to(WEIGHTS)
    return {"MEDFED_REALDATA": str(root), "TORCH_HOME": str(home)}


@pytest.fixture(scope="module")
def study(real_env, tmp_path_factory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("study")
    with pytest.MonkeyPatch.context() as patch:
        for key, value in real_env.items():
            patch.setenv(key, value)
        plan = StudyPlan(
            manifests=tuple(MANIFESTS),
            seeds=(0, 1),
            rounds=2,
            local_steps=3,
            methods=("feddrm", "fedavgft", CENTRAL),
            n_boot=40,
        )
        results = run_real_study(plan, out, echo=lambda line: None)
    return results, out


def test_every_figure_has_an_interval_over_seeds_and_a_verdict_against_feddrm(study):
    results, out = study

    figures = results["figures"]
    wanted = {"real-odir macro AUC", "real-eyepacs accuracy", "real-odir glaucoma AUC"}
    assert wanted <= set(figures)
    for name, by_method in figures.items():
        for method, entry in by_method.items():
            if entry is not None:
                assert entry["low"] <= entry["estimate"] <= entry["high"] or np.isclose(
                    entry["low"], entry["high"]
                ), (name, method)
    assert figures["routing accuracy"][CENTRAL] is None  # one model routes nothing
    verdicts = results["verdicts"]["system accuracy (origin unknown)"]
    assert set(verdicts) == {"fedavgft", CENTRAL}
    assert all(
        v["verdict"] in ("ahead", "behind", "no difference detected") for v in verdicts.values()
    )
    assert 0 < results["majority"]["rate"] < 1
    written = (out / "real-study.md").read_text()
    assert "majority class" in written and "Holm" in written and "two-level bootstrap" in written


def test_photos_of_a_left_out_source_are_flagged_at_a_measured_rate(study):
    results, _ = study

    held = results["outside"]["held_out"]
    assert set(held) == {"real-odir", "real-sjchoi86", "real-eyepacs"}
    for entry in held.values():
        for rule in ("distance", "max-probability", "either"):
            outside, own = entry[rule]["outside"], entry[rule]["own"]
            assert outside["n"] > 0 and own["n"] > 0
            assert 0 <= outside["low"] <= outside["rate"] <= outside["high"] <= 1
        assert set(entry["retina"]) == {"distance", "max-probability", "either"}


def test_route_answers_a_real_photo_with_its_site_probability_and_class_probabilities(
    study, real_env
):
    _, out = study
    run = out / "runs" / "feddrm" / "seed0"
    photo = next((REALDATA / "odir" / "glaucoma").iterdir())

    result = CliRunner().invoke(app, ["route", str(run), str(photo), "--json"], env=real_env)

    assert result.exit_code == 0, result.output
    answer = json.loads(result.output)[0]
    assert set(answer["site_probs"]) == {"real-odir", "real-sjchoi86", "real-eyepacs"}
    assert answer["status"] in ("routed", "abstained")
    assert answer["router"] == "density_ratio"
    if answer["status"] == "routed":
        assert answer["chosen_site"] in answer["site_probs"]


def test_the_dashboard_and_the_report_show_a_real_run_with_the_real_sources_cards(
    study, monkeypatch, tmp_path
):
    from tests.test_dashboard import open_page, texts

    _, out = study
    run = out / "runs" / "feddrm" / "seed0"
    sites = ["real-odir", "real-sjchoi86", "real-eyepacs"]

    at = open_page(monkeypatch, [run])
    assert at.title[0].value == "Federation" and not at.error
    assert sorted(at.table[0].value.index) == sorted(sites)
    at = open_page(monkeypatch, [run], "sites")  # one run: no run to pick
    shown = texts(at, "markdown")
    for site in sites:
        assert f"### Data card: {site}" in shown
    assert "Research use only" in shown  # the real sources' terms, from their manifests
    report = tmp_path / "report.html"
    made = CliRunner().invoke(app, ["report", str(run), "--out", str(report)])
    assert made.exit_code == 0, made.output
    html = report.read_text(encoding="utf-8")
    assert all(site in html for site in sites) and "Research use only" in html
    card = (run / "model" / "MODEL_CARD.md").read_text(encoding="utf-8")
    assert "Kim's Eye Hospital" in card and "Research use only" in card


EVERY_ALGORITHM = ALGORITHMS  # the frozen-encoder tests' list: every algorithm but FedGMI


@pytest.mark.parametrize(
    ("algorithm", "params"), EVERY_ALGORITHM, ids=[a for a, _ in EVERY_ALGORITHM]
)
def test_every_algorithm_trains_on_the_real_federations_frozen_features(
    study, real_env, monkeypatch, tmp_path, algorithm, params
):
    from medfed.config import TrainConfig
    from medfed.federation.training import load_sites, train

    if algorithm == "lora":
        pytest.importorskip("peft")
    _, out = study
    for key, value in real_env.items():
        monkeypatch.setenv(key, value)
    sites = load_sites(MANIFESTS, out / "cache")  # decoded and encoded by the study already
    config = TrainConfig(
        algorithm=algorithm,
        params=params,
        rounds=2,
        local_steps=2,
        batch_size=16,
        init="torchvision:mobilenet_v2",
        frozen_encoder=True,
        concurrency=1,
    )

    summary = train(sites, config, tmp_path / "run", cache_dir=out / "cache")

    assert summary.rounds == 2
    figures = json.loads((tmp_path / "run" / "summary.json").read_text(encoding="utf-8"))
    assert set(figures["sites"]) == {"real-odir", "real-sjchoi86", "real-eyepacs"}
    assert np.isfinite(figures["system_accuracy"])


def test_fedgmi_refuses_the_frozen_encoder_by_name(study, real_env, monkeypatch, tmp_path):
    from medfed.config import TrainConfig
    from medfed.core.errors import MedfedError
    from medfed.federation.training import load_sites, train

    _, out = study
    for key, value in real_env.items():
        monkeypatch.setenv(key, value)
    config = TrainConfig(
        algorithm="fedgmi", init="torchvision:mobilenet_v2", frozen_encoder=True, rounds=1
    )
    with pytest.raises(MedfedError, match="frozen encoder"):
        train(load_sites(MANIFESTS, out / "cache"), config, tmp_path / "run")
