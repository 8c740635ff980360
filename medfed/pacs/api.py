"""``medfed serve``: the routing service, an HTTP API over one or more trained runs.

``POST /route`` answers an uploaded scan (a photo, a DICOM file, a zipped DICOM series, a NIfTI
file) with the same JSON as ``medfed route --json``, plus ``audit_id`` (its row in the run's
audit log, the scan id of the Review page) and ``run``; the row is committed before the answer
is sent. ``GET /health``, ``GET /model-card`` and ``GET /review-queue`` read the runs.

Limits are checked before anything is decoded: the request's size (its Content-Length, and the
bytes actually read), a zip's members and unpacked size, and the pixels of every image, DICOM
file and NIfTI volume (from their headers). A refused request is answered 413 or 400 and is
never routed or logged. Off loopback every request needs ``Authorization: Bearer TOKEN``.
"""

from __future__ import annotations

import hmac
import json
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from medfed.errors import DataError, MedfedError
from medfed.pacs.uploads import LimitError, Limits, unpack_upload
from medfed.serving.audit import AuditError
from medfed.serving.bundle import TrainedFederation
from medfed.serving.kept import keep_scan
from medfed.serving.recorded import record_scan
from medfed.serving.routers import Router

__all__ = ["Served", "create_app", "warm_up"]

_CHUNK = 1 << 16


@dataclass
class Served:
    """One run the service answers with: its folder, federation and router."""

    name: str
    path: Path
    fed: TrainedFederation
    router: Router


def _error(status: int, detail: str) -> Any:
    return JSONResponse({"detail": detail}, status_code=status)


def _pick(runs: dict[str, Served], name: str | None) -> Served:
    if name is None:
        if len(runs) == 1:
            return next(iter(runs.values()))
        raise DataError(
            f"this service answers with {len(runs)} runs: name one with ?run=NAME "
            f"({', '.join(sorted(runs))})"
        )
    if name not in runs:
        raise DataError(f"no run named {name!r} here; choose one of {', '.join(sorted(runs))}")
    return runs[name]


def _clean(value: Any) -> Any:
    """JSON-safe values: NaN and infinities become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


async def _read_body(request: Request, limit: int) -> bytes | None:
    """The request's bytes, or None when more than ``limit`` arrive."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def _form_file(request: Request, body: bytes) -> tuple[str | None, bytes | None]:
    """The form field ``file`` of a multipart request whose bytes are ``body``."""

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    form = await Request(request.scope, receive).form(max_files=1, max_fields=8)
    upload = form.get("file")
    if upload is None or isinstance(upload, str):
        return None, None
    return upload.filename, await upload.read()


def _route_upload(served: Served, name: str, data: bytes, limits: Limits) -> dict[str, Any]:
    """Route one upload (blocking: run in a worker thread) and record it."""
    with tempfile.TemporaryDirectory(prefix="medfed-serve-") as folder:
        path = unpack_upload(Path(folder), name, data, limits)
        done = record_scan(served.fed, served.router, path, served.path, name=name)
        if done.entry.status != "error" and path.is_file():
            keep_scan(served.path, path, done.entry.sha256, path.name)
    return {**done.to_dict(), "run": served.name}


def warm_up() -> None:
    """Import what the first scan would otherwise wait for: MONAI's transforms, imported on
    first use by the preprocessing pipelines (seconds on a small machine)."""
    import monai.transforms  # noqa: F401


def create_app(runs: dict[str, Served], limits: Limits, token: str | None) -> FastAPI:
    """The FastAPI application over ``runs`` (name -> Served); ``token``: the bearer token
    every request must carry (None: none needed, loopback only)."""
    app = FastAPI(title="medfed routing service", docs_url=None, redoc_url=None)

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Any:
        if token is not None:
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                return _error(401, "missing or wrong bearer token (Authorization: Bearer TOKEN)")
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limits.max_bytes):
            return _error(
                413,
                f"the request is over the {limits.max_bytes} bytes this service "
                "accepts (--max-bytes)",
            )
        return await call_next(request)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "runs": {n: _describe(s) for n, s in runs.items()}}

    @app.get("/model-card")
    def model_card(run: str | None = None) -> Any:
        try:
            served = _pick(runs, run)
        except MedfedError as exc:
            return _error(404, str(exc))
        return JSONResponse(_clean(_card(served)))

    @app.get("/review-queue")
    def review_queue(run: str | None = None, reader: str | None = None) -> Any:
        from medfed.serving.review import Review

        try:
            served = _pick(runs, run)
            items = Review(served.path).queue(reader=reader)
        except MedfedError as exc:
            return _error(404 if isinstance(exc, DataError) else 500, str(exc))
        return JSONResponse(_clean([item.to_dict() for item in items]))

    @app.post("/route")
    async def route(request: Request, name: str | None = None, run: str | None = None) -> Any:
        try:
            served = _pick(runs, run)
        except MedfedError as exc:
            return _error(404, str(exc))
        data = await _read_body(request, limits.max_bytes)
        if data is None:
            return _error(
                413,
                f"the request is over the {limits.max_bytes} bytes this service "
                "accepts (--max-bytes)",
            )
        if request.headers.get("content-type", "").startswith("multipart/form-data"):
            name, data = await _form_file(request, data)
        if not name or data is None:
            return _error(
                400,
                "no scan: send its bytes with ?name=FILE_NAME, or as the form "
                "field 'file' (multipart/form-data)",
            )
        try:
            answer = await run_in_threadpool(_route_upload, served, name, data, limits)
        except AuditError as exc:
            return _error(503, f"not answered: the decision cannot be recorded ({exc})")
        except MedfedError as exc:
            return _error(413 if isinstance(exc, LimitError) else 400, str(exc))
        code = 422 if answer["status"] == "error" else 200
        return JSONResponse(json.loads(json.dumps(_clean(answer))), status_code=code)

    return app


def _describe(served: Served) -> dict[str, Any]:
    return {
        "modality": served.fed.modality,
        "algorithm": served.fed.algorithm,
        "router": served.router.name,
        "sites": [s.id for s in served.fed.sites],
        "classes": served.fed.class_names(),
    }


def _card(served: Served) -> dict[str, Any]:
    """What a clinician checks before trusting the run: the model, its sites and its figures."""
    from medfed.runs import RunDir

    run = RunDir(served.path)
    card: dict[str, Any] = {"run": served.name, **_describe(served)}
    if run.summary_path.is_file():
        summary = json.loads(run.summary_path.read_text(encoding="utf-8"))
        keys = (
            "rounds",
            "mean_site_auc",
            "worst_site_auc",
            "worst_site",
            "average_accuracy",
            "system_accuracy",
            "routing_accuracy",
        )
        card["figures"] = {k: summary.get(k) for k in keys if k in summary}
        card["sites_figures"] = {
            site: {k: v for k, v in figures.items() if k in ("auc", "accuracy", "n_test")}
            for site, figures in (summary.get("sites") or {}).items()
            if isinstance(figures, dict)
        }
    return card
