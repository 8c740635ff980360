"""The model card: ``RUN/model/MODEL_CARD.md`` written by every finished run, built from the run's
own files (so an old run can have it written again), and shown in report.html."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from medfed.cli import app
from medfed.core.errors import RunDirError
from medfed.federation.training import train
from medfed.metrics import Interval
from medfed.reports.evaluation import auc_text
from medfed.reports.model_card import (
    MODEL_CARD,
    CardInputs,
    card_document,
    limits,
    markdown_of,
    render_markdown,
    write_model_card,
)
from medfed.reports.study import render_study
from medfed.reports.study_runs import load_study
from medfed.reports.text import UNRELIABLE_MARK
from medfed.runs import RunDir
from medfed.runs.schema import PrivacySpent
from tests.dashboard_runs import clinical_summary, write_summary_run
from tests.tensorsites import tensor_sites
from tests.test_engine import config

runner = CliRunner()


def summary_run(tmp_path: Path, facts: dict | None = None, events=(), **changes) -> Path:
    """A finished run holding a known summary, its sites' declared facts and ``events``."""
    summary = clinical_summary(**changes)
    path = write_summary_run(tmp_path / "run", summary)
    sites = [{"id": s, "labels": {"normal": 0, "glaucoma": 1}} | (facts or {}).get(s, {})
             for s in summary.sites]  # fmt: skip
    RunDir(path).write_config({"train": {"rounds": 3}, "sites": sites})
    for event in events:
        RunDir(path).log_event(**event)
    (path / "model").mkdir()
    return path


def section(card: str, title: str) -> str:
    return card.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


# ---------------------------------------------------------------------------- the card's text
def test_the_card_gives_every_sites_auc_with_its_ci_and_names_the_worst_site(tmp_path) -> None:
    path = summary_run(tmp_path)
    summary = RunDir(path).read_summary()

    card = write_model_card(path).read_text(encoding="utf-8")

    performance = section(card, "Performance at each site")
    for site, figures in summary.sites.items():
        assert figures.auc_ci is not None
        row = next(line for line in performance.splitlines() if line.startswith(f"| {site} "))
        assert auc_text(figures) in row
    worst = summary.federation.worst_site
    worst_row = next(line for line in performance.splitlines() if line.startswith(f"| {worst} "))
    assert "worst site" in worst_row
    assert f"worst site: {worst}, AUC" in performance
    for title in (
        "Model", "Intended use and population", "Sites and their data",
        "Calibration and operating points", "Routing and abstention",
        "Privacy and what left the sites", "Known limits",
    ):  # fmt: skip
        assert f"## {title}\n\n_TRIPOD+AI: " in card
    assert "Task: classify a fundus scan as glaucoma (positive) or normal (negative)" in card


def test_the_card_tables_calibration_operating_points_and_the_routing_posterior(
    tmp_path,
) -> None:
    path = summary_run(tmp_path)
    summary = RunDir(path).read_summary()

    card = render_markdown(CardInputs.read(path))

    calibration = section(card, "Calibration and operating points")
    for figures in summary.sites.values():
        assert f"{figures.calibration.brier:.3f}" in calibration
        assert f"{figures.operating_point.threshold:.3f}" in calibration
    routing = section(card, "Routing and abstention")
    assert "default router: density_ratio" in routing
    assert "abstain rate: 0.0" in routing and "/" in routing  # a rate with its counts


def test_synthetic_small_and_unreliable_sites_are_named_among_the_limits(tmp_path) -> None:
    facts = {"refuge": {"licence": "synthetic, no restrictions"}}
    inputs = CardInputs.read(summary_run(tmp_path, facts))

    found = limits(inputs)

    assert any(line.startswith("synthetic data at refuge") for line in found)
    assert not any("synthetic data at rimone" in line for line in found)
    unreliable = [s for s, m in inputs.summary.sites.items() if m.unreliable]
    assert unreliable  # the clinical summary holds a site on 4 positives
    for site in unreliable:
        assert any(
            line.startswith(f"{UNRELIABLE_MARK} unreliable figures at {site}") for line in found
        )
    small = [s for s, m in inputs.summary.sites.items() if m.n_test < 50]
    for site in small:
        assert any(line.startswith(f"small site: {site} ") for line in found)


