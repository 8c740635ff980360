"""What the commands share: the command groups of ``medfed --help``, help that lists the
registries, option checks, and turning a MedfedError into its message and exit code."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import click
import typer
from typer.core import TyperCommand
from typer.models import ArgumentInfo
from typer.utils import get_params_from_function

from medfed.config import WIRE_PRECISION_NOTES
from medfed.core.devices import DEVICES
from medfed.core.errors import ConfigError, MedfedError, require_extra
from medfed.core.fileio import check_not_in_run, check_out_folder

# The groups of `medfed --help`, by what a user does, in the order help shows them.
SITES = "Sites"
TRAINING = "Training and evaluation"
SERVING = "Serving and review"
DEPLOYMENT = "Deployment"
EXPERIMENTS = "Experiments"
PANELS: tuple[str, ...] = (SITES, TRAINING, SERVING, DEPLOYMENT, EXPERIMENTS)


def keep_argument_help(command: click.Command) -> None:
    """Give each argument of ``command`` and its sub-commands the help it declares. Click 8.5
    gave ``click.Argument`` a ``help`` of its own, and its ``__init__`` resets the one typer's
    ``TyperArgument`` sets just before calling it: every argument's help would silently vanish
    from ``--help``."""
    for sub in getattr(command, "commands", {}).values():
        keep_argument_help(sub)
    declared = getattr(command.callback, "__wrapped__", None)  # typer wraps each command
    if declared is None:
        return
    helps = {
        name: meta.default.help
        for name, meta in get_params_from_function(declared).items()
        if isinstance(meta.default, ArgumentInfo)
    }
    for param in command.params:
        if isinstance(param, click.Argument) and not param.help:
            param.help = helps.get(param.name or "")


def help_text(func: Callable[..., Any]) -> str:
    """A command's docstring as help: its paragraphs each on one line, since typer's rich help
    keeps a docstring's line breaks, which then break a sentence mid-line on any terminal
    narrower or wider than the source."""
    paragraphs = inspect.cleandoc(func.__doc__ or "").split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs)


def adder(group: typer.Typer, panel: str | None = None) -> Callable[..., None]:
    """A function that adds a command to ``group`` under ``panel``, with its help unwrapped."""

    def add(func: Callable[..., Any], name: str | None = None, **kw: Any) -> None:
        group.command(name, help=help_text(func), rich_help_panel=panel, **kw)(func)

    return add


# --- help that lists the registries -----------------------------------------------------------
# The registries import torch, so their entries are read only when a command's help is shown;
# `medfed --help` and every command's parsing stay free of that import.


def _registry(section: str) -> tuple[str, list[tuple[str, str]]]:
    """A help section's title and its (name, one-line description) entries."""
    if section == "algorithms":
        from medfed.algorithms import ALGORITHMS

        return "Algorithms (--algorithm)", [(n, c.summary) for n, c in ALGORITHMS.items()]
    if section == "backbones":
        from medfed.models.backbones import BACKBONE_SUMMARIES, BACKBONES

        entries = [("auto", "the default for the modality and algorithm; config.toml records it")]
        return "Backbones (--backbone)", entries + [
            (n, BACKBONE_SUMMARIES.get(n, "")) for n in BACKBONES
        ]
    if section == "routers":
        from medfed.routing.routers import ROUTERS

        entries = [("auto", "density_ratio when the run has a client head, else majority_vote")]
        return "Routers (--router)", entries + [(n, c.summary) for n, c in ROUTERS.items()]
    if section == "wire precisions":
        return "Wire precisions (--wire-precision)", list(WIRE_PRECISION_NOTES.items())
    raise ValueError(f"no help section {section!r}")


def registry_help(sections: tuple[str, ...]) -> str:
    """One line per registered entry, grouped by section (paragraphs: typer keeps their breaks)."""
    try:
        from rich.markup import escape
    except ImportError:  # plain click help: no markup to escape

        def escape(text: str) -> str:
            return text

    paragraphs: list[str] = []
    for section in sections:
        try:
            title, entries = _registry(section)
        except ImportError as exc:  # help must still show when an optional package is missing
            title, entries = f"{section.capitalize()} (cannot be listed: {exc})", []
        width = max((len(name) for name, _ in entries), default=0) + 2
        paragraphs += ["", escape(f"{title}:")] if paragraphs else [escape(f"{title}:")]
        paragraphs += [escape(f"  {name:<{width}}{summary}".rstrip()) for name, summary in entries]
    return "\n\n".join(paragraphs)


def with_registries(*sections: str) -> type[TyperCommand]:
    """A command class whose help ends with the given registries' entries."""

    class RegistryHelpCommand(TyperCommand):
        def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
            self.epilog = registry_help(sections)
            super().format_help(ctx, formatter)

    return RegistryHelpCommand


