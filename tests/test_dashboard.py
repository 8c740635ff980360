"""The clinician dashboard on small real runs: every page through Streamlit's AppTest, the run
directory data it reads (site overview, ROC points), and the ``medfed dashboard`` command."""

from __future__ import annotations

import base64
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nibabel.testing
import numpy as np
import pydicom.data
import pytest
import torch
from streamlit import config as streamlit_config
from streamlit.testing.v1 import AppTest
from typer.testing import CliRunner

from medfed.cli import app
from medfed.clinic.audit import AuditLog
from medfed.clinic.route import route_one
from medfed.config import Modality, TrainConfig
from medfed.core.units import human_bytes
from medfed.dashboard import APP, RUNS_ENV
from medfed.dashboard.charts import CHOSEN, NOT_RELIED_ON, WORST
from medfed.dashboard.launch import streamlit_command
from medfed.dashboard.rundata import (
    audit_frame,
    audit_table,
    filter_audit,
    find_runs,
    label_runs,
)
from medfed.data.overview import read_site_overview, to_picture, write_site_overview
from medfed.federation.training import load_sites, train
from medfed.routing.bundle import TrainedFederation, mixture_coefficients
from medfed.routing.routers import make_router
from medfed.runs import SCHEMA_VERSION, RunDir
from tests.dashboard_runs import (
    DROPPED_SITE,
    ROUNDS,
    DashboardRuns,
    clinical_summary,
    dashboard_runs,  # noqa: F401 - the session fixture
    old_summary,
    write_summary_run,
)

SITES = ["acrima", "refuge", "rimone"]
MANIFEST_ORDER = ["acrima", "rimone", "refuge"]  # as synthesize() lists the sites
WARN = "\u26a0"  # the unreliable marker
TIMEOUT = 120  # seconds per script run: the first one imports torch and plotly


@pytest.fixture(scope="module")
def runs(dashboard_runs: DashboardRuns) -> DashboardRuns:  # noqa: F811
    return dashboard_runs


def serve_on_loopback(address: str | None = "127.0.0.1") -> None:
    """As 'medfed dashboard' starts Streamlit (the app shows nothing on other addresses)."""
    streamlit_config.set_option("server.address", address)


