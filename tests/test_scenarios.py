"""The scenario sweep (``medfed scenarios``): its intervals and verdicts on scans whose answer is
known, its plans and bad settings, and its quick form end to end (a slow test)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tomli_w

from medfed.errors import ConfigError
from medfed.experiments.paired import (
    AVERAGE_ACCURACY,
    FIGURES_BY_KEY,
    accuracy_interval,
    level_difference,
    scans_from_rows,
)
from medfed.experiments.scenarios import (
    ABLATIONS,
    NO_DIFFERENCE,
    NOT_REPRODUCED,
    REPRODUCED,
    ScenarioPlan,
    constant_answer,
    finished_run,
    judge,
    level_figures,
    scenario_markdown,
)
from medfed.reports.heterogeneity import read_sweep

SYSTEM = FIGURES_BY_KEY["system_accuracy"]


def _scans(hit_rate: float, seed: int, n: int = 80, sites: int = 3, own: float | None = None):
    """One run's test scans at ``sites`` sites: the routed answer right with ``hit_rate``, the
    site's own model right with ``own`` (default the same); 5 grades, a patient per scan."""
    rng = np.random.default_rng(seed)
    rows = []
    for s in range(sites):
        for k in range(n):
            label = int(rng.integers(0, 5))
            right = rng.random() < hit_rate
            right_own = rng.random() < (hit_rate if own is None else own)
            rows.append(
                {
                    "site": f"site{s}",
                    "scan_id": f"s{s}-{k}",
                    "patient_id": f"p{s}-{k}",
                    "label": label,
                    "score": None,
                    "prediction": label if right_own else (label + 1) % 5,
                    "system_prediction": label if right else (label + 1) % 5,
                    "system_prediction_origin_known": label if right else (label + 2) % 5,
                }
            )
    return scans_from_rows(rows)


def test_accuracy_interval_holds_the_share_answered_correctly():
    scans = {0: _scans(0.7, 1), 1: _scans(0.7, 2)}
    truth = np.mean(
        [
            np.concatenate([s.correct for s in per_site.values()]).mean()
            for per_site in scans.values()
        ]
    )

    iv = accuracy_interval(scans, SYSTEM, n_boot=300)

    assert iv.estimate == pytest.approx(truth)
    assert iv.low < truth < iv.high
    assert iv.high - iv.low < 0.2


def test_average_accuracy_reads_each_sites_own_model():
    scans = {0: _scans(0.2, 1, own=0.9)}

    own = accuracy_interval(scans, AVERAGE_ACCURACY, n_boot=200)
    system = accuracy_interval(scans, SYSTEM, n_boot=200)

    assert own.estimate > 0.8 and system.estimate < 0.3


def test_level_difference_finds_a_real_rise_and_none_between_equal_levels():
    low = {0: _scans(0.4, 1), 1: _scans(0.4, 2)}
    high = {0: _scans(0.8, 3), 1: _scans(0.8, 4)}
    same = {0: _scans(0.4, 5), 1: _scans(0.4, 6)}

    rise = level_difference(high, low, SYSTEM, n_boot=400)
    flat = level_difference(same, low, SYSTEM, n_boot=400)

    assert rise.low > 0.25
    assert flat.low < 0 < flat.high


def _plan(name: str, **kw):
    return ScenarioPlan.make(name, quick=True, n_boot=300, **kw)


def test_claims_read_their_verdicts_off_the_intervals():
    plan = _plan("covariate", methods=["local"])
    # FedDRM's system accuracy rises from low to high; its own-model accuracy does not fall.
    scans = {
        "low": {"feddrm": {0: _scans(0.4, 1, own=0.8)}},
        "mid": {"feddrm": {0: _scans(0.6, 2, own=0.8)}},
        "high": {"feddrm": {0: _scans(0.85, 3, own=0.8)}},
    }
    # The methods of a level are tested on the same scans: local answers as FedDRM does.
    for by_method in scans.values():
        by_method["local"] = by_method["feddrm"]
    levels = {k: level_figures(v, plan.n_boot) for k, v in scans.items()}

    rise, fall = (judge(c, plan, scans, levels) for c in plan.ablation.claims)

    assert rise["verdict"] == REPRODUCED
    assert fall["verdict"] == NO_DIFFERENCE


