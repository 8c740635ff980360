"""Experiment tracking with MLflow (medfed[mlflow]): a trained run logged to a local store
through ``medfed train --track`` and ``medfed track``, its parameters, per-round metrics,
intervals and artifacts all there; a sweep folder as a parent with its children; the routing
model loaded back answering as ``medfed route``; a store that is down never loses a run."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from medfed.cli import app

mlflow = pytest.importorskip("mlflow")
runner = CliRunner()
TINY = ["--rounds", "2", "--local-steps", "1", "--batch-size", "8", "--device", "cpu"]


@pytest.fixture(scope="module")
def tracked(tmp_path_factory) -> dict:
    """Two FedDRM runs on two synthetic sites, the first logged by ``train --track local``."""
    from medfed.data.synth import synthesize

    base = tmp_path_factory.mktemp("tracking")
    manifests = synthesize(base / "data", "fundus", n_per_site=24, seed=2, image_size=48)[:2]
    common = ["--sites", *map(str, manifests), "--algorithm", "feddrm", *TINY]
    common += ["--cache-dir", str(base / "cache"), "--no-progress"]
    sweep = base / "sweep"
    runs = []
    for seed in (0, 1):
        out = sweep / f"seed{seed}"
        track = ["--track", "local"] if seed == 0 else []
        result = runner.invoke(
            app, ["train", *common, "--seed", str(seed), "--out", str(out), *track]
        )
        assert result.exit_code == 0, result.output
        runs.append(out)
    return {"base": base, "sweep": sweep, "runs": runs, "manifests": manifests}


@pytest.fixture(scope="module", autouse=True)
def _mlflow_home(tmp_path_factory):
    """MLflow's defaults kept in a temporary folder: nothing goes to the home directory."""
    home = tmp_path_factory.mktemp("mlflow_home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{(home / 'default.db').as_posix()}")
        patch.setenv("MLFLOW_REGISTRY_URI", f"sqlite:///{(home / 'default.db').as_posix()}")
        patch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        yield home


def _free_port() -> int:
    from tests.test_tracking_server import free_port

    return free_port()


def _client(uri: str):
    return mlflow.tracking.MlflowClient(tracking_uri=uri)


def test_a_tracked_run_holds_its_settings_rounds_intervals_and_documents(tracked) -> None:
    run = tracked["runs"][0]
    record = json.loads((run / "tracking.json").read_text(encoding="utf-8"))
    assert record["tracking_uri"] == f"sqlite:///{(tracked['sweep'] / 'mlflow.db').as_posix()}"
    client = _client(record["tracking_uri"])
    logged = client.get_run(record["run_id"])
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))

    params, metrics, tags = logged.data.params, logged.data.metrics, logged.data.tags
    assert params["train.algorithm"] == "feddrm" and params["train.rounds"] == "2"
    assert params["train.params.lam"] == "0.8" and params["model.backbone"] == summary["backbone"]
    assert tags["medfed.algorithm"] == "feddrm" and tags["medfed.seed"] == "0"
    assert tags["medfed.sites"] == ",".join(m.stem for m in tracked["manifests"])
    assert len(tags["medfed.plan_hash"]) == 16 and tags["medfed.version"]
    # per-round metrics, one step per round
    history = client.get_metric_history(record["run_id"], "val_auc_worst_site")
    assert [m.step for m in history] == [1, 2]
    assert len(client.get_metric_history(record["run_id"], "bytes")) == 2
    # the final figures with their intervals
    assert metrics["system_accuracy"] == pytest.approx(summary["system_accuracy"])
    site = tracked["manifests"][0].stem
    ci = summary["sites"][site]["auc_ci"]
    assert metrics[f"test_auc.{site}"] == pytest.approx(summary["sites"][site]["auc"])
    assert metrics[f"test_auc.{site}_low"] == pytest.approx(ci["low"])
    assert metrics[f"test_auc.{site}_high"] == pytest.approx(ci["high"])
    assert metrics["pooled_auc_low"] < metrics["pooled_auc"] < metrics["pooled_auc_high"]
    # the documents, never per-scan data
    names = {a.path for a in client.list_artifacts(record["run_id"])}
    assert {"summary.json", "config.toml", "MODEL_CARD.md", "report.html", "data_cards"} <= names
    assert "predictions.csv" not in names
    cards = {a.path for a in client.list_artifacts(record["run_id"], "data_cards")}
    assert cards == {f"data_cards/{m.stem}.md" for m in tracked["manifests"]}


