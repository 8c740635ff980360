"""The routing service and the PACS inboxes: ``medfed serve`` and ``medfed pacs ...``."""

from __future__ import annotations

import contextlib
import functools
import math
from pathlib import Path
from typing import Annotated, Any

import typer

from medfed.cli.common import (
    SERVING,
    DeviceOpt,
    LogFormatOpt,
    MetricsHostOpt,
    MetricsPortOpt,
    TrainedRunArg,
    adder,
    friendly,
    update_section,
    wants_metrics,
)
from medfed.clinic.pacs import MAX_BYTES, MAX_FILES, MAX_PIXELS
from medfed.core.errors import ConfigError, require_extra

pacs_app = typer.Typer(
    help="New scans from the hospital's PACS: a DICOMweb inbox and a DICOM listener.\n\n"
    "Also every study's state in the PACS (medfed pacs backfill) and the routing service's "
    "load test (medfed pacs load).",
    no_args_is_help=True,
)

RunsArg = Annotated[list[Path], typer.Argument(help="Run directories written by 'medfed train'.")]
RouterOpt = Annotated[str, typer.Option(help="auto or a router of 'medfed route --help'.")]
TlsCertOpt = Annotated[Path | None, typer.Option("--tls-cert", help="TLS certificate (PEM).")]
TlsKeyOpt = Annotated[Path | None, typer.Option("--tls-key", help="TLS private key (PEM).")]


PatientIdsOpt = Annotated[
    str,
    typer.Option(
        "--patient-ids",
        help="How the review lists a scan's patient: hash (a keyed hash of the PatientID, "
        "kept with the run), plain (the PatientID) or none. Scans are also listed by "
        "accession number and study date.",
    ),
]
RetentionOpt = Annotated[
    float,
    typer.Option(
        "--retention-days",
        help="Remove kept scans and written-back reports older than this many days when the "
        "service starts (each logged; the audit log keeps every row); 0 keeps them. Purge "
        "daily with 'medfed review RUN --purge-older-than DAYS'.",
        min=0,
    ),
]
SQLITE_ENDS = ("", "-wal", "-shm", "-journal")  # a SQLite database and its side files


def _load(runs: list[Path], router: str, device: str) -> dict[str, Any]:
    from medfed.clinic.releases import LiveModel
    from medfed.clinic.serve import Served

    served = {}
    for path in runs:
        name = path.resolve().name
        if name in served:
            raise ConfigError(f"{path}: two runs are named {name!r}; serve runs of distinct names")
        _require_audit_log(path)
        live = LiveModel.open(path, router, device)
        served[name] = Served(name, path, *live.current(), router, device, live=live)
    return served


def _require_audit_log(run: Path) -> None:
    """Refuse to serve a run whose audit log is damaged: every answer is recorded there first."""
    from medfed.clinic.audit import AUDIT_FILE
    from medfed.clinic.serve import audit_unwritable

    log = run / AUDIT_FILE
    why = audit_unwritable(log)
    if why:
        raise ConfigError(
            f"{log}: the audit log is damaged or cannot be written ({why}); medfed serve records "
            "every answer there before sending it, so it does not start. Move the file aside "
            "(or restore it from a backup) and make the run directory writable, then start "
            "medfed serve again"
        )


