"""Scans from the PACS on the dashboard: the Routing page's audit log and the Review page's
queue list them by accession number, patient (a keyed hash by default) and study date beside
the file and the study UID, and the Review page pictures the photo."""

from __future__ import annotations

from pathlib import Path

import pytest

from medfed.clinic.pacs.instances import Ids, ids_from_name, with_pacs_ids
from tests.badinput import Shared
from tests.pacs_studies import fundus_photo

pytest.importorskip("streamlit")
import pandas as pd  # noqa: E402
from streamlit import config as streamlit_config  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from medfed.dashboard import APP, RUNS_ENV  # noqa: E402


def test_the_audit_name_of_a_pacs_scan_gives_back_its_ids() -> None:
    ids = Ids("1.2.3", "1.2.3.4", "1.2.3.4.5")
    assert ids_from_name(ids.name) == ids
    assert ids_from_name("pacs:1.2/3.4") == Ids("1.2", "3.4")
    for other in ("scan.png", "pacs:../etc/passwd", "pacs:1.2", "/data/pacs:1.2/3.4"):
        assert ids_from_name(other) is None
    table = pd.DataFrame({"scan": [1, 2], "file": ["up.png", ids.name], "site": ["a", "b"]})
    shown = with_pacs_ids(table)  # no run's PACS log: the study UID alone
    columns = ["scan", "file", "accession", "patient", "study date", "study", "site"]
    assert list(shown.columns) == columns
    assert shown["study"].tolist() == ["", "1.2.3"] and shown["accession"].tolist() == ["", ""]
    assert with_pacs_ids(table.iloc[:1]).columns.tolist() == ["scan", "file", "site"]


def _page(monkeypatch, run: Path, page: str) -> AppTest:
    monkeypatch.setenv(RUNS_ENV, str(run))
    streamlit_config.set_option("server.address", "127.0.0.1")
    at = AppTest.from_file(str(APP), default_timeout=120).run()
    at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_routing_and_review_pages_list_pacs_scans_by_accession_patient_and_date(
    monkeypatch, shared: Shared, tmp_path: Path
) -> None:
    from medfed.clinic.pacs.handling import Inbox
    from medfed.clinic.pacs.visits import patient_token
    from medfed.clinic.review import Review, queue_text
    from medfed.routing.bundle import TrainedFederation
    from medfed.routing.routers import make_router

    run = shared.copy_run(tmp_path)
    fed = TrainedFederation.load(run, "cpu")
    photo = fundus_photo(sorted((shared.data / "ACRIMA").glob("*.jpg"))[0], "PDASH")
    sent = []
    Inbox(run, fed, make_router("auto", fed), "test").handle([photo], sent.append)
    assert len(sent) == 1
    study, series = str(photo.StudyInstanceUID), str(photo.SeriesInstanceUID)
    token = patient_token(run, "PDASH")  # the default policy: a keyed hash, never the ID
    assert token.startswith("h:") and "PDASH" not in token

    review = _page(monkeypatch, run, "views/review.py")
    queue = review.dataframe[0].value
    assert queue["accession"].tolist() == ["PDASH"] and queue["patient"].tolist() == [token]
    assert queue["study date"].tolist() == ["2026-12-01"] and queue["study"].tolist() == [study]
    captions = [c.value for c in review.caption]
    where = f"accession PDASH, patient {token}, 2026-12-01; study {study}, series {series}."
    assert f"From the PACS: {where}" in captions
    assert len(review.image) == 1  # the photo kept with the run
    assert f"accession PDASH, patient {token}, 2026-12-01 (pacs:" in queue_text(Review(run))

    routing = _page(monkeypatch, run, "views/routing.py")
    logged = [d.value for d in routing.dataframe if "study" in d.value.columns]
    assert logged and logged[0]["accession"].tolist() == ["PDASH"]
    # the run's PACS log holds the keyed hash, not the PatientID, under the default policy
    from medfed.clinic.pacs.records import PacsLog

    assert [s.patient for s in PacsLog(run).scans()] == [token]