def test_a_peak_elsewhere_is_not_reproduced():
    plan = _plan("lambda")
    rates = {"0.1": 0.3, "0.3": 0.5, "0.5": 0.85, "0.8": 0.5, "0.95": 0.45}
    base = _scans(0.5, 7)
    scans = {}
    for label, rate in rates.items():
        rng = np.random.default_rng(int(float(label) * 100))
        scans[label] = {
            "feddrm": {
                0: {
                    site: s.__class__(**{**s.__dict__, "correct": rng.random(s.y.size) < rate})
                    for site, s in base.items()
                }
            }
        }
    levels = {k: level_figures(v, plan.n_boot) for k, v in scans.items()}

    (peak,) = (judge(c, plan, scans, levels) for c in plan.ablation.claims)

    assert peak["verdict"] == NOT_REPRODUCED
    assert len(peak["rows"]) == 4


@pytest.mark.parametrize(
    ("ablation", "kw", "words"),
    [
        ("altitude", {}, "unknown; choose one of"),
        ("covariate", {"methods": ["fedgmi"]}, "not a method of the covariate ablation"),
        ("covariate", {"levels": ["extreme"]}, "not a level of covariate"),
        ("label", {"seeds": 0}, "--seeds must be at least 1"),
    ],
)
def test_bad_scenario_settings_name_the_option(ablation, kw, words):
    with pytest.raises(ConfigError, match=words):
        ScenarioPlan.make(ablation, **kw)


def test_every_ablation_is_planned_with_feddrm_and_the_same_budget():
    for name, ablation in ABLATIONS.items():
        plan = ScenarioPlan.make(name)
        assert plan.methods[0] == "feddrm" and plan.seeds >= 3
        assert [lv.label for lv in plan.levels] == [lv.label for lv in ablation.levels]
    clients = ScenarioPlan.make("clients")
    assert [lv.client_fraction for lv in clients.levels] == [1.0, 1.0, 0.5, 0.25]
    assert ScenarioPlan.make("lambda").methods == ("feddrm",)


@pytest.mark.slow
def test_quick_concept_sweep_writes_its_tables_and_docs_section(tmp_path: Path):
    from medfed.experiments.scenarios import run_scenarios

    page = tmp_path / "scenarios.md"
    page.write_text(
        "# x\n<!-- scenario-concept:start -->\nPLACEHOLDER-TEXT\n<!-- scenario-concept:end -->\n",
        encoding="utf-8",
    )
    plan = ScenarioPlan.make("concept", quick=True, seeds=1, methods=["local"], n_boot=200)
    lines: list[str] = []

    results = run_scenarios(tmp_path / "out", plan, echo=lines.append, readme=page)

    saved = json.loads((tmp_path / "out" / "scenario-concept.json").read_text())
    assert [lv["label"] for lv in saved["levels"]] == ["off", "on"]
    for level in saved["levels"]:
        assert set(level["methods"]) == {"feddrm", "local"}
        cell = level["differences"]["local"]["system_accuracy"]
        iv = cell["interval"]
        assert iv is None or iv["low"] <= iv["estimate"] <= iv["high"]
    (claim,) = results["claims"]
    assert claim["verdict"] in (REPRODUCED, NOT_REPRODUCED, NO_DIFFERENCE)
    text = page.read_text(encoding="utf-8")
    assert "PLACEHOLDER-TEXT" not in text and "| on | local |" in text
    assert scenario_markdown(saved) in text
    assert any(line.startswith(claim["text"]) for line in lines)
    # The heterogeneity report reads the levels as regimes, each with its measured ranking.
    sweep = read_sweep(tmp_path / "out" / "sweep-concept.json")
    assert [s["concept"] for s in sweep["scenarios"]] == [False, True]
    for scenario, level in zip(sweep["scenarios"], saved["levels"], strict=True):
        assert sorted(scenario["ranking"]) == ["feddrm", "local"]
        accuracy = {m: f["system_accuracy"]["estimate"] for m, f in level["methods"].items()}
        assert scenario["ranking"][0] == max(accuracy, key=accuracy.get)
        assert scenario["label"] == level["label_regime"]
        # FedDRM's paired difference beside the ranking, as the scenario's JSON holds it
        paired = level["differences"]["local"]["system_accuracy"]
        assert scenario["differences"] == {
            "local": {"interval": paired["interval"], "verdict": paired["verdict"]}
        }
    assert "| on | (most common grade) |" in text

    # Again with --reuse-runs: every run is read back, nothing trains, the figures are the same
    # and the wall time stated is the first invocation's.
    again: list[str] = []
    second = run_scenarios(tmp_path / "out", plan, echo=again.append, reuse=True)
    assert second["reused_runs"] == 4 and not any("system accuracy" in x for x in again)
    assert [lv["methods"] for lv in second["levels"]] == [lv["methods"] for lv in saved["levels"]]
    assert second["seconds"] == saved["seconds"]  # re-rendering trains nothing


