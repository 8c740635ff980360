"""Federated statistics before training: what a site releases (minimum-count suppression, DP
noise on counts), how its policy decides on a statistics plan, the deployed statistics run
through medfed's real ClientApp (gate and audit log included), its statistics.json on the
dashboard's Sites page, and a site's audit log on the Site audit page."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from streamlit import config as streamlit_config
from streamlit.testing.v1 import AppTest
from typer.testing import CliRunner

from medfed.cli import app as cli
from medfed.config import load_manifest
from medfed.core.errors import ConfigError
from medfed.dashboard import APP, RUNS_ENV, STATE_ENV
from medfed.data.cache import TensorCache
from medfed.data.checks import check_site
from medfed.governance.disclosure import Noise, prevalence, release
from medfed.governance.policy import parse_policy
from medfed.governance.records import read_audit, record_approval
from medfed.governance.statistics import (
    StatisticsSettings,
    check_statistics_plan,
    make_statistics_plan,
)
from medfed.runs.statistics import read_statistics

pytest.importorskip("flwr")

SITES = ["acrima", "rimone", "refuge"]
MIN_COUNT = 2
POLICIES = {
    "acrima": "[outputs]\ndata_card = false\n",  # refuses: nothing of its data may leave
    "rimone": "[outputs]\nmin_count = 5\n",  # takes part on its operator's approval
}
TIMEOUT = 120


def report(**more) -> dict:
    """A data card's statistics as SiteReport.to_dict() holds them."""
    return {
        "site": "a",
        "modality": "fundus",
        "counts": {"train": {"neg": 30, "pos": 4}, "test": {"neg": 12, "pos": 7}},
        "size_counts": {"512x512": 40, "300x300": 13},
        "histogram": {
            "unit": "0-255",
            "edges": [0.0, 128.0, 256.0],
            "counts": [[50.0, 3.0], [0.5, 52.5], [20.0, 33.0]],
        },
        "acquisition": {"manufacturer": {"Topcon": 50, "Zeiss": 3}},
        **more,
    }


# ---------------------------------------------------------------------------- suppression
def test_cells_under_the_minimum_count_are_suppressed_and_counted() -> None:
    out = release(report(), StatisticsSettings(min_count=5))

    assert out["counts"] == {"train": {"neg": 30, "pos": None}, "test": {"neg": 12, "pos": 7}}
    assert out["sizes"] == {"512x512": 40, "300x300": 13}
    assert out["histogram"]["counts"] == [[50.0, None], [None, 52.5], [20.0, 33.0]]
    assert out["acquisition"] == {"manufacturer": {"Topcon": 50}}  # a rare device is not named
    assert out["suppressed"] == {"counts": 1, "sizes": 0, "histogram": 2, "acquisition": 1}
    assert out["noise"] is None and out["min_count"] == 5


def test_the_site_policy_minimum_applies_when_larger_than_the_runs() -> None:
    out = release(report(), StatisticsSettings(min_count=2), policy_min_count=15)

    assert out["min_count"] == 15
    assert out["counts"]["test"] == {"neg": None, "pos": None}
    assert out["sizes"] == {"512x512": 40}


def test_prevalence_has_a_wilson_interval_and_none_when_a_cell_is_suppressed() -> None:
    shares = prevalence({"train": {"neg": 30, "pos": 4}, "test": {"neg": 12, "pos": 7}})
    pos = shares["pos"]

    assert (pos["k"], pos["n"]) == (11, 53)
    assert pos["low"] < 11 / 53 < pos["high"]
    assert pos["estimate"] == pytest.approx(11 / 53)
    assert prevalence({"train": {"neg": 30, "pos": None}}) == {"neg": None, "pos": None}


def test_the_data_card_check_counts_sizes_and_histograms_per_scan(tiny_sites) -> None:
    manifests, cache = tiny_sites
    card = check_site(load_manifest(manifests["refuge"]), TensorCache(cache))

    assert sum(card.size_counts.values()) == card.n_readable > 0
    counts = np.array(card.histogram["counts"])
    assert counts.shape == (3, 16) and card.histogram["unit"] == "0-255"
    assert counts.sum(axis=1) == pytest.approx([card.n_readable] * 3, abs=0.01)  # 1 per scan