@friendly
def serve(
    runs: RunsArg,
    host: Annotated[
        str,
        typer.Option(
            help="Address to listen on. Off loopback a bearer token is required and TLS is "
            "served (--tls-cert, --tls-key); behind a reverse proxy, keep 127.0.0.1."
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.", min=1, max=65535)] = 8765,
    router: RouterOpt = "auto",
    device: DeviceOpt = "auto",
    token_file: Annotated[
        Path | None,
        typer.Option(
            "--token-file",
            help="Bearer token file (made, owner-only, when missing). Required off loopback: "
            "default FIRST_RUN/serve.token there; on loopback, only when given.",
        ),
    ] = None,
    tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None,
    max_bytes: Annotated[
        int, typer.Option(help="Largest request (and unzipped series), bytes.")
    ] = MAX_BYTES,
    max_pixels: Annotated[int, typer.Option(help="Most pixels (voxels) of one scan.")] = MAX_PIXELS,
    max_files: Annotated[int, typer.Option(help="Most files in one zipped series.")] = MAX_FILES,
    log_format: LogFormatOpt = "text",
    retention_days: RetentionOpt = 0.0,
) -> None:
    """Start the routing service: an HTTP API that answers scans as 'medfed route --json' does.

    POST /route (the scan's bytes with ?name=FILE, or a form field 'file'), GET /health,
    GET /model-card, GET /review-queue; ?run=NAME picks a run when several are served. Every
    answer is in the run's audit log before it is sent. GET /livez and GET /readyz (no token),
    GET /metrics (Prometheus); one log line per request on stderr (--log-format json)."""
    require_extra("fastapi", "serve", "medfed serve")
    require_extra("uvicorn", "serve", "medfed serve")
    require_extra("prometheus_client", "serve", "medfed serve")
    import uvicorn

    from medfed.clinic.bearer import TOKEN_FILE, bearer_token, is_loopback
    from medfed.clinic.pacs.credentials import check_tls_pair
    from medfed.clinic.pacs.uploads import Limits
    from medfed.clinic.serve import create_app, warm_up
    from medfed.ops.telemetry import EventLog

    log = EventLog(log_format)
    limits = Limits(max_bytes, max_pixels, max_files)
    if not runs:
        raise ConfigError("name at least one run directory to serve")
    local = is_loopback(host)
    check_tls_pair(tls_cert, tls_key)
    if not local and tls_cert is None:
        raise ConfigError(
            f"--host {host} is not loopback: the service must serve TLS there (--tls-cert, "
            "--tls-key), or listen on 127.0.0.1 behind a TLS reverse proxy"
        )
    token = None
    if token_file is not None or not local:
        where = token_file or runs[0] / TOKEN_FILE
        token, made = bearer_token(where)
        typer.echo(f"bearer token {'written to' if made else 'read from'} {where} (owner-only)")
    served = _load(runs, router, device)
    for path in runs:
        keep_data_private(path, retention_days)
    warm_up()  # before listening: the first patient does not wait for imports
    app = create_app(served, limits, token, log)
    scheme = "https" if tls_cert else "http"
    log("service.started", runs=",".join(served), url=f"{scheme}://{host}:{port}")
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,  # request lines name no patient, but keep logs free of them all
        ssl_certfile=str(tls_cert) if tls_cert else None,
        ssl_keyfile=str(tls_key) if tls_key else None,
    )


def _inbox(
    run: Path,
    router: str,
    device: str,
    source: str,
    retention_days: float = 0.0,
    patient_ids: str = "hash",
) -> Any:  # an Inbox
    from medfed.clinic.pacs.handling import Inbox
    from medfed.clinic.pacs.visits import check_policy
    from medfed.clinic.releases import LiveModel

    check_policy(patient_ids)
    live = LiveModel.open(run, router, device)
    keep_data_private(run, retention_days)
    return Inbox(run, *live.current(), source, patient_ids, live=live)


def keep_data_private(run: Path, retention_days: float = 0.0) -> None:
    """A service that writes patient data into ``run``: everything it writes owner-only (files
    0600, folders 0700), and what an earlier run of it left there made so too; with a retention,
    what is older than it removed (and logged)."""
    from medfed.clinic.audit import AUDIT_FILE
    from medfed.clinic.pacs.records import PACS_FILE
    from medfed.core.fileio import keep_private

    databases = [run / f"{name}{end}" for name in (AUDIT_FILE, PACS_FILE) for end in SQLITE_ENDS]
    keep_private(*databases, run / "review", run / "pacs")
    if retention_days > 0:
        from medfed.clinic.retention import purge

        removed = purge(run, retention_days)
        if removed:
            typer.echo(
                f"retention: removed {len(removed)} kept scan(s) and report(s) older than "
                f"{retention_days:g} days from {run} (logged in RUN/review/purged.jsonl)",
                err=True,
            )


def _seconds(least: float) -> Any:
    """Option callback: a finite number of seconds, at least ``least``."""

    def check(ctx: typer.Context, param: typer.CallbackParam, value: float | None) -> Any:
        if value is not None and not (math.isfinite(value) and value >= least):
            name = param.opts[0] if param.opts else param.name
            raise typer.BadParameter(
                f"{name} {value}: give a number of seconds, at least {least:g}",
                ctx=ctx,
                param=param,
            )
        return value

    return check


DicomwebOpt = Annotated[
    str,
    typer.Option(
        "--dicomweb",
        help="The PACS's DICOMweb root (QIDO-RS, WADO-RS, STOW-RS), e.g. "
        "https://pacs.example.org/dicom-web; plain http only on loopback.",
    ),
]
TokenFileOpt = Annotated[
    Path | None,
    typer.Option("--token-file", help="Bearer token for the PACS (an owner-only file)."),
]
BasicFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--basic-auth-file",
        help="HTTP Basic credentials for the PACS (stock Orthanc): an owner-only (chmod 600) "
        "file whose first line is USER:PASSWORD.",
    ),
]
BasicEnvOpt = Annotated[
    bool,
    typer.Option(
        "--basic-auth-env",
        help="HTTP Basic credentials from the environment variables MEDFED_PACS_USER and "
        "MEDFED_PACS_PASSWORD.",
    ),
]
CaFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--ca-file",
        help="CA certificates (PEM) that signed the PACS's TLS certificate (default: the "
        "system's).",
    ),
]


