"""The DICOMweb inbox against a real Orthanc on loopback: 5 fundus photo studies and 2 CT
studies are stored; the fundus run's watcher answers each fundus study once and skips the CT
studies saying why, the CT run's watcher answers the CT studies; every answer is read back from
Orthanc, and restarted watchers answer nothing twice."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from medfed.cli import app as cli
from tests.badinput import Shared
from tests.pacs_studies import fundus_photo, orthanc

pytest.importorskip("dicomweb_client")


@pytest.fixture(scope="module")
def ct_run(tmp_path_factory) -> tuple[Path, list[list]]:
    """A tiny CT federation (one round) and two of its synthetic CT series as studies."""
    import pydicom

    from medfed.config import TrainConfig
    from medfed.data.synth import synthesize
    from medfed.federation.training import load_sites, train

    base = tmp_path_factory.mktemp("ct")
    manifests = synthesize(base / "data", modality="ct", n_per_site=8, seed=1)
    config = TrainConfig("fedavg", rounds=1, local_steps=1, batch_size=8, device="cpu")
    train(load_sites(manifests, base / "cache"), config, base / "run_ct")
    folders = sorted({p.parent for p in (base / "data" / "CT_DICOM").rglob("*.dcm")})[:2]
    studies = [[pydicom.dcmread(p) for p in sorted(f.glob("*.dcm"))] for f in folders]
    return base / "run_ct", studies


def _reports(server, study: str) -> list:
    from dicomweb_client.api import DICOMwebClient

    client = DICOMwebClient(server.dicomweb)
    found = client.search_for_series(study, search_filters={"Modality": "SR"})
    reports = []
    for series in found:
        uid = series["0020000E"]["Value"][0]
        reports += client.retrieve_series(study, uid)
    return reports


def _watch(run: Path, url: str, *options: str, exit_code: int = 0) -> str:
    argv = ["pacs", "watch", str(run), "--dicomweb", url, "--polls", "1", "--device", "cpu"]
    result = CliRunner().invoke(cli, [*argv, *options])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == exit_code, result.output
    return result.output


def test_watcher_answers_each_study_once_and_stores_the_answer_back(
    shared: Shared, ct_run, tmp_path: Path
) -> None:
    from medfed.clinic.audit import AuditLog
    from medfed.clinic.kept import kept_scan
    from medfed.clinic.pacs.answer import read_answer
    from medfed.clinic.pacs.records import PacsLog

    run = shared.copy_run(tmp_path)
    photos = sorted((shared.data / "ACRIMA").glob("*.jpg"))[:3]
    photos += sorted((shared.data / "REFUGE").rglob("*.jpg"))[:2]
    fundus = [
        fundus_photo(p, f"PF{i}", modality="OP" if i < 3 else "OT") for i, p in enumerate(photos)
    ]
    ct_copy = tmp_path / "run_ct"
    shutil.copytree(ct_run[0], ct_copy)
    cts = ct_run[1]
    with orthanc(tmp_path / "orthanc") as server:
        server.store(fundus)
        for series in cts:
            server.store(series)
        assert len(server.get("/studies")) == 7

        first = _watch(run, server.dicomweb)

        assert first.count("answered study") == 5, first
        assert first.count("skipped study") == 2 and "wrong modality: CT" in first
        log = PacsLog(run)
        for skipped in log.scans("skipped"):  # named by the study's attributes, as the PACS lists
            series = next(c for c in cts if c[0].StudyInstanceUID == skipped.study_uid)
            date = str(series[0].StudyDate)
            assert skipped.study_date == f"{date[:4]}-{date[4:6]}-{date[6:8]}"
            assert skipped.accession == str(series[0].get("AccessionNumber", ""))[:16]
        answered = log.scans("answered")
        assert len(answered) == 5
        audit = dict(AuditLog(run).records())
        for ds in fundus:
            study = str(ds.StudyInstanceUID)
            reports = _reports(server, study)
            assert len(reports) == 1, study
            texts = read_answer(reports[0])
            answer = json.loads(texts["json"])
            scan = next(s for s in answered if s.study_uid == study)
            assert answer["audit_id"] == scan.audit_id
            assert audit[scan.audit_id].status == answer["status"]
            assert audit[scan.audit_id].file == f"pacs:{scan.key}"
            assert reports[0].PatientID == ds.PatientID
            assert texts["status"] in ("routed", "abstained")
        for series in cts:
            assert _reports(server, str(series[0].StudyInstanceUID)) == []

        on_ct = _watch(ct_copy, server.dicomweb)  # the CT run's watcher

        assert on_ct.count("answered study") == 2 and on_ct.count("skipped study") == 5
        assert "wrong modality: OP" in on_ct and "wrong modality: OT" in on_ct
        ct_scans = PacsLog(ct_copy).scans("answered")
        for series in cts:
            reports = _reports(server, str(series[0].StudyInstanceUID))
            assert len(reports) == 1
            answer = json.loads(read_answer(reports[0])["json"])
            scan = next(s for s in ct_scans if s.study_uid == series[0].StudyInstanceUID)
            assert answer["audit_id"] == scan.audit_id and answer["status"] != "error"
            # The series is kept with the run, so the Review page can show what was read.
            entry = dict(AuditLog(ct_copy).records())[scan.audit_id]
            kept = kept_scan(ct_copy, entry.sha256)
            assert kept is not None and kept.name == "series"
            assert len(list(kept.glob("*.dcm"))) == len(series)
        rows = len(audit), len(AuditLog(ct_copy).records())

        again = _watch(run, server.dicomweb) + _watch(ct_copy, server.dicomweb)  # restarted

        assert "answered" not in again and "skipped" not in again
        assert (len(AuditLog(run).records()), len(AuditLog(ct_copy).records())) == rows
        for ds in [*fundus, *(series[0] for series in cts)]:
            assert len(_reports(server, str(ds.StudyInstanceUID))) == 1
        assert log.feed_seq(server.dicomweb.rstrip("/")) is not None  # Orthanc's change feed


def test_an_abstained_scan_is_answered_in_the_pacs_without_a_prediction(
    shared: Shared, tmp_path: Path
) -> None:
    """A study made by 'medfed pacs make-study', stored in Orthanc, abstained on: the SR read
    back from Orthanc says so and holds no prediction, in its text or its JSON."""
    from medfed.clinic.pacs.answer import read_answer
    from medfed.clinic.pacs.make_study import StudyIds, make_study

    run = shared.copy_run(tmp_path)
    model = run / "model" / "model.json"
    bundle = json.loads(model.read_text())
    bundle["abstention"]["threshold"] = 0.0  # every scan lies beyond it: the router abstains
    model.write_text(json.dumps(bundle))
    photo = sorted((shared.data / "ACRIMA").glob("*.jpg"))[0]
    study = make_study([photo], StudyIds("PABSTAIN", accession="ACC9", study_date="20250101"))
    with orthanc(tmp_path / "orthanc") as server:
        server.store(study)
        said = _watch(run, server.dicomweb)
        (report,) = _reports(server, str(study[0].StudyInstanceUID))

    assert said.count("answered study") == 1
    texts = read_answer(report)
    answer = json.loads(texts["json"])
    assert texts["status"] == answer["status"] == "abstained"
    assert texts["prediction"].startswith("none: abstained")
    assert answer["prediction"] is None and answer["prediction_prob"] is None
    assert answer.get("class_probs") is None and "nearest" not in answer
    assert (report.PatientID, report.AccessionNumber, report.StudyDate) == (
        "PABSTAIN",
        "ACC9",
        "20250101",
    )


def test_an_answer_stored_before_a_crash_is_sent_again_never_routed_again(
    shared: Shared, tmp_path: Path
) -> None:
    from medfed.clinic.audit import AuditLog
    from medfed.clinic.pacs.handling import Inbox
    from medfed.clinic.pacs.watcher import DicomwebWatcher
    from medfed.routing.bundle import TrainedFederation
    from medfed.routing.routers import make_router

    run = shared.copy_run(tmp_path)
    photo = sorted((shared.data / "ACRIMA").glob("*.jpg"))[0]
    with orthanc(tmp_path / "orthanc") as server:
        server.store([fundus_photo(photo, "PCRASH")])
        fed = TrainedFederation.load(run, "cpu")
        inbox = Inbox(run, fed, make_router("auto", fed), server.dicomweb)
        watcher = DicomwebWatcher.connect(inbox, server.dicomweb)

        def crash(report) -> None:
            raise KeyboardInterrupt  # killed between the audit log and the PACS

        watcher._store, real = crash, watcher._store
        with pytest.raises(KeyboardInterrupt):
            watcher.poll()
        assert [s.status for s in inbox.log.scans()] == ["pending"]
        watcher._store = real

        outcomes = watcher.poll()

        assert [o.scan.status for o in outcomes] == ["answered"]
        assert len(AuditLog(run).records()) == 1


def test_plain_http_to_another_machine_is_refused(shared: Shared) -> None:
    argv = ["pacs", "watch", str(shared.run), "--dicomweb", "http://pacs.example.org/dicom-web"]
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code != 0 and "https" in result.output
    assert "Traceback" not in result.output


def test_an_unreachable_pacs_exits_3_with_an_error_line_and_nothing_is_recorded(
    shared: Shared, tmp_path: Path
) -> None:
    from medfed.clinic.pacs.records import PacsLog
    from tests.pacs_studies import free_port

    run = shared.copy_run(tmp_path)
    output = _watch(run, f"http://127.0.0.1:{free_port()}/dicom-web", exit_code=3)
    assert "error:" in output and "Nothing was recorded" in output
    assert "could not reach" in output and "Traceback" not in output
    assert PacsLog(run).scans() == []


def test_an_unreadable_photo_is_skipped_with_why_once(shared: Shared, tmp_path: Path) -> None:
    from medfed.clinic.pacs.records import PacsLog

    run = shared.copy_run(tmp_path)
    photo = fundus_photo(sorted((shared.data / "ACRIMA").glob("*.jpg"))[0], "PBROKEN")
    photo.PixelData = photo.PixelData[:100]  # cut short: the pixels cannot be decoded
    headless = fundus_photo(sorted((shared.data / "ACRIMA").glob("*.jpg"))[1], "PHEADLESS")
    del headless.preamble  # stored without the Part 10 preamble: served back as no DICOM file
    with orthanc(tmp_path / "orthanc") as server:
        server.store([photo])
        server.store([headless])
        first = _watch(run, server.dicomweb)
        again = _watch(run, server.dicomweb)
        assert _reports(server, str(photo.StudyInstanceUID)) == []
    assert first.count("skipped study") == 2, first
    assert "unreadable" in first and "not a DICOM file" in first
    assert "skipped" not in again
    scans = {s.study_uid: s for s in PacsLog(run).scans()}
    assert {s.status for s in scans.values()} == {"skipped"}
    assert scans[photo.StudyInstanceUID].instance_uid == photo.SOPInstanceUID
    assert scans[headless.StudyInstanceUID].instance_uid is None  # the series it was listed in
    assert not (run / "audit.sqlite").exists()  # never routed