# ---------------------------------------------------------------------------- DP noise
@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
def test_noise_has_the_stated_scale(mechanism: str) -> None:
    noise = Noise(mechanism, epsilon=0.5, delta=1e-5, tables=4)
    draws = noise.sample(np.random.default_rng(0), 40_000)

    expected_std = noise.scale * (np.sqrt(2) if mechanism == "laplace" else 1.0)
    assert abs(draws.mean()) < 4 * expected_std / np.sqrt(draws.size)
    assert draws.std() == pytest.approx(expected_std, rel=0.03)
    if mechanism == "laplace":
        assert noise.scale == pytest.approx(4 / 0.5)  # T / epsilon
        assert np.mean(np.abs(draws)) == pytest.approx(noise.scale, rel=0.03)
    else:
        assert noise.scale == pytest.approx(np.sqrt(2 * np.log(1.25e5)) * 2 / 0.5)


def test_released_counts_carry_noise_of_that_scale_clipped_at_zero() -> None:
    many = {f"c{i}": 1000 for i in range(3000)}
    big = report(counts={"train": many}, histogram={}, acquisition={}, size_counts={})
    settings = StatisticsSettings(noise="laplace", epsilon=1.0)

    out = release(big, settings, rng=np.random.default_rng(1))

    residual = np.array(list(out["counts"]["train"].values())) - 1000
    assert out["noise"]["tables"] == 2 and out["noise"]["scale"] == pytest.approx(2.0)
    assert residual.std() == pytest.approx(np.sqrt(2) * 2.0, rel=0.05)
    zeros = report(counts={"train": dict.fromkeys(many, 0)}, histogram={}, acquisition={})
    clipped = release(zeros, settings, rng=np.random.default_rng(2))
    values = list(clipped["counts"]["train"].values())
    assert min(values) == 0 and clipped["noise"]["clipped"] > 1000  # about half go below 0


def test_noise_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="epsilon < 1"):
        StatisticsSettings(noise="gaussian", epsilon=2.0, delta=1e-5)
    with pytest.raises(ConfigError, match="needs an epsilon"):
        StatisticsSettings(noise="laplace")
    with pytest.raises(ConfigError, match="without noise"):
        StatisticsSettings(epsilon=1.0)
    with pytest.raises(ConfigError, match="min_count"):
        StatisticsSettings(min_count=-1)


# ---------------------------------------------------------------------------- the policy
def test_a_statistics_plan_is_checked_against_the_policy_rules_that_apply() -> None:
    plan = make_statistics_plan(StatisticsSettings(min_count=3), SITES, run_name="s")
    noisy = make_statistics_plan(
        StatisticsSettings(noise="laplace", epsilon=2.0), SITES, run_name="s"
    )

    def rules(text: str, p=plan) -> list[str]:
        return [r.rule for r in check_statistics_plan(parse_policy(text, "p.toml"), p)]

    assert plan.outputs == ["data_card"]
    assert rules("[outputs]\ndata_card = false\n") == ["outputs.data_card", "approval.required"]
    assert rules("[approval]\nrequired = false\n[outputs]\nmin_count = 50\n") == []
    assert rules('[approval]\nrequired = false\n[allow]\nalgorithms = ["fedavg"]\n') == []
    assert rules("[approval]\nrequired = false\n[privacy]\nrequire_dp = true\n") == [
        "privacy.require_dp"
    ]
    policy = "[approval]\nrequired = false\n[privacy]\nmax_epsilon = 1.0\n"
    assert rules(policy, noisy) == ["privacy.max_epsilon"]
    assert rules(f"[approval]\nplans = [{plan.sha256!r}]\n".replace("'", '"')) == []


# ---------------------------------------------------------------------------- deployed run
@pytest.fixture(scope="module")
def deployed(tiny_sites, tmp_path_factory) -> dict:
    """A statistics run over the three tiny sites through medfed's real ClientApp (each node's
    gate and audit log): acrima's policy forbids data_card, rimone's asks for 5 scans a cell
    and its operator approved the plan, refuge has no policy."""
    from medfed.flower.statistics import StatisticsDeployment, run_statistics
    from tests.flowergrid import InProcessGrid

    manifests, cache = tiny_sites
    root = tmp_path_factory.mktemp("fedstats")
    run_dir = root / "runs" / "stats"
    deployment = StatisticsDeployment(
        StatisticsSettings(min_count=MIN_COUNT), SITES, run_dir, "stats", 30.0, 30.0
    )
    configs = {}
    for i, site in enumerate(SITES):
        config = {
            "manifest": str(manifests[site]),
            "state-dir": str(root / f"state_{site}"),
            "cache-dir": str(cache),
        }
        if site in POLICIES:
            (root / f"{site}.toml").write_text(POLICIES[site], encoding="utf-8")
            config["policy"] = str(root / f"{site}.toml")
        configs[10 + i] = config
    record_approval(root / "state_rimone", deployment.plan())
    grid = InProcessGrid(configs)
    run_statistics(grid, deployment)
    return {"root": root, "run_dir": run_dir, "manifests": manifests, "cache": cache,
            "plan": deployment.plan()}  # fmt: skip