def test_the_routing_model_answers_photos_exactly_as_medfed_route(tracked) -> None:
    import pandas as pd

    run = tracked["runs"][0]
    record = json.loads((run / "tracking.json").read_text(encoding="utf-8"))
    photos = sorted(tracked["manifests"][0].parent.parent.rglob("*.jpg"))[:3]
    photos += sorted(tracked["manifests"][1].parent.parent.rglob("*.png"))[:2]
    assert len(photos) >= 3

    mlflow.set_tracking_uri(record["tracking_uri"])
    model = mlflow.pyfunc.load_model(f"runs:/{record['run_id']}/router")
    answers = model.predict(pd.DataFrame({"path": [str(p) for p in photos]}))
    routed = runner.invoke(app, ["route", str(run), *map(str, photos), "--json", "--no-audit"])

    assert routed.exit_code == 0, routed.output
    expected = json.loads(routed.output)
    got = [_answer(row) for row in answers.to_dict("records")]

    assert got == [_answer(row) for row in expected]  # every field, every digit
    # the same photos sent as bytes (named as the files were): the same answers
    sent = pd.DataFrame({"image": [p.read_bytes() for p in photos], "name": list(map(str, photos))})
    as_bytes = [_answer(row) for row in model.predict(sent).to_dict("records")]
    assert as_bytes == got


def _answer(row: dict) -> dict:
    """An answer without its time stamp and its empty fields (a DataFrame holds them as NaN)."""
    return {
        k: v
        for k, v in row.items()
        if k != "time" and v is not None and not (isinstance(v, float) and math.isnan(v))
    }


def test_a_sweep_folder_is_a_parent_with_one_child_per_run(tracked, tmp_path) -> None:
    sweep = tmp_path / "sweep"
    shutil.copytree(tracked["sweep"], sweep, ignore=shutil.ignore_patterns("mlflow.db", "ml*"))
    (sweep / "results.md").write_text("| method | auc |\n", encoding="utf-8")
    uri = f"sqlite:///{(tmp_path / 'store.db').as_posix()}"

    result = runner.invoke(app, ["track", str(sweep), "--track", uri, "--experiment", "sweeps"])

    assert result.exit_code == 0, result.output
    client = _client(uri)
    experiment = client.get_experiment_by_name("sweeps")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 2
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
    assert {r.data.tags["mlflow.runName"] for r in children} == {"seed0", "seed1"}
    assert "results.md" in {a.path for a in client.list_artifacts(parents[0].info.run_id)}


def test_a_store_that_is_down_never_loses_the_run_and_track_uploads_it_later(
    tracked, tmp_path
) -> None:
    out = tmp_path / "run"
    down = f"http://127.0.0.1:{_free_port()}"
    common = ["--sites", *map(str, tracked["manifests"]), "--algorithm", "fedavg", *TINY]
    common += ["--cache-dir", str(tracked["base"] / "cache"), "--no-progress"]

    result = runner.invoke(app, ["train", *common, "--out", str(out), "--track", down])

    assert result.exit_code == 0, result.output
    assert (out / "summary.json").is_file() and not (out / "tracking.json").exists()
    said = [line for line in result.output.splitlines() if line.startswith("tracking:")]
    assert len(said) == 1 and f"medfed track {out} --track {down}" in said[0]
    uri = f"sqlite:///{(tmp_path / 'later.db').as_posix()}"
    later = runner.invoke(app, ["track", str(out), "--track", uri])
    assert later.exit_code == 0, later.output
    record = json.loads((out / "tracking.json").read_text(encoding="utf-8"))
    logged = _client(uri).get_run(record["run_id"])
    assert logged.data.params["train.algorithm"] == "fedavg" and logged.info.status == "FINISHED"
    assert len(_client(uri).get_metric_history(record["run_id"], "train_loss")) == 2


def test_the_settings_file_names_the_store(tracked, tmp_path) -> None:
    from medfed.tracking import tracking_settings

    settings = tmp_path / "settings.toml"
    settings.write_text(
        '[train]\nalgorithm = "fedavg"\n\n[tracking]\nuri = "http://mlflow.hospital:5000"\n'
        'experiment = "pilot"\nregister = "glaucoma-router"\n',
        encoding="utf-8",
    )
    found = tracking_settings(None, tmp_path, settings_file=settings)
    assert found is not None and found.uri == "http://mlflow.hospital:5000"
    assert (found.experiment, found.register) == ("pilot", "glaucoma-router")
    assert tracking_settings("local", tmp_path, settings_file=settings).uri.startswith("sqlite:")
    assert tracking_settings(None, tmp_path) is None
    bare = tmp_path / "bare.toml"
    bare.write_text('[tracking]\nexperiment = "pilot"\n', encoding="utf-8")
    local = tracking_settings(None, tmp_path, settings_file=bare)
    assert local.uri == f"sqlite:///{(tmp_path / 'mlflow.db').resolve().as_posix()}"
    # medfed train --config reads the file's [tracking] table: a store that is down is said once
    settings.write_text(
        '[train]\nalgorithm = "fedavg"\nrounds = 1\nlocal_steps = 1\nbatch_size = 8\n\n'
        f'[tracking]\nuri = "http://127.0.0.1:{_free_port()}"\n',
        encoding="utf-8",
    )
    out = tmp_path / "run"
    argv = ["train", "--config", str(settings), "--sites", *map(str, tracked["manifests"])]
    argv += ["--cache-dir", str(tracked["base"] / "cache"), "--no-progress", "--out", str(out)]
    result = runner.invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert sum(line.startswith("tracking:") for line in result.output.splitlines()) == 1