def test_the_constant_answer_is_the_most_common_grade():
    def rows(sites):
        return [
            {"site": site, "scan_id": f"{site}{k}", "patient_id": f"{site}{k}", "label": g,
             "score": None, "prediction": 0, "system_prediction": 0,
             "system_prediction_origin_known": 0}
            for site, grades in sites
            for k, g in enumerate(grades)
        ]  # fmt: skip

    first = scans_from_rows(rows([("a", [0, 0, 0, 1]), ("b", [2, 2, 0, 1])]))
    second = scans_from_rows(rows([("a", [3, 3, 1, 1]), ("b", [3, 4, 4, 4])]))

    found = constant_answer({0: first, 1: second})

    assert found["grades"] == {"0": 0, "1": 3}  # each seed's federation its own grade
    assert found["system"]["estimate"] == pytest.approx((4 + 3) / 16)
    assert found["system_origin_known"]["estimate"] == pytest.approx((3 + 2 + 2 + 3) / 16)
    assert found["average"] == pytest.approx((3 / 4 + 2 / 4 + 2 / 4 + 3 / 4) / 4)
    assert found["system"]["low"] < 7 / 16 < found["system"]["high"]


def test_a_run_is_reused_only_when_it_finished_with_the_same_settings(tmp_path: Path):
    from medfed.algorithms import make_algorithm
    from medfed.config import TrainConfig

    folder = tmp_path / "run"
    folder.mkdir()
    config = TrainConfig(algorithm="feddrm", rounds=2, seed=0)
    # as a run writes it: the algorithm's parameters resolved (lam 0.8 by default) and its
    # client head rule settled for a run that trains its encoder
    algorithm = make_algorithm("feddrm", {})
    algorithm.settle(False)
    resolved = algorithm.resolved_params()
    assert resolved["client"] == "trained"
    stored = {"train": json.loads(json.dumps(config.to_dict() | {"params": resolved}))}
    (folder / "config.toml").write_text(tomli_w.dumps(stored), encoding="utf-8")
    assert not finished_run(folder, config)  # no summary or predictions: it did not finish
    (folder / "summary.json").write_text("{}", encoding="utf-8")
    (folder / "predictions.csv").write_text("site\n", encoding="utf-8")

    assert finished_run(folder, config)
    assert not finished_run(folder, TrainConfig(algorithm="feddrm", rounds=2, seed=1))
    lam = TrainConfig(algorithm="feddrm", rounds=2, seed=0, params={"lam": "0.1"})
    assert not finished_run(folder, lam)  # another lambda
    same = TrainConfig(algorithm="feddrm", rounds=2, seed=0, params={"lam": "0.8"})
    assert finished_run(folder, same)  # the default, named: parameters compare resolved
    unsettled = make_algorithm("feddrm", {}).resolved_params()  # client "auto", as never written
    (folder / "config.toml").write_text(
        tomli_w.dumps({"train": json.loads(json.dumps(config.to_dict() | {"params": unsettled}))}),
        encoding="utf-8",
    )
    assert not finished_run(folder, config)
    (folder / "config.toml").write_text("[train\n", encoding="utf-8")
    assert not finished_run(folder, config)  # a damaged config.toml: train again
