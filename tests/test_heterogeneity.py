"""Heterogeneity scenarios: the glaucoma federation's shift knobs (sites that label by their own
cup-to-disc threshold, covariate levels ordered by MMD², Beta label shift), and the
heterogeneity report (``medfed sites heterogeneity``) on small synthetic federations."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from medfed.cli import app
from medfed.data.cache import TensorCache
from medfed.data.checks import check_manifests
from medfed.data.synth import GlaucomaShift, SynthesisError, load_synth_meta, synthesize
from medfed.data.synth_fundus import CDR_RULE, CONCEPT_CDR_RULE, PREVALENCE_RANGE, plan_sites
from medfed.experiments.scenario_verdicts import UNINFORMATIVE
from medfed.reports.heterogeneity import (
    NEEDS_RUN,
    NO_SWEEP,
    HeterogeneityError,
    bands,
    concept_shift,
    covariate_shift,
    heterogeneity,
    label_shift,
    measured_sweep,
    ranking,
    ranking_text,
    read_sweeps,
)
from tests.badinput import Shared, shared  # noqa: F401 - the shared trained run

runner = CliRunner()
SIZE = 48  # pixels: the tests need shapes and labels, not detail


@pytest.fixture(scope="module")
def concept_federation(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("concept") / "data"
    shift = GlaucomaShift(n_sites=4, concept=True)
    synthesize(out, "fundus", n_per_site=24, seed=1, image_size=SIZE, shift=shift)
    return out


# -------------------------------------------------------------------------------- the knobs


def test_each_site_labels_by_its_own_cup_to_disc_threshold(concept_federation: Path) -> None:
    meta = load_synth_meta(concept_federation)

    rules = {site: info["cdr_rule"] for site, info in meta["sites"].items()}
    assert rules == {
        "acrima": CDR_RULE,
        "rimone": CONCEPT_CDR_RULE,
        "refuge": CDR_RULE,
        "acrima_2": CDR_RULE,
    }
    for site, info in meta["sites"].items():
        for item in info["items"]:
            assert (item["cdr"] >= rules[site]) == (item["label"] == "glaucoma"), (site, item)
    # the disagreement band is populated: eyes the concept site calls normal, others glaucoma
    assert any(CDR_RULE <= i["cdr"] < CONCEPT_CDR_RULE for i in meta["sites"]["rimone"]["items"])


def test_each_sites_rule_is_written_into_its_manifest(concept_federation: Path) -> None:
    text = (concept_federation / "sites" / "rimone.toml").read_text(encoding="utf-8")
    other = (concept_federation / "sites" / "acrima_2.toml").read_text(encoding="utf-8")

    assert "records glaucoma when the vertical cup-to-disc ratio is at least 0.70" in text
    assert "concept shift" in text
    assert "at least 0.60" in other and "concept shift" not in other


def test_without_concept_shift_every_planned_site_uses_one_rule() -> None:
    sites = plan_sites(GlaucomaShift(n_sites=5), seed=0)

    assert [s.id for s in sites] == ["acrima", "rimone", "refuge", "acrima_2", "rimone_2"]
    assert {s.cdr_rule for s in sites} == {CDR_RULE}


def test_mid_covariate_shift_keeps_the_hand_made_cameras() -> None:
    from medfed.data.synth import FUNDUS_SITES

    planned = plan_sites(GlaucomaShift(), seed=0)

    assert [s.camera for s in planned] == [s.camera for s in FUNDUS_SITES]


def test_label_alpha_draws_glaucoma_shares_that_spread_more_when_small() -> None:
    def shares(alpha: float) -> np.ndarray:
        ratios = np.array(
            [s.glaucoma_ratio for s in plan_sites(GlaucomaShift(30, "mid", alpha), 2)]
        )
        return ratios / (1 + ratios)

    strong, weak = shares(0.5), shares(200.0)

    assert strong.std() > 3 * weak.std()
    low, high = PREVALENCE_RANGE
    assert strong.min() >= low - 1e-3 and strong.max() <= high + 1e-3


def test_covariate_levels_are_ordered_by_mmd(tmp_path: Path) -> None:
    means = {}
    for level in ("low", "mid", "high"):
        shift = GlaucomaShift(covariate=level)
        manifests = synthesize(tmp_path / level, "fundus", 16, seed=0, image_size=SIZE, shift=shift)
        reports = check_manifests(manifests, TensorCache(tmp_path / "cache"))
        means[level] = np.mean([d for r in reports for d in r.distances.values()])

    assert means["low"] < means["mid"] < means["high"], means


@pytest.mark.parametrize(
    ("shift", "message"),
    [
        (GlaucomaShift(n_sites=2), "n_sites must be a whole number from 3 to 32"),
        (GlaucomaShift(covariate="extreme"), "covariate shift 'extreme'"),
        (GlaucomaShift(label_alpha=0.0), "label_alpha must be a positive number"),
    ],
)
def test_rejects_glaucoma_shift_settings_it_cannot_honour(
    tmp_path: Path, shift: GlaucomaShift, message: str
) -> None:
    with pytest.raises(SynthesisError, match=message):
        synthesize(tmp_path / "out", "fundus", shift=shift)

    assert not (tmp_path / "out").exists()


def test_shift_settings_need_the_glaucoma_sites(tmp_path: Path) -> None:
    with pytest.raises(SynthesisError, match="use modality 'fundus' or 'all'"):
        synthesize(tmp_path / "out", "ct", shift=GlaucomaShift())


def test_cli_writes_a_planned_glaucoma_federation(tmp_path: Path) -> None:
    argv = ["synth", "--out", str(tmp_path / "f"), "--modality", "fundus", "--n-per-site", "12"]
    argv += ["--n-sites", "4", "--covariate-shift", "low", "--label-alpha", "2", "--concept-shift"]

    result = runner.invoke(app, argv)

    assert result.exit_code == 0, result.output
    assert "wrote 4 site(s)" in result.output
    shift = load_synth_meta(tmp_path / "f")["shift"]
    assert shift == {"n_sites": 4, "covariate": "low", "label_alpha": 2.0, "concept": True}


# ---------------------------------------------------------------------------- the statistics


def _counts(per_site: dict[str, dict[str, int]]) -> dict[str, dict[str, dict[str, int]]]:
    return {site: {"train": per} for site, per in per_site.items()}


def test_label_shift_finds_none_in_equal_mixes_and_a_small_alpha_in_opposite_ones() -> None:
    same = label_shift({s: {"normal": 50, "glaucoma": 50} for s in "abc"})
    apart = label_shift(
        {
            "a": {"normal": 90, "glaucoma": 10},
            "b": {"normal": 10, "glaucoma": 90},
            "c": {"normal": 50, "glaucoma": 50},
        }
    )

    assert same["alpha"] is None and same["level"] == "none" and same["p_value"] == 1.0
    assert apart["level"] == "strong" and apart["alpha"] < 2 and apart["p_value"] < 1e-6


def test_covariate_level_is_the_synthetic_band_holding_the_mean_mmd() -> None:
    edges = bands("glaucoma")
    matrix = {
        "sites": ["a", "b"],
        "matrix": [[0.0, edges["mid"][0] + 1e-3], [edges["mid"][0] + 1e-3, 0.0]],
    }

    assert covariate_shift(matrix, "glaucoma")["level"] == "mid"
    assert covariate_shift(matrix, "ct")["level"] is None  # no band calibrated for CT


def _matrix(ids: list[str], value) -> dict:
    return {"sites": ids, "matrix": [[0.0 if a == b else value(a, b) for b in ids] for a in ids]}


def test_concept_flag_fires_on_a_drop_that_the_distance_does_not_explain() -> None:
    ids = ["a", "b", "c", "d"]
    mmd = {frozenset(p): v for p, v in zip(
        [("a", "b"), ("a", "c"), ("a", "d"), ("b", "c"), ("b", "d"), ("c", "d")],
        [0.1, 0.2, 0.3, 0.4, 0.5, 0.6], strict=True)}  # fmt: skip
    distances = _matrix(ids, lambda a, b: mmd[frozenset((a, b))])
    # each model loses 0.2 * MMD on another site, and model d loses 0.3 more on site a
    cross = {
        m: {d: 0.9 - (0.2 * mmd[frozenset((m, d))] if m != d else 0.0) for d in ids} for m in ids
    }
    cross["d"]["a"] -= 0.3

    found = concept_shift(cross, distances)

    assert found["flagged"] == ["d->a"]
    clean = concept_shift(
        {m: dict(row) | ({"a": row["a"] + 0.3} if m == "d" else {}) for m, row in cross.items()},
        distances,
    )
    assert clean["flagged"] == [] and len(clean["pairs"]) == 12


def test_concept_indicator_says_it_needs_a_run_or_more_sites() -> None:
    assert concept_shift(None, None)["reason"] == NEEDS_RUN
    two = concept_shift(
        {"a": {"a": 0.9, "b": 0.8}, "b": {"a": 0.7, "b": 0.9}},
        _matrix(["a", "b"], lambda a, b: 0.2),
    )
    assert "needs at least 4" in two["reason"]


def _scenario(n_sites: int, ranking: list[str], verdict: str) -> dict:
    return {
        "level": f"clients: m = {n_sites}",
        "covariate": "mid",
        "label": "strong",
        "concept": False,
        "n_sites": n_sites,
        "informative": True,
        "ranking": ranking,
        "reference": "feddrm",
        "differences": {
            m: {"interval": {"estimate": 0.0, "low": -0.1, "high": 0.1}, "verdict": verdict}
            for m in ranking
            if m != "feddrm"
        },
    }


def test_a_measured_sweep_ranks_methods_for_the_regime_found(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep.json"
    scenarios = [
        _scenario(16, ["feddrm", "fedbn"], "ahead"),
        _scenario(3, ["fedbn", "feddrm", "local"], "no difference detected"),
        {**_scenario(3, ["local", "feddrm"], "behind"), "label": "none"},
        {**_scenario(3, ["local", "feddrm"], "behind"), "level": "label: 2 grades per site"},
        _scenario(3, ["fedbn", "feddrm", "local"], "no difference detected"),  # measured alike
    ]
    sweep.write_text(json.dumps({"format": 2, "source": "a sweep", "scenarios": scenarios}))
    counts = _counts({"a": {"n": 90, "g": 10}, "b": {"n": 10, "g": 90}, "c": {"n": 50, "g": 50}})
    value = bands("glaucoma")["mid"][0] + 0.01
    distances = _matrix(["a", "b", "c"], lambda a, b: value)

    without = heterogeneity(counts, distances, "glaucoma")
    ranked = heterogeneity(counts, distances, "glaucoma", sweep=read_sweeps([sweep]))

    assert without["methods"] == {"ranking": None, "note": NO_SWEEP}
    assert ranked["regime"]["label"] == "strong"
    # of the two scenarios of this regime, the one with as many sites as the federation
    assert ranked["methods"]["ranking"] == ["fedbn", "feddrm", "local"]
    text = ranking_text(ranked["methods"])
    assert text.startswith("fedbn > feddrm > local (by point estimates of system accuracy")
    assert "feddrm's paired 95% intervals: no difference detected from fedbn, local" in text
    assert "measured by a sweep (clients: m = 3, 3 sites)" in text
    # the regime's other measurement at this size is stated beside it, a repeated one once
    assert [a["ranking"] for a in ranked["methods"]["also"]] == [["local", "feddrm"]]
    assert text.endswith(
        "; also measured in this regime: local > feddrm (by point estimates of system accuracy; "
        "feddrm's paired 95% intervals: behind local; measured by a sweep "
        "(label: 2 grades per site, 3 sites))"
    )
    assert ranked["regime"]["resembles"].startswith(
        "medfed synth --covariate-shift mid --label-alpha"
    )
    # a federation of 20 sites reads the 16-site scenario
    many = heterogeneity(
        {f"s{k}": counts["ab"[k % 2]] for k in range(20)},
        _matrix([f"s{k}" for k in range(20)], lambda a, b: value),
        "glaucoma",
        sweep=read_sweeps([sweep]),
    )
    assert many["methods"]["ranking"] == ["feddrm", "fedbn"]
    assert "ahead of fedbn" in ranking_text(many["methods"])


def test_an_uninformative_level_gives_no_ranking(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep.json"
    blind = {**_scenario(3, [], "no verdict: uninformative level"), "informative": False}
    sweep.write_text(json.dumps({"format": 2, "source": "a sweep", "scenarios": [blind]}))
    counts = _counts({"a": {"n": 90, "g": 10}, "b": {"n": 10, "g": 90}, "c": {"n": 50, "g": 50}})
    value = bands("glaucoma")["mid"][0] + 0.01

    found = heterogeneity(
        counts, _matrix(["a", "b", "c"], lambda a, b: value), "glaucoma", sweep=read_sweeps([sweep])
    )

    assert found["methods"]["ranking"] is None
    assert "could not tell methods apart" in ranking_text(found["methods"])
    assert "clients: m = 3" in found["methods"]["note"]
    # a sweep written before the gate is refused with what to do
    sweep.write_text(json.dumps({"format": 1, "source": "a sweep", "scenarios": [blind]}))
    with pytest.raises(HeterogeneityError, match="format 1.*--reuse-runs"):
        read_sweeps([sweep])


def test_the_sweeps_measured_for_the_docs_ship_with_medfed() -> None:
    sweep = measured_sweep()

    assert sweep is not None
    ablations = {s["level"].split(":")[0] for s in sweep["scenarios"]}
    assert {"covariate", "label", "concept", "clients"} <= ablations
    assert any(s["informative"] for s in sweep["scenarios"])
    verdicts = {"ahead", "behind", "no difference detected"}
    for s in sweep["scenarios"]:
        accuracy = s["system_accuracy"]
        assert 0 < s["majority_rate"] < 1
        # FedDRM against each baseline (the paper's FedDRM is a variant, not a baseline)
        assert set(s["differences"]) == set(accuracy) - {"feddrm", "feddrm-paper"}
        if not s["informative"]:  # the gate says why; no ranking and no verdict there
            assert s["gate"] and s["ranking"] == []
            assert {d["verdict"] for d in s["differences"].values()} == {UNINFORMATIVE}
            continue
        assert s["ranking"] == sorted(accuracy, key=lambda m: -accuracy[m])
        for d in s["differences"].values():
            iv = d["interval"]
            assert d["verdict"] in verdicts
            assert iv["low"] <= iv["estimate"] <= iv["high"]


# -------------------------------------------------------------------------------- the report


def _report(*argv: str) -> str:
    result = runner.invoke(app, ["sites", "heterogeneity", *argv])
    assert result.exit_code == 0, result.output
    return result.output


def test_report_on_a_synthetic_glaucoma_federation_without_a_run(
    concept_federation: Path, tmp_path: Path
) -> None:
    text = _report("--sites-dir", str(concept_federation), "--cache-dir", str(tmp_path / "c"))
    data = json.loads(
        _report(
            "--sites-dir", str(concept_federation), "--cache-dir", str(tmp_path / "c"), "--json"
        )
    )

    assert "Guidance from medfed's synthetic scenarios" in text
    assert "--run RUN" in text
    # the methods line: the shipped sweeps' ranking for the regime found, or why there is none
    expected = ranking(data["regime"], measured_sweep(), 4)
    assert data["methods"] == json.loads(json.dumps(expected))
    assert f"methods: {ranking_text(expected)}" in text
    assert "glaucoma share (95% CI) k/n" in text
    assert set(data["sites"]) == {"acrima", "rimone", "refuge", "acrima_2"}
    meta = load_synth_meta(concept_federation)
    for site, info in meta["sites"].items():  # the shares are the written labels
        share = data["prevalence"][site]["glaucoma"]
        assert share["k"] == info["class_counts"]["glaucoma"] and share["n"] == 24
        assert share["low"] <= share["value"] <= share["high"]
    assert data["covariate_shift"]["level"] == "mid"  # synthesized at the mid level
    assert data["regime"]["concept"] is None


def test_report_on_a_synthetic_dr_federation(tmp_path: Path) -> None:
    synthesize(tmp_path / "dr", n_per_site=20, seed=0, image_size=SIZE, task="dr")

    data = json.loads(
        _report("--sites-dir", str(tmp_path / "dr"), "--cache-dir", str(tmp_path / "c"), "--json")
    )

    assert data["covariate_shift"]["task"] == "dr"
    assert set(data["prevalence"]["aptos"]) == {
        "no_dr",
        "mild",
        "moderate",
        "severe",
        "proliferative",
    }
    # screening and referral sites: their grade mixes differ beyond sampling
    assert data["label_shift"]["level"] in ("strong", "moderate")
    # the methods measured by the shipped sweeps in the regime found, with their intervals
    assert data["methods"] == json.loads(json.dumps(ranking(data["regime"], measured_sweep(), 3)))


def test_report_with_a_trained_run_measures_each_pairs_drop(shared: Shared, tmp_path: Path) -> None:  # noqa: F811
    data = shared.copy_data(tmp_path)
    run = str(shared.run)

    text = _report("--sites-dir", str(data), "--run", run, "--cache-dir", str(tmp_path / "c"))
    found = json.loads(_report("--run", run, "--json"))  # the run's own site overview

    summary = json.loads((shared.run / "summary.json").read_text())
    auc = found["concept_shift"]["auc"]
    assert len(auc["pairs"]) == 6
    for pair in auc["pairs"]:
        row = summary["cross_site"][pair["model"]]
        assert pair["drop"] == pytest.approx(row[pair["model"]]["auc"] - row[pair["data"]]["auc"])
        assert pair["drop_se"] is not None and not pair["flag"]
    # 24 scans per site: every test split is below the reliability line, so nothing is judged
    assert all(p["unreliable"] for p in auc["pairs"]) and found["regime"]["concept"] is None
    assert "fewer than 10 positives or negatives: not measurable" in text
    assert "concept: not measured (see above)" in text