def open_page(monkeypatch, roots: list[Path], page: str | None = None) -> AppTest:
    """Run the app over ``roots`` and switch to ``views/<page>.py``; fail on any exception."""
    monkeypatch.setenv(RUNS_ENV, os.pathsep.join(map(str, roots)))
    serve_on_loopback()
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT).run()
    if page is not None:
        at.switch_page(f"views/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def pick(at: AppTest, key: str, value: str) -> AppTest:
    at.selectbox(key=key).set_value(value).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def texts(at: AppTest, *kinds: str) -> str:
    """Everything shown as the given element kinds, as one string."""
    return "\n".join(str(e.value) for kind in kinds for e in at.get(kind))


def figures(at: AppTest) -> list[dict]:
    """The page's Plotly figures as plain JSON (typed arrays decoded to lists)."""
    return [json.loads(e.proto.spec, object_hook=_plain) for e in at.get("plotly_chart")]


def _plain(obj: dict):
    if set(obj) >= {"dtype", "bdata"}:  # Plotly's base64 typed array
        values = np.frombuffer(base64.b64decode(obj["bdata"]), dtype=obj["dtype"])
        if "shape" in obj:
            values = values.reshape([int(n) for n in str(obj["shape"]).split(",")])
        return values.tolist()
    return obj


def trace_names(figure: dict) -> set[str]:
    return {t.get("name") for t in figure["data"]}


def summary_of(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def copy_run(source: Path, tmp_path: Path) -> Path:
    target = tmp_path / "runs" / source.name
    shutil.copytree(source, target)
    (target / "audit.sqlite").unlink(missing_ok=True)
    return target


# ---------------------------------------------------------------------------- run directory data
def test_summary_holds_a_roc_curve_for_every_site(runs: DashboardRuns) -> None:
    for run in (runs.feddrm, runs.fedavg):
        for site, figures_ in summary_of(run)["sites"].items():
            roc = figures_["roc"]
            assert roc["fpr"][0] == 0 and roc["fpr"][-1] == 1, site
            assert roc["tpr"] == sorted(roc["tpr"]) and roc["tpr"][-1] == 1
            assert len(roc["fpr"]) == len(roc["tpr"]) == len(roc["thresholds"])


def test_site_overview_holds_cards_counts_samples_distances_and_embedding(runs) -> None:
    overview = read_site_overview(runs.feddrm)
    assert overview is not None and sorted(overview["sites"]) == SITES
    for site, info in overview["sites"].items():
        assert sum(sum(per.values()) for per in info["counts"].values()) == 24
        assert sum(info["class_ratio"].values()) == pytest.approx(1.0)
        card = (runs.feddrm / "site_overview" / info["card"]).read_text()
        assert card.startswith(f"# Data card: {site}")
        assert {s["label"] for s in info["samples"]} == {"normal", "glaucoma"}
        assert all((runs.feddrm / "site_overview" / s["file"]).is_file() for s in info["samples"])
    d = overview["distances"]
    matrix = d["matrix"]
    assert [matrix[i][i] for i in range(3)] == [0, 0, 0]
    assert all(matrix[i][j] == matrix[j][i] > 0 for i in range(3) for j in range(3) if i != j)
    card = (runs.feddrm / "site_overview" / "cards" / f"{d['sites'][0]}.md").read_text()
    assert f"- {d['sites'][1]}: {matrix[0][1]:.4f}" in card  # the card and the matrix agree
    embedding = overview["embedding"]
    assert len(embedding["x"]) == len(embedding["site"]) == 3 * 24
    assert set(embedding["site"]) == set(SITES)


def test_sample_pictures_show_the_middle_ct_slice_and_stretch_unscaled_values() -> None:
    volume = torch.zeros(1, 5, 4, 3)
    volume[0, 2] = torch.linspace(0, 1, 12).reshape(4, 3)  # only the middle slice is lit
    picture = to_picture(volume, Modality.CT)
    assert picture.shape == (4, 3) and picture.dtype == np.uint8
    assert picture.min() == 0 and picture.max() == 255
    photo = to_picture(torch.full((3, 2, 2), 0.5), Modality.FUNDUS)
    assert photo.shape == (2, 2, 3) and (photo == 128).all()  # in [0, 1]: kept as it is
    normalized = to_picture(torch.tensor([[[-2.0, 2.0]]]).expand(3, 1, 2), Modality.FUNDUS)
    assert normalized[0, 0].tolist() == [0, 0, 0] and normalized[0, 1].tolist() == [255] * 3


def test_runs_are_found_below_folders_and_named_apart(tmp_path: Path) -> None:
    for folder in ("a/runs/feddrm", "b/feddrm", "a/runs/fedavg", "a/runs/fedavg/checkpoints/x"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "config.toml").write_text("")
    found = find_runs([tmp_path / "a", tmp_path / "b", tmp_path / "a/runs/fedavg"])
    labels = [r.label for r in label_runs(found)]
    assert labels == ["fedavg", "runs/feddrm", "b/feddrm"]
    assert find_runs([tmp_path / "missing"]) == []


def test_audit_filters_combine(tmp_path: Path, runs: DashboardRuns) -> None:
    run = copy_run(runs.feddrm, tmp_path)
    fed = TrainedFederation.load(run, "cpu")
    photo, dicom = runs.fundus_photo(), Path(pydicom.data.get_testdata_file("CT_small.dcm"))
    router = make_router("auto", fed)
    AuditLog(run).append([route_one(fed, router, p) for p in (photo, dicom, tmp_path / "no.jpg")])
    frame = audit_frame(AuditLog(run).read())
    assert len(filter_audit(frame)) == 3
    assert filter_audit(frame, statuses=["error"])["file"].tolist() == [str(tmp_path / "no.jpg")]
    assert filter_audit(frame, text="ct_SMALL")["status"].tolist() == ["abstained"]
    assert filter_audit(frame, statuses=["error"], text="ct_small").empty
    # an abstained or failed scan has no probability and a routed one no reason: shown as
    # n/a or blank, never None or nan
    shown = audit_table(frame)
    cells = [str(v) for v in shown.to_numpy().ravel()]
    assert not [c for c in cells if c in ("None", "nan", "NaN", "<NA>")], shown.to_dict("records")
    assert "n/a" in shown["probability"].tolist()


def test_the_traffic_panels_titles_keep_clear_of_the_panels_above() -> None:
    """Four methods: two rows of panels; each row's titles sit in a gap of their own, not on
    the round axis of the row above."""
    import pandas as pd

    from medfed.dashboard.charts import traffic_lines

    rows = [
        {"method": m, "site": s, "round": r, "bytes_up": 1000.0 * (i + 1)}
        for i, m in enumerate(["fedavg", "feddrm", "fedprox", "lora"])
        for s in ("a", "b")
        for r in (1, 2, 3)
    ]
    fig = traffic_lines(pd.DataFrame(rows), "bytes_up")
    domains = sorted({tuple(fig.layout[k].domain) for k in fig.layout if k.startswith("yaxis")})
    assert len(domains) == 2
    (low_bottom, low_top), (high_bottom, _) = domains
    margin = fig.layout.margin
    height = fig.layout.height - (margin.t or 100) - (margin.b or 80)  # plotly's defaults
    assert (high_bottom - low_top) * height >= 60  # pixels for the axis labels and the titles


# ------------------------------------------------------------------------------------- pages
def ci_text(figures_: dict) -> str:
    """A site's AUC cell as the page should show it, from summary.json."""
    ci = figures_.get("auc_ci")
    if figures_["auc"] is None:
        text = "n/a"
    elif ci is None:
        text = f"{figures_['auc']:.3f} (CI n/a)"
    else:
        text = f"{ci['estimate']:.3f} ({ci['low']:.3f}\u2013{ci['high']:.3f})"
    return text + (" \u26a0" if figures_.get("unreliable") else "")


def test_federation_page_puts_each_methods_per_site_auc_side_by_side(monkeypatch, runs) -> None:
    at = open_page(monkeypatch, [runs.runs])
    assert at.title[0].value == "Federation" and not at.error
    aucs = at.table[0].value
    assert list(aucs.columns) == ["n test (pos / neg)", "fedavg", "feddrm", "reliability"]
    assert sorted(aucs.index) == SITES
    with_ci = 0
    for method, run in (("fedavg", runs.fedavg), ("feddrm", runs.feddrm)):
        summary = summary_of(run)
        for site in SITES:
            figures_ = summary["sites"][site]
            assert aucs.loc[site, method] == ci_text(figures_)
            assert aucs.loc[site, method].startswith(f"{figures_['auc']:.3f}")
            with_ci += figures_["auc_ci"] is not None
            counts = f"{figures_['n_test']} ({figures_['n_pos']} pos / {figures_['n_neg']} neg)"
            assert aucs.loc[site, "n test (pos / neg)"] == counts
            if figures_["unreliable"]:
                marker = f"\u26a0 unreliable: {figures_['unreliable']}"
                assert aucs.loc[site, "reliability"] == marker
        assert with_ci  # the trained runs do carry CIs
        worst = next(m for m in at.metric if m.label == f"Worst site: {method}")
        assert worst.value == summary["worst_site"]
        worst_site = summary["sites"][summary["worst_site"]]
        assert worst.delta == "AUC " + ci_text(worst_site)
        if worst_site["unreliable"]:
            warning = f"{summary['worst_site']}: {WARN} unreliable: {worst_site['unreliable']}"
            assert f"Worst site of {method}, {warning}" in texts(at, "caption")
        figures_ = at.table[1].value
        assert figures_.loc["worst site", method] == summary["worst_site"]
        system = f"{summary['system_accuracy']:.3f}"
        assert figures_.loc["system accuracy at op. point", method] == system
        assert figures_.loc["AUC Gini", method] == f"{summary['auc_gini']:.3f}"


def title_of(figure: dict) -> str:
    return figure["layout"].get("title", {}).get("text", "")


def roc_figure(at: AppTest, title: str) -> dict:
    return next(f for f in figures(at) if title in title_of(f))


def test_federation_page_draws_a_roc_curve_per_site(monkeypatch, runs) -> None:
    at = open_page(monkeypatch, [runs.runs])
    pick(at, "roc_method", "feddrm")
    roc = roc_figure(at, "feddrm: test ROC per site")
    sites = summary_of(runs.feddrm)["sites"]
    curves = {f"{s}: AUC {ci_text(sites[s])}" for s in SITES}
    assert trace_names(roc) == curves | {"operating point"}
    curve = next(t for t in roc["data"] if t["name"].startswith("acrima"))
    assert list(curve["x"]) == sites["acrima"]["roc"]["fpr"]
    marks = next(t for t in roc["data"] if t["name"] == "operating point")
    specificity = sites["acrima"]["operating_point"]["specificity"]["value"]
    assert marks["x"][0] == pytest.approx(1 - specificity)


def test_federation_page_overlays_the_methods_roc_curves_at_one_site(monkeypatch, runs) -> None:
    at = open_page(monkeypatch, [runs.runs])
    pick(at, "roc_site", "refuge")
    roc = roc_figure(at, "refuge: test ROC per method")
    names = trace_names(roc)
    for method, run in (("fedavg", runs.fedavg), ("feddrm", runs.feddrm)):
        refuge = summary_of(run)["sites"]["refuge"]
        assert f"{method}: AUC {ci_text(refuge)}" in names
        curve = next(t for t in roc["data"] if t["name"].startswith(f"{method}:"))
        assert list(curve["x"]) == refuge["roc"]["fpr"]
        assert list(curve["y"]) == refuge["roc"]["tpr"]
    at = open_page(monkeypatch, [runs.feddrm])  # one run: nothing to overlay, and it says so
    assert "Select several runs" in texts(at, "caption")
    assert not any(
        "per method" in f["layout"].get("title", {}).get("text", "") for f in figures(at)
    )


# ------------------------------------------------------------ clinical figures (crafted summaries)
def wilson_text(k: int, n: int) -> str:
    """A rate as the page shows it, with its Wilson 95% interval worked out here."""
    z, p = 1.959963984540054, k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return f"{p:.3f} ({centre - half:.3f}\u2013{centre + half:.3f}) {k}/{n}"


@pytest.fixture(scope="module")
def crafted(tmp_path_factory) -> Path:
    """A folder with a run whose every clinical figure is known, and the same run as written
    before those figures existed."""
    base = tmp_path_factory.mktemp("crafted") / "runs"
    write_summary_run(base / "clinical", clinical_summary())
    write_summary_run(base / "old", old_summary())
    return base


@pytest.fixture(scope="module")
def crafted_page(crafted: Path) -> AppTest:
    """The Federation page over both crafted runs (run once, read by several tests)."""
    with pytest.MonkeyPatch.context() as patch:
        at = open_page(patch, [crafted])
    assert not at.error, texts(at, "error")
    return at


def table_with(at: AppTest, column: str):
    return next(t.value for t in at.table if column in t.value.columns)


def test_per_site_table_shows_cis_counts_and_flags_a_site_with_4_positives(crafted_page) -> None:
    at = crafted_page
    aucs = at.table[0].value
    assert list(aucs.columns) == ["n test (pos / neg)", "clinical", "old", "reliability"]
    assert aucs.loc["acrima", "clinical"] == "0.840 (0.780\u20130.900)"
    assert aucs.loc["rimone", "clinical"] == "0.700 (0.450\u20130.920) \u26a0"
    assert aucs.loc["rimone", "old"] == "0.700 (CI n/a)"  # the old run has no CI: n/a, no crash
    assert aucs.loc["rimone", "n test (pos / neg)"] == "30 (4 pos / 26 neg)"
    assert aucs.loc["acrima", "n test (pos / neg)"] == "120 (40 pos / 80 neg)"
    assert aucs.loc["rimone", "reliability"] == "\u26a0 unreliable: fewer than 10 positives (4)"
    assert aucs.loc["acrima", "reliability"] == ""

    worst = next(m for m in at.metric if m.label == "Worst site: clinical")
    assert worst.value == "rimone"
    assert worst.delta == "AUC 0.700 (0.450\u20130.920) \u26a0"
    warning = "Worst site of clinical, rimone: \u26a0 unreliable: fewer than 10 positives (4)"
    assert warning in texts(at, "caption")
    pooled = next(m for m in at.metric if m.label == "Pooled AUC: clinical")
    assert pooled.value == "0.820" and pooled.delta.startswith(
        "95% CI 0.710\u20130.890, I\u00b2 35%"
    )
    assert next(m for m in at.metric if m.label == "Pooled AUC: old").value == "n/a"
    federation = at.table[1].value
    pooled_row = federation.loc["pooled AUC (random effects, 95% CI)"]
    assert pooled_row["clinical"] == "0.820 (0.710\u20130.890), I\u00b2 35% over 3 sites"
    assert pooled_row["old"] == "n/a"
    assert federation.loc["worst site AUC (95% CI)", "clinical"] == "0.700 (0.450\u20130.920)"
    system = federation.loc["system accuracy at op. point (95% CI)", "clinical"]
    assert system == wilson_text(280, 350)

    bars = next(f for f in figures(at) if f["data"][0]["type"] == "bar")
    clinical = next(t for t in bars["data"] if t["name"] == "clinical")
    assert clinical["x"] == list(SITES)
    assert clinical["error_y"]["array"] == pytest.approx([0.06, 0.05, 0.22])
    assert clinical["error_y"]["arrayminus"] == pytest.approx([0.06, 0.06, 0.25])
    assert clinical["marker"]["pattern"]["shape"] == ["", "", "/"]  # rimone: hatched
    assert clinical["marker"]["line"]["width"] == [0, 0, 3]  # the worst site outlined
    assert bars["layout"]["xaxis"]["ticktext"] == ["acrima", "refuge", "rimone \u26a0"]
    old = next(t for t in bars["data"] if t["name"] == "old")
    assert old["error_y"]["visible"] is False  # no CI in the old run: no whiskers drawn
    assert WORST not in {t["marker"]["color"] for t in bars["data"]}  # red marks the worst only
    assert "fewer than 10 positives (4)" in clinical["text"][2]


def test_operating_points_and_calibration_per_site(crafted_page) -> None:
    at = crafted_page
    points = table_with(at, "threshold")
    assert list(points.index) == list(SITES)
    assert points.loc["rimone", "threshold"] == "0.550"
    assert points.loc["acrima", "threshold"] == "0.420"
    assert points.loc["rimone", "rule"] == "specificity:0.9"
    assert points.loc["rimone", "sensitivity"] == wilson_text(3, 4)
    assert points.loc["rimone", "specificity"] == wilson_text(20, 26)
    assert points.loc["rimone", "PPV"] == wilson_text(3, 9)
    assert points.loc["rimone", "NPV"] == wilson_text(20, 21)
    assert points.loc["rimone", "TP / FP / TN / FN"] == "3 / 6 / 20 / 1"
    assert points.loc["rimone", "reliability"].startswith("\u26a0 unreliable")
    assert points.loc["refuge", "reliability"] == ""

    calibration = table_with(at, "Brier")
    assert calibration.loc["refuge"].to_dict() == {
        "n": "200",
        "Brier": "0.120",
        "ECE": "0.070",
        "intercept": "-0.200",
        "slope": "0.850",
        "note": "",
        "reliability": "",
    }
    diagram = next(f for f in figures(at) if "reliability" in title_of(f))
    assert trace_names(diagram) == {"acrima", "refuge", "rimone \u26a0", "perfect calibration"}
    refuge = next(t for t in diagram["data"] if t["name"] == "refuge")
    assert list(refuge["x"]) == [0.1, 0.5, 0.9] and list(refuge["y"]) == [0.05, 0.4, 0.8]
    diagonal = next(t for t in diagram["data"] if t["name"] == "perfect calibration")
    assert list(diagonal["x"]) == [0, 1] and list(diagonal["y"]) == [0, 1]


def test_cross_site_heatmap_and_both_protocols(crafted_page) -> None:
    at = crafted_page
    heatmap = next(f for f in figures(at) if f["data"][0]["type"] == "heatmap")
    assert title_of(heatmap) == "Cross-site AUC (rows: model's site, columns: data's site)"
    cells = heatmap["data"][0]
    assert cells["y"] == list(SITES)  # rows: the model's site
    assert cells["x"] == ["acrima", "refuge", "rimone \u26a0"]  # columns: the data's site
    assert cells["z"][0][1] == pytest.approx(0.66)  # acrima's model on refuge's scans
    assert cells["z"][0][2] is None and cells["text"][0][2] == "n/a"  # undefined AUC
    assert cells["customdata"][1][0][:2] == ["0.690", "120"]  # accuracy and scans in hover
    assert "accuracy" in cells["hovertemplate"]

    systems = table_with(at, "system accuracy at op. point")
    unknown = systems.loc[("origin unknown", "density_ratio (default)")]
    known = systems.loc[("origin known", "density_ratio (default)")]
    assert unknown["system accuracy at op. point"] == wilson_text(280, 350)
    assert known["system accuracy at op. point"] == wilson_text(300, 350)
    assert known["sensitivity"] == wilson_text(70, 88)
    assert systems.loc[("origin unknown", "majority_vote"), "routing accuracy"] == "n/a"


def test_a_run_written_before_the_clinical_figures_shows_n_a(monkeypatch, crafted) -> None:
    at = open_page(monkeypatch, [crafted / "old"])
    assert not at.error and not at.exception
    aucs = at.table[0].value
    assert aucs.loc["acrima", "old"] == "0.840 (CI n/a)"
    assert aucs.loc["acrima", "n test (pos / neg)"] == "120 (pos / neg n/a)"
    assert aucs.loc["acrima", "reliability"] == "n/a"
    assert next(m for m in at.metric if m.label == "Worst site: old").delta == "AUC 0.700 (CI n/a)"
    assert at.table[1].value.loc["pooled AUC (random effects, 95% CI)", "old"] == "n/a"
    info = texts(at, "info")
    for missing in ("no operating points", "no calibration figures", "no cross-site figures"):
        assert missing in info
    assert "no ROC curve (summary.json holds no ROC points" in info
    systems = table_with(at, "system accuracy at op. point")
    at_op = "system accuracy at op. point"
    assert systems.loc[("origin unknown", "density_ratio (default)"), at_op] == ("0.800 (CI n/a)")
    assert "no origin-known figures" in texts(at, "caption")


def test_training_page_plots_rounds_per_site_and_marks_the_dropout_and_resume(
    monkeypatch, runs
) -> None:
    at = open_page(monkeypatch, [runs.runs], "training")
    pick(at, "training_run", "feddrm")
    assert not at.error
    loss, auc = [f for f in figures(at) if "runs compared" not in title_of(f)][:2]
    assert trace_names(loss) == {*SITES, "dropped out"}
    legend = [t["name"] for t in loss["data"] if t["name"] in SITES]
    assert legend == MANIFEST_ORDER  # sites in the order of their manifests
    assert "AUC" in auc["layout"]["title"]["text"]
    rounds = {x for t in loss["data"] if t["name"] in SITES for x in t["x"]}
    assert rounds == set(range(1, ROUNDS + 1))
    cross = next(t for t in loss["data"] if t["name"] == "dropped out")
    assert cross["x"] == [2]
    notes = [a["text"] for a in loss["layout"]["annotations"]]
    assert "resumed after round 2" in notes
    dropped = at.table[0].value
    assert dropped["site"].tolist() == [DROPPED_SITE] and dropped["round"].tolist() == [2]
    assert "Resumed 1 time(s), after round 2" in texts(at, "markdown")


def test_sites_page_shows_cards_class_ratio_samples_distances_and_embedding(
    monkeypatch, runs
) -> None:
    at = open_page(monkeypatch, [runs.runs], "sites")
    pick(at, "sites_run", "feddrm")
    assert not at.error and not at.info
    assert [t.label for t in at.tabs] == MANIFEST_ORDER
    markdown = texts(at, "markdown")
    for site in SITES:
        assert f"### Data card: {site}" in markdown
    assert "Class ratio" in texts(at, "subheader")
    kinds = {figure["data"][0]["type"] for figure in figures(at)}
    assert {"bar", "heatmap", "scatter"} <= kinds
    heatmap = next(f for f in figures(at) if f["data"][0]["type"] == "heatmap")
    distances = read_site_overview(runs.feddrm)["distances"]
    index = [distances["sites"].index(s) for s in MANIFEST_ORDER]
    assert heatmap["data"][0]["x"] == MANIFEST_ORDER == heatmap["data"][0]["y"]
    assert heatmap["data"][0]["z"] == [[distances["matrix"][i][j] for j in index] for i in index]
    ratio = next(f for f in figures(at) if f["data"][0]["type"] == "bar")
    assert ratio["data"][0]["x"] == MANIFEST_ORDER
    scatter = next(f for f in figures(at) if f["data"][0]["type"] == "scatter")
    assert {name.split(",")[0] for name in trace_names(scatter)} == set(SITES)
    assert len(at.image) == 3 and all(len(i.value) == 4 for i in at.image)
    assert set(at.image[0].captions) == {"normal", "glaucoma"}


def test_sites_page_shows_fedgmi_mixture_coefficients(monkeypatch, runs, tmp_path) -> None:
    sites = load_sites(sorted((runs.data / "sites").glob("*.toml")), runs.base / "cache")
    config = TrainConfig("fedgmi", rounds=2, local_steps=1, batch_size=8, device="cpu")
    train(sites, config, tmp_path / "runs" / "fedgmi")
    at = open_page(monkeypatch, [tmp_path / "runs"], "sites")
    assert "Mixture coefficients" in texts(at, "subheader")
    shares = at.table[0].value
    assert sorted(shares.index) == SITES
    assert np.allclose(shares.sum(axis=1).to_numpy(), 1.0, atol=1e-3)
    stored = mixture_coefficients(tmp_path / "runs" / "fedgmi")
    for site in SITES:  # the page shows what the sites' saved models hold
        assert shares.loc[site].to_numpy() == pytest.approx(stored[site], abs=1e-3)


def test_sites_page_says_so_when_the_run_publishes_no_images(monkeypatch, runs, tmp_path) -> None:
    run = copy_run(runs.fedavg, tmp_path)
    shutil.rmtree(run / "site_overview")
    sites = load_sites(sorted((runs.data / "sites").glob("*.toml")), runs.base / "cache")
    write_site_overview(run, sites, samples_per_site=0, embed=False)
    at = open_page(monkeypatch, [run], "sites")
    assert not at.image and not at.error
    info = texts(at, "info")
    assert "No sample images in this run directory" in info
    assert "No per-scan embedding" in info
    assert any(f["data"][0]["type"] == "heatmap" for f in figures(at))


def test_sites_page_falls_back_to_the_summary_without_an_overview(monkeypatch, runs, tmp_path):
    run = copy_run(runs.fedavg, tmp_path)
    shutil.rmtree(run / "site_overview")
    at = open_page(monkeypatch, [run], "sites")
    assert "has no site overview" in texts(at, "info")
    table = at.table[0].value
    assert sorted(table.index) == SITES
    assert table.loc["acrima", "test scans"] == summary_of(run)["sites"]["acrima"]["n_test"]


@pytest.mark.parametrize(
    ("kind", "mime"),
    [("jpeg", "image/jpeg"), ("dicom", "application/dicom"), ("nifti", "application/gzip")],
)
def test_routing_page_routes_an_uploaded_scan_and_logs_it_once(
    monkeypatch, runs, tmp_path, kind, mime
) -> None:
    source = {
        "jpeg": runs.fundus_photo(),
        "dicom": Path(pydicom.data.get_testdata_file("CT_small.dcm")),
        "nifti": Path(nibabel.testing.data_path) / "standard.nii.gz",
    }[kind]
    run = copy_run(runs.feddrm, tmp_path)
    at = open_page(monkeypatch, [run], "routing")
    assert "No scan has been routed" in texts(at, "info")

    at.file_uploader(key="scan_upload").upload(source.name, source.read_bytes(), mime).run()

    assert not at.exception and not at.error, texts(at, "error")
    log = AuditLog(run).read()
    assert len(log) == 1 and log[0].file == source.name
    fed = TrainedFederation.load(run, "cpu")
    expected = route_one(fed, make_router("auto", fed), source)  # as 'medfed route' answers
    assert log[0].status == expected.status and log[0].sha256 == expected.sha256
    assert log[0].site_probs == pytest.approx(expected.site_probs)
    assert f"Result: {source.name}" in texts(at, "subheader")
    chosen = next(m for m in at.metric if m.label == "Chosen site").value
    if expected.status == "routed":
        assert chosen == expected.chosen_site
        assert f"Routed to site {expected.chosen_site}" in texts(at, "success")
        prediction = next(m for m in at.metric if m.label == "Prediction")
        assert prediction.value == expected.prediction
    else:
        assert chosen == "abstain" and "abstain" in texts(at, "warning")
        assert not [m for m in at.metric if m.label == "Prediction"]  # no headline answer
    distance = next(m for m in at.metric if m.label == "Distance to the closest site")
    assert distance.delta == f"threshold {fed.abstention.threshold:.2f}: abstains above"
    shown_score = "n/a" if expected.ood_score is None else f"{expected.ood_score:.2f}"
    assert distance.value == shown_score
    assert len(at.image) == 1 and len(at.image[0].value) == 1  # the scan, as a thumbnail
    middle = " (middle slice)" if kind != "jpeg" else ""
    assert at.image[0].captions == [f"the scan{middle}"]
    if kind == "jpeg":
        probs = at.table[0].value
        assert sorted(probs.index) == SITES and probs["probability"].sum() == pytest.approx(1.0)
        assert probs["probability"].to_dict() == pytest.approx(expected.site_probs)
        bars = figures(at)[0]["data"][0]
        if expected.status == "routed":  # the chosen site stands out, never in the worst red
            chosen_bar = bars["x"].index(expected.chosen_site)
            assert bars["marker"]["color"][chosen_bar] == CHOSEN
        assert WORST not in bars["marker"]["color"]
    else:  # a CT scan is never forced onto a fundus site
        assert expected.status == "abstained" and not at.table
        assert "ct scan, but this federation was trained on fundus" in texts(at, "warning")
    assert at.dataframe[0].value["file"].tolist() == [source.name]

    at.run()  # any rerun (a filter, a click elsewhere) must not log the scan again
    assert len(AuditLog(run).read()) == 1


def test_an_abstained_scan_shows_no_prediction_and_marks_its_probabilities(
    monkeypatch, runs, tmp_path
) -> None:
    run = copy_run(runs.feddrm, tmp_path)
    model = run / "model" / "model.json"
    bundle = json.loads(model.read_text())
    bundle["abstention"]["threshold"] = 0.0  # every scan lies beyond it: the router abstains
    model.write_text(json.dumps(bundle))
    photo = runs.fundus_photo()
    at = open_page(monkeypatch, [run, runs.data], "routing")
    at.text_input(key="scan_path").input(str(photo))
    at.button(key="route_path").click().run()
    assert not at.exception and not at.error
    assert AuditLog(run).read()[0].status == "abstained"

    assert [m.label for m in at.metric] == ["Chosen site", "Distance to the closest site"]
    assert at.metric[0].value == "abstain"
    assert at.metric[1].delta == "threshold 0.00: abstains above"
    assert "no site fits: distance" in texts(at, "warning")
    assert "Prediction" not in [m.label for m in at.metric]  # no answer headline
    (folded,) = [e for e in at.expander if e.label.startswith("Not to be relied on")]
    captions = "\n".join(str(c.value) for c in folded.caption)
    assert "should not be relied on" in captions
    assert "Not an answer: the nearest site" in captions
    audit = next(d.value for d in at.dataframe if "router" in d.value.columns)
    assert audit["prediction"].str.endswith("abstained: not an answer").all()
    bars = figures(at)[0]
    assert "not to be relied on" in title_of(bars)
    colours = set(bars["data"][0]["marker"]["color"])
    assert colours == {NOT_RELIED_ON} and not colours & {WORST, CHOSEN}
    assert sorted(at.table[0].value.index) == SITES
    assert len(at.image) == 1


def test_routing_page_routes_a_path_and_filters_the_audit_log(monkeypatch, runs, tmp_path):
    run = copy_run(runs.feddrm, tmp_path)
    scans = tmp_path / "scans"
    scans.mkdir()
    broken = scans / "broken.jpg"
    broken.write_bytes(runs.fundus_photo().read_bytes()[:100])
    at = open_page(monkeypatch, [run, runs.data, scans], "routing")
    for path in (runs.fundus_photo(), broken):
        at.text_input(key="scan_path").input(str(path))
        at.button(key="route_path").click().run()
        assert not at.exception
    assert "Could not route this scan" in texts(at, "error") and "broken.jpg" in texts(at, "error")
    assert len(at.dataframe[0].value) == 2

    at.multiselect(key="audit_status").set_value(["error"]).run()
    assert at.dataframe[0].value["file"].tolist() == [str(broken)]
    assert "1 of 2 routed scans" in texts(at, "caption")
    at.multiselect(key="audit_status").set_value([]).run()
    at.text_input(key="audit_text").input(runs.fundus_photo().name).run()
    assert at.dataframe[0].value["file"].tolist() == [str(runs.fundus_photo())]
    assert len(AuditLog(run).read()) == 2


def test_communication_page_shows_bytes_per_round_per_site_and_method(monkeypatch, runs) -> None:
    at = open_page(monkeypatch, [runs.runs], "communication")
    assert not at.error
    table = at.table[0].value
    assert list(table.index) == ["fedavg", "feddrm"]
    for method, run in (("fedavg", runs.fedavg), ("feddrm", runs.feddrm)):
        summary = summary_of(run)
        assert table.loc[method, "per round (all sites)"] == human_bytes(summary["bytes_per_round"])
        sent = summary["bytes_per_round_by_site"]["acrima"]["up"]
        assert table.loc[method, "acrima sent"] == human_bytes(sent)
    assert [c.removesuffix(" sent") for c in table.columns if c.endswith(" sent")] == (
        MANIFEST_ORDER
    )
    bars, lines = figures(at)
    assert {t["name"].split(",")[0] for t in bars["data"]} == set(SITES)
    panels = {a["text"] for a in lines["layout"]["annotations"]}
    assert panels == {"fedavg", "feddrm"}
    rimone = [t for t in lines["data"] if t["name"] == DROPPED_SITE]
    assert any(0 in t["y"] for t in rimone)  # the round it dropped out sent nothing
    assert "exchanged nothing" in texts(at, "caption")
    # every site has its own line in every panel, in manifest order, each told apart
    for panel in ("x", "x2"):
        names = [t["name"] for t in lines["data"] if t.get("xaxis", "x") == panel]
        assert names == MANIFEST_ORDER
    assert len({t["marker"]["symbol"] for t in lines["data"] if t.get("xaxis", "x") == "x"}) == 3
    # each panel's axis starts at 0 and fits its own data; the title says the axis's unit
    axes = [v for k, v in lines["layout"].items() if k.startswith("yaxis")]
    assert all(a.get("rangemode") == "tozero" and not a.get("matches") for a in axes)
    unit = lines["layout"]["yaxis"]["title"]["text"].split()[0]
    assert unit in {"kB", "MB", "GB"} and f"({unit})" in title_of(lines)
    bar_unit = bars["layout"]["yaxis"]["title"]["text"].split()[1]  # "mean kB per round"
    assert f"({bar_unit})" in title_of(bars)


PAGES = ["federation", "training", "sites", "routing", "review", "communication"]


@pytest.mark.parametrize("page", PAGES)
def test_every_page_explains_an_empty_folder_and_an_empty_run_directory(
    monkeypatch, runs, tmp_path, page
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    at = open_page(monkeypatch, [empty], page)
    assert "No run directory found" in texts(at, "warning")
    assert "medfed dashboard demo_out" in texts(at, "info")

    started = tmp_path / "started"
    started.mkdir()
    shutil.copy(runs.feddrm / "config.toml", started / "config.toml")
    at = open_page(monkeypatch, [started], page)
    assert not at.error
    shown = texts(at, "info", "warning", "caption")
    assert "no round recorded yet" in shown or "no trained model yet" in shown


@pytest.mark.parametrize("page", PAGES)
def test_a_half_written_run_shows_what_it_has_and_says_it_is_unfinished(
    monkeypatch, runs, page
) -> None:
    at = open_page(monkeypatch, [runs.half_written], page)
    assert not at.error
    shown = texts(at, "info", "warning", "caption", "markdown")
    if page == "sites":
        assert "has no site overview" in shown
    elif page == "routing":
        assert "no trained model yet" in shown and "2 of 3 rounds recorded" in shown
    else:
        assert "not finished: 2 of 3 rounds recorded" in shown or page == "communication"
    if page in ("training", "communication"):
        assert figures(at)  # the rounds done so far are drawn
    if page == "training":
        assert at.table[0].value["site"].tolist() == [DROPPED_SITE]


def plain(text: str) -> str:
    """Markdown text as it reads on the page (escapes dropped)."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", text)


def test_a_damaged_summary_is_reported_by_name(monkeypatch, runs, tmp_path) -> None:
    run = copy_run(runs.fedavg, tmp_path)
    (run / "summary.json").write_text("{")
    at = open_page(monkeypatch, [run])
    shown = plain(texts(at, "warning"))
    assert "Run fedavg is left out" in shown.replace("*", "")
    assert "summary.json: not valid JSON" in shown


def test_a_summary_from_a_newer_medfed_says_to_upgrade(monkeypatch, runs, tmp_path) -> None:
    run = copy_run(runs.fedavg, tmp_path)
    newer = summary_of(run) | {"schema_version": SCHEMA_VERSION + 1}
    (run / "summary.json").write_text(json.dumps(newer))
    at = open_page(monkeypatch, [run])
    shown = plain(texts(at, "warning"))
    assert f"summary.json: written with schema_version {SCHEMA_VERSION + 1}" in shown
    assert "upgrade medfed" in shown and not at.exception


def test_run_files_carry_the_schema_version(runs) -> None:
    for run in (runs.feddrm, runs.fedavg):
        assert summary_of(run)["schema_version"] == SCHEMA_VERSION
        lines = (run / "metrics.jsonl").read_text().splitlines()
        events = (run / "events.jsonl").read_text().splitlines()
        assert {json.loads(line)["schema_version"] for line in lines + events} == {SCHEMA_VERSION}
        model = json.loads((run / "model" / "model.json").read_text())
        assert model["schema_version"] == SCHEMA_VERSION
        assert RunDir(run).read_config()["train"]["rounds"] == ROUNDS


def test_the_dashboard_never_imports_training_code(runs) -> None:
    script = f"""
import os, sys
os.environ[{RUNS_ENV!r}] = {str(runs.runs)!r}
from streamlit import config
from streamlit.testing.v1 import AppTest
config.set_option("server.address", "127.0.0.1")
at = AppTest.from_file({str(APP)!r}, default_timeout={TIMEOUT}).run()
for page in {PAGES!r}:
    at.switch_page(f"views/{{page}}.py").run()
    assert not at.exception, (page, [e.value for e in at.exception])
print(" ".join(sorted(m for m in sys.modules if m.startswith("medfed"))))
"""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = set(done.stdout.split())
    assert "medfed.routing.bundle" in loaded  # the Routing page did load the trained models
    forbidden = {"medfed.federation", "medfed.algorithms", "medfed.experiments"}
    assert not {m for m in loaded if m.split(".")[0:2] and ".".join(m.split(".")[:2]) in forbidden}


def test_dashboard_command_serves_on_loopback_and_names_a_missing_folder(tmp_path) -> None:
    command = streamlit_command(8599)
    assert "--server.address=127.0.0.1" in command and "--server.port=8599" in command
    assert "--browser.gatherUsageStats=false" in command and str(APP) in command
    result = CliRunner().invoke(app, ["dashboard", str(tmp_path / "nowhere")])
    assert result.exit_code == 2
    assert f"{tmp_path / 'nowhere'}: no such run directory or folder" in result.output
    result = CliRunner().invoke(app, ["dashboard", str(tmp_path), "--port", "0"])
    assert result.exit_code == 2 and "--port" in result.output and "0" in result.output


def launched_env(monkeypatch, args: list[str]) -> tuple[int, str, dict[str, str] | None]:
    """Run 'medfed dashboard ARGS' in-process with Streamlit's start caught: (exit code,
    output, the environment Streamlit would have been started with)."""
    import medfed.dashboard.launch as launch_module

    started: dict[str, dict[str, str]] = {}

    def execve(path, argv, env) -> None:  # the launcher's last step, caught
        started["env"] = dict(env)

    monkeypatch.setattr(launch_module.os, "execve", execve)
    result = CliRunner().invoke(app, ["dashboard", *args])
    return result.exit_code, result.output, started.get("env")


def test_dashboard_reviewer_header_reaches_the_review_page_through_the_environment(
    monkeypatch, tmp_path
) -> None:
    from medfed.dashboard.rundata import REVIEWER_HEADER_ENV, reviewer_header

    monkeypatch.setenv(REVIEWER_HEADER_ENV, "X-Set-Before")
    code, _, env = launched_env(monkeypatch, [str(tmp_path), "--reviewer-header", "X-Remote-User"])
    assert code == 0 and env is not None
    assert env[REVIEWER_HEADER_ENV] == "X-Remote-User" and env[RUNS_ENV] == str(tmp_path)
    assert reviewer_header(env) == "X-Remote-User"  # as the page reads it
    code, _, env = launched_env(monkeypatch, [str(tmp_path), "--reviewer-header", ""])
    assert code == 0 and reviewer_header(env) is None  # the page asks for the name
    code, _, env = launched_env(monkeypatch, [str(tmp_path)])
    assert code == 0 and env[REVIEWER_HEADER_ENV] == "X-Set-Before"  # left as it was


def test_dashboard_refuses_a_reviewer_header_that_is_no_header_name(monkeypatch, tmp_path):
    code, output, env = launched_env(monkeypatch, [str(tmp_path), "--reviewer-header", "X User:"])
    assert code == 2 and env is None  # nothing started
    assert "--reviewer-header 'X User:': not an HTTP header name" in " ".join(output.split())


# ---------------------------------------------------------------------------------- polish
def test_data_card_values_are_escaped_and_the_split_table_shows_once(monkeypatch, runs) -> None:
    at = open_page(monkeypatch, [runs.feddrm], "sites")
    markdown = texts(at, "markdown")
    card_file = (runs.feddrm / "site_overview" / "cards" / "acrima.md").read_text()
    assert "'_g_' marks glaucoma" in card_file  # the description, as the manifest has it
    assert "'\\_g\\_' marks glaucoma" in markdown  # shown as written, not in italics
    assert "### Data card: acrima" in markdown and "| site id | `acrima` |" in markdown
    # every line of the card shows, with the same values as the card file
    card = next(e.value for e in at.markdown if "Data card: acrima" in e.value)
    shown = [plain(line).strip() for line in card.split("\n")]
    written = [line.strip() for line in card_file.rstrip("\n").split("\n")]
    assert len(shown) == len(written)
    for ours, theirs in zip(shown, written, strict=True):
        ours = ours.removeprefix("##") if theirs.startswith("#") else ours
        assert ours.replace(" ", "") == theirs.replace(" ", ""), (ours, theirs)
    assert "Scans per split and class" not in markdown  # the card holds that table
    assert not [t for t in at.table if "total" in t.value.columns]  # the split table


def test_markdown_in_card_values_is_escaped_once() -> None:
    from medfed.dashboard.checks import escape_markdown
    from medfed.dashboard.rundata import card_markdown

    assert escape_markdown("_g_ *x* [a](b) :red[c] $d$") == (
        "\\_g\\_ \\*x\\* \\[a\\](b) \\:red\\[c\\] \\$d\\$"
    )
    assert escape_markdown(escape_markdown("_g_ <b>")) == escape_markdown("_g_ <b>")
    card = "\n".join(
        ["# Data card: s_1", "", "| field | value |", "| --- | --- |"]
        + ["| source | _to fill in by the site_ |"]
    )
    assert card_markdown(card).split("\n") == [
        "### Data card: s\\_1",
        "",
        "| field | value |",
        "| --- | --- |",
        "| source | _to fill in by the site_ |",
    ]
    assert card_markdown("- 1. not a list\n2. neither") == "- 1\\. not a list\n2\\. neither"


def test_classes_and_methods_never_share_a_colour(monkeypatch, runs) -> None:
    from medfed.dashboard.charts import CLASS_PALETTE, METHOD_PALETTE, SITE_PALETTE

    assert not set(CLASS_PALETTE) & (set(METHOD_PALETTE) | set(SITE_PALETTE) | {WORST})
    at = open_page(monkeypatch, [runs.feddrm], "sites")
    ratio = next(f for f in figures(at) if f["data"][0]["type"] == "bar")
    colours = {t["marker"]["color"] for t in ratio["data"]}
    assert colours <= set(CLASS_PALETTE) and len(colours) == 2  # normal, glaucoma


def test_training_page_overlays_the_runs_on_one_chart(monkeypatch, runs) -> None:
    at = open_page(monkeypatch, [runs.runs], "training")
    overlays = [f for f in figures(at) if "runs compared" in title_of(f)]
    assert overlays and "training loss" in title_of(overlays[0])
    loss = overlays[0]
    assert [t["name"] for t in loss["data"]] == ["fedavg", "feddrm"]  # one line per run
    assert loss["layout"]["legend"]["title"]["text"] == "run"
    feddrm = next(t for t in loss["data"] if t["name"] == "feddrm")
    records = [
        json.loads(line) for line in (runs.feddrm / "metrics.jsonl").read_text().splitlines()
    ]
    first = [r["train_loss"] for r in records if r["round"] == 1 and r["status"] == "ok"]
    assert feddrm["y"][0] == pytest.approx(sum(first) / len(first))  # the mean over sites


def test_federation_page_shows_the_runs_settings_side_by_side(monkeypatch, runs) -> None:
    at = open_page(monkeypatch, [runs.runs])
    settings = next(t.value for t in at.table if "learning rate" in t.value.index)
    assert list(settings.columns) == ["fedavg", "feddrm"]
    assert settings.loc["algorithm"].tolist() == ["fedavg", "feddrm"]
    for row, value in (
        ("rounds", str(ROUNDS)),
        ("local steps", "2"),
        ("learning rate", "0.002"),
        ("normalization", "site"),
        ("augmentation", "flip"),
        ("wire precision", "float32"),
    ):
        assert settings.loc[row].tolist() == [value, value], row
    assert settings.loc["operating rule", "feddrm"].startswith("specificity")
    for method, run in (("fedavg", runs.fedavg), ("feddrm", runs.feddrm)):
        trained = RunDir(run).read_config()["model"]["backbone"]  # "auto" as resolved
        assert settings.loc["backbone", method] == trained
    aucs = at.table[0].value
    assert list(aucs.index) == MANIFEST_ORDER  # sites in the order of their manifests
    bars = next(f for f in figures(at) if f["data"][0]["type"] == "bar")
    assert list(bars["data"][0]["x"]) == MANIFEST_ORDER


def test_audit_log_columns_read_as_words_and_fill_the_page(monkeypatch, runs, tmp_path) -> None:
    run = copy_run(runs.feddrm, tmp_path)
    at = open_page(monkeypatch, [run, runs.data], "routing")
    at.text_input(key="scan_path").input(str(runs.fundus_photo()))
    at.button(key="route_path").click().run()
    table = at.dataframe[0]
    columns = list(table.value.columns)
    assert "chosen site" in columns and "distance to closest site" in columns
    assert not [c for c in columns if "_" in c]  # no column named as in code
    assert "distance to closest site" in table.proto.columns  # formatted for reading


# --------------------------------------------------------------------------------- security
@pytest.mark.parametrize("address", ["0.0.0.0", None])
def test_the_app_shows_nothing_when_it_listens_beyond_this_machine(runs, monkeypatch, address):
    monkeypatch.setenv(RUNS_ENV, str(runs.runs))
    serve_on_loopback(address)
    try:
        at = AppTest.from_file(str(APP), default_timeout=TIMEOUT).run()
    finally:
        serve_on_loopback()
    assert not at.exception
    shown = texts(at, "error")
    assert "server.address" in shown and "--server.address 127.0.0.1" in shown
    assert not at.title and not at.table  # no page, no figure


def test_the_launcher_caps_uploads() -> None:
    assert "--server.maxUploadSize=200" in streamlit_command(8599)


def _outside_symlink(run: Path, photo: Path) -> str:
    link = run / "scan.jpg"
    link.symlink_to(photo)
    return str(link)


@pytest.mark.parametrize(
    "how",
    [
        "a path outside the folders",
        "a path climbing out with ..",
        "a symlink inside pointing outside",
    ],
)
def test_the_path_box_reads_only_under_the_dashboards_folders(monkeypatch, runs, tmp_path, how):
    run = copy_run(runs.feddrm, tmp_path)
    photo = runs.fundus_photo()
    given = {
        "a path outside the folders": str(photo),
        "a path climbing out with ..": str(run) + "/.." * len(run.parts) + str(photo),
        "a symlink inside pointing outside": None,
    }[how] or _outside_symlink(run, photo)
    at = open_page(monkeypatch, [run], "routing")
    at.text_input(key="scan_path").input(given)
    at.button(key="route_path").click().run()
    assert not at.exception
    shown = plain(texts(at, "error"))
    assert "outside the folders this dashboard reads" in shown and str(run) in shown
    assert not AuditLog(run).read()  # nothing was read, nothing logged


def test_an_upload_over_the_size_limit_is_refused(monkeypatch, runs, tmp_path) -> None:
    import medfed.dashboard

    monkeypatch.setattr(medfed.dashboard, "MAX_UPLOAD_MB", 0.0005)  # 500 bytes
    run = copy_run(runs.feddrm, tmp_path)
    photo = runs.fundus_photo()
    at = open_page(monkeypatch, [run], "routing")
    at.file_uploader(key="scan_upload").upload(photo.name, photo.read_bytes(), "image/jpeg").run()
    assert not at.exception
    shown = plain(texts(at, "error"))
    assert photo.name in shown and "more than the 500 B this page accepts" in shown
    assert not AuditLog(run).read()


def test_an_upload_with_too_many_pixels_gets_the_data_layers_answer(
    monkeypatch, runs, tmp_path
) -> None:
    from PIL import Image

    huge = tmp_path / "huge.png"
    Image.new("1", (12_000, 9_000)).save(huge)  # 108 megapixels in a few kB
    run = copy_run(runs.feddrm, tmp_path)
    at = open_page(monkeypatch, [run], "routing")
    at.file_uploader(key="scan_upload").upload(huge.name, huge.read_bytes(), "image/png").run()
    assert not at.exception
    shown = plain(texts(at, "error"))
    assert "Could not route this scan" in shown and "huge.png" in shown
    assert "megapixels" in shown


def test_routing_review_and_method_detail_open_on_the_run_that_routes(monkeypatch, runs) -> None:
    # fedavg comes first by name; feddrm is the run trained to route (routing accuracy)
    for page, key in (("routing", "routing_run"), ("review", "review_run"), ("federation", None)):
        at = open_page(monkeypatch, [runs.fedavg, runs.feddrm], page)
        box = at.selectbox(key=key or "roc_method")
        assert "fedavg" in " ".join(box.options) and "feddrm" in box.value, (page, box.options)


def test_routing_page_says_how_far_the_site_probabilities_can_be_trusted(monkeypatch, runs) -> None:
    at = open_page(monkeypatch, [runs.feddrm, runs.data], "routing")
    assert not at.exception
    assert "How far the site probabilities can be trusted" in texts(at, "subheader")
    shown = at.dataframe[-1].value
    assert shown["posterior"].tolist()[1] == "uncalibrated (temperature 1)"
    assert shown["posterior"].tolist()[0].startswith("as routed (temperature ")
    names = [trace.get("name") for f in figures(at) for trace in f["data"]]
    assert "P(chosen site), as routed" in names  # the reliability curve