def test_real_data_is_not_called_synthetic(tmp_path) -> None:
    facts = {s: {"source": "hospital PACS export 2021"} for s in ("acrima", "refuge", "rimone")}
    card = render_markdown(CardInputs.read(summary_run(tmp_path, facts)))
    assert "synthetic data at" not in card


def test_the_privacy_section_gives_each_sites_epsilon_and_secure_aggregation(tmp_path) -> None:
    spent = PrivacySpent(
        epsilon=2.5, delta=1e-5, budget=3.0, noise_multiplier=1.1, sample_rate=0.1, clip=1.0,
        steps=30, planned_steps=30, accountant="rdp",
    )  # fmt: skip
    events = [{"kind": "start", "secure_aggregation": "secagg+"}]
    path = summary_run(tmp_path, events=events, privacy={"refuge": spent})

    privacy = section(render_markdown(CardInputs.read(path)), "Privacy and what left the sites")

    row = next(line for line in privacy.splitlines() if line.startswith("| refuge "))
    assert "2.50" in row and "1.0e-05" in row
    assert "secure aggregation: secagg+" in privacy


def test_a_run_without_privacy_says_epsilon_is_unbounded(tmp_path) -> None:
    privacy = section(
        render_markdown(CardInputs.read(summary_run(tmp_path))), "Privacy and what left the sites"
    )
    assert "No differential privacy" in privacy and "secure aggregation: no" in privacy


def test_an_old_run_without_cis_reads_na_not_a_made_up_interval(tmp_path) -> None:
    path = summary_run(tmp_path, worst_site_auc_ci=None)
    data = json.loads((path / "summary.json").read_text())
    for figures in data["sites"].values():
        figures.pop("auc_ci")
    (path / "summary.json").write_text(json.dumps(data))

    card = render_markdown(CardInputs.read(path))

    performance = section(card, "Performance at each site")
    assert "(no CI:" in performance and "DeLong" not in performance


# ---------------------------------------------------------------------------- bad runs
def test_a_folder_that_is_not_a_finished_run_is_refused_by_name(tmp_path) -> None:
    with pytest.raises(RunDirError, match="not a run directory|no such|missing|summary"):
        write_model_card(tmp_path / "nothing")
    path = summary_run(tmp_path)
    (path / "model").rmdir()
    with pytest.raises(RunDirError, match="model: missing"):
        write_model_card(path)


# ---------------------------------------------------------------------------- written by runs
def test_every_finished_run_writes_its_model_card_with_per_site_cis(tmp_path) -> None:
    out = tmp_path / "run"

    summary = train(tensor_sites(3), config("feddrm", rounds=2, local_steps=2), out)

    card_path = RunDir(out).model_dir / MODEL_CARD
    card = card_path.read_text(encoding="utf-8")
    run_summary = RunDir(out).read_summary()
    for site in summary["sites"]:
        assert auc_text(run_summary.sites[site]) in card
    assert "training finished: 2" in card  # written after the finish event
    for site in summary["sites"]:  # written once, with the data cards already beside it
        assert f"site_overview/cards/{site}" in card
    RunDir(out).verify_model()  # the card sits beside the weights without upsetting files.json

    # Written again for an old run: removed, then rewritten by 'medfed evaluate --model-card'.
    card_path.unlink()
    result = runner.invoke(app, ["evaluate", str(out), "--model-card"])
    assert result.exit_code == 0, result.output
    assert card_path.read_text(encoding="utf-8") == card


