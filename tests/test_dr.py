"""The synthetic diabetic-retinopathy federation: lesions that follow the grade, the APTOS,
EyePACS and IDRiD layouts read back by ``sites check``, screening and referral label mixes,
each site's camera, and the shift knobs of ``medfed synth --task dr``."""

from __future__ import annotations

import csv
import hashlib
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from medfed.cli import app
from medfed.config import load_manifest
from medfed.data import _phantoms, synth_dr
from medfed.data.grading import ICDR_GRADES, ICDR_LABELS
from medfed.data.layouts import scan_site
from medfed.data.synth import SynthesisError, load_synth_meta, synthesize
from medfed.data.synth_dr import DRShift, plan_sites

N = 30
SIZE = 64  # pixels: the layouts, labels and cameras do not need the default 224
runner = CliRunner()


@pytest.fixture(scope="module")
def dr(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dr") / "federation"
    synthesize(out, n_per_site=N, seed=0, image_size=SIZE, task="dr")
    return out


def _hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


# --------------------------------------------------------------------------- the layouts


def test_writes_the_three_public_layouts(dr: Path) -> None:
    aptos = (dr / "APTOS" / "train.csv").read_text().splitlines()
    eyepacs = (dr / "EYEPACS" / "trainLabels.csv").read_text().splitlines()
    idrid = dr / "IDRID" / "B. Disease Grading"
    training = idrid / "2. Groundtruths" / "a. IDRiD_Disease Grading_Training Labels.csv"

    assert aptos[0] == "id_code,diagnosis" and len(aptos) == N + 1
    code = aptos[1].split(",")[0]
    assert len(code) == 12 and (dr / "APTOS" / "train_images" / f"{code}.png").is_file()
    assert eyepacs[0] == "image,level" and eyepacs[1].split(",")[0].endswith("_left")
    assert (dr / "EYEPACS" / "train" / f"{eyepacs[1].split(',')[0]}.jpeg").is_file()
    assert training.read_text().splitlines()[0] == (
        "Image name,Retinopathy grade,Risk of macular edema "
    )
    assert (idrid / "1. Original Images" / "a. Training Set" / "IDRiD_001.jpg").is_file()
    assert (idrid / "1. Original Images" / "b. Testing Set" / "IDRiD_001.jpg").is_file()


def test_every_site_reads_back_its_recorded_grades(dr: Path) -> None:
    meta = load_synth_meta(dr)
    for site_id, truth in meta["sites"].items():
        manifest = load_manifest(dr / truth["manifest"])
        scan = scan_site(manifest)

        assert scan.problems == [], site_id
        assert manifest.labels == ICDR_LABELS
        got = Counter(ICDR_GRADES[r.label] for r in scan.records)
        assert got == Counter({k: v for k, v in truth["class_counts"].items() if v}), site_id


def test_eyepacs_keeps_both_eyes_of_a_patient_together(dr: Path) -> None:
    records = scan_site(load_manifest(dr / "sites" / "eyepacs.toml")).records
    by_patient = Counter(r.patient_id for r in records)

    assert set(by_patient.values()) <= {1, 2} and max(by_patient.values()) == 2
    pairs = [r for r in records if r.patient_id == records[0].patient_id]
    assert {p.path.stem.rsplit("_", 1)[1] for p in pairs} <= {"left", "right"}


def test_idrid_keeps_its_train_test_split_and_tells_the_sets_apart(dr: Path) -> None:
    records = scan_site(load_manifest(dr / "sites" / "idrid.toml")).records
    splits = Counter(str(r.split) for r in records)

    assert splits["train"] > splits["test"] > 0
    assert len({r.patient_id for r in records}) == len(records)  # IDRiD_001 twice, two patients


def test_sites_check_reads_every_dr_site(dr: Path, tmp_path: Path) -> None:
    manifests = sorted(str(p) for p in (dr / "sites").glob("*.toml"))

    result = runner.invoke(
        app, ["sites", "check", *manifests, "--cache-dir", str(tmp_path / "c"), "--json"]
    )

    assert result.exit_code == 0, result.output
    reports = json.loads(result.output)
    assert [r["layout"] for r in reports] == ["aptos", "eyepacs", "idrid"]
    assert all(r["ready"] for r in reports)


# ---------------------------------------------------------------- what the sites hold


def test_lesions_follow_the_grade(dr: Path) -> None:
    items = [i for s in load_synth_meta(dr)["sites"].values() for i in s["items"]]
    for item in items:
        kinds, grade = set(item["lesions"]), item["grade"]
        assert (grade == 0) == (not kinds)
        assert ("microaneurysm" in kinds) == (grade >= 1)
        assert ("haemorrhage" in kinds) == (grade >= 2)
        assert ("cotton_wool" in kinds) == (grade >= 3)
        assert ("new_vessels" in kinds) == (grade == 4)


def test_lesions_are_visible_in_the_pixels() -> None:
    camera = plan_sites(DRShift(covariate="low"), 0)[0].camera
    anatomy = _phantoms.sample_fundus_anatomy(np.random.default_rng(0), False, camera)
    healthy = _phantoms.sample_retinopathy(np.random.default_rng(1), 0, anatomy)
    severe = _phantoms.sample_retinopathy(np.random.default_rng(1), 3, anatomy)

    clean = _phantoms.render_fundus(np.random.default_rng(2), anatomy, camera, healthy)
    sick = _phantoms.render_fundus(np.random.default_rng(2), anatomy, camera, severe)

    changed = np.abs(clean.astype(int) - sick.astype(int)).max(axis=2) > 30
    assert 0.01 < changed.mean() < 0.3  # lesions mark the retina without repainting it
    assert healthy.counts() == {} and severe.counts()["haemorrhage"] >= 10


def test_screening_sites_see_mild_eyes_and_the_referral_clinic_severe_ones(dr: Path) -> None:
    meta = load_synth_meta(dr)["sites"]
    referable = {
        site: sum(s["class_counts"][g] for g in ICDR_GRADES[2:]) / N for site, s in meta.items()
    }

    assert meta["idrid"]["role"] == "referral"
    assert referable["idrid"] > 0.7 > 0.3 > max(referable["aptos"], referable["eyepacs"])


def test_each_site_has_its_own_camera(dr: Path) -> None:
    cameras = {site: s["camera"] for site, s in load_synth_meta(dr)["sites"].items()}

    sizes = {(c["height"], c["width"]) for c in cameras.values()}
    casts = {tuple(c["cast"]) for c in cameras.values()}
    assert len(sizes) == 3 and len(casts) == 3


def test_same_seed_gives_the_same_bytes(dr: Path, tmp_path: Path) -> None:
    synthesize(tmp_path, n_per_site=N, seed=0, image_size=SIZE, task="dr")

    assert _hashes(tmp_path) == _hashes(dr)


# ----------------------------------------------------------------------- the shift knobs


def test_number_of_sites_cycles_the_layouts_with_new_cameras() -> None:
    sites = plan_sites(DRShift(n_sites=7), seed=0)

    assert [s.id for s in sites] == [
        "aptos", "eyepacs", "idrid", "aptos_2", "eyepacs_2", "idrid_2", "aptos_3"
    ]  # fmt: skip
    assert [s.role for s in sites].count("referral") == 2
    assert sites[3].camera != sites[0].camera and sites[3].layout == "aptos"


def test_covariate_strength_scales_how_far_cameras_depart() -> None:
    def spread(level: str) -> float:
        casts = np.array([s.camera.cast for s in plan_sites(DRShift(covariate=level), 0)])
        return float(np.abs(casts - 1.0).sum())

    assert spread("low") < spread("mid") < spread("high")


def test_dirichlet_alpha_sets_how_far_grade_mixes_differ() -> None:
    def spread(alpha: float) -> float:
        mixes = np.array([s.mix for s in plan_sites(DRShift(n_sites=12, label_alpha=alpha), 3)])
        return float(mixes.std(axis=0).sum())

    assert spread(0.3) > 2 * spread(100.0)


def test_classes_per_site_leaves_each_site_that_many_grades() -> None:
    sites = plan_sites(DRShift(n_sites=4, classes_per_site=2), 0)

    for site in sites:
        counts = synth_dr.grade_counts(100, site.mix)
        assert sum(c > 0 for c in counts) == 2 and sum(counts) == 100
    assert sites[2].mix[0] == 0.0 and sites[0].mix[4] == 0.0  # referral vs screening grades


def test_concept_shift_makes_one_site_record_moderate_eyes_as_mild(tmp_path: Path) -> None:
    synthesize(
        tmp_path, n_per_site=40, seed=1, image_size=SIZE, task="dr", shift=DRShift(concept=True)
    )
    meta = load_synth_meta(tmp_path)["sites"]

    shifted = meta["eyepacs"]
    assert shifted["referable_from"] == 3 and meta["aptos"]["referable_from"] == 2
    moderate = [i for i in shifted["items"] if i["grade"] == 2]
    assert moderate and all(i["label"] == "mild" for i in moderate)
    with (tmp_path / "EYEPACS" / "trainLabels.csv").open() as handle:
        assert "2" not in {row["level"] for row in csv.DictReader(handle)}
    assert (
        "referable DR from grade 3" in load_manifest(tmp_path / "sites/eyepacs.toml").known_shifts
    )


def test_cli_writes_a_dr_federation_with_its_knobs(tmp_path: Path) -> None:
    argv = ["synth", "--out", str(tmp_path / "f"), "--task", "dr", "--n-per-site", "20"]
    argv += ["--n-sites", "4", "--covariate-shift", "high", "--label-alpha", "0.5"]
    argv += ["--image-size", "48"]

    result = runner.invoke(app, argv)

    assert result.exit_code == 0, result.output
    assert "wrote 4 site(s)" in result.output
    shift = load_synth_meta(tmp_path / "f")["shift"]
    assert shift["n_sites"] == 4 and shift["covariate"] == "high" and shift["label_alpha"] == 0.5
    assert load_synth_meta(tmp_path / "f")["image_size"] == 48


def test_cli_refuses_dr_knobs_without_task_dr(tmp_path: Path) -> None:
    argv = ["synth", "--out", str(tmp_path / "f"), "--classes-per-site", "2"]
    result = runner.invoke(app, argv)

    assert result.exit_code == 2
    assert "--classes-per-site applies to --task dr only" in result.output
    assert not (tmp_path / "f").exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"shift": DRShift(n_sites=2)}, "n_sites must be a whole number from 3 to 32"),
        ({"shift": DRShift(n_sites=33)}, "from 3 to 32"),
        ({"shift": DRShift(covariate="extreme")}, "covariate shift 'extreme'"),
        ({"shift": DRShift(label_alpha=0.0)}, "label_alpha must be a positive number"),
        ({"shift": DRShift(label_alpha=float("nan"))}, "label_alpha must be a positive number"),
        ({"shift": DRShift(classes_per_site=1)}, "classes_per_site must be"),
        ({"n_per_site": 12}, "use at least 20"),
        ({"modality": "ct"}, "task 'dr' writes fundus sites"),
        ({"task": "segmentation"}, "task 'segmentation' is not one of"),
    ],
)
def test_rejects_dr_settings_it_cannot_honour(tmp_path: Path, kwargs: dict, message: str) -> None:
    options = {"task": "dr", **kwargs}

    with pytest.raises(SynthesisError, match=message):
        synthesize(tmp_path / "out", **options)

    assert not (tmp_path / "out").exists()


def test_dr_shift_settings_need_task_dr(tmp_path: Path) -> None:
    with pytest.raises(SynthesisError, match="task 'binary' takes GlaucomaShift"):
        synthesize(tmp_path / "out", shift=DRShift())


def test_a_dr_federation_replaces_a_binary_one(tmp_path: Path) -> None:
    synthesize(tmp_path, "ct", n_per_site=4)

    synthesize(tmp_path, n_per_site=20, image_size=SIZE, task="dr")

    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "APTOS", "EYEPACS", "IDRID", "sites", "synth_meta.json"
    ]  # fmt: skip
