"""The ``medfed`` command: thin typer commands that parse, call the library, and print.

One module per group of commands, as ``medfed --help`` shows them: sites, training (and
evaluation), serving (and review), deploy, experiments; the training settings' options come
from their declarations in :class:`medfed.config.TrainConfig` (:mod:`medfed.cli.settings`).
"""

from __future__ import annotations

from typing import Annotated, Any

import click
import typer
from typer.core import TyperGroup

from medfed import __version__
from medfed.cli import deploy, experiments, pacs, serving, sites, training
from medfed.cli.common import PANELS, friendly, keep_argument_help, registry_help

__all__ = ["app", "friendly", "registry_help"]


class GroupedCommands(TyperGroup):
    """Lists the commands group by group (PANELS' order): typer would list every command
    before the sub-command groups, whatever their group. Built, it gives every argument its
    help back (see keep_argument_help)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        keep_argument_help(self)

    def list_commands(self, ctx: click.Context) -> list[str]:
        def rank(name: str) -> int:
            panel = getattr(self.commands[name], "rich_help_panel", None)
            return PANELS.index(panel) if panel in PANELS else len(PANELS)

        return sorted(super().list_commands(ctx), key=rank)


app = typer.Typer(
    cls=GroupedCommands,
    help="medfed: federated learning across hospitals.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    # click names the close commands of a mistyped one itself ("Did you mean 'sites'?"): typer
    # adding its own would print the suggestion twice.
    suggest_commands=False,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"medfed {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """medfed: federated learning across hospitals."""


for group in (sites, training, serving, pacs, deploy, experiments):  # the order help shows them in
    group.register(app)
