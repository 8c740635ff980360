"""``medfed serve``: the routing service, an HTTP API over one or more trained runs.

``POST /route`` answers an uploaded scan (a photo, a DICOM file, a zipped DICOM series, a NIfTI
file) with the same JSON as ``medfed route --json``, plus ``audit_id`` (its row in the run's
audit log, the scan id of the Review page) and ``run``; the row is committed before the answer
is sent. ``GET /health``, ``GET /model-card`` and ``GET /review-queue`` read the runs. Each answer
names its model (``model``); a run whose served model is replaced (``medfed ops promote``,
``rollback``) answers with the new one from its next scan on (:mod:`medfed.clinic.releases`).
``GET /livez`` (the process answers) and ``GET /readyz`` (every run's model is loaded and its
audit log takes a row) need no token and name nothing; ``GET /metrics`` is Prometheus' text.

Limits are checked before anything is decoded: the request's size (its Content-Length, and the
bytes actually read), a zip's members and unpacked size, and the pixels of every image, DICOM
file and NIfTI volume (from their headers). A refused request is answered 413 or 400 and is
never routed or logged. Off loopback every request but the probes needs ``Authorization:
Bearer TOKEN``.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import math
import os
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from medfed.clinic.audit import AUDIT_FILE, AuditError
from medfed.clinic.kept import keep_scan
from medfed.clinic.pacs.uploads import LimitError, Limits, unpack_upload
from medfed.clinic.recorded import record_scan
from medfed.clinic.releases import LiveModel
from medfed.core.errors import DataError, MedfedError
from medfed.ops.telemetry import EventLog, ServeMetrics, request_id
from medfed.routing.bundle import TrainedFederation
from medfed.routing.routers import Router

__all__ = ["OPEN_PATHS", "Served", "create_app", "readiness", "warm_up"]

_CHUNK = 1 << 16
OPEN_PATHS = ("/livez", "/readyz")  # probes: no token, and a body that names nothing
_QUIET = (*OPEN_PATHS, "/metrics")  # polled every few seconds: logged only when they fail


class Served:
    """One run the service answers with: its folder and its current model (federation and
    router), replaced in place when the run's served model changes (medfed ops promote)."""

    def __init__(
        self,
        name: str,
        path: Path,
        fed: TrainedFederation,
        router: Router,
        rule: str = "auto",
        device: str = "auto",
        live: LiveModel | None = None,
    ) -> None:
        self.name, self.path = name, Path(path)
        self.live = live or LiveModel(self.path, fed, router, rule, device)

    @property
    def fed(self) -> TrainedFederation:
        return self.live.current()[0]


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
        fed, router = served.live.current()  # one model for the whole answer
        done = record_scan(fed, router, path, served.path, name=name)
        if done.entry.status != "error" and path.is_file():
            keep_scan(served.path, path, done.entry.sha256, path.name)
    return {**done.to_dict(), "run": served.name}


def warm_up() -> None:
    """Import what the first scan would otherwise wait for: MONAI's transforms, imported on
    first use by the preprocessing pipelines (seconds on a small machine)."""
    import monai.transforms  # noqa: F401


def _refusal(request: Request, limits: Limits, token: str | None) -> Any:
    """The answer to a request refused before it is handled (no token, too large); None when
    it may go on. The liveness and readiness probes need no token and carry no body."""
    if request.url.path in OPEN_PATHS:
        return None
    if token is not None:
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return _error(401, "missing or wrong bearer token (Authorization: Bearer TOKEN)")
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > limits.max_bytes):
        return _error(
            413,
            f"the request is over the {limits.max_bytes} bytes this service accepts (--max-bytes)",
        )
    return None


def _add_guard(
    app: FastAPI, limits: Limits, token: str | None, log: EventLog, metrics: ServeMetrics
) -> None:
    """Every request: its id, the token and size checks, one log line and its metrics. The
    log line names the path, never the query (which may name the scan's file)."""

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Any:
        rid = request_id(request.headers.get("x-request-id"))
        request.state.request_id, request.state.outcome = rid, None
        start = time.perf_counter()
        response = _refusal(request, limits, token)
        if response is None:
            try:
                response = await call_next(request)
            except Exception as exc:  # answered 500; the log says what, never a traceback
                log("request.failed", "error", request_id=rid, path=request.url.path,
                    error=type(exc).__name__)  # fmt: skip
                response = _error(500, "internal error; the service log has the request id")
        seconds = time.perf_counter() - start
        response.headers["X-Request-ID"] = rid
        path, outcome = request.url.path, request.state.outcome
        if path == "/route" and outcome is None:
            outcome = "refused"  # not answered, not logged in the audit log
        metrics.observe(path, response.status_code, seconds, outcome)
        if request.url.path not in _QUIET or response.status_code != 200:
            log(
                "request", "info" if response.status_code < 500 else "error", request_id=rid,
                method=request.method, path=request.url.path, status=response.status_code,
                seconds=round(seconds, 4), outcome=outcome,
            )  # fmt: skip
        return response


