"""The DICOMweb watcher finds new studies whatever their StudyDate, answers each scan once across
restarts, says when the PACS cannot be reached, signs in with HTTP Basic, checks the PACS's
TLS certificate against --ca-file, and `medfed pacs backfill` lists every study. Each test
starts a real Orthanc on loopback (free ports, its own storage) and kills it by PID."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydicom.dataset import Dataset
from typer.testing import CliRunner

from medfed.cli import app as cli
from tests.badinput import Shared
from tests.pacs_studies import (
    assert_private,
    ct_series,
    free_port,
    fundus_photo,
    orthanc,
    self_signed,
    tls_proxy,
)

pytest.importorskip("dicomweb_client")
pytestmark = pytest.mark.slow


def _invoke(argv: list, exit_code: int = 0, env: dict[str, str] | None = None) -> str:
    result = CliRunner().invoke(cli, [str(a) for a in argv], env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == exit_code, result.output
    assert "Traceback" not in result.output
    return result.output


def _watch(run: Path, url: str, *options, exit_code: int = 0, env=None) -> str:
    argv = ["pacs", "watch", run, "--dicomweb", url, "--polls", "1", "--device", "cpu"]
    return _invoke([*argv, *options], exit_code, env)


def _backfill(run: Path, url: str, *options, exit_code: int = 0) -> str:
    argv = ["pacs", "backfill", run, "--dicomweb", url, "--device", "cpu", *options]
    return _invoke(argv, exit_code)


def _photo(shared: Shared, k: int, patient: str, date: str | None = None) -> Dataset:
    photos = sorted((shared.data / "ACRIMA").glob("*.jpg"))
    ds = fundus_photo(photos[k], patient)
    if date is None:
        del ds.StudyDate
    else:
        ds.StudyDate = date
    return ds


def _secret(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text + "\n", encoding="utf-8")
    path.chmod(mode)
    return path


@pytest.mark.parametrize("find", ["changes", "sweep"])
def test_a_backdated_study_stored_after_the_first_poll_is_answered(
    find: str, shared: Shared, tmp_path: Path
) -> None:
    from medfed.clinic.pacs.records import PacsLog

    run = shared.copy_run(tmp_path)
    today = _photo(shared, 0, "PTODAY", "20261201")
    with orthanc(tmp_path / "orthanc") as server:
        server.store([today])
        first = _watch(run, server.dicomweb, "--find", find)
        assert first.count("answered study") == 1 and str(today.StudyInstanceUID) in first

        backdated = _photo(shared, 1, "PMIGRATED", "19990101")  # older than the first poll's
        undated = _photo(shared, 2, "PUNDATED")  # no StudyDate at all
        server.store([backdated])
        server.store([undated])
        second = _watch(run, server.dicomweb, "--find", find)

        assert second.count("answered study") == 2, second
        assert str(backdated.StudyInstanceUID) in second
        assert str(undated.StudyInstanceUID) in second
        assert str(today.StudyInstanceUID) not in second
        third = _watch(run, server.dicomweb, "--find", find)
        assert "answered study" not in third and "skipped study" not in third
        for ds in (today, backdated, undated):
            assert server.reports(str(ds.StudyInstanceUID)) == 1
    assert len(PacsLog(run).scans("answered")) == 3
    assert assert_private(run) >= 5  # the logs, kept photos, answers: owner-only
    assert f"finding new studies by {'reading' if find == 'changes' else 'sweeping'}" in first


def test_a_restarted_watcher_answers_nothing_twice_whatever_it_reads(
    shared: Shared, tmp_path: Path
) -> None:
    from medfed.clinic.audit import AuditLog
    from medfed.clinic.pacs.records import PacsLog, watch_lock

    run = shared.copy_run(tmp_path)
    studies = [_photo(shared, k, f"PR{k}", "20250101") for k in range(3)]
    with orthanc(tmp_path / "orthanc") as server:
        for ds in studies:
            server.store([ds])
        first = _watch(run, server.dicomweb)  # auto: Orthanc offers its change feed
        assert first.count("answered study") == 3 and "change feed" in first
        rows = len(AuditLog(run).records())
        source = server.dicomweb

        again = _watch(run, source)  # restarted: goes on from the feed's last change
        PacsLog(run).set_feed_seq(source, 10**6)  # as if Orthanc's database were replaced
        reset = _watch(run, source)
        swept = _watch(run, source, "--find", "sweep")  # every study, none examined before
        swept_again = _watch(run, source, "--find", "sweep")

        for output in (again, reset, swept, swept_again):
            assert "answered study" not in output and "skipped study" not in output, output
        assert "new Orthanc database" in reset
        assert len(AuditLog(run).records()) == rows
        for ds in studies:
            assert server.reports(str(ds.StudyInstanceUID)) == 1
        with watch_lock(run):  # a second watcher of the same run is refused
            refused = _watch(run, source, exit_code=2)
        assert "another 'medfed pacs watch'" in refused


def test_an_unreachable_pacs_gives_a_nonzero_exit_and_an_error_line(
    shared: Shared, tmp_path: Path
) -> None:
    run = shared.copy_run(tmp_path)
    nowhere = f"http://127.0.0.1:{free_port()}/dicom-web"

    once = _watch(run, nowhere, exit_code=3)
    unbounded = _invoke(
        ["pacs", "watch", run, "--dicomweb", nowhere, "--interval", "1", "--max-failures", "2",
         "--device", "cpu"],
        exit_code=3,
    )  # fmt: skip
    listed = _backfill(run, nowhere, exit_code=3)

    assert "error:" in once and "is the PACS up" in once and "could not reach" in once
    assert unbounded.count("Nothing was recorded") == 2 and "2 polls in a row failed" in unbounded
    assert "error:" in listed and "searching studies" in listed


def test_basic_auth_signs_in_to_orthanc_from_a_file_or_the_environment(
    shared: Shared, tmp_path: Path
) -> None:
    run, other = shared.copy_run(tmp_path), shared.copy_run(tmp_path / "other")
    users = {"medfed": "horse battery staple"}
    good = _secret(tmp_path / "pacs.auth", "medfed:horse battery staple")
    bad = _secret(tmp_path / "wrong.auth", "medfed:guess")
    photo = _photo(shared, 0, "PAUTH", "20261201")
    with orthanc(tmp_path / "orthanc", users=users) as server:
        server.store([photo])
        url = server.dicomweb

        anonymous = _watch(run, url, exit_code=3)
        wrong = _watch(run, url, "--basic-auth-file", bad, exit_code=3)
        signed_in = _watch(run, url, "--basic-auth-file", good)
        env = {"MEDFED_PACS_USER": "medfed", "MEDFED_PACS_PASSWORD": users["medfed"]}
        from_env = _watch(other, url, "--basic-auth-env", "--find", "sweep", env=env)

        assert "refused medfed's credentials (HTTP 401)" in anonymous
        assert "refused medfed's credentials (HTTP 401)" in wrong
        assert signed_in.count("answered study") == 1
        assert from_env.count("answered study") == 1
        assert "horse battery" not in signed_in + wrong + from_env  # never printed


def test_tls_to_the_pacs_is_checked_against_the_ca_file(shared: Shared, tmp_path: Path) -> None:
    pytest.importorskip("cryptography")
    run = shared.copy_run(tmp_path)
    ca, key = self_signed(tmp_path / "tls")
    photo = _photo(shared, 0, "PTLS", "20261201")
    with orthanc(tmp_path / "orthanc") as server, tls_proxy(server.http, ca, key) as port:
        server.store([photo])
        url = f"https://127.0.0.1:{port}/dicom-web"  # the hospital's TLS reverse proxy

        unchecked = _watch(run, url, exit_code=3)
        checked = _watch(run, url, "--ca-file", ca)

    assert "TLS certificate could not be checked" in unchecked and "--ca-file" in unchecked
    assert checked.count("answered study") == 1
    assert "change feed (https://127.0.0.1" in checked  # the feed is read through TLS too


def test_backfill_lists_answered_skipped_and_pending_and_answers_the_pending(
    shared: Shared, tmp_path: Path
) -> None:
    import json

    run = shared.copy_run(tmp_path)
    answered = _photo(shared, 0, "PDONE", "20261201")
    cts = ct_series(tmp_path / "ct", "PCT")
    with orthanc(tmp_path / "orthanc") as server:
        server.store([answered])
        server.store(cts)
        _watch(run, server.dicomweb)  # answers the photo, skips the CT study
        pending = _photo(shared, 1, "PLATE", "19990101")  # stored after, backdated
        server.store([pending])
        late = str(pending.StudyInstanceUID)

        listed = _backfill(run, server.dicomweb)
        done = _backfill(run, server.dicomweb, "--answer")
        after = json.loads(_backfill(run, server.dicomweb, "--json"))
        watched = _watch(run, server.dicomweb)

        assert server.reports(late) == 1
    lines = {line.split()[2]: line for line in listed.splitlines() if " study " in line}
    assert lines[str(answered.StudyInstanceUID)].startswith("answered")
    assert "audit id" in lines[str(answered.StudyInstanceUID)]
    assert lines[str(cts[0].StudyInstanceUID)].startswith("skipped")
    assert "wrong modality: CT" in lines[str(cts[0].StudyInstanceUID)]
    assert lines[late].startswith("pending") and "not yet answered" in lines[late]
    assert "3 studies" in listed and "1 scans answered, 1 skipped, 1 pending" in listed
    assert f"answered study {late}" in done and "(just now)" in done
    assert "0 pending" in done
    assert (after["studies"], after["answered"], after["skipped"], after["pending"]) == (3, 2, 1, 0)
    assert {s["status"] for s in after["scans"] if s["study"] == late} == {"answered"}
    assert "answered study" not in watched  # the watcher does not answer it again


def test_a_pending_answer_is_listed_as_routed_and_sent_by_backfill(
    shared: Shared, tmp_path: Path
) -> None:
    from medfed.clinic.audit import AuditLog
    from medfed.clinic.pacs.handling import Inbox
    from medfed.clinic.pacs.watcher import DicomwebWatcher
    from medfed.routing.bundle import TrainedFederation
    from medfed.routing.routers import make_router

    run = shared.copy_run(tmp_path)
    photo = _photo(shared, 0, "PCRASH", "20261201")
    with orthanc(tmp_path / "orthanc") as server:
        server.store([photo])
        fed = TrainedFederation.load(run, "cpu")
        inbox = Inbox(run, fed, make_router("auto", fed), server.dicomweb)
        watcher = DicomwebWatcher.connect(inbox, server.dicomweb)

        def crash(report) -> None:
            raise KeyboardInterrupt  # killed between the audit log and the PACS

        watcher._store = crash
        with pytest.raises(KeyboardInterrupt):
            watcher.poll()

        listed = _backfill(run, server.dicomweb)
        sent = _backfill(run, server.dicomweb, "--answer")

        assert server.reports(str(photo.StudyInstanceUID)) == 1
    assert "pending" in listed and "not yet stored in the PACS" in listed
    assert "answered" in sent and "0 pending" in sent
    assert len(AuditLog(run).records()) == 1  # sent again, never routed again
