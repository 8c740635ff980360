"""A real MLflow tracking server on loopback (``mlflow server``, started and stopped by the
test by its PID): a trained run logged to it through ``medfed train --track http://...`` holds
its parameters, per-round metrics, intervals and artifacts, and its model registered by name
answers as the run folder does."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from medfed.cli import app

runner = CliRunner()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    pytest.importorskip("mlflow")
    import httpx

    root = tmp_path_factory.mktemp("mlflow_server")
    port = free_port()
    command = [
        sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
        "--backend-store-uri", f"sqlite:///{(root / 'store.db').as_posix()}",
        "--artifacts-destination", (root / "artifacts").as_uri(), "--workers", "1",
    ]  # fmt: skip
    env = {**os.environ, "MLFLOW_TRACKING_URI": ""}
    log = (root / "server.log").open("wb")
    process = subprocess.Popen(
        command, cwd=root, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if process.poll() is not None:
                pytest.fail(f"mlflow server exited: {(root / 'server.log').read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        else:
            pytest.fail(
                f"mlflow server did not answer: {(root / 'server.log').read_text()[-2000:]}"
            )
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)  # the server and its workers, by the PID we started
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


def test_a_run_logged_to_a_real_tracking_server_is_complete(server, tmp_path) -> None:
    import mlflow
    import pandas as pd

    from medfed.data.synth import synthesize

    manifests = synthesize(tmp_path / "data", "fundus", n_per_site=24, seed=3, image_size=48)[:2]
    out = tmp_path / "run"
    argv = ["train", "--sites", *map(str, manifests), "--algorithm", "feddrm", "--rounds", "2"]
    argv += ["--local-steps", "1", "--batch-size", "8", "--device", "cpu", "--no-progress"]
    argv += ["--cache-dir", str(tmp_path / "cache"), "--out", str(out), "--track", server]
    argv += ["--experiment", "pilot"]

    result = runner.invoke(app, argv)

    assert result.exit_code == 0, result.output
    record = json.loads((out / "tracking.json").read_text(encoding="utf-8"))
    assert (
        record["url"] == f"{server}/#/experiments/{record['experiment_id']}/runs/{record['run_id']}"
    )
    client = mlflow.tracking.MlflowClient(tracking_uri=server)
    logged = client.get_run(record["run_id"])
    assert logged.data.params["train.algorithm"] == "feddrm"
    assert logged.data.tags["medfed.algorithm"] == "feddrm"
    assert [m.step for m in client.get_metric_history(record["run_id"], "train_loss")] == [1, 2]
    assert "worst_site_auc_low" in logged.data.metrics
    names = {a.path for a in client.list_artifacts(record["run_id"])}
    assert {"summary.json", "MODEL_CARD.md", "report.html", "data_cards"} <= names
    # registered by name through the same server: the model answers as the run folder
    registered = runner.invoke(
        app, ["track", str(out), "--track", server, "--register", "fundus-router"]
    )
    assert registered.exit_code == 0, registered.output
    photo = next(Path(manifests[0]).parent.parent.rglob("*.jpg"))
    mlflow.set_tracking_uri(server)
    model = mlflow.pyfunc.load_model("models:/fundus-router/1")
    got = json.loads(model.predict(pd.DataFrame({"path": [str(photo)]})).to_json(orient="records"))
    routed = runner.invoke(app, ["route", str(out), str(photo), "--json", "--no-audit"])
    expected = json.loads(routed.output)
    assert got[0]["chosen_site"] == expected[0]["chosen_site"]
    assert got[0]["class_probs"] == pytest.approx(expected[0]["class_probs"])