def create_app(
    runs: dict[str, Served],
    limits: Limits,
    token: str | None,
    log: EventLog | None = None,
    metrics: ServeMetrics | None = None,
) -> FastAPI:
    """The FastAPI application over ``runs`` (name -> Served); ``token``: the bearer token
    every request must carry but the probes (None: none needed, loopback only); ``log``:
    where its event lines go (text on stderr by default); ``metrics``: its /metrics."""
    app = FastAPI(title="medfed routing service", docs_url=None, redoc_url=None)
    log = log or EventLog()
    metrics = metrics or ServeMetrics()
    _add_guard(app, limits, token, log, metrics)
    for served in runs.values():
        served.live.on_swap = _swap_logger(log, metrics, served.name)

    @app.get("/livez")
    def livez() -> Any:
        return PlainTextResponse("ok")

    @app.get("/readyz")
    def readyz() -> Any:
        problems = readiness(runs)
        for problem in problems:
            log("not_ready", "warning", reason=problem)
        checks = {"model": not any(p.startswith("model") for p in problems),
                  "audit_log": not any(p.startswith("audit") for p in problems)}  # fmt: skip
        body = {"status": "not ready" if problems else "ready", "checks": checks}
        return JSONResponse(body, status_code=503 if problems else 200)

    @app.get("/metrics")
    def prometheus() -> Any:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "runs": {n: _describe(s) for n, s in runs.items()}}

    @app.get("/model-card")
    def model_card(run: str | None = None, format: str = "markdown") -> Any:
        try:
            served = _pick(runs, run)
        except MedfedError as exc:
            return _error(404, str(exc))
        if format not in ("markdown", "json"):
            return _error(400, f"format={format}: give format=markdown or format=json")
        return _card_answer(served, format)

    @app.get("/review-queue")
    def review_queue(run: str | None = None, reader: str | None = None) -> Any:
        from medfed.clinic.review import Review

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
        request.state.outcome = answer["status"]
        log("scan.answered", request_id=request.state.request_id, run=served.name,
            audit_id=answer.get("audit_id"), status=answer["status"])  # fmt: skip
        code = 422 if answer["status"] == "error" else 200
        return JSONResponse(json.loads(json.dumps(_clean(answer))), status_code=code)

    return app


def _swap_logger(log: EventLog, metrics: ServeMetrics, run: str) -> Any:
    """What the service does when a run's served model changed: a log line and a count."""

    def swapped(before: str | None, after: str | None, problem: str | None) -> None:
        metrics.model_changes.labels("failed" if problem else "replaced").inc()
        if problem:
            log("model.replace_failed", "error", run=run, model=after, reason=problem)
        else:
            log("model.replaced", run=run, model=after, replaced=before)

    return swapped


def readiness(runs: dict[str, Served]) -> list[str]:
    """Why the service cannot answer yet ([]: ready): a run without its model, or an audit
    log that cannot be written (each answer is recorded there before it is sent)."""
    problems = [] if runs else ["model: no run is served"]
    for served in runs.values():
        if served.fed is None or not served.fed.sites:
            problems.append(f"model: run {served.name} has no model loaded")
        why = audit_unwritable(served.path / AUDIT_FILE)
        if why:
            problems.append(f"audit log {served.path / AUDIT_FILE}: {why}")
    return problems


def audit_unwritable(path: Path) -> str | None:
    """Why the audit log at ``path`` cannot take a row (None when it can): a write lock is
    taken and given back, nothing written."""
    if not path.exists():
        folder = path.parent
        return None if os.access(folder, os.W_OK | os.X_OK) else f"{folder} is not writable"
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=2)) as db:
            db.execute("BEGIN IMMEDIATE")
            db.execute("SELECT count(*) FROM sqlite_master")
            db.rollback()
    except sqlite3.Error as exc:
        return str(exc)
    return None


def _describe(served: Served) -> dict[str, Any]:
    fed, router = served.live.current()
    out = {
        "model": fed.model_id,
        "modality": fed.modality,
        "algorithm": fed.algorithm,
        "router": router.name,
        "sites": [s.id for s in fed.sites],
        "classes": fed.class_names(),
    }
    return out | ({"model_problem": served.live.problem} if served.live.problem else {})


def _card_answer(served: Served, form: str) -> Any:
    """MODEL_CARD.md as written (markdown), or the data it is written from (JSON, under
    ``card``, beside the run's description); a run without a finished summary gets the short
    description alone in JSON and 404 in markdown."""
    from medfed.reports.model_card import CardInputs, card_document, markdown_of

    try:
        document = card_document(CardInputs.read(served.path))
    except MedfedError as exc:
        if form == "json":
            return JSONResponse(_clean(_card(served)))
        return _error(404, f"{served.path}: no model card ({exc})")
    if form == "json":
        return JSONResponse(_clean({**_card(served), "card": document}))
    return Response(markdown_of(document), media_type="text/markdown; charset=utf-8")


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
