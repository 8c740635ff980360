"""The DICOM listener (C-STORE SCP): an allowed sender's photo is answered once its series is
quiet, with the audit log and a report sent back by C-STORE; a CT series is skipped as the
wrong modality; a caller whose AE title is not allowed is rejected and nothing is kept."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.badinput import Shared
from tests.pacs_studies import assert_private, ct_series, free_port, fundus_photo

pytest.importorskip("pynetdicom")
from pynetdicom import AE, evt  # noqa: E402
from pynetdicom.presentation import build_context  # noqa: E402


def _send(port: int, calling: str, datasets) -> str:
    """How the association went: 'stored' (every instance), 'rejected' or 'aborted'."""
    ae = AE(ae_title=calling)
    for ds in datasets:
        ae.add_requested_context(ds.SOPClassUID)
    assoc = ae.associate("127.0.0.1", port, ae_title="MEDFED")
    if not assoc.is_established:
        return "rejected" if assoc.is_rejected else "aborted"
    statuses = [assoc.send_c_store(ds).Status for ds in datasets]
    assoc.release()
    assert statuses == [0] * len(datasets)
    return "stored"


@pytest.fixture
def pacs(tmp_path: Path):
    """A stand-in PACS (storage SCP) that receives the answers."""
    received = []

    def keep(event) -> int:
        ds = event.dataset
        ds.file_meta = event.file_meta
        received.append(ds)
        return 0x0000

    ae = AE(ae_title="PACS")
    ae.supported_contexts = [build_context("1.2.840.10008.5.1.4.1.1.88.11")]
    port = free_port()
    server = ae.start_server(
        ("127.0.0.1", port), block=False, evt_handlers=[(evt.EVT_C_STORE, keep)]
    )
    try:
        yield port, received
    finally:
        server.shutdown()


def _scrape(port: int) -> dict[str, float]:
    """The metrics at http://127.0.0.1:PORT/metrics, parsed from Prometheus' text format."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sample.labels.items())
            found[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return found


def _wait(condition, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the listener did not answer in time"
        time.sleep(0.1)


def test_a_stored_photo_is_answered_once_and_the_answer_sent_back(
    shared: Shared, tmp_path: Path, pacs
) -> None:
    from medfed.clinic.audit import AuditLog
    from medfed.clinic.pacs.answer import read_answer
    from medfed.clinic.pacs.handling import Inbox
    from medfed.clinic.pacs.listener import Destination, Listener
    from medfed.clinic.pacs.records import PacsLog
    from medfed.routing.bundle import TrainedFederation
    from medfed.routing.routers import make_router

    pacs_port, received = pacs
    run = shared.copy_run(tmp_path)
    fed = TrainedFederation.load(run, "cpu")
    inbox = Inbox(run, fed, make_router("auto", fed), "MEDFED")
    lines: list[str] = []
    listener = Listener(
        inbox, "MEDFED", ("CAMERA", "CT01"), quiet=0.5,
        destination=Destination("PACS", "127.0.0.1", pacs_port), echo=lines.append,
    )  # fmt: skip
    from medfed.ops.telemetry import ListenMetrics

    listener.metrics = ListenMetrics(listener.waiting)
    metrics_port = free_port()
    server = listener.metrics.serve(metrics_port)
    port = free_port()
    photo = fundus_photo(sorted((shared.data / "ACRIMA").glob("*.jpg"))[0], "PLISTEN")
    ct = ct_series(tmp_path / "ct", "PLCT", n=3)
    listener.start("127.0.0.1", port)
    try:
        assert _send(port, "CAMERA", [photo]) == "stored"
        assert _send(port, "CT01", ct) == "stored"
        _wait(lambda: len(PacsLog(run).scans()) == 2 and len(received) == 1)
        assert _send(port, "CAMERA", [photo]) == "stored"  # the same photo again
        time.sleep(1.5)
        listener.flush(force=True)
        metrics = _scrape(metrics_port)
    finally:
        listener.stop()
        server.shutdown()

    # Prometheus text: 5 instances kept (the photo twice, 3 CT slices), one scan answered and
    # one skipped (the repeat is no new scan), nothing waiting
    assert metrics['medfed_pacs_listen_instances_total{result="kept"}'] == 5
    assert metrics['medfed_pacs_listen_scans_total{outcome="answered"}'] == 1
    assert metrics['medfed_pacs_listen_scans_total{outcome="skipped"}'] == 1
    assert metrics["medfed_pacs_listen_queue_depth"] == 0
    assert metrics["medfed_pacs_listen_idle_seconds"] >= 1.0

    scans = {s.modality: s for s in PacsLog(run).scans()}
    assert scans["OP"].status == "answered" and scans["OP"].instance_uid == photo.SOPInstanceUID
    assert scans["CT"].status == "skipped" and "wrong modality: CT" in scans["CT"].reason
    assert len(received) == 1  # answered once, though stored twice
    report = received[0]
    assert report.StudyInstanceUID == photo.StudyInstanceUID and report.Modality == "SR"
    assert int(read_answer(report)["audit"].split()[0]) == scans["OP"].audit_id
    assert [e.file for _, e in AuditLog(run).records()] == [f"pacs:{scans['OP'].key}"]
    assert not any((run / "pacs" / "incoming").iterdir())
    assert sum("answered study" in line for line in lines) == 1
    assert assert_private(run) >= 3  # the logs, the kept photo, the answer: owner-only


def test_a_caller_not_on_the_allow_list_is_rejected(shared: Shared, tmp_path: Path) -> None:
    from medfed.clinic.pacs.handling import Inbox
    from medfed.clinic.pacs.listener import Listener
    from medfed.routing.bundle import TrainedFederation
    from medfed.routing.routers import make_router

    run = shared.copy_run(tmp_path)
    fed = TrainedFederation.load(run, "cpu")
    listener = Listener(Inbox(run, fed, make_router("auto", fed), "MEDFED"), "MEDFED", ("CAMERA",))
    port = free_port()
    listener.start("127.0.0.1", port)
    try:
        photo = fundus_photo(sorted((shared.data / "ACRIMA").glob("*.jpg"))[0], "PNO")
        how = _send(port, "INTRUDER", [photo])
    finally:
        listener.stop()
    assert how == "rejected"
    assert not (run / "pacs" / "incoming").exists()
    assert not (run / "audit.sqlite").exists()


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--allow", "CAMERA", "--host", "0.0.0.0"], "TLS"),
        (["--allow", "CAMERA", "--answer-to", "PACS-host-4242"], "AE_TITLE@HOST:PORT"),
        (["--allow", "A_TITLE_FAR_TOO_LONG"], "1 to 16 characters"),
    ],
)
def test_listen_refuses_bad_settings(shared: Shared, argv, words) -> None:
    from typer.testing import CliRunner

    from medfed.cli import app

    result = CliRunner().invoke(app, ["pacs", "listen", str(shared.run), *argv])
    assert result.exit_code != 0 and words in result.output, result.output
    assert "Traceback" not in result.output


