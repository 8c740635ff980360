"""Experiment tracking: ``medfed track`` and the ``--track`` option the training and sweep
commands share (:mod:`medfed.tracking`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from medfed.cli.common import TRAINING, adder, friendly
from medfed.core.errors import ConfigError

if TYPE_CHECKING:
    from medfed.tracking import TrackSettings

TRACK_HELP = (
    "Log to MLflow when it ends: a tracking URI (http://host:5000, sqlite:////path/mlflow.db, "
    "file:///path/mlruns) or 'local' (a SQLite file beside the run folder); needs "
    "medfed[mlflow]. A store that is down is reported once; the run goes on."
)
TrackOption = Annotated[str | None, typer.Option("--track", help=TRACK_HELP)]
ExperimentOption = Annotated[
    str | None, typer.Option("--experiment", help="The MLflow experiment (default: medfed).")
]


def planned_tracking(
    track: str | None,
    out: Path,
    experiment: str | None = None,
    settings_file: Path | None = None,
) -> TrackSettings | None:
    """The tracking a command asks for, checked before anything trains (MLflow installed, the
    URI well formed); None when it asks for none."""
    from medfed.tracking import tracking_settings
    from medfed.tracking.settings import require_mlflow

    settings = tracking_settings(
        track, out.parent, experiment=experiment, settings_file=settings_file
    )
    if settings is not None:
        require_mlflow()
    return settings


def track_finished(out: Path, settings: TrackSettings | None) -> None:
    """Log ``out`` when tracking was asked for; a store that fails is reported, not fatal."""
    if settings is None:
        return
    from medfed.tracking.runlog import track_safely

    top = track_safely(out, settings, lambda line: typer.echo(line, err=True))
    if top is not None:
        typer.echo(f"tracked in {settings.uri} (experiment {settings.experiment}): run {top}")


@friendly
def track(
    folder: Annotated[
        Path,
        typer.Argument(help="A run folder, or a sweep's --out folder (one child run per run)."),
    ],
    uri: Annotated[
        str,
        typer.Option(
            "--track",
            help="The tracking URI (as for medfed train --track); 'local': a SQLite file "
            "beside the folder.",
        ),
    ] = "local",
    experiment: ExperimentOption = None,
    register: Annotated[
        str | None,
        typer.Option(help="Register each run's router model under this name (a registry)."),
    ] = None,
) -> None:
    """Log a finished run, or every run of a sweep folder, to MLflow.

    Settings, per-round metrics, figures with their intervals, model card, data cards and the
    routing model; a sweep folder becomes a parent run with one child per run."""
    from medfed.tracking import tracking_settings
    from medfed.tracking.runlog import TrackingUnavailable, log_folder
    from medfed.tracking.settings import require_mlflow

    if not folder.is_dir():
        raise ConfigError(f"{folder}: no such folder; give a run folder or a sweep's --out")
    settings = tracking_settings(uri, folder.parent, experiment=experiment, register=register)
    assert settings is not None
    require_mlflow()
    try:
        top, children = log_folder(folder, settings)
    except TrackingUnavailable as exc:
        raise ConfigError(
            f"--track {settings.uri}: {exc}; start the server or fix the URI"
        ) from None
    what = f"with {len(children)} child run(s)" if children else "one run"
    where = f"{settings.uri} (experiment {settings.experiment})"
    typer.echo(f"tracked {folder} in {where}: {top}, {what}")


def register_commands(app: typer.Typer) -> None:
    adder(app, TRAINING)(track)
