"""The scenario sweep (``medfed scenarios``): its intervals and verdicts on scans whose answer is
known, its plans and bad settings, and its quick form end to end (a slow test)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tomli_w

from medfed.core.errors import ConfigError
from medfed.experiments.paired import (
    AVERAGE_ACCURACY,
    FIGURES_BY_KEY,
    accuracy_interval,
    level_difference,
    scans_from_rows,
)
from medfed.experiments.scenario_tables import scenario_markdown
from medfed.experiments.scenario_verdicts import (
    AHEAD,
    MARGIN,
    NO_DIFFERENCE,
    NOT_REPRODUCED,
    REPRODUCED,
    UNINFORMATIVE,
    adjust_table,
    constant_answer,
    level_table,
)
from medfed.experiments.scenarios import (
    ABLATIONS,
    ScenarioPlan,
    Trainings,
    finished_run,
    judge_claims,
)
from medfed.reports.heterogeneity import read_sweep
from tests.test_frozen_encoder import NEEDS_REAL, real_home

SYSTEM = FIGURES_BY_KEY["system_accuracy"]


def _scans(
    hit_rate: float,
    seed: int,
    n: int = 80,
    sites: int = 3,
    own: float | None = None,
    constant: int | None = None,
):
    """One run's test scans at ``sites`` sites: the routed answer right with ``hit_rate``, the
    site's own model right with ``own`` (default the same); 5 grades, a patient per scan. The
    labels depend on ``seed`` only, so that methods of one seed share their test scans; with
    ``constant`` every answer is that grade."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 5, size=(sites, n))

    def exactly(rate: float) -> np.ndarray:  # a share ``rate`` of each site's scans, spread
        return rng.permutation(n) < round(rate * n)

    rows = []
    for s in range(sites):
        right_at, own_at = exactly(hit_rate), exactly(hit_rate if own is None else own)
        for k in range(n):
            label = int(labels[s, k])
            right, right_own = right_at[k], own_at[k]
            rows.append(
                {
                    "site": f"site{s}",
                    "scan_id": f"s{s}-{k}",
                    "patient_id": f"p{s}-{k}",
                    "label": label,
                    "score": None,
                    "prediction": label if right_own else (label + 1) % 5,
                    "system_prediction": (
                        constant if constant is not None else label if right else (label + 1) % 5
                    ),
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


def _judged(plan, scans):
    """The level tables, their Holm-adjusted verdicts and the claims, as run_scenarios makes
    them from ``scans`` (level -> method -> seed -> scans)."""
    levels, boots = {}, {}
    for label, by_method in scans.items():
        levels[label], boots[label] = level_table(by_method, plan.n_boot)
    adjust_table(levels)
    return levels, judge_claims(plan, Trainings(scans), levels, boots)


def test_claims_read_their_verdicts_off_the_intervals():
    plan = _plan("covariate", methods=["local"])
    # FedDRM's system accuracy rises from low to high; its own-model accuracy does not fall.
    rates = {"low": 0.4, "mid": 0.6, "high": 0.85}
    scans = {
        label: {
            "feddrm": {k: _scans(rate, 10 * n + k, own=0.8) for k in range(2)},
            # the methods of a level are tested on the same scans; local learned as well
            "local": {k: _scans(rate, 10 * n + k, own=0.8) for k in range(2)},
        }
        for n, (label, rate) in enumerate(rates.items())
    }

    levels, (rise, fall) = _judged(plan, scans)

    assert all(level["gate"]["informative"] for level in levels.values())
    assert rise["variants"]["feddrm"]["verdict"] == REPRODUCED
    assert fall["variants"]["feddrm"]["verdict"] == NO_DIFFERENCE
    # the interval holds the variation between seeds: it resamples them
    row = rise["variants"]["feddrm"]["rows"][0]
    assert "seeds with replacement" in row["interval"]["method"]


def test_a_peak_elsewhere_is_not_reproduced():
    plan = _plan("lambda")
    rates = {"0.1": 0.45, "0.3": 0.55, "0.5": 0.85, "0.8": 0.55, "0.95": 0.5}
    scans = {
        label: {
            "feddrm-paper": {k: _scans(rate, 40 + k) for k in range(2)},
            "feddrm": {k: _scans(0.6, 90 + k) for k in range(2)},  # lambda does not enter it
        }
        for label, rate in rates.items()
    }

    _, (peak,) = _judged(plan, scans)

    assert list(peak["variants"]) == ["feddrm-paper"]  # the variant lambda trains is judged
    found = peak["variants"]["feddrm-paper"]
    assert found["verdict"] == NOT_REPRODUCED
    assert len(found["rows"]) == 4


def test_a_constant_answer_at_the_majority_rate_makes_a_level_uninformative():
    plan = _plan("label", methods=["local", "fedbn"])
    majority = {}
    for k in range(2):  # each seed's most common pooled grade: the constant answer to give
        pooled = np.concatenate([s.y for s in _scans(0.5, 70 + k).values()])
        majority[k] = int(np.bincount(pooled).argmax())
    learned = {
        "feddrm": {k: _scans(0.9, 70 + k) for k in range(2)},
        "fedbn": {k: _scans(0.8, 70 + k) for k in range(2)},
    }
    scans = {
        # every baseline learned: FedDRM's lead over them is decided
        "Dirichlet 0.3": {**learned, "local": {k: _scans(0.6, 70 + k) for k in range(2)}},
        # local answers every scan with its seed's most common grade: no verdict here
        "2 grades per site": {
            **learned,
            "local": {k: _scans(0.0, 70 + k, constant=majority[k]) for k in range(2)},
        },
    }

    levels, (ahead,) = _judged(plan, scans)

    informative, blind = levels["Dirichlet 0.3"], levels["2 grades per site"]
    assert informative["gate"]["informative"]
    assert informative["differences"]["feddrm"]["local"]["verdict"] == AHEAD
    assert not blind["gate"]["informative"]
    assert blind["gate"]["majority_rate"] == pytest.approx(
        blind["methods"]["local"]["system_accuracy"]["estimate"]
    )
    assert any("answers every scan of seed 0 with grade" in w for w in blind["gate"]["why"])
    assert any(f"+ {MARGIN:g}" in w for w in blind["gate"]["why"])
    assert blind["differences"]["feddrm"]["local"]["verdict"] == UNINFORMATIVE
    assert ahead["variants"]["feddrm"]["verdict"] == UNINFORMATIVE


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
        assert plan.methods[0] == "feddrm" and plan.seeds >= 8
        assert plan.budget.frozen_encoder and plan.budget.init == "torchvision:mobilenet_v2"
        assert plan.methods[1] == "feddrm-paper"  # both FedDRM variants, always
        assert [lv.label for lv in plan.levels] == [lv.label for lv in ablation.levels]
    clients = ScenarioPlan.make("clients")
    assert [lv.client_fraction for lv in clients.levels] == [1.0, 0.5, 0.25]
    # one pool split among the sites, as in the paper: fewer photos at each as m grows
    assert [lv.n_per_site * lv.shift.n_sites for lv in clients.levels] == [640] * 3
    lam = ScenarioPlan.make("lambda")
    assert lam.methods == ("feddrm", "feddrm-paper")  # no baseline: lambda is FedDRM's alone
    low = lam.ablation.level("0.1")
    # each variant at the level's lambda, the paper's keeping its own spec; runs at the
    # default lambda keep the plain name the other ablations share
    assert low.method_label("feddrm-paper") == "feddrm:private_norms=false,client=trained,lam=0.1"
    assert low.method_label("feddrm") == "feddrm:lam=0.1"
    assert low.run_name("feddrm-paper") == "feddrm-paper_lam0.1"
    assert lam.ablation.level("0.8").run_name("feddrm-paper") == "feddrm-paper"


@pytest.mark.slow
@NEEDS_REAL
def test_quick_concept_sweep_writes_its_tables_and_docs_section(tmp_path: Path, monkeypatch):
    from medfed.experiments.scenarios import run_scenarios

    real_home(tmp_path / "torch_home", monkeypatch)  # the sweeps start from ImageNet features
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
        iv = level["differences"]["feddrm"]["local"]["system_accuracy"]
        assert iv is None or iv["low"] <= iv["estimate"] <= iv["high"]
        assert level["gate"]["majority_rate"] == level["constant"]["system"]["estimate"]
        # the runs learned from the frozen ImageNet encoder: each curve has its three marks
        assert all(None not in c for c in level["curves"].values())
    # medfed's own scenario: no paper claim, so no verdict on one
    assert results["claims"] == [] and "no paper claim" in results["note"]
    assert saved["levels"][0]["shared_with"] == [
        "covariate: mid", "lambda: 0.1", "lambda: 0.3", "lambda: 0.5", "lambda: 0.8",
        "lambda: 0.95",
    ]  # fmt: skip
    text = page.read_text(encoding="utf-8")
    assert "PLACEHOLDER-TEXT" not in text and "| on | local |" in text
    assert scenario_markdown(saved) in text and "no paper claim" in text
    assert "Holm's adjustment" in text and "| on | (most common grade) |" in text
    # The heterogeneity report reads the levels as regimes, ranked only where informative.
    sweep = read_sweep(tmp_path / "out" / "sweep-concept.json")
    assert [s["concept"] for s in sweep["scenarios"]] == [False, True]
    for scenario, level in zip(sweep["scenarios"], saved["levels"], strict=True):
        assert scenario["informative"] == level["gate"]["informative"]
        accuracy = {m: f["system_accuracy"]["estimate"] for m, f in level["methods"].items()}
        if scenario["informative"]:
            assert scenario["ranking"][0] == max(accuracy, key=accuracy.get)
        else:
            assert scenario["ranking"] == []
        assert scenario["label"] == level["label_regime"]
        # FedDRM's paired difference beside the ranking, as the scenario's JSON holds it
        paired = level["differences"]["feddrm"]["local"]
        assert scenario["differences"] == {
            "local": {"interval": paired["system_accuracy"], "verdict": paired["verdict"]}
        }

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