def test_the_dashboard_links_a_run_to_its_mlflow_run(tracked, monkeypatch) -> None:
    from tests.test_dashboard import open_page, texts

    run = tracked["runs"][0]
    record = json.loads((run / "tracking.json").read_text(encoding="utf-8"))

    at = open_page(monkeypatch, [tracked["sweep"]])
    assert f"MLflow run {record['run_id']}" in texts(at, "markdown")


def test_refusals_and_suppressed_figures_are_logged_as_such() -> None:
    from medfed.tracking.runlog import event_tags, final_metrics, run_tags

    events = [
        {"event": "dropout", "site": "a"},
        {"event": "dropout", "site": "b"},
        {"event": "site_refused", "site": "c", "refusals": ["algorithm fedprox not allowed"]},
    ]
    tags = event_tags(events)
    assert tags["medfed.events.dropout"] == "2" and tags["medfed.events.site_refused"] == "1"
    assert "fedprox not allowed" in tags["medfed.refused.c"]
    summary = {"suppressed": {"c: auc": "fewer than 10 test scans"}, "predictions": "sites"}
    tags = run_tags({"train": {}}, summary | {"sites": {}}, Path("run"))
    assert tags["medfed.suppressed.c_ auc"] == "fewer than 10 test scans"
    assert tags["medfed.predictions"] == "kept at the sites (not logged)"
    figures = final_metrics({"sites": {"c": {"auc": None, "accuracy": 0.5}}, "x": float("nan")})
    assert figures == {"test_accuracy.c": 0.5}  # nothing suppressed or undefined is a metric


def test_without_mlflow_medfed_runs_and_track_says_how_to_install(
    tracked, tmp_path, monkeypatch
) -> None:
    import subprocess
    import sys

    blocked = "import sys; sys.modules['mlflow'] = None; from medfed.cli import app; app()"
    helped = subprocess.run(
        [sys.executable, "-c", blocked, "--help"], capture_output=True, text=True, timeout=120
    )
    assert helped.returncode == 0 and "train" in helped.stdout, helped.stderr
    monkeypatch.setitem(sys.modules, "mlflow", None)  # `import mlflow` fails as if not installed
    out = tmp_path / "run"
    argv = ["train", "--sites", *map(str, tracked["manifests"]), *TINY, "--out", str(out)]
    result = runner.invoke(app, [*argv, "--track", "local"])
    assert result.exit_code == 2 and "pip install 'medfed[mlflow]'" in result.output
    assert not (out / "summary.json").exists()  # refused before anything trained


def test_a_deployed_statistics_run_logs_only_what_the_policies_released(tmp_path) -> None:
    from medfed.runs.schema import FederationStatistics, SiteStatistics
    from medfed.runs.statistics import write_statistics

    run = tmp_path / "stats"
    refusal = {"rule": "outputs.data_card", "reason": "the data card may not leave"}
    released = SiteStatistics(
        status="released", min_count=10, counts={"class": {"0": 40.0, "1": None}},
        suppressed={"class": 1, "device": 2},
    )  # fmt: skip
    sites = {
        "clinic-a": released,
        "clinic-b": SiteStatistics(status="refused", reason="refused", refusals=[refusal]),
    }
    write_statistics(run, FederationStatistics(
        run_name="stats", plan_sha256="ab" * 32, engine="flower", time=1.0, min_count=10,
        noise="none", epsilon=0.0, delta=0.0, sites=sites,
    ))  # fmt: skip
    uri = f"sqlite:///{(tmp_path / 'store.db').as_posix()}"

    result = runner.invoke(app, ["track", str(run), "--track", uri])

    assert result.exit_code == 0, result.output
    record = json.loads((run / "tracking.json").read_text(encoding="utf-8"))
    logged = _client(uri).get_run(record["run_id"])
    tags, metrics = logged.data.tags, logged.data.metrics
    assert tags["medfed.kind"] == "statistics" and tags["medfed.site_status.clinic-a"] == "released"
    assert tags["medfed.site_status.clinic-b"] == "refused"
    assert "the data card may not leave" in tags["medfed.refused.clinic-b"]
    assert metrics["suppressed_cells.clinic-a.device"] == 2
    assert (metrics["sites_released"], metrics["sites_refused"]) == (1, 1)
    assert logged.data.params["min_count"] == "10"
    names = {a.path for a in _client(uri).list_artifacts(record["run_id"])}
    assert names == {"statistics.json"}
