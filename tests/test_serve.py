"""``medfed serve``: the HTTP answer is ``medfed route --json``'s, recorded before it is sent;
limits and the bearer token refuse what they must, and nothing refused is logged."""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from medfed.cli import app as cli
from tests.badinput import Shared
from tests.pacs_studies import assert_private, audit_rows, ct_series, fundus_photo

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402


@pytest.fixture(scope="module")
def served(shared: Shared, tmp_path_factory):
    from medfed.clinic.pacs.uploads import Limits
    from medfed.clinic.serve import Served, create_app
    from medfed.routing.bundle import TrainedFederation
    from medfed.routing.routers import make_router

    run = shared.copy_run(tmp_path_factory.mktemp("serve"))
    fed = TrainedFederation.load(run, "cpu")
    runs = {"run": Served("run", run, fed, make_router("auto", fed))}
    limits = Limits(max_bytes=2_000_000, max_pixels=200_000, max_files=50)
    client = TestClient(create_app(runs, limits, token=None))
    return client, run, shared


def _photo(shared: Shared) -> Path:
    return sorted((shared.data / "ACRIMA").glob("*.jpg"))[0]


def test_the_answer_is_route_json_and_is_logged_before_it_is_sent(served) -> None:
    client, run, shared = served
    photo = _photo(shared)
    answer = client.post("/route", params={"name": photo.name}, content=photo.read_bytes())
    assert answer.status_code == 200, answer.text
    got = answer.json()
    printed = CliRunner().invoke(cli, ["route", str(run), str(photo), "--json", "--no-audit"])
    expected = json.loads(printed.output)[0]
    for key in ("sha256", "router", "status", "chosen_site", "prediction", "reason"):
        assert got[key] == expected[key], key
    assert got["site_probs"] == pytest.approx(expected["site_probs"])
    assert got["prediction_prob"] == pytest.approx(expected["prediction_prob"])
    assert got["status"] in ("routed", "abstained") and got["file"] == photo.name
    assert (got["audit_id"], photo.name, got["status"]) in audit_rows(run)


def test_a_multipart_upload_is_answered_the_same(served) -> None:
    client, run, shared = served
    photo = _photo(shared)
    answer = client.post("/route", files={"file": (photo.name, photo.read_bytes(), "image/jpeg")})
    assert answer.status_code == 200, answer.text
    assert answer.json()["file"] == photo.name
    assert answer.json()["audit_id"] == audit_rows(run)[-1][0]


def test_a_dicom_fundus_photo_is_routed_and_kept_for_review(served) -> None:
    client, run, shared = served
    ds = fundus_photo(_photo(shared), "PSERVE1")
    buffer = io.BytesIO()
    ds.save_as(buffer, enforce_file_format=True)
    answer = client.post("/route", params={"name": "photo.dcm"}, content=buffer.getvalue())
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["status"] in ("routed", "abstained") and body["chosen_site"] or body["reason"]
    assert (run / "review" / "scans" / body["sha256"]).is_dir()
    assert assert_private(run) >= 2  # the audit log and the kept photo: owner-only
    queue = client.get("/review-queue").json()
    assert body["audit_id"] in {item["scan_id"] for item in queue}


def test_a_zipped_ct_series_is_answered_as_the_wrong_modality(served, tmp_path) -> None:
    client, run, _ = served
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zipped:
        for i, ds in enumerate(ct_series(tmp_path, "PCT")):
            one = io.BytesIO()
            ds.save_as(one, enforce_file_format=True)
            zipped.writestr(f"deep/folder/{i}.dcm", one.getvalue())
    answer = client.post("/route", params={"name": "ct.zip"}, content=buffer.getvalue())
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "abstained"
    assert "ct scan" in answer.json()["reason"]


def test_an_unreadable_scan_is_an_error_answer_that_is_logged(served) -> None:
    client, run, _ = served
    answer = client.post("/route", params={"name": "broken.png"}, content=b"not a png at all")
    assert answer.status_code == 422
    assert answer.json()["status"] == "error" and "broken.png" in answer.json()["reason"]
    assert (answer.json()["audit_id"], "broken.png", "error") in audit_rows(run)