def _watcher(
    run: Path, dicomweb: str, router: str, device: str, auth: tuple[Path | None, Path | None, bool],
    ca_file: Path | None, find: str = "sweep", orthanc: str | None = None,
    retention_days: float = 0.0, patient_ids: str = "hash",
) -> Any:  # a DicomwebWatcher  # fmt: skip
    """A watcher of ``dicomweb`` for ``run``, every option checked before the run is loaded."""
    require_extra("dicomweb_client", "serve", "medfed pacs")
    from medfed.clinic.pacs.credentials import check_ca_file, credentials
    from medfed.clinic.pacs.finding import FINDERS
    from medfed.clinic.pacs.watcher import DicomwebWatcher, check_url

    url = check_url(dicomweb)
    if find not in FINDERS:
        raise ConfigError(f"--find {find!r}: expected one of {', '.join(FINDERS)}")
    if orthanc is not None and find == "sweep":
        raise ConfigError("--orthanc names the change feed's server; --find sweep reads none")
    if orthanc is not None:
        check_url(orthanc, "--orthanc")
    creds = credentials(*auth)
    ca = check_ca_file(ca_file, url)
    warn = functools.partial(typer.echo, err=True)
    inbox = _inbox(run, router, device, url, retention_days, patient_ids)
    return DicomwebWatcher.connect(inbox, url, creds, ca, find, orthanc, warn)


