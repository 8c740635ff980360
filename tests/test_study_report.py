"""``medfed report``: one self-contained HTML file over several runs (methods) on the same sites,
that loads nothing from a network and shows every site's AUC with its CI, in a real browser
too."""

from __future__ import annotations

import html
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from medfed.cli import app
from medfed.core.errors import ConfigError
from medfed.reports.evaluation import auc_text
from medfed.reports.study import render_study
from medfed.reports.study_runs import OVERVIEW_FILE, load_study
from medfed.reports.text import UNRELIABLE_MARK
from medfed.runs import RunDir
from medfed.runs.schema import Summary
from tests.dashboard_runs import DashboardRuns, build
from tests.test_dashboard_browser import CHROMIUM, require_browser
from tests.test_report import old_summary_dict
from tests.test_schema import site_figures

runner = CliRunner()
# What would make a browser fetch something: every reference must stay inside the file.
LOADS = re.compile(r"<script|<link|<iframe|<object|<embed|@import|url\(|\bsrc\s*=", re.I)


@dataclass(frozen=True)
class Study:
    runs: DashboardRuns
    html_path: Path
    text: str
    summaries: dict[str, Summary]


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Study:
    """The dashboard's two small real runs (FedDRM with a dropout and a resume, FedAvg) on
    three synthetic fundus sites, reported through the command line."""
    runs = build(tmp_path_factory.mktemp("study"))
    out = runs.base / "report" / "report.html"
    result = runner.invoke(app, ["report", str(runs.feddrm), str(runs.fedavg), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "2 method(s) (feddrm, fedavg) on 3 site(s)" in result.output
    summaries = {p.name: RunDir(p).read_summary() for p in (runs.feddrm, runs.fedavg)}
    return Study(runs, out, out.read_text(encoding="utf-8"), summaries)


def test_the_report_is_one_file_with_every_sites_auc_and_its_ci(study: Study) -> None:
    assert [p.name for p in study.html_path.parent.iterdir()] == ["report.html"]
    section = study.text.split('<section id="discrimination">')[1].split("</section>")[0]
    table = section.split("</table>")[0]
    for method, summary in study.summaries.items():
        assert f'<th scope="col">{method}</th>' in table
        for site, figures in summary.sites.items():
            row = table.split(f'<th scope="row">{site}</th>')[1].split("</tr>")[0]
            assert html.escape(auc_text(figures, mark=False)) in row
            if figures.n_pos >= 2 and figures.n_neg >= 2:
                assert figures.auc_ci is not None, f"{method}/{site}: the run has no AUC CI"
                assert html.escape(figures.auc_ci.text()) in row
        pooled = summary.pooled_auc
        assert pooled is not None and html.escape(pooled.method) in section
    # Three sites of a handful of test scans: every figure is flagged, with its reason.
    reason = study.summaries["feddrm"].sites["acrima"].unreliable
    assert reason and f'title="{html.escape(reason)}">{UNRELIABLE_MARK} unreliable' in study.text


def test_the_report_loads_nothing_from_a_network(study: Study) -> None:
    text = study.text
    assert "http://" not in text and "https://" not in text
    assert not LOADS.search(text), LOADS.search(text)
    assert all(ref.startswith("#") for ref in re.findall(r'href="([^"]*)"', text))
    assert html.escape("default-src 'none'") in text  # the page forbids loads, should one slip in
    assert text.count("<svg ") == 2 + 2 + 1  # a forest plot and a reliability diagram per method


def test_the_report_holds_every_section_for_the_clinicians(study: Study) -> None:
    text = study.text
    for heading in (
        "The sites and their data",
        "Discrimination: AUC per site",
        "Operating points",
        "Calibration",
        "Cross-site matrix",
        "Routing a new patient&#x27;s scan",
        "What each method sent over the network",
    ):
        assert f"<h2>{heading}</h2>" in text
    feddrm = study.summaries["feddrm"]
    op = feddrm.sites["refuge"].operating_point
    assert op is not None and html.escape(f"{op.tp} / {op.fp} / {op.tn} / {op.fn}") in text
    assert "origin unknown: each candidate site normalizes" in text
    assert "origin known: the scan is normalized" in text
    # The sites' data: split sizes with their classes, and the data card facts of the manifest.
    site = feddrm.sites["acrima"]
    assert f"{site.n_train}<span" in text and "glaucoma" in text
    assert "Synthetic glaucoma screening site" in text and "<dt>Licence</dt>" in text
    assert "feddrm" in text and 'class="own"' in text  # the matrix outlines its diagonal


def test_every_accuracy_column_of_the_report_names_its_rule(study: Study) -> None:
    headers = re.findall(r'<th scope="col">([^<]*)</th>', study.text)
    accuracy = [h for h in headers if "acc" in h.lower() and "routing acc" not in h.lower()]
    assert accuracy
    for header in accuracy:
        assert "at op. point" in header or "at argmax" in header, header
    assert "accuracy at argmax" in study.text  # the cross-site matrix's cells
    # Wide tables scroll inside the page rather than past it.
    assert ".scroll { overflow-x: auto;" in study.text
    assert study.text.count('<div class="scroll"><table') == study.text.count("<table")


def test_an_old_run_reads_as_na_and_every_string_from_its_files_is_escaped(tmp_path) -> None:
    hostile = '<img src=x onerror="alert(1)">'
    run = RunDir(tmp_path / "old")
    run.write_config({"sites": [{"id": hostile, "description": "<script>alert(2)</script>"}]})
    sites = {hostile: site_figures(0.8), "b": site_figures(None)}
    run.write_summary(old_summary_dict(sites=sites))
    assert not (run.path / OVERVIEW_FILE).exists()

    text = render_study(load_study([run.path]))

    assert "<img" not in text and "<script" not in text
    assert html.escape(hostile) in text and "&lt;script&gt;alert(2)&lt;/script&gt;" in text
    assert "n/a (test split holds one class)" in text
    assert "no operating point in this run" in text and "no calibration in this run" in text
    assert "this run predates the cross-site matrix" in text
    # The same method twice, in folders of the same name: told apart by folder, then by position.
    again = tmp_path / "elsewhere" / "old"
    shutil.copytree(run.path, again)
    assert [r.label for r in load_study([run.path, again])] == [
        "feddrm (old) #1",
        "feddrm (old) #2",
    ]
    # The same run twice is refused, however it is spelt.
    with pytest.raises(ConfigError, match="the same run as"):
        load_study([run.path, tmp_path / "elsewhere" / ".." / "old"])


def test_the_overview_is_read_where_the_data_layer_writes_it() -> None:
    from medfed.data import overview

    assert Path(overview.OVERVIEW_DIR, overview.OVERVIEW_FILE) == OVERVIEW_FILE


def test_report_refuses_what_is_not_a_run(tmp_path) -> None:
    result = runner.invoke(app, ["report", str(tmp_path / "nowhere"), "--out", "x.html"])
    assert result.exit_code == 2 and "no such run directory" in result.output


@pytest.mark.browser
def test_browser_opens_the_file_and_shows_each_sites_auc_with_its_ci(
    study: Study, tmp_path
) -> None:
    require_browser()
    from playwright.sync_api import expect, sync_playwright

    requested: list[str] = []
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM))
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            page.on("request", lambda request: requested.append(request.url))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(study.html_path.resolve().as_uri())

            section = page.locator("#discrimination")
            expect(
                section.get_by_role("heading", name="Discrimination: AUC per site")
            ).to_be_visible()
            table = section.locator("table").first
            for method, summary in study.summaries.items():
                expect(table.locator("thead")).to_contain_text(method)
                for site, figures in summary.sites.items():
                    row = table.locator("tbody tr", has=page.locator(f'th:text-is("{site}")'))
                    expect(row).to_contain_text(auc_text(figures, mark=False))
            expect(section.locator("svg[role=img]")).to_have_count(2)
            page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        finally:
            browser.close()
    assert requested == [study.html_path.resolve().as_uri()]
    assert errors == []  # nothing blocked by the page's policy, no malformed markup reported
    assert (tmp_path / "report.png").stat().st_size > 50_000
