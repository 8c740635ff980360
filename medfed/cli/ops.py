"""Operations: ``medfed ops units`` (systemd units for the services), and ``medfed ops
promote`` / ``rollback`` / ``releases`` (replacing the served model by a newer run)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

import typer

from medfed.cli.common import SERVING, adder, friendly
from medfed.core.errors import ConfigError

ops_app = typer.Typer(
    help="Run medfed's services under systemd, and replace the model they serve.\n\nThe "
    "routing service, the PACS inboxes and the dashboard; a newer run promoted into the served "
    "run directory (one audit trail), and rolled back in one command.",
    no_args_is_help=True,
    suggest_commands=False,
)


def _titles(allow: list[str]) -> tuple[str, ...]:
    for title in allow:
        if not (1 <= len(title.strip()) <= 16) or not re.fullmatch(r"[\x20-\x5b\x5d-\x7e]+", title):
            raise ConfigError(
                f"--allow {title!r}: an AE title is 1 to 16 printable characters, no backslash"
            )
    return tuple(allow)


def _distinct_ports(ports: list[tuple[str, int | None]]) -> None:
    """ConfigError naming two options that give the same port (one service would not start)."""
    seen: dict[int, str] = {}
    for option, port in ports:
        if port is None:
            continue
        if port in seen:
            raise ConfigError(
                f"{option} {port}: the same port as {seen[port]}; give each service its own port"
            )
        seen[port] = option


@friendly
def units(
    run: Annotated[Path, typer.Option(help="The run directory the services answer with.")],
    out: Annotated[Path, typer.Option(help="Folder to write the .service files to.")],
    user: Annotated[
        str, typer.Option(help="Unprivileged account the services run as (not root).")
    ] = "medfed",
    serve_port: Annotated[int, typer.Option(help="medfed serve's port.", min=1, max=65535)] = 8765,
    dashboard_port: Annotated[
        int, typer.Option(help="The dashboard's port.", min=1, max=65535)
    ] = 8501,
    dashboard_metrics_port: Annotated[
        int | None,
        typer.Option(help="The dashboard's --metrics-port (loopback).", min=1, max=65535),
    ] = None,
    dicomweb: Annotated[
        str | None, typer.Option(help="The PACS's DICOMweb root: adds the watcher's unit.")
    ] = None,
    basic_auth_file: Annotated[
        Path | None,
        typer.Option("--basic-auth-file", help="The watcher's PACS account (an owner-only file)."),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(help="The watcher's --metrics-port (loopback).", min=1, max=65535),
    ] = None,
    allow: Annotated[
        list[str] | None,
        typer.Option("--allow", help="Calling AE title (repeat): adds the listener's unit."),
    ] = None,
    listen_port: Annotated[
        int, typer.Option(help="The listener's DICOM port.", min=1, max=65535)
    ] = 11112,
    answer_to: Annotated[
        str | None, typer.Option("--answer-to", help="The listener's AE_TITLE@HOST:PORT.")
    ] = None,
    python: Annotated[
        Path | None,
        typer.Option(help="The Python medfed is installed in (default: this one)."),
    ] = None,
    writable: Annotated[
        list[Path] | None,
        typer.Option(help="Another folder the services may write to (repeat)."),
    ] = None,
) -> None:
    """Write systemd units for medfed serve, the dashboard and the PACS inboxes.

    The watcher's unit comes with --dicomweb, the listener's with --allow. Each runs as
    --user, restarts on failure (not on wrong settings, exit 2), may write only to the run
    directory (ReadWritePaths) and /var/lib/medfed, under NoNewPrivileges,
    ProtectSystem=strict and the other sandboxing options (docs/operations.md)."""
    from medfed.ops.units import UnitSettings, check_user, in_tmp, unit_files

    check_user(user)
    if not run.is_dir() or not (run / "config.toml").is_file():
        raise ConfigError(
            f"--run {run}: not a run directory (no config.toml); give a folder 'medfed train' wrote"
        )
    if dicomweb is not None:
        from medfed.clinic.pacs.connection import check_url

        dicomweb = check_url(dicomweb)
    _distinct_ports(
        [("--serve-port", serve_port), ("--dashboard-port", dashboard_port),
         ("--dashboard-metrics-port", dashboard_metrics_port), ("--metrics-port", metrics_port),
         ("--listen-port", listen_port if allow else None)]
    )  # fmt: skip
    if (basic_auth_file is not None or metrics_port is not None) and dicomweb is None:
        raise ConfigError("--basic-auth-file and --metrics-port are the watcher's: add --dicomweb")
    if answer_to is not None:
        if not allow:
            raise ConfigError("--answer-to is the listener's: add --allow AE_TITLE")
        from medfed.clinic.pacs.listener import parse_destination

        parse_destination(answer_to)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: a file; give a folder for the .service files")
    settings = UnitSettings(
        run=run.resolve(), user=user, serve_port=serve_port, dashboard_port=dashboard_port,
        dashboard_metrics_port=dashboard_metrics_port,
        dicomweb=dicomweb, basic_auth_file=basic_auth_file, metrics_port=metrics_port,
        allow=_titles(allow or []), listen_port=listen_port, answer_to=answer_to,
        extra_paths=tuple(writable or ()),
        **({"python": str(python)} if python is not None else {}),
    )  # fmt: skip
    files = unit_files(settings)
    for path in in_tmp(settings):
        typer.echo(
            f"warning: {path} is under /tmp, which PrivateTmp=yes would hide from the services: "
            "the units leave PrivateTmp off; keep runs in a lasting folder (e.g. /srv/medfed)",
            err=True,
        )
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
        typer.echo(f"wrote {out / name}")
    typer.echo(
        f"install: sudo cp {out}/*.service /etc/systemd/system/ && sudo systemctl daemon-reload"
    )
    typer.echo(f"start:   sudo systemctl enable --now {' '.join(files)}")


LiveArg = Annotated[
    Path, typer.Argument(help="The run directory the services serve (their audit log stays).")
]
ReasonOpt = Annotated[
    str, typer.Option(help="Why the model changes (kept in LIVE/releases/history.jsonl).")
]


def _release_line(release: Any) -> str:
    return (
        f"{release.time}  {release.action:<8} {release.model} (replaced {release.replaced}) "
        f"by {release.by}: {release.reason or 'no reason given'}"
    )


@friendly
def promote(
    live: LiveArg,
    new_run: Annotated[Path, typer.Argument(help="The newer run directory whose model to serve.")],
    reason: ReasonOpt = "",
) -> None:
    """Serve a newer run's model from the served run directory, keeping its audit trail.

    The new run's model and everything that describes it (config, summary, predictions, site
    overview) replace LIVE's; the audit log, review and PACS records stay, and each answer
    names the model that gave it. The replaced model is kept under LIVE/releases/ for
    'medfed ops rollback'. A running medfed serve, pacs watch or pacs listen answers with the
    new model from its next scan on."""
    from medfed.clinic.releases import promote as promote_run

    done = promote_run(live, new_run, reason)
    typer.echo(f"{live}: now serves model {done.model} from {new_run} (was {done.replaced})")
    typer.echo(f"undo: medfed ops rollback {live}")


@friendly
def rollback(
    live: LiveArg,
    reason: ReasonOpt = "",
    to: Annotated[
        str | None,
        typer.Option(help="A kept model id (medfed ops releases LIVE) instead of the last one."),
    ] = None,
) -> None:
    """Serve again the model the run directory served before its last change."""
    from medfed.clinic.releases import rollback as roll_back

    done = roll_back(live, reason, to)
    typer.echo(f"{live}: now serves model {done.model} again (was {done.replaced})")


@friendly
def releases(live: LiveArg) -> None:
    """The models a served run directory served, and the ones kept for rollback."""
    from medfed.clinic.releases import history, kept_models
    from medfed.runs.rundir import RunDir

    RunDir(live).require()
    for release in history(live):
        typer.echo(_release_line(release))
    kept = kept_models(live)
    typer.echo(
        f"serving: {RunDir(live).model_id()}; kept for rollback: {', '.join(kept) or 'none'}"
    )


def register(app: typer.Typer) -> None:
    for command in (units, promote, rollback, releases):
        adder(ops_app)(command)
    app.add_typer(ops_app, name="ops", rich_help_panel=SERVING)
