"""The resident site worker (medfed deploy worker): a deployed run through it equals one without,
and a worker that is missing, badly placed or sent garbage gets a clear answer."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from medfed.config import TrainConfig  # noqa: E402
from medfed.core.errors import ConfigError  # noqa: E402
from medfed.flower import worker as site_worker  # noqa: E402
from medfed.runs import RunDir  # noqa: E402
from tests.flowergrid import run_in_process  # noqa: E402

CONFIG = TrainConfig(algorithm="feddrm", rounds=2, local_steps=2, batch_size=8, seed=5)


@pytest.fixture(scope="module")
def sites(tiny_sites, tmp_path_factory) -> tuple[dict[str, Path], Path, Path]:
    """The conftest's three small sites, and a folder for this module's runs."""
    manifests, cache = tiny_sites
    return manifests, cache, tmp_path_factory.mktemp("worker_runs")


@pytest.fixture
def serving(tmp_path):
    """A worker serving on a socket in a thread of this process."""
    folder = tmp_path / "sock"
    folder.mkdir(mode=0o700)
    server = site_worker.WorkerServer(folder / "worker.sock")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.path
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def _figures(run: Path) -> tuple[list, dict]:
    records = [
        (r["round"], r["site"], r["status"], r.get("train_loss"), r.get("val_loss"))
        for r in RunDir(run).read_metrics()
    ]
    summary = RunDir(run).read_summary()
    return records, {site: s["auc"] for site, s in summary["sites"].items()}


def test_a_run_through_the_worker_equals_a_run_without(sites, serving) -> None:
    manifests, cache, root = sites
    direct, _ = run_in_process(root, manifests, cache, CONFIG, name="direct")
    relayed, _ = run_in_process(root, manifests, cache, CONFIG, name="relayed", worker=serving)
    assert _figures(relayed) == _figures(direct)
    assert oct(serving.stat().st_mode & 0o777) == "0o600"
    # SecAgg+ keeps its key exchanges in the ClientApp and hands the training to the worker.
    secured, _ = run_in_process(
        root, manifests, cache, CONFIG, name="relayed_secure", worker=serving, secure=True
    )
    records = RunDir(secured).read_metrics()
    assert all(r["status"] == "ok" and r["aggregated"] for r in records)


def test_a_worker_that_does_not_answer_is_named_with_how_to_start_it(sites, tmp_path) -> None:
    manifests, cache, root = sites
    missing = tmp_path / "nobody.sock"
    with pytest.raises(ConfigError, match="did not connect") as refused:
        run_in_process(root, manifests, cache, CONFIG, name="no_worker", worker=missing, wait_s=1)
    assert f"worker at {missing} does not answer" in str(refused.value)
    assert f"medfed deploy worker {missing}" in str(refused.value)


def test_a_garbled_request_is_answered_and_the_worker_goes_on(serving) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(serving))
        site_worker._send(sock, b"train", b"\xff not a context", b"")
        status, _, _ = site_worker._receive(sock, 3)
    assert json.loads(status) == {"ok": False, "error": json.loads(status)["error"]}
    assert "bad request" in json.loads(status)["error"]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(serving))
        site_worker._send(sock, b"format_disk", b"", b"")
        status, _, _ = site_worker._receive(sock, 3)
    assert "unknown work 'format_disk'" in json.loads(status)["error"]


def test_a_socket_path_others_could_replace_is_refused(tmp_path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ConfigError, match="others may write to"):
        site_worker.WorkerServer(shared / "worker.sock")
    (tmp_path / "file.sock").write_text("not a socket\n")
    with pytest.raises(ConfigError, match="is not a socket"):
        site_worker.WorkerServer(tmp_path / "file.sock")
    with pytest.raises(ConfigError, match="does not exist"):
        site_worker.WorkerServer(tmp_path / "nofolder" / "worker.sock")
    with pytest.raises(ConfigError, match="at most 100 bytes"):
        site_worker.WorkerServer(tmp_path / ("w" * 120))