def test_a_series_received_before_a_restart_is_answered_after_it(shared: Shared, tmp_path) -> None:
    from medfed.clinic.pacs.handling import Inbox
    from medfed.clinic.pacs.listener import Listener
    from medfed.clinic.pacs.records import PacsLog
    from medfed.routing.bundle import TrainedFederation
    from medfed.routing.routers import make_router

    run = shared.copy_run(tmp_path)
    fed = TrainedFederation.load(run, "cpu")
    inbox = Inbox(run, fed, make_router("auto", fed), "MEDFED")
    photo = fundus_photo(sorted((shared.data / "ACRIMA").glob("*.jpg"))[1], "PRESTART")
    first = Listener(inbox, "MEDFED", ("CAMERA",), quiet=3600.0)  # never quiet before the stop
    port = free_port()
    first.start("127.0.0.1", port)
    try:
        assert _send(port, "CAMERA", [photo]) == "stored"
    finally:
        first.stop()  # stopped (as if killed) before the series was complete
    assert PacsLog(run).scans() == []
    assert len(list((run / "pacs" / "incoming").iterdir())) == 1

    second = Listener(inbox, "MEDFED", ("CAMERA",), quiet=0.2, echo=lambda _: None)
    second.start("127.0.0.1", free_port())
    try:
        _wait(lambda: len(PacsLog(run).scans("answered")) == 1)
    finally:
        second.stop()
    [scan] = PacsLog(run).scans()
    assert scan.instance_uid == photo.SOPInstanceUID
    assert (run / "pacs" / "answers" / f"{scan.answer_uid}.dcm").is_file()