def test_the_statistics_run_releases_each_sites_data_card_counts(deployed) -> None:
    stats = read_statistics(deployed["run_dir"])
    assert stats is not None and stats.plan_sha256 == deployed["plan"].sha256

    for site, floor in (("refuge", MIN_COUNT), ("rimone", 5)):
        entry = stats.sites[site]
        card = check_site(
            load_manifest(deployed["manifests"][site]), TensorCache(deployed["cache"])
        )
        assert entry.status == "released" and entry.min_count == floor
        hidden = 0
        for split, per in card.counts.items():
            for name, n in per.items():
                expected = None if n < floor else n
                hidden += expected is None
                assert entry.counts[split][name] == expected, (site, split, name)
        assert entry.suppressed["counts"] == hidden
        assert entry.histogram is not None and len(entry.histogram.counts) == 3  # RGB
        assert entry.histogram.edges[0] == 0 and entry.histogram.edges[-1] == 256
        if not hidden:
            total = sum(sum(per.values()) for per in card.counts.values())
            assert next(iter(entry.prevalence.values())).n == total


def test_a_site_whose_policy_forbids_data_card_refuses_by_that_rule(deployed) -> None:
    stats = read_statistics(deployed["run_dir"])
    refused = stats.sites["acrima"]

    assert refused.status == "refused"
    assert refused.refusals[0]["rule"] == "outputs.data_card"
    assert refused.counts == {} and refused.histogram is None
    audit = read_audit(deployed["root"] / "state_acrima")
    assert [(r["direction"], r["kind"], r["decision"]) for r in audit] == [
        ("received", "query.statistics", "refused"),
        ("sent", "query.statistics", "refused"),
    ]
    assert audit[0]["rule"] == "outputs.data_card" and audit[0]["run"] == "stats"


def test_the_audit_logs_show_the_statistics_messages(deployed) -> None:
    audit = read_audit(deployed["root"] / "state_rimone")
    kinds = [(r["direction"], r["kind"], r["decision"]) for r in audit]

    assert kinds == [
        ("received", "query.statistics", "accepted"),
        ("decision", "query.statistics", "accepted"),
        ("sent", "query.statistics", "accepted"),
    ]
    assert "approved by" in audit[1]["reason"] and audit[2]["bytes"] > 0
    assert all(len(r["sha256"]) == 64 for r in audit)


def test_a_statistics_plan_never_covers_a_training_message(deployed) -> None:
    from flwr.app import ConfigRecord, RecordDict

    from medfed.flower.gate import refusals

    plan = deployed["plan"]
    run = {"name": "stats", "train": plan.train, "plan": plan.to_json()}
    content = RecordDict({"run": ConfigRecord({"json": json.dumps(run)})})
    policy = deployed["root"] / "rimone.toml"
    config = {"policy": str(policy), "state-dir": str(deployed["root"] / "state_rimone")}

    decision, found = refusals(content, config)

    assert decision == "refused" and [r.rule for r in found] == ["plan"]


# ---------------------------------------------------------------------------- the dashboard
def open_app(monkeypatch, runs: str = "", state: Path | None = None) -> AppTest:
    monkeypatch.setenv(RUNS_ENV, runs)
    if state is not None:
        monkeypatch.setenv(STATE_ENV, str(state))
    else:
        monkeypatch.delenv(STATE_ENV, raising=False)
    streamlit_config.set_option("server.address", "127.0.0.1")
    return AppTest.from_file(str(APP), default_timeout=TIMEOUT).run()


def shown(at: AppTest) -> str:
    kinds = ("markdown", "caption", "info", "warning", "error", "subheader")
    parts = [str(e.value) for kind in kinds for e in at.get(kind)]
    parts += [t.value.to_string() for t in at.table]
    return "\n".join(parts).replace("\\_", "_")