def test_the_report_shows_each_runs_model_card(tmp_path) -> None:
    path = summary_run(tmp_path, worst_site_auc_ci=Interval(0.7, 0.6, 0.8, "DeLong"))
    html = render_study(load_study([path]))
    assert 'id="model-card"' in html and "Model cards" in html
    card = html.split('id="model-card"', 1)[1]
    assert "Performance at each site" in card and "Known limits" in card
    assert "TRIPOD+AI" in card


def test_a_site_that_refused_the_run_is_named_among_the_limits(tmp_path) -> None:
    refused = {"acrima": [{"rule": "allow.algorithms", "reason": "the run trains 'fedavg'"}]}
    events = [{"kind": "start", "refused_sites": refused}]
    found = limits(CardInputs.read(summary_run(tmp_path, events=events)))
    assert (
        "site refused the run by its policy (rule allow.algorithms): acrima; not trained" in found
    )


def test_the_cards_data_and_its_markdown_are_one_document(tmp_path) -> None:
    run = summary_run(tmp_path)
    written = (write_model_card(run)).read_text(encoding="utf-8")
    document = json.loads(json.dumps(card_document(CardInputs.read(run))))
    assert markdown_of(document) == written == render_markdown(CardInputs.read(run))
    tables = [b["table"] for s in document["sections"] for b in s["blocks"] if "table" in b]
    assert tables and all(len(row) == len(t["header"]) for t in tables for row in t["rows"])
    assert [s["title"] for s in document["sections"]] == [
        line[3:] for line in written.splitlines() if line.startswith("## ")
    ]


def test_a_site_missing_the_specificity_target_or_poorly_calibrated_is_flagged() -> None:
    from dataclasses import replace

    from medfed.reports.card_flags import site_flags

    summary = clinical_summary()
    first, *others = summary.sites
    figures = summary.sites[first]
    op = figures.operating_point
    low_spec = replace(op.specificity, interval=Interval(0.70, 0.60, 0.79, "wilson"))
    bad = replace(
        figures,
        operating_point=replace(op, specificity=low_spec),
        calibration=replace(figures.calibration, slope=0.70),
    )
    sites = {first: bad, **{s: summary.sites[s] for s in others}}
    rest = {s: summary.sites[s] for s in others}
    baseline = site_flags(rest, "specificity:0.90")  # the fixture's own sites, as they are
    assert all("0.890)" in line for line in baseline)  # upper bound 0.890: below 0.90
    flags = [f for f in site_flags(sites, "specificity:0.90") if f not in baseline]
    assert len(flags) == 2 and all(line.startswith(f"{first}:") for line in flags)
    assert "0.700 (0.600\u20130.790)" in flags[0] and "target 0.90" in flags[0]
    assert "slope 0.70" in flags[1]
    assert site_flags(sites, "youden") == [flags[1]]  # no specificity target to miss
    assert not site_flags(rest, "specificity:0.85")


def test_the_card_holds_each_sites_tripod_items_or_says_not_recorded(tmp_path) -> None:
    declared = {
        "reference_standard": "two graders, a glaucoma specialist adjudicating",
        "inclusion": "adults screened 2019-2021",
        "data_dates": "2019-03 to 2021-11",
        "data_controller": "Example Eye Hospital",
        "retention": "10 years",
    }
    path = summary_run(tmp_path, facts={"acrima": declared})

    card = write_model_card(path).read_text(encoding="utf-8")

    items = section(card, "Reference standard, eligibility and data governance")
    row_a = next(line for line in items.splitlines() if line.startswith("| acrima "))
    for value in declared.values():
        assert value in row_a
    assert "not recorded" in row_a  # the exclusion criteria a site did not give
    row_b = next(line for line in items.splitlines() if line.startswith("| refuge "))
    assert row_b.count("not recorded") == 6
    intended = section(card, "Intended use and population")
    assert "Contraindications:" in intended and "Regulatory status: not recorded" in intended
    # every calibration slope with its 95% interval, and the rule beside the table
    calibration = section(card, "Calibration and operating points")
    assert "slope (95% CI; ideal 1)" in calibration
    assert "Sites flagged by these rules" in calibration
