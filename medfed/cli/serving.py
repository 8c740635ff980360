"""Serving and review: ``medfed route``, ``review`` and ``dashboard``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

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
    wants_metrics,
    with_registries,
)
from medfed.core.errors import ConfigError, require_extra
from medfed.core.fileio import check_out_file

_BACKUP_HELP = (
    "Copy RUN/audit.sqlite to this new file (SQLite's online backup: consistent while others "
    "write; owner-only), and do nothing else."
)


_PURGE_HELP = (
    "Remove the kept scans (RUN/review/scans) and the reports written back to the PACS "
    "(RUN/pacs/answers) older than this many days, logging each in RUN/review/purged.jsonl "
    "(the audit log keeps every row and hash), and do nothing else."
)


def _purge(run: Path, days: float, dry_run: bool) -> None:
    from medfed.clinic.retention import PURGE_LOG, check_days, purge

    days = check_days(days)
    removed = purge(run, days, dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    for item in removed:
        typer.echo(f"{verb} {item.kind} {item.key} ({item.age_days:.1f} days old)")
    where = "" if dry_run or not removed else f"; logged in {run / PURGE_LOG}"
    typer.echo(f"{verb} {len(removed)} item(s) older than {days:g} days from {run}{where}")


def _print_figures(run: Path, work, window, result, labels) -> None:
    """The prospective figures of ``result`` (or that nothing was routed yet)."""
    from medfed.reports.prospective import PROSPECTIVE_LEGEND, prospective_table

    typer.echo(
        f"prospective review of {run} ({window.describe()}): {result.n_reads} read(s) of "
        f"{result.n_scans} scan(s); classes: {', '.join(labels.classes)}"
        + (f" (positive class: {labels.positive})" if labels.positive else "")
    )
    if not work.log.path.is_file():
        typer.echo(f"no scan has been routed with {run} yet; route scans with 'medfed route'")
    else:
        typer.echo(prospective_table(result.rows()))
        typer.echo(PROSPECTIVE_LEGEND)
        typer.echo(f"reads: {result.blinding()}")


def _upkeep(run: Path, backup: Path | None, purge_days: float | None, dry_run: bool) -> bool:
    """The audit log's backup or the retention's purge, when asked for (True: done)."""
    if backup is not None:
        _backup(run, backup)
        return True
    if purge_days is not None:
        _purge(run, purge_days, dry_run)
        return True
    if dry_run:
        raise ConfigError("--dry-run goes with --purge-older-than DAYS")
    return False


def _backup(run: Path, target: Path) -> None:
    from medfed.clinic.audit import AuditLog

    typer.echo(f"backed up {AuditLog(run).path} to {AuditLog(run).backup(target)}")


@friendly
def review(
    run: Annotated[Path, typer.Argument(help="A run directory scans were routed with.")],
    export: Annotated[
        Path | None,
        typer.Option(
            "--export",
            help="Write the reads to this CSV (scan_id, routed_time, file, sha256, status, "
            "chosen_site, read_id, reader, read, note, time): each reader's current read, "
            "then a blank row per scan nobody has read, to fill in reader, read (a class of the "
            "run or 'ungradable'), note and time. It holds no model answer unless --unblinded.",
        ),
    ] = None,
    unblinded: Annotated[
        bool,
        typer.Option(
            "--unblinded",
            help="With --export: add the model's answer (prediction, prediction_prob); reads "
            "imported from such a file are recorded as made after seeing it.",
        ),
    ] = False,
    import_: Annotated[
        Path | None,
        typer.Option(
            "--import",
            help="Add the reads of this CSV (columns scan_id, reader, read; optional read_id, "
            "note, time in ISO 8601, UTC when no offset). A read is identified by read_id or by "
            "scan and reader: a read already recorded is unchanged (importing twice adds "
            "nothing), a changed one is an amendment; each bad line is refused by number.",
        ),
    ] = None,
    figures: Annotated[
        Path | None, typer.Option("--figures", help="Also write the figures to this CSV.")
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(help="Window start, inclusive (ISO 8601, e.g. 2026-11-01; UTC by default)."),
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="Window end, exclusive (ISO 8601; default: now).")
    ] = None,
    by: Annotated[
        str,
        typer.Option(
            help="Window on the reads' time ('read') or on the scans' routing time ('routed')."
        ),
    ] = "read",
    backup: Annotated[Path | None, typer.Option("--backup", help=_BACKUP_HELP)] = None,
    purge_older_than: Annotated[
        float | None, typer.Option("--purge-older-than", help=_PURGE_HELP)
    ] = None,
    dry_run: Annotated[
        bool, typer.Option(help="With --purge-older-than: list what would go, remove nothing.")
    ] = False,
) -> None:
    """Clinician review of routed scans: prospective figures, disagreements, reads.

    Print the prospective figures (per site and system, each with its 95% CI and n) and the
    disagreements; exchange reads with sites reading elsewhere (--export, --import)."""
    from medfed.clinic.review import Review, ReviewError, Window, queue_text, write_figures_csv
    from medfed.runs import RunDir

    if export is not None and import_ is not None:
        raise ConfigError("give --export or --import, not both: export after the import instead")
    RunDir(run).require()
    if _upkeep(run, backup, purge_older_than, dry_run):
        return
    window = Window(since, until, by)  # type: ignore[arg-type]  (checked by Window)
    work = Review(run)
    labels = work.labels
    if export is not None:
        check_out_file(export, "--export")
        written = work.export_reads(export, unblinded=unblinded)
        typer.echo(f"wrote {export}: {written} row(s); fill in reader and read, then --import it")
        return
    if import_ is not None:
        done = work.import_reads(import_)
        typer.echo(f"imported {import_}: {done.describe()}")
        for _, why in done.refused:
            typer.echo(f"refused: {why}", err=True)
    if work.log.path.is_file():
        typer.echo(queue_text(work))
    result = work.figures(window)
    _print_figures(run, work, window, result, labels)
    for d in work.disagreements(window):
        reads = ", ".join(f"{who}: {what}" for who, what in d.reads.items())
        typer.echo(f"readers disagree on scan {d.scan_id} ({d.file}): {reads}")
    if figures is not None:
        check_out_file(figures, "--figures")
        write_figures_csv(result, figures)
        typer.echo(f"wrote {figures}")
    if import_ is not None and done.refused:
        raise ReviewError(
            f"{import_}: {len(done.refused)} line(s) refused (above); fix them and "
            "import the file again (the lines already imported stay unchanged)"
        )


@friendly
def route(
    run: TrainedRunArg,
    files: Annotated[
        list[str],  # text, not Path: Path('') would read as '.', the current folder
        typer.Argument(
            help="JPEG/PNG/TIFF/BMP photos, DICOM files or series folders, NIfTI (.nii, "
            ".nii.gz); "
            "a file given twice is answered once."
        ),
    ],
    router: Annotated[str, typer.Option(help="auto or a router listed below.")] = "auto",
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print strict JSON instead of text: a list with one object per file, with the "
            "fields time, file, sha256, router, status (routed, abstained or error), "
            "chosen_site, site_probs, prediction (null when abstained), prediction_prob (of "
            "the class named), ood_score, reason, class_probs, decision_rule (the rule that "
            "named the class), nearest (an abstained scan's nearest site, not an answer) and "
            "audit_id (when logged); a value that is missing or not a number is null.",
        ),
    ] = False,
    device: DeviceOpt = "auto",
    audit: Annotated[
        bool,
        typer.Option(help="Append each decision to RUN/audit.sqlite (checked before routing)."),
    ] = True,
    progress: Annotated[
        bool,
        typer.Option(
            help="Show a progress bar over the files (on a terminal, unless MEDFED_NO_PROGRESS "
            "is set)."
        ),
    ] = True,
) -> None:
    """Send each scan to the site whose model fits it best (or abstain), and answer it.

    Exit code 1 when any file could not be answered; the other files are still answered.
    """
    from medfed.clinic.route import distinct, route_files
    from medfed.core.names import printable
    from medfed.routing.bundle import TrainedFederation
    from medfed.routing.routers import make_router

    if any(not name for name in files):
        raise ConfigError(
            "an empty scan path ('') was given; name each scan file or DICOM series folder"
        )
    fed = TrainedFederation.load(run, device)
    chosen = make_router(router, fed)
    unique, repeated = distinct([Path(name) for name in files])
    for path, times in repeated.items():
        shown = printable(str(path))
        typer.echo(f"warning: {shown} was given {times} times; it is answered once", err=True)
    results = route_files(fed, chosen, unique, run if audit else None, progress=progress)
    if as_json:
        rows = [r.to_dict() for r in results]
        typer.echo(json.dumps(rows, indent=2, allow_nan=False))
    else:
        typer.echo(f"router: {chosen.name} ({fed.algorithm}, {len(fed.sites)} sites)")
        for result in results:
            typer.echo(result.describe())
    if any(r.entry.status == "error" for r in results):
        raise typer.Exit(1)


@friendly
def dashboard(
    runs: Annotated[
        list[Path] | None,
        typer.Argument(help="Run directories, or folders holding them (default: demo_out)."),
    ] = None,
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1.", min=1, max=65535)] = 8501,
    reviewer_header: Annotated[
        str | None,
        typer.Option(
            "--reviewer-header",
            help="Request header the Review page takes the reader's name from, as set by a "
            "sign-in proxy in front of the dashboard ('' : none, the page asks for the name). "
            "Default: $MEDFED_REVIEWER_HEADER, else X-Forwarded-User.",
        ),
    ] = None,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            help="A SuperNode's state-dir: its audit log (every message, with the policy's "
            "decision) on the Site audit page. Without RUN, only that page has content."
        ),
    ] = None,
    log_format: LogFormatOpt = "text",
    metrics_port: MetricsPortOpt = None,
    metrics_host: MetricsHostOpt = "127.0.0.1",
) -> None:
    """Open the clinician dashboard (Streamlit, on 127.0.0.1 only) over run directories.

    As a service (--log-format json or --metrics-port), Streamlit runs under a supervisor: every
    line it prints becomes one log line, each page run is logged (page, result, seconds), and
    --metrics-port serves Prometheus metrics (Streamlit's health, page runs and their time,
    Streamlit's warnings and errors). Streamlit's own liveness check is /_stcore/health."""
    require_extra("streamlit", "dashboard", "medfed dashboard")
    from medfed.dashboard.launch import Service, launch

    wants_metrics(metrics_port, metrics_host, "medfed dashboard")
    service = Service(log_format, metrics_port, metrics_host)
    roots = runs or ([] if state_dir is not None else [Path("demo_out")])
    status = launch(
        roots, port, echo=typer.echo, reviewer=reviewer_header, state_dir=state_dir,
        service=service,
    )  # fmt: skip
    if status:
        raise typer.Exit(status)


def register(app: typer.Typer) -> None:
    from medfed.cli import ops

    add = adder(app, SERVING)
    add(route, cls=with_registries("routers"))
    add(review)
    add(dashboard)
    ops.register(app)  # medfed ops units: these commands as systemd services