@pytest.mark.parametrize(
    ("name", "make", "words"),
    [
        ("huge.png", lambda: _png((600, 600)), "pixels, over the limit"),
        ("big.png", lambda: os.urandom(2_100_000), "bytes"),
        ("bomb.zip", lambda: _zip(60), "over the limit of 50"),
        ("../..", lambda: b"x", "not a file name"),
    ],
)
def test_what_is_over_a_limit_is_refused_and_never_logged(served, name, make, words) -> None:
    client, run, _ = served
    before = audit_rows(run)
    answer = client.post("/route", params={"name": name}, content=make())
    assert answer.status_code in (400, 413)
    assert words in answer.json()["detail"]
    assert audit_rows(run) == before


def test_health_and_model_card_describe_the_run(served) -> None:
    client, _, _ = served
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["runs"]["run"]["modality"] == "fundus"
    card = client.get("/model-card", params={"format": "json"}).json()
    assert card["algorithm"] == "feddrm" and len(card["sites"]) == 3
    assert "worst_site_auc" in card["figures"]
    assert client.get("/model-card", params={"run": "other"}).status_code == 404


def test_the_served_model_card_is_model_card_md_and_its_json_holds_the_same_figures(
    served,
) -> None:
    from medfed.reports.model_card import MODEL_CARD, markdown_of

    client, run, _ = served
    answer = client.get("/model-card")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/markdown")
    assert answer.text == (run / "model" / MODEL_CARD).read_text(encoding="utf-8")
    document = client.get("/model-card", params={"format": "json"}).json()["card"]
    assert markdown_of(document) == answer.text
    cells = [c for s in document["sections"] for b in s["blocks"] if "table" in b
             for row in b["table"]["rows"] for c in row]  # fmt: skip
    assert cells and all(c in answer.text for c in cells)
    assert client.get("/model-card", params={"format": "xml"}).status_code == 400


def test_a_request_without_the_token_is_refused(shared: Shared, tmp_path) -> None:
    from medfed.clinic.pacs.uploads import Limits
    from medfed.clinic.serve import create_app

    client = TestClient(create_app({}, Limits(), token="s3cret"))
    assert client.get("/health").status_code == 401
    assert client.get("/health", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/health", headers={"Authorization": "Bearer s3cret"}).status_code == 200


def test_serve_off_loopback_needs_tls_and_an_owner_only_token(shared: Shared, tmp_path) -> None:
    run = str(shared.run)
    off = CliRunner().invoke(cli, ["serve", run, "--host", "0.0.0.0"])
    assert off.exit_code != 0 and "TLS" in off.output and "Traceback" not in off.output
    token = tmp_path / "token"
    token.write_text("abc\n")
    token.chmod(0o644)
    lax = CliRunner().invoke(cli, ["serve", run, "--token-file", str(token)])
    assert lax.exit_code != 0 and "chmod 600" in lax.output


def test_a_made_token_is_owner_only(tmp_path) -> None:
    from medfed.clinic.bearer import bearer_token

    token, made = bearer_token(tmp_path / "serve.token")
    assert made and len(token) >= 32
    assert (tmp_path / "serve.token").stat().st_mode & 0o777 == 0o600
    assert bearer_token(tmp_path / "serve.token") == (token, False)


def _png(size: tuple[int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.zeros((*size, 3), dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def _zip(n: int) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zipped:
        for i in range(n):
            zipped.writestr(f"{i}.dcm", b"x")
    return buffer.getvalue()


def test_no_answer_is_sent_when_the_audit_log_cannot_record_it(shared: Shared, tmp_path) -> None:
    from medfed.clinic.pacs.uploads import Limits
    from medfed.clinic.serve import Served, create_app
    from medfed.routing.bundle import TrainedFederation
    from medfed.routing.routers import make_router

    run = shared.copy_run(tmp_path)
    (run / "audit.sqlite").write_bytes(b"this is no database" * 100)
    fed = TrainedFederation.load(run, "cpu")
    client = TestClient(
        create_app({"r": Served("r", run, fed, make_router("auto", fed))}, Limits(), None)
    )
    photo = _photo(shared)
    answer = client.post("/route", params={"name": photo.name}, content=photo.read_bytes())
    assert answer.status_code == 503
    assert (
        "not answered" in answer.json()["detail"]
        and "not a SQLite database" in answer.json()["detail"]
    )
    assert "status" not in answer.json()
