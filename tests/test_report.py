"""Method specs of ``medfed compare``, the tables written into the README, and the tables of
``medfed evaluate``: CIs, counts and the unreliable marker, and old runs shown as n/a."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from medfed.cli import app
from medfed.clinic.audit import AuditLog
from medfed.core.errors import ConfigError
from medfed.experiments.demo import MethodSpec
from medfed.metrics import Interval, calibration, operating_point, unreliable, wilson
from medfed.reports.evaluation import (
    ORIGIN_KNOWN,
    ORIGIN_UNKNOWN,
    calibration_table,
    communication_table,
    cross_site_table,
    evaluation_text,
    federation_lines,
    methods_table,
    operating_point_table,
    routers_table,
    site_table,
)
from medfed.reports.markdown import replace_marked_section, update_readme_section
from medfed.reports.text import UNRELIABLE_MARK, ci_text, count_text, rate_text
from medfed.runs import RunDir
from medfed.runs.schema import Summary
from tests.badinput import Shared
from tests.oldruns import before_intervals
from tests.test_schema import make_summary, router, site_figures, summary_dict


def test_method_specs_parse_parameters_and_wire_options() -> None:
    spec = MethodSpec.parse("fedals:base=feddrm,alpha=5@int8+delta")
    assert (spec.algorithm, spec.params) == ("fedals", {"base": "feddrm", "alpha": "5"})
    assert (spec.wire_precision, spec.wire_delta) == ("int8", True)
    plain = MethodSpec.parse("fedavg")
    assert (plain.params, plain.wire_precision, plain.wire_delta) == ({}, "float32", False)
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        MethodSpec.parse("fedprox:mu")
    with pytest.raises(ConfigError, match="delta"):
        MethodSpec.parse("fedavg@int8+zip")


def summary(system: float, nbytes: float) -> Summary:
    return make_summary(
        system_accuracy=system,
        bytes_per_round=nbytes,
        routing_method="majority_vote",
        routing_accuracy=None,
    )


def test_communication_table_compares_with_the_baseline() -> None:
    table = communication_table(
        {"fedavg": summary(0.80, 4e6), "lora@int8": summary(0.795, 2e5)}, baseline="fedavg"
    )
    row = next(line for line in table.splitlines() if line.startswith("| lora@int8"))
    assert "20.0x" in row and "-0.5" in row and "200.00 kB" in row
    assert "| method" in methods_table({"fedavg": summary(0.8, 4e6)})


def test_evaluate_tables_show_each_site_the_federation_and_every_router() -> None:
    run = Summary.from_dict(
        old_summary_dict(sites={"a": site_figures(0.8), "b": site_figures(None)})
    )

    sites = site_table(run)
    lines = federation_lines(run)
    routers = routers_table(run)

    row_b = next(line for line in sites.splitlines() if line.startswith("| b "))
    assert "n/a (test split holds one class)" in row_b and "1.00 MB" in row_b
    assert (
        "worst site: b" in lines and "system accuracy at op. point (density_ratio): 0.720" in lines
    )
    assert "| majority_vote " in routers and "| density_ratio " in routers


def test_marked_sections_are_replaced_and_missing_markers_refused() -> None:
    text = "a\n<!-- t:start -->\nold\n<!-- t:end -->\nb\n"
    assert (
        replace_marked_section(text, "t", "new") == "a\n<!-- t:start -->\nnew\n<!-- t:end -->\nb\n"
    )
    with pytest.raises(ValueError, match="markers"):
        replace_marked_section("no markers", "t", "new")


SECTION = "<!-- bench-table:start -->\nold\n<!-- bench-table:end -->\n"


def test_a_section_links_its_plots_relative_to_the_page_it_is_written_into(tmp_path) -> None:
    plot = tmp_path / "out" / "fundus.png"
    plot.parent.mkdir()
    plot.write_bytes(b"\x89PNG plot")
    pages = {  # page -> the plots' folder beside it, as its image links name it
        tmp_path / "README.md": "docs/bench",
        tmp_path / "docs" / "benchmarks.md": "bench",
        tmp_path / "docs" / "guide" / "speed.md": "../bench",
    }
    for page, plot_dir in pages.items():
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(f"# Bench\n{SECTION}tail\n", encoding="utf-8")
        body = f"![fundus]({plot_dir}/fundus.png)"
        update_readme_section(page, "bench-table", body, [plot], Path(plot_dir))
        text = page.read_text(encoding="utf-8")
        assert text.endswith(f"{body}\n<!-- bench-table:end -->\ntail\n") and "old" not in text
        link = re.search(r"\]\(([^)]*)\)", text)[1]
        assert (page.parent / link).read_bytes() == b"\x89PNG plot"
    # one folder of plots, whichever page links to it
    found = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.png"))
    assert found == ["docs/bench/fundus.png", "out/fundus.png"]


def test_a_page_without_the_markers_is_refused_before_any_plot_is_copied(tmp_path) -> None:
    page = tmp_path / "docs" / "benchmarks.md"
    page.parent.mkdir()
    page.write_text("# Bench\n", encoding="utf-8")
    with pytest.raises(ValueError, match="bench-table:start"):
        update_readme_section(page, "bench-table", "x", [tmp_path / "none.png"], Path("bench"))
    assert not (page.parent / "bench").exists()


# ---------------------------------------------------------------------------- CIs and counts
def test_one_figure_reads_the_same_from_an_interval_a_stored_interval_or_a_bare_value() -> None:
    iv = Interval(0.84, 0.78, 0.9, "DeLong")
    assert ci_text(iv) == ci_text(iv.to_dict()) == "0.840 (0.780\u20130.900)"
    assert ci_text(iv, digits=2) == "0.84 (0.78\u20130.90)"
    assert ci_text(None, 0.84) == "0.840" and ci_text(None) == "n/a"
    assert ci_text(None, 0.84, no_ci="CI n/a") == "0.840 (CI n/a)"
    assert ci_text(None, None, no_ci="CI n/a") == "n/a"
    assert rate_text(wilson(18, 20)) == f"{ci_text(wilson(18, 20).interval)} {count_text(18, 20)}"
    assert rate_text(wilson(0, 0)) == "n/a (0 scans)"
    assert (
        rate_text(None, 0.9) == "0.900" and rate_text(None, 0.9, no_ci="CI n/a") == "0.900 (CI n/a)"
    )


def rich_site(auc: float, n_pos: int, n_neg: int) -> dict[str, Any]:
    """A site's figures as a run with CIs writes them (real metric objects, to_dict'ed)."""
    y = np.array([1] * n_pos + [0] * n_neg)
    score = np.random.default_rng(n_pos).uniform(0.3, 0.9, y.size) - 0.2 * (y == 0)
    return site_figures(auc) | {
        "n_pos": n_pos,
        "n_neg": n_neg,
        "auc_ci": Interval(auc, auc - 0.1, min(1.0, auc + 0.1), "DeLong").to_dict(),
        "unreliable": unreliable(n_pos, n_neg),
        "operating_point": operating_point(y, score, 0.5, "specificity:0.9").to_dict(),
        "calibration": calibration(y, score).to_dict(),
    }


def rich_router(system: tuple[int, int], routing: tuple[int, int] | None) -> dict[str, Any]:
    rates = {"system_accuracy": wilson(*system), "abstain_rate": wilson(9, 180)}
    rates |= {"sensitivity": wilson(50, 80), "specificity": wilson(60, 90)}
    if routing is not None:
        rates["routing_accuracy"] = wilson(*routing)
    data = router(system[0] / system[1], None if routing is None else routing[0] / routing[1])
    return data | {"rates": {k: p.to_dict() for k, p in rates.items()}}


def rich_summary() -> Summary:
    cell = {"auc": 0.7, "auc_reason": None, "accuracy": 0.6, "n": 30}
    return make_summary(
        sites={"a": rich_site(0.84, 30, 40), "b": rich_site(0.7, 4, 20)},
        pooled_auc={
            "estimate": 0.8,
            "low": 0.7,
            "high": 0.88,
            "i2": 0.35,
            "tau2": 0.1,
            "q": 1.5,
            "n_sites": 2,
            "method": "DerSimonian-Laird on logit AUC",
        },
        worst_site_auc_ci=Interval(0.7, 0.6, 0.8, "DeLong").to_dict(),
        average_accuracy_by_train=0.66,
        cross_site={m: {d: cell for d in ("a", "b")} for m in ("a", "b")},
        routers={"density_ratio": rich_router((130, 180), (150, 180))},
        routers_origin_known={
            "density_ratio": rich_router((140, 180), (160, 180)),
            "majority_vote": rich_router((120, 180), None),
        },
        operating_rule="specificity:0.90",
    )


def row_of(table: str, first: str) -> str:
    return next(line for line in table.splitlines() if line.startswith(f"| {first} "))


def test_site_table_shows_auc_with_ci_method_counts_and_the_unreliable_marker() -> None:
    run = rich_summary()
    table = site_table(run)

    a, b = row_of(table, "a"), row_of(table, "b")
    assert "0.840 (0.740–0.940)" in a and "DeLong" in a and "30/40" in a
    assert UNRELIABLE_MARK not in a
    assert f"0.700 (0.600–0.800) {UNRELIABLE_MARK}" in b and "4/20" in b
    assert f"{UNRELIABLE_MARK} unreliable at b: fewer than 10 positives (4)" in table


def test_operating_points_and_calibration_show_rates_with_ci_and_counts() -> None:
    run = rich_summary()
    op = run.sites["a"].operating_point
    ops = row_of(operating_point_table(run), "a")
    for rate in (op.sensitivity, op.specificity, op.ppv, op.npv):
        assert rate.text() in ops
    assert f"{op.tp}/{op.fp}/{op.tn}/{op.fn}" in ops and "specificity:0.9" in ops
    assert f"{UNRELIABLE_MARK}" in row_of(operating_point_table(run), "b")

    c = run.sites["a"].calibration
    cells = [cell.strip() for cell in row_of(calibration_table(run), "a").split("|")[1:-1]]
    figures = [f"{v:.3f}" for v in (c.brier, c.ece, c.intercept)]
    assert c.slope_ci is not None and c.slope_ci[0] < c.slope < c.slope_ci[1]
    slope = f"{c.slope:.3f} ({c.slope_ci[0]:.2f}-{c.slope_ci[1]:.2f})"  # with its Wald 95% CI
    assert cells == ["a", str(c.n), *figures, slope, ""]  # no note: every figure is defined


def test_federation_lines_give_the_pool_the_worst_site_and_both_weightings() -> None:
    lines = federation_lines(rich_summary())

    assert "pooled AUC (random effects): 0.800 (0.700–0.880), I² 35% over 2 sites" in lines[1]
    assert "worst site AUC: 0.700 (0.600–0.800) [DeLong]" in lines
    assert "average accuracy at argmax (weighted by test scans): 0.700" in lines
    assert "average accuracy at argmax (weighted by training scans): 0.660" in lines
    assert "system accuracy at op. point (density_ratio): 0.722 (0.653–0.782) 130/180" in lines


def test_routers_are_shown_under_both_protocols_with_their_intervals() -> None:
    run = rich_summary()
    unknown = routers_table(run, ORIGIN_UNKNOWN)
    known = routers_table(run, ORIGIN_KNOWN)

    assert wilson(130, 180).text() in row_of(unknown, "density_ratio")
    assert wilson(140, 180).text() in row_of(known, "density_ratio")
    assert "| n/a " in row_of(known, "majority_vote")  # a vote routes nowhere
    text = evaluation_text(run)
    assert "Routers, origin unknown (each candidate site" in text
    assert "Routers, origin known (the scan is normalized with its own site's" in text
    with pytest.raises(ValueError, match="protocol"):
        routers_table(run, "somewhere")


def test_cross_site_matrix_has_a_row_per_model_and_a_column_per_test_split() -> None:
    table = cross_site_table(rich_summary())
    assert table.splitlines()[0].split("|")[2:4] == [" a     ", " b     "]
    assert row_of(table, "b").count("0.700") == 2
    # Beside the matrix: the routed system on each site's scans, under both protocols.
    text = evaluation_text(rich_summary())
    assert wilson(9, 12).text() in row_of(text, "routed system (density_ratio), origin known")


def old_summary_dict(**changes: Any) -> dict[str, Any]:
    """summary.json as a run written before the clinical figures holds it."""
    return before_intervals(summary_dict(**changes))


def test_an_old_run_without_the_new_fields_still_prints_everything_as_na() -> None:
    run = Summary.from_dict(old_summary_dict())
    assert run.sites["a"].auc_ci is None and not run.routers_origin_known

    text = evaluation_text(run)

    assert "| 0.800 " in row_of(site_table(run), "a") and "| n/a " in row_of(site_table(run), "a")
    assert "Operating points: n/a (not in this run)" in text
    assert "Calibration: n/a (not in this run)" in text
    assert "Cross-site matrix: n/a (not in this run)" in text
    assert "pooled AUC (random effects): n/a" in text
    assert "average accuracy at argmax (weighted by training scans): n/a" in text
    assert (
        "Routers, origin known (the scan is normalized" in text and "n/a (not in this run)" in text
    )
    # The per-site tables of a run with some sites lacking figures still print.
    assert "no operating point in this run" in operating_point_table(run)
    assert "no calibration in this run" in calibration_table(run)


def test_medfed_evaluate_prints_the_tables_and_json_prints_every_field(
    tmp_path: Path, shared: Shared
) -> None:
    run = RunDir(shared.copy_run(tmp_path))  # a finished run (with its model/), these figures
    run.write_summary(rich_summary())
    runner = CliRunner()

    result = runner.invoke(app, ["evaluate", str(run.path)])
    as_json = runner.invoke(app, ["evaluate", str(run.path), "--json"])

    assert result.exit_code == 0, result.output
    assert "0.840 (0.740–0.940)" in result.output and "origin known" in result.output
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.output)
    assert data["sites"]["b"]["unreliable"] == "fewer than 10 positives (4)"
    assert data["routers_origin_known"]["majority_vote"]["rates"]["system_accuracy"]["k"] == 120


# ---------------------------------------------------------------------------- prospective review
def _reviewed_run(tmp_path: Path) -> Path:
    """A finished run (config and summary) whose audit log holds four routed scans, three read
    (two of them by two readers) and one abstained."""
    from medfed.clinic.review import Review
    from tests.test_review import at, entry, make_run

    run = make_run(
        tmp_path / "run",
        [
            entry(at(1), prediction="glaucoma"),
            entry(at(1), site="refuge", prediction="normal"),
            entry(at(1), prediction="glaucoma"),
            entry(at(1), status="abstained", prediction="normal"),
        ],
    )
    RunDir(run).write_summary(summary_dict())
    review = Review(run)
    review.record(1, "Dr Ames", "glaucoma", time=at(2))
    review.record(1, "Dr Baker", "glaucoma", time=at(2))
    review.record(2, "Dr Ames", "glaucoma", time=at(2))
    review.record(2, "Dr Baker", "normal", time=at(2))
    review.record(3, "Dr Ames", "ungradable", time=at(2))
    return run


def test_prospective_table_shows_each_scope_with_its_ci_counts_and_notes(tmp_path) -> None:
    from medfed.clinic.review import Review
    from medfed.reports.prospective import prospective_table

    figures = Review(_reviewed_run(tmp_path)).figures()
    text = prospective_table(figures.rows())
    lines = text.splitlines()
    assert [c.strip() for c in lines[0].split("|")[1:-1]] == [
        "scope", "sensitivity", "specificity", "agreement with reader", "kappa between readers",
        "ungradable rate", "abstain rate",
    ]  # fmt: skip
    system = next(line for line in lines if line.startswith("| system"))
    sens = figures.scope("system").operating.sensitivity
    assert f"{sens.text()} {UNRELIABLE_MARK}" in system  # 2 positives: flagged
    assert wilson(1, 4).text() in system  # abstain rate: 1 of the 4 routed scans
    assert "0.333 (0.061\u20130.792) 1/3" in system  # ungradable: scan 3 of the 3 read
    assert f"{UNRELIABLE_MARK} unreliable at system (sensitivity): fewer than 10" in text
    assert "specificity: no scans (acrima, refuge, system)" in text  # every read says glaucoma
    assert "abstain rate: abstentions have no site; see the system row (acrima, refuge)" in text


def test_the_study_report_shows_the_prospective_review_only_with_reads(tmp_path) -> None:
    from medfed.clinic.review import prospective_rows
    from medfed.reports.study import load_study, render_study

    run = _reviewed_run(tmp_path)
    rows = prospective_rows(run)
    text = render_study(load_study([run]), prospective={run: rows})
    section = text.split('<section id="review">')[1].split("</section>")[0]
    assert "<h2>Prospective review</h2>" in section and 'href="#review"' in text
    assert '<th scope="row">system</th>' in section and "kappa between readers" in section
    plain = render_study(load_study([run]))
    assert 'id="review"' not in plain and "Prospective review" not in plain
    assert prospective_rows(tmp_path / "elsewhere") == []  # no audit log: no section


def test_medfed_report_adds_the_prospective_review_of_a_run_with_reads(
    tmp_path: Path, shared: Shared
) -> None:
    from medfed.clinic.review import Review
    from tests.test_review import at, entry

    run = shared.copy_run(tmp_path)
    (run / "audit.sqlite").unlink(missing_ok=True)
    runner = CliRunner()
    plain = runner.invoke(app, ["report", str(run), "--out", str(tmp_path / "plain.html")])
    assert plain.exit_code == 0, plain.output
    assert 'id="review"' not in (tmp_path / "plain.html").read_text(encoding="utf-8")
    classes = Review(run).labels.classes
    AuditLog(run).append([entry(at(1), prediction=classes[1]), entry(at(1), prediction=classes[0])])
    Review(run).record(1, "Dr Ames", classes[1], time=at(2))
    Review(run).record(2, "Dr Ames", classes[1], time=at(2))
    made = runner.invoke(app, ["report", str(run), "--out", str(tmp_path / "report.html")])
    assert made.exit_code == 0, made.output
    text = (tmp_path / "report.html").read_text(encoding="utf-8")
    section = text.split('<section id="review">')[1].split("</section>")[0]
    assert "<h2>Prospective review</h2>" in section
    assert "0.500 (0.095\u20130.905) 1/2" in section  # sensitivity: one of two positives called
    assert 'id="disagreements"' not in text  # one reader so far: nobody disagrees
    # A second reader reads scan 1 otherwise: the report lists it, with both reads.
    Review(run).record(1, "Dr Baker", classes[0], time=at(3))
    again = runner.invoke(app, ["report", str(run), "--out", str(tmp_path / "again.html")])
    assert again.exit_code == 0, again.output
    text = (tmp_path / "again.html").read_text(encoding="utf-8")
    section = text.split('<section id="disagreements">')[1].split("</section>")[0]
    assert "<h2>Reader disagreements</h2>" in section and 'href="#disagreements"' in text
    assert f"Dr Ames: {classes[1]}; Dr Baker: {classes[0]}" in section


def test_the_study_report_holds_the_paired_comparisons_written_beside_the_runs(tmp_path) -> None:
    from medfed.clinic.review import disagreement_rows
    from medfed.reports.study import load_study, render_study
    from medfed.reports.study_checks import comparisons_section, read_comparisons

    out = tmp_path / "demo_out"
    run = _reviewed_run(out / "runs")
    comparisons = {
        "reference": "feddrm",
        "ci": "feddrm minus each method; 95% percentile interval of a paired bootstrap",
        "verdict_rule": "ahead: the whole interval above 0",
        "figures": {
            "system_accuracy": {
                "label": "system accuracy at op. point",
                "protocol": "origin unknown",
            }
        },
        "methods": {
            "fedavg": {
                "system_accuracy": {
                    "interval": {"estimate": 0.05, "low": 0.01, "high": 0.09},
                    "verdict": "ahead",
                }
            }
        },
    }
    record = {"command": "medfed demo", "seed": 0, "methods": ["feddrm", "fedavg"]}
    (out / "demo-table.json").write_text(json.dumps(record | {"comparisons": comparisons}))
    (out / "compare-table.json").write_text("{not json")  # unreadable: left out

    runs = load_study([run])
    found = read_comparisons(runs)
    text = render_study(runs, comparisons=found, disagreements={run: disagreement_rows(run)})

    assert list(found) == [out / "demo-table.json"]
    section = text.split('<section id="comparisons">')[1].split("</section>")[0]
    assert "<h2>Paired comparisons</h2>" in section
    assert "feddrm \u2212 method: system accuracy at op. point (origin unknown)" in section
    assert "+0.050 (+0.010 to +0.090) ahead" in section
    assert (
        "seed 0, system accuracy at op. point (origin unknown): feddrm ahead of fedavg." in section
    )
    # Scan 2: Dr Ames read glaucoma, Dr Baker normal.
    section = text.split('<section id="disagreements">')[1].split("</section>")[0]
    assert "Dr Ames: glaucoma; Dr Baker: normal" in section
    assert comparisons_section({}) == []
    plain = render_study(runs)
    assert 'id="comparisons"' not in plain and 'id="disagreements"' not in plain


# The decision rules an accuracy column may be taken at; routing accuracy (the share of scans
# sent to their own site) decides no label and has none.
RULE_WORDS = ("at op. point", "at argmax")


def assert_every_accuracy_column_names_its_rule(markdown: str) -> None:
    """Every header cell of every markdown table in ``markdown`` that holds an accuracy names
    the rule it is taken at."""
    lines = markdown.splitlines()
    headers = [
        line
        for line, below in zip(lines, lines[1:], strict=False)
        if line.startswith("|") and below.startswith("| ---")
    ]
    assert headers, "no markdown table found"
    for line in headers:
        for cell in (c.strip() for c in line.split("|")[1:-1]):
            if "acc" in cell.lower() and "routing acc" not in cell.lower():
                assert any(rule in cell for rule in RULE_WORDS), f"{cell!r} names no rule"


def test_every_accuracy_column_of_the_evaluate_tables_names_its_rule() -> None:
    run = rich_summary()
    text = evaluation_text(run)

    assert_every_accuracy_column_names_its_rule(text)
    assert_every_accuracy_column_names_its_rule(methods_table({"fedavg": summary(0.8, 4e6)}))
    assert_every_accuracy_column_names_its_rule(
        communication_table({"fedavg": summary(0.8, 4e6)}, baseline="fedavg")
    )
    assert "at op. point: each site's model calls a scan positive at the threshold" in text
    a = run.sites["a"]
    op = a.operating_point
    at_point = (op.tp + op.tn) / (op.tp + op.fp + op.tn + op.fn)
    assert a.operating_accuracy == pytest.approx(at_point)
    cells = [c.strip() for c in row_of(site_table(run), "a").split("|")[1:-1]]
    assert cells[5:7] == [f"{at_point:.3f}", f"{a.accuracy:.3f}"]


def test_the_average_accuracy_at_the_operating_point_is_stored_and_read_from_old_runs() -> None:
    run = rich_summary()
    sites = run.sites.values()
    by_test = sum(m.operating_accuracy * m.n_test for m in sites) / sum(m.n_test for m in sites)
    by_train = sum(m.operating_accuracy * m.n_train for m in sites) / sum(m.n_train for m in sites)

    assert run.average_accuracy_operating == pytest.approx(by_test)
    assert run.average_accuracy_operating_by_train == pytest.approx(by_train)
    written = run.to_dict()
    assert written["average_accuracy_operating"] == pytest.approx(by_test)
    assert Summary.from_dict(written) == run
    # A run written before the field reads it from its sites' operating points; a site
    # without one counts at argmax, the rule its system answers by.
    old = Summary.from_dict(old_summary_dict())
    assert "average_accuracy_operating" not in old_summary_dict()
    expected = sum(m.accuracy * m.n_test for m in old.sites.values()) / sum(
        m.n_test for m in old.sites.values()
    )
    assert old.average_accuracy_operating == pytest.approx(expected)
    lines = federation_lines(run)
    assert f"average accuracy at op. point (weighted by test scans): {by_test:.3f}" in lines