@friendly
def watch(
    run: TrainedRunArg,
    dicomweb: DicomwebOpt,
    interval: Annotated[
        float, typer.Option(help="Seconds between polls.", callback=_seconds(1.0))
    ] = 30.0,
    polls: Annotated[
        int | None,
        typer.Option(help="Stop after this many polls (default: run until stopped).", min=1),
    ] = None,
    max_failures: Annotated[
        int,
        typer.Option(
            "--max-failures",
            help="Stop (exit 3) after this many polls in a row could not reach the PACS; 0: "
            "keep trying.",
            min=0,
        ),
    ] = 0,
    find: Annotated[
        str,
        typer.Option(
            help="How new studies are found: 'changes' (Orthanc's change feed), 'sweep' (every "
            "study each poll, against those examined), 'auto' (the feed when offered).",
        ),
    ] = "auto",
    orthanc: Annotated[
        str | None,
        typer.Option(
            "--orthanc",
            help="Orthanc's REST root, for its change feed (default: --dicomweb without its "
            "/dicom-web).",
        ),
    ] = None,
    token_file: TokenFileOpt = None,
    basic_auth_file: BasicFileOpt = None,
    basic_auth_env: BasicEnvOpt = False,
    ca_file: CaFileOpt = None,
    router: RouterOpt = "auto",
    device: DeviceOpt = "auto",
    metrics_port: MetricsPortOpt = None,
    metrics_host: MetricsHostOpt = "127.0.0.1",
    retention_days: RetentionOpt = 0.0,
    patient_ids: PatientIdsOpt = "hash",
) -> None:
    """Answer new studies in the PACS through DICOMweb, once each, beside each study.

    New studies are found by Orthanc's change feed, or by a sweep of every study, never by
    StudyDate (a backdated study stored late is answered too). Search (QIDO-RS), fetch
    (WADO-RS), route, and store the answer back in each study as a DICOM Basic Text SR
    (STOW-RS). Each scan (a CT series, or one photo) is answered once, also across restarts
    (RUN/pacs.sqlite); series of another modality, and unreadable ones, are reported as
    skipped, with why. A poll that cannot reach the PACS is an error line; the command then
    exits 3 (with --polls, or after --max-failures polls in a row). --metrics-port serves
    polls, lag, queue depth and scans answered or skipped."""
    from medfed.clinic.pacs.records import watch_lock

    metrics = None
    if wants_metrics(metrics_port, metrics_host, "medfed pacs watch"):
        from medfed.ops.telemetry import WatchMetrics

        metrics = WatchMetrics()
    auth = (token_file, basic_auth_file, basic_auth_env)
    watcher = _watcher(
        run, dicomweb, router, device, auth, ca_file, find, orthanc, retention_days, patient_ids
    )
    watcher.metrics = metrics
    url = watcher.inbox.source
    failed = 0
    with watch_lock(run):
        if metrics is not None:
            metrics.serve(metrics_port, metrics_host)
            typer.echo(f"metrics on http://{metrics_host}:{metrics_port}/metrics", err=True)
        typer.echo(f"watching {url} for {watcher.inbox.fed.modality} studies", err=True)
        try:
            failed = watcher.watch(interval, typer.echo, polls, max_failures)
        except KeyboardInterrupt:
            typer.echo("stopped", err=True)
    if failed:
        typer.echo(f"error: {failed} poll(s) could not reach {url}; see the lines above", err=True)
        raise typer.Exit(3)


@friendly
def backfill(
    run: TrainedRunArg,
    dicomweb: DicomwebOpt,
    answer: Annotated[
        bool, typer.Option("--answer", help="Answer the pending scans (once each).")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object: the counts and every scan.")
    ] = False,
    token_file: TokenFileOpt = None,
    basic_auth_file: BasicFileOpt = None,
    basic_auth_env: BasicEnvOpt = False,
    ca_file: CaFileOpt = None,
    router: RouterOpt = "auto",
    device: DeviceOpt = "auto",
    patient_ids: PatientIdsOpt = "hash",
) -> None:
    """List every study in the PACS: each scan answered, skipped (with why) or pending.

    The PACS is searched whole (QIDO-RS, whatever the studies' dates) and each scan read
    against RUN/pacs.sqlite. Pending: not yet answered, or routed but its answer not yet
    stored. --answer answers the pending ones as 'medfed pacs watch' would, once each. Exits
    3 when the PACS cannot be reached."""
    import json

    from medfed.clinic.pacs.reconcile import count_rows, survey
    from medfed.clinic.pacs.records import watch_lock

    auth = (token_file, basic_auth_file, basic_auth_env)
    watcher = _watcher(run, dicomweb, router, device, auth, ca_file, patient_ids=patient_ids)
    with watch_lock(run) if answer else contextlib.nullcontext():
        rows = []
        for row in survey(watcher, answer):
            rows.append(row)
            if not as_json:
                typer.echo(row.describe())
    counts = count_rows(rows)
    if as_json:
        typer.echo(json.dumps({**counts, "scans": [r.to_dict() for r in rows]}, indent=1))
        return
    typer.echo(
        f"{counts['studies']} studies in {watcher.inbox.source}: {counts['answered']} scans "
        f"answered, {counts['skipped']} skipped, {counts['pending']} pending"
        + ("" if answer or not counts["pending"] else " (--answer answers them)")
    )


