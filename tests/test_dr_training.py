"""A DR grading federation (ICDR grades 0-4) trains end to end with FedAvg, FedBN, FedDRM and
LoRA, and ``medfed evaluate`` prints macro AUC and quadratic weighted kappa with CIs and the
referable-DR operating point; the figures agree with scikit-learn on predictions.csv."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from sklearn.metrics import cohen_kappa_score
from typer.testing import CliRunner

from medfed.cli import app
from medfed.data.synth import synthesize

runner = CliRunner()
ALGORITHMS = {
    "fedavg": [],
    "fedbn": [],
    "feddrm": [],
    "lora": ["--param", "warmup_rounds=1"],
}


@pytest.fixture(scope="module")
def dr_sites(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], Path]:
    root = tmp_path_factory.mktemp("dr_training")
    manifests = synthesize(root / "data", n_per_site=36, seed=0, image_size=64, task="dr")
    return [str(p) for p in manifests], root / "cache"


def _train(sites: list[str], cache: Path, out: Path, algorithm: str) -> None:
    argv = ["train", "--sites", *sites, "--algorithm", algorithm, *ALGORITHMS[algorithm]]
    argv += ["--rounds", "2", "--local-steps", "2", "--out", str(out)]
    argv += ["--cache-dir", str(cache), "--no-progress"]
    result = runner.invoke(app, argv)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_dr_federation_trains_and_evaluates_as_grades(
    dr_sites: tuple[list[str], Path], tmp_path: Path, algorithm: str, monkeypatch
) -> None:
    sites, cache = dr_sites
    run = tmp_path / algorithm

    _train(sites, cache, run, algorithm)
    printed = runner.invoke(app, ["evaluate", str(run)])

    assert printed.exit_code == 0, printed.output
    text = printed.output
    assert "macro AUC (95% CI)" in text and "quadratic weighted kappa (95% CI)" in text
    assert "Referable DR (grade 2 or worse" in text and "specificity:0.90" in text
    assert "routed system, quadratic weighted kappa" in text
    summary = json.loads((run / "summary.json").read_text())
    with (run / "predictions.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    for site, figures in summary["sites"].items():
        mine = [r for r in rows if r["site"] == site]
        y = [int(r["label"]) for r in mine]
        pred = [int(r["prediction"]) for r in mine]
        kappa = figures["kappa"]
        if kappa["value"] is not None:
            expected = cohen_kappa_score(y, pred, weights="quadratic", labels=list(range(5)))
            assert kappa["value"] == pytest.approx(expected, abs=1e-9)
        assert [c["name"] for c in figures["class_auc"]] == [
            "no_dr", "mild", "moderate", "severe", "proliferative"
        ]  # fmt: skip
        referable = figures["referable"]
        assert referable["n_pos"] == sum(v >= 2 for v in y)
        assert referable["operating_point"]["rule"] == "specificity:0.90"
        assert figures["auc"] == figures["macro_auc"]["value"]
    assert summary["system_kappa"]["n"] == len(rows)
    if algorithm == "feddrm":  # the HTML report reads as grades too
        report = tmp_path / "report.html"
        made = runner.invoke(app, ["report", str(run), "--out", str(report)])
        assert made.exit_code == 0, made.output
        html = report.read_text()
        section = html[html.index('id="grading"') :]
        assert "Grading: more than two classes" in html
        assert "quadratic weighted kappa (95% CI)" in section and "proliferative" in section
        assert "Referable DR (grade 2 or worse" in section
        for site, figures in summary["sites"].items():
            assert f'<th scope="row">{site}</th>' in section
            assert f"{figures['macro_auc']['value']:.3f}" in section
        _dashboard_reads_grades(monkeypatch, run, summary)


def _dashboard_reads_grades(monkeypatch: pytest.MonkeyPatch, run: Path, summary: dict) -> None:
    """The dashboard's Federation page shows the same grading tables for the run."""
    from streamlit import config as streamlit_config
    from streamlit.testing.v1 import AppTest

    from medfed.dashboard import APP, RUNS_ENV

    monkeypatch.setenv(RUNS_ENV, str(run))
    streamlit_config.set_option("server.address", "127.0.0.1")
    at = AppTest.from_file(str(APP), default_timeout=120).run()
    at.switch_page("views/federation.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert "Grading" in [h.value for h in at.subheader]
    tables = [t.value for t in at.table]
    grading = next(t for t in tables if "quadratic weighted kappa (95% CI)" in t.columns)
    assert list(grading["site"]) == list(summary["sites"])
    macro = {s: f["macro_auc"]["value"] for s, f in summary["sites"].items()}
    for site, cell in zip(grading["site"], grading["macro AUC (95% CI)"], strict=True):
        assert cell.startswith(f"{macro[site]:.3f}")
    assert any("proliferative" in t.columns for t in tables)
    assert any("referable/not" in t.columns for t in tables)


def test_sites_that_never_see_some_grades_train_with_client_sampling(tmp_path: Path) -> None:
    made = runner.invoke(
        app,
        ["synth", "--out", str(tmp_path / "d"), "--task", "dr", "--n-per-site", "24"]
        + ["--classes-per-site", "2", "--covariate-shift", "high", "--image-size", "64"],
    )
    assert made.exit_code == 0, made.output
    sites = sorted(str(p) for p in (tmp_path / "d" / "sites").glob("*.toml"))
    argv = ["train", "--sites", *sites, "--algorithm", "fedbn", "--client-fraction", "0.67"]
    argv += ["--rounds", "2", "--local-steps", "1", "--out", str(tmp_path / "run")]
    argv += ["--cache-dir", str(tmp_path / "cache"), "--no-progress"]

    trained = runner.invoke(app, argv)
    printed = runner.invoke(app, ["evaluate", str(tmp_path / "run")])

    assert trained.exit_code == 0, trained.output
    assert printed.exit_code == 0, printed.output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    for figures in summary["sites"].values():
        absent = [c for c in figures["class_auc"] if c["n_pos"] == 0]
        assert len(absent) >= 3 and all(c["auc"] is None and c["reason"] for c in absent)
        referable = figures["referable"]
        if min(referable["n_pos"], referable["n_neg"]) < 2:
            assert referable["auc"] is None and "too few for an AUC" in referable["auc_reason"]
    assert "n/a (0 of" in printed.output


def test_referable_operating_point_follows_the_runs_operating_point_rule(
    dr_sites: tuple[list[str], Path], tmp_path: Path
) -> None:
    sites, cache = dr_sites
    run = tmp_path / "youden"
    argv = ["train", "--sites", *sites, "--algorithm", "fedavg", "--operating-point", "youden"]
    argv += ["--rounds", "1", "--local-steps", "1", "--out", str(run)]
    argv += ["--cache-dir", str(cache), "--no-progress"]

    result = runner.invoke(app, argv)

    assert result.exit_code == 0, result.output
    summary = json.loads((run / "summary.json").read_text())
    rules = {s: f["referable"]["operating_point"]["rule"] for s, f in summary["sites"].items()}
    assert set(rules.values()) == {"youden"}, rules
    assert json.loads((run / "model" / "model.json").read_text())["operating_rule"] == "youden"