def test_the_sites_page_shows_the_federation_overview(deployed, monkeypatch) -> None:
    at = open_app(monkeypatch, str(deployed["run_dir"].parent))
    at.switch_page("views/sites.py").run()

    assert not at.exception, [e.value for e in at.exception]
    text = shown(at)
    assert "Federation overview (statistics run)" in text
    assert "Site acrima released nothing (refused)" in text and "outputs.data_card" in text
    assert "suppressed (< 5)" in text  # rimone's policy minimum
    assert "No differential-privacy noise" in text
    assert "Intensity histogram per channel" in text
    stats = read_statistics(deployed["run_dir"])
    sizes = [size for s in stats.sites.values() for size in s.sizes]
    assert sizes and all(size in text for size in sizes)  # the image sizes table
    assert "Cameras and scanners" in text


def test_the_site_audit_page_lists_and_filters_the_log(deployed, monkeypatch) -> None:
    at = open_app(monkeypatch, state=deployed["root"] / "state_acrima")

    assert not at.exception, [e.value for e in at.exception]
    frame = at.dataframe[0].value
    assert list(frame["kind"]) == ["query.statistics"] * 2
    assert list(frame["decision"]) == ["refused", "refused"]
    assert "rule outputs.data_card" in shown(at).replace("\\", "")
    at.multiselect(key="audit_decision").set_value(["accepted"]).run()
    assert at.dataframe[0].value.empty


def test_the_audit_page_filters_by_run(deployed, monkeypatch, tmp_path) -> None:
    from medfed.governance.records import log_message

    state = tmp_path / "state"
    for run in ("one", "two"):
        log_message(state, direction="received", kind="train", run=run, round=1, bytes=10,
                    sha256="a" * 64, decision="accepted")  # fmt: skip
    at = open_app(monkeypatch, state=state)
    at.selectbox(key="audit_run").set_value("two").run()

    assert list(at.dataframe[0].value["run"]) == ["two"]


# ---------------------------------------------------------------------------- the commands
def test_deploy_stats_writes_an_app_the_sites_check_and_approve(tmp_path) -> None:
    runner = CliRunner()
    app = tmp_path / "stats_app"
    argv = ["deploy", "stats", str(app), "--site", "acrima", "--site", "rimone"]
    argv += ["--run-dir", str(tmp_path / "run"), "--min-count", "5"]
    argv += ["--noise", "laplace", "--epsilon", "1"]
    written = runner.invoke(cli, argv)
    assert written.exit_code == 0, written.output
    assert "laplace noise on every count, epsilon 1" in written.output
    policy = tmp_path / "policy.toml"
    policy.write_text("[outputs]\ndata_card = false\n", encoding="utf-8")

    check = runner.invoke(cli, ["deploy", "policy", "check", str(policy), "--run", str(app)])
    state = tmp_path / "state"
    approve = runner.invoke(
        cli, ["deploy", "approve", "--run", str(app), "--state-dir", str(state)]
    )

    assert check.exit_code == 1 and "refused: rule outputs.data_card" in check.output
    assert "statistics only: no training, no weights" in check.output
    assert approve.exit_code == 0, approve.output
    from medfed.flower.statistics import StatisticsDeployment, statistics_run_config

    plan = StatisticsDeployment.from_run_config(statistics_run_config(app)).plan()
    assert json.loads((state / "approvals.jsonl").read_text())["plan_sha256"] == plan.sha256


def test_sites_stats_gives_the_deployed_overview_in_one_process(deployed, tmp_path) -> None:
    manifests = [str(deployed["manifests"][site]) for site in SITES]
    argv = ["sites", "stats", *manifests, "--out", str(tmp_path / "stats")]
    argv += ["--min-count", str(MIN_COUNT), "--cache-dir", str(deployed["cache"])]

    result = CliRunner().invoke(cli, argv)

    assert result.exit_code == 0, result.output
    here, there = read_statistics(tmp_path / "stats"), read_statistics(deployed["run_dir"])
    assert here.engine == "in-process" and list(here.sites) == SITES
    # refuge has no policy: the same cells, suppressed alike, the same prevalence
    assert here.sites["refuge"].to_dict() == there.sites["refuge"].to_dict()


def test_the_dashboard_launch_passes_the_state_folder(monkeypatch, tmp_path) -> None:
    from medfed.dashboard import launch as launcher

    seen = {}
    monkeypatch.setattr(launcher.os, "execve", lambda exe, argv, env: seen.update(env))
    (tmp_path / "state").mkdir()
    launcher.launch([], 8600, echo=lambda s: None, state_dir=tmp_path / "state")

    assert seen[STATE_ENV] == str((tmp_path / "state").resolve())
    assert seen[RUNS_ENV] == ""  # no run directory: the Site audit page alone has content