@friendly
def listen(
    run: TrainedRunArg,
    allow: Annotated[
        list[str],
        typer.Option(
            "--allow", help="Calling AE title allowed to store scans (repeat for each sender)."
        ),
    ],
    host: Annotated[
        str, typer.Option(help="Address to listen on; off loopback, DICOM TLS is required.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="DICOM port.", min=1, max=65535)] = 11112,
    ae_title: Annotated[str, typer.Option("--ae-title", help="This listener's AE title.")] = (
        "MEDFED"
    ),
    quiet: Annotated[
        float,
        typer.Option(
            help="Seconds with no new instance after which a series is complete.",
            callback=_seconds(0.0),
        ),
    ] = 10.0,
    answer_to: Annotated[
        str | None,
        typer.Option(
            "--answer-to",
            help="Send each answer (Basic Text SR) by C-STORE to AE_TITLE@HOST:PORT (the "
            "PACS); without it answers are kept in RUN/pacs/answers/.",
        ),
    ] = None,
    tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None,
    router: RouterOpt = "auto",
    device: DeviceOpt = "auto",
    retention_days: RetentionOpt = 0.0,
    metrics_port: MetricsPortOpt = None,
    metrics_host: MetricsHostOpt = "127.0.0.1",
    patient_ids: PatientIdsOpt = "hash",
) -> None:
    """Listen for scans sent by DICOM (C-STORE) and answer each complete series.

    Only the allowed calling AE titles may associate. A series is answered once no instance
    of it arrived for --quiet seconds, once, with the same audit log and answer as
    'medfed pacs watch'. --metrics-port serves instances received, series waiting, seconds
    since the last instance, and scans answered or skipped."""
    require_extra("pynetdicom", "serve", "medfed pacs listen")
    import threading

    from medfed.clinic.bearer import is_loopback
    from medfed.clinic.pacs.credentials import check_tls_pair
    from medfed.clinic.pacs.listener import Listener, parse_destination

    destination = parse_destination(answer_to) if answer_to else None
    metrics_wanted = wants_metrics(metrics_port, metrics_host, "medfed pacs listen")
    tls = check_tls_pair(tls_cert, tls_key)
    if tls is None and not is_loopback(host):
        raise ConfigError(
            f"--host {host} is not loopback: DICOM there must use TLS (--tls-cert, --tls-key)"
        )
    inbox = _inbox(run, router, device, f"{ae_title}@{host}:{port}", retention_days, patient_ids)
    listener = Listener(inbox, ae_title, tuple(allow), quiet, destination, typer.echo)
    if metrics_wanted:
        from medfed.ops.telemetry import ListenMetrics

        listener.metrics = ListenMetrics(listener.waiting)
        listener.metrics.serve(metrics_port, metrics_host)
        typer.echo(f"metrics on http://{metrics_host}:{metrics_port}/metrics", err=True)
    listener.start(host, port, tls)
    typer.echo(f"listening as {ae_title} on {host}:{port} for {', '.join(allow)}", err=True)
    try:
        threading.Event().wait()  # until interrupted
    except KeyboardInterrupt:
        typer.echo(
            f"stopped; series not yet complete stay in {listener.incoming} and are answered "
            "after the next start",
            err=True,
        )
    finally:
        listener.stop()


@friendly
def load(
    run: Annotated[Path, typer.Argument(help="A run directory (served from a copy).")],
    scan: Annotated[Path, typer.Option("--scan", help="The scan every request sends.")],
    clients: Annotated[int, typer.Option(help="Concurrent clients.", min=1)] = 8,
    requests: Annotated[int, typer.Option(help="Requests per phase.", min=2)] = 200,
    device: DeviceOpt = "cpu",
    update_docs: Annotated[
        Path | None,
        typer.Option(
            "--update-docs",
            help="Write the table between the serve-load markers of this page (docs/pacs.md).",
        ),
    ] = None,
) -> None:
    """Load-test 'medfed serve' on loopback: throughput, p50/p99 latency, lost answers.

    Lost: accepted requests with no audit row; measured steadily, then across a kill
    (SIGKILL) and restart of the service mid-load."""
    require_extra("httpx", "serve", "medfed pacs load")
    from medfed.clinic.load import load_table, load_test
    from medfed.reports.markdown import replace_marked_section

    if update_docs is not None:
        if not update_docs.is_file():
            raise ConfigError(f"--update-docs {update_docs}: no such file")
        text = update_docs.read_text(encoding="utf-8")
        try:  # the markers are checked before the test runs
            replace_marked_section(text, "serve-load", "")
        except ValueError as exc:
            raise ConfigError(f"--update-docs {update_docs}: {exc}") from None
    results = load_test(run, scan, clients, requests, device, typer.echo)
    table = load_table(results, scan, run)
    typer.echo(table)
    update_section(update_docs, "serve-load", table)
    if any(r.lost for r in results):
        raise typer.Exit(1)


@friendly
def make_study(
    inputs: Annotated[
        list[Path],
        typer.Argument(help="Fundus photos (JPEG, PNG, TIFF) and CT volumes (.nii, .nii.gz)."),
    ],
    out: Annotated[Path, typer.Option(help="Folder for the study's DICOM files.")],
    patient_id: Annotated[str, typer.Option("--patient-id", help="The test patient's ID.")],
    accession: Annotated[str, typer.Option(help="Accession number (16 characters).")] = "",
    study_date: Annotated[
        str | None, typer.Option("--study-date", help="YYYYMMDD (default: today).")
    ] = None,
    patient_name: Annotated[
        str, typer.Option("--patient-name", help="Default: Test^PATIENT_ID.")
    ] = "",
    modality: Annotated[
        str, typer.Option(help="Photos as OP (ophthalmic photography), XC or OT.")
    ] = "OP",
) -> None:
    """Make a test study for a PACS from photos and CT volumes, one series each.

    Each photo becomes an RGB instance, each NIfTI volume a CT series (Hounsfield units,
    positioned so that medfed reads back the same volume); every instance shares the patient,
    accession number, study date and study UID given. Store the files in a test PACS (e.g.
    Orthanc's upload, storescu or STOW-RS) to try 'medfed pacs watch' or 'listen'."""
    from medfed.clinic.pacs.make_study import StudyIds, make_study, write_study
    from medfed.core.fileio import check_out_folder

    check_out_folder(out)
    dated = {"study_date": study_date} if study_date is not None else {}
    ids = StudyIds(patient_id, accession, patient_name=patient_name, **dated)
    paths = write_study(make_study(inputs, ids, modality), out)
    series = len({p.parent for p in paths})
    typer.echo(
        f"wrote {len(paths)} instance(s) in {series} series to {out} (patient {patient_id}, "
        f"study {ids.study_uid}, date {ids.study_date})"
    )


def register(app: typer.Typer) -> None:
    pacs_add = adder(pacs_app)
    pacs_add(make_study)
    pacs_add(watch)
    pacs_add(backfill)
    pacs_add(listen)
    pacs_add(load)
    add = adder(app, SERVING)
    add(serve)
    app.add_typer(pacs_app, name="pacs", rich_help_panel=SERVING)
