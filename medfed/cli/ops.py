"""Operations: ``medfed ops units`` (systemd units for the services)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from medfed.cli.common import SERVING, adder, friendly
from medfed.errors import ConfigError

ops_app = typer.Typer(
    help="Run medfed's services under systemd.\n\nThe routing service, the PACS inboxes and "
    "the dashboard.",
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
        from medfed.pacs.connection import check_url

        dicomweb = check_url(dicomweb)
    if (basic_auth_file is not None or metrics_port is not None) and dicomweb is None:
        raise ConfigError("--basic-auth-file and --metrics-port are the watcher's: add --dicomweb")
    if answer_to is not None:
        if not allow:
            raise ConfigError("--answer-to is the listener's: add --allow AE_TITLE")
        from medfed.pacs.listener import parse_destination

        parse_destination(answer_to)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: a file; give a folder for the .service files")
    settings = UnitSettings(
        run=run.resolve(), user=user, serve_port=serve_port, dashboard_port=dashboard_port,
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


def register(app: typer.Typer) -> None:
    adder(ops_app)(units)
    app.add_typer(ops_app, name="ops", rich_help_panel=SERVING)