def named_folder(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """Option callback: refuse an empty path for an output or cache folder. An empty string
    reaches the command as '.', which would scatter the files into the current folder."""
    if value is not None and str(value) in ("", "."):
        name = param.opts[0] if param.opts else param.name
        example = "cache" if param.name == "cache_dir" else "runs/feddrm"
        raise typer.BadParameter(
            f"{name} is empty (or '.'): give a folder by name, e.g. {name} {example}",
            ctx=ctx,
            param=param,
        )
    return value


# --- options several commands share ---------------------------------------------------------
# A command's default goes with its parameter (`out: OutFolderOpt = Path("demo_out")`).

CacheDirOpt = Annotated[
    Path | None,
    typer.Option(  # the folder default_cache_dir (medfed.data.cache) picks
        help="Preprocessing cache folder (default: $MEDFED_CACHE, else ~/.cache/medfed).",
        callback=named_folder,
    ),
]
# Every device medfed runs on (medfed.core.devices); DEVICE_OPTION alone for an optional one.
DEVICE_OPTION = typer.Option(help=f"{', '.join(DEVICES)}.")
DeviceOpt = Annotated[str, DEVICE_OPTION]
OutFolderOpt = Annotated[
    Path,
    typer.Option(help="Folder for what it writes: data, runs, results.", callback=named_folder),
]
QuickOpt = Annotated[bool, typer.Option(help="A smaller budget (how small: see above).")]
SeedOpt = Annotated[int, typer.Option(help="Random seed.")]
TrainedRunArg = Annotated[Path, typer.Argument(help="A run directory written by 'medfed train'.")]
UpdateReadmeOpt = Annotated[
    Path | None,
    typer.Option(help="Write the results into this Markdown page's section (named above)."),
]


def friendly(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a MedfedError into its message and exit code instead of a traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except MedfedError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(exc.exit_code) from None
        except OSError as exc:  # the system refused a file: name it, never a traceback
            names = [str(n) for n in (exc.filename, exc.filename2) if n]
            where = " -> ".join(names) or "a file or folder"
            typer.echo(
                f"error: {where}: {exc.strerror or exc}; check that the path exists, is a file "
                "or a folder as the command expects, and that this user may read and write it",
                err=True,
            )
            raise typer.Exit(1) from None

    return wrapper


# --- checks made before long work starts -------------------------------------------------------


def check_readme(readme: Path | None, marker: str) -> None:
    """``--update-readme`` names a UTF-8 file with the section's markers: known before the
    runs start rather than after they finish."""
    if readme is None:
        return
    if not readme.is_file():
        raise ConfigError(f"--update-readme {readme}: no such file")
    try:
        text = readme.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"--update-readme {readme}: cannot be read as UTF-8 text ({exc})"
        ) from None
    start, end = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"
    if start not in text or end not in text:
        raise ConfigError(
            f"--update-readme {readme}: the file lacks the section markers {start} and {end}; "
            "add both lines where the tables should go"
        )


def check_outputs(out: Path, readme: Path | None = None, *markers: str) -> None:
    """Before an experiment starts: ``--update-readme`` holds every section it will write, and
    ``--out`` is a folder it may write to that is no run's."""
    for marker in markers:
        check_readme(readme, marker)
    check_out_folder(out)
    check_not_in_run(out)


def update_section(page: Path | None, marker: str, text: str) -> None:
    """Put ``text`` in the ``marker`` section of ``page`` (when given), and say so."""
    if page is None:
        return
    from medfed.reports.markdown import replace_marked_section

    old = page.read_text(encoding="utf-8")
    page.write_text(replace_marked_section(old, marker, text), encoding="utf-8")
    typer.echo(f"updated the {marker} section of {page}")


def check_methods(methods: tuple[str, ...], seed: int) -> None:
    """Every ``--method`` parses, names an algorithm with parameters it takes and valid
    settings, and is given once, before any data is written or any run trains."""
    from medfed.algorithms import make_algorithm
    from medfed.experiments.demo import FULL, MethodSpec

    seen: dict[str, str] = {}
    for text in methods:
        spec = MethodSpec.parse(text)
        try:
            make_algorithm(spec.algorithm, spec.params)
            spec.config(FULL, seed)
        except ConfigError as exc:
            raise ConfigError(f"--method {text!r}: {exc}") from None
        if spec.dirname in seen:
            raise ConfigError(
                f"--method {text!r} and {seen[spec.dirname]!r} are the same method (both would "
                f"write runs/{spec.dirname}); give each method once"
            )
        seen[spec.dirname] = text


# Options the services share (medfed serve, pacs watch and listen, dashboard).
def _log_format(ctx: typer.Context, param: typer.CallbackParam, value: str) -> str:
    if value not in ("text", "json"):
        raise typer.BadParameter(f"{value!r}: expected text or json", ctx=ctx, param=param)
    return value


LogFormatOpt = Annotated[
    str,
    typer.Option(
        "--log-format",
        help="Log lines on stderr: text, or json (one object a line: time, level, event, "
        "request_id, ...).",
        callback=_log_format,
    ),
]


MetricsPortOpt = Annotated[
    int | None,
    typer.Option(
        "--metrics-port",
        help="Serve Prometheus metrics at http://--metrics-host:PORT/metrics (default: none).",
        min=1,
        max=65535,
    ),
]
MetricsHostOpt = Annotated[
    str,
    typer.Option("--metrics-host", help="Address of --metrics-port: an IP address; keep loopback."),
]


def wants_metrics(port: int | None, host: str, command: str) -> bool:
    """Whether --metrics-port asks for metrics; --metrics-host checked either way."""
    import ipaddress

    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(
            f"--metrics-host {host!r}: not an IP address; give one, e.g. 127.0.0.1 (loopback)"
        ) from None
    if port is None:
        return False
    require_extra("prometheus_client", "serve", f"{command} --metrics-port")
    return True
