"""The ``medfed`` command: thin typer commands that parse, call the library, and print."""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import click
import typer
from typer.core import TyperArgument, TyperCommand

from medfed import __version__
from medfed.config import DEVICES, FAULT_KINDS, WIRE_PRECISION_NOTES, Modality, TrainConfig
from medfed.errors import ConfigError, ManifestError, MedfedError, require_extra
from medfed.fileio import check_out_folder

if TYPE_CHECKING:
    from medfed.config import RunConfigFile, SiteManifest


def _keep_argument_help() -> None:
    """Show each argument's help text. Newer click gives ``click.Argument`` a ``help`` of its
    own, and its ``__init__`` resets the help that typer's ``TyperArgument`` sets just before
    calling it, so every argument's help would silently vanish from ``--help``."""
    init = TyperArgument.__init__
    if getattr(init, "keeps_help", False):
        return

    @functools.wraps(init)
    def keeping(self: TyperArgument, *args: Any, help: str | None = None, **kw: Any) -> None:
        init(self, *args, help=help, **kw)
        self.help = help

    keeping.keeps_help = True  # type: ignore[attr-defined]
    TyperArgument.__init__ = keeping  # type: ignore[method-assign]


_keep_argument_help()

app = typer.Typer(
    help="medfed: federated learning across hospitals.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
sites_app = typer.Typer(help="Onboard sites: validate them and write their data cards.")
app.add_typer(sites_app, name="sites")


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
        from medfed.serving.routers import ROUTERS

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


def _with_registries(*sections: str) -> type[TyperCommand]:
    """A command class whose help ends with the given registries' entries."""

    class RegistryHelpCommand(TyperCommand):
        def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
            self.epilog = registry_help(sections)
            super().format_help(ctx, formatter)

    return RegistryHelpCommand


def _default(name: str, file_option: str | None = None) -> str:
    """A training setting's default, for help texts (options default to None: 'not given');
    ``file_option``: the option whose file's setting comes first."""
    value = TrainConfig.__dataclass_fields__[name].default
    if file_option:
        return f"(default: {file_option}'s, else {value})"
    return f"(default: {value})"


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


# The folder default_cache_dir (medfed.data.cache) picks, for help texts.
CACHE_DIR_HELP = "Preprocessing cache folder (default: $MEDFED_CACHE, else ~/.cache/medfed)."


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


def _parse_params(items: list[str]) -> dict[str, str]:
    params: dict[str, str] = {}
    for item in items:
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not key or not value:
            raise ConfigError(f"--param {item!r} must be NAME=VALUE, e.g. --param lam=0.8")
        if key in params:
            raise ConfigError(
                f"--param {key} is given twice ({key}={params[key]} and {key}={value}); "
                "give each parameter once"
            )
        params[key] = value
    return params


@app.command()
@friendly
def synth(
    out: Annotated[
        Path,
        typer.Option(help="Folder to write the synthetic sites into.", callback=named_folder),
    ],
    modality: Annotated[str, typer.Option(help="fundus, ct or all.")] = "all",
    n_per_site: Annotated[
        int | None,
        typer.Option(help="Scans (fundus) or patients (CT) per site (default: 240 and 200)."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Random seed; the same seed gives the same files.")] = 0,
) -> None:
    """Write synthetic sites in real on-disk layouts, with their manifests under OUT/sites/."""
    from medfed.data.synth import synthesize

    manifests = synthesize(out, modality=modality, n_per_site=n_per_site, seed=seed)
    typer.echo(f"wrote {len(manifests)} site(s) under {out}:")
    for path in manifests:
        typer.echo(f"  {path}")
    typer.echo(f"next: medfed sites check {out}/sites/*.toml")


@sites_app.command("check")
@friendly
def sites_check(
    manifests: Annotated[list[Path], typer.Argument(help="Site manifests (*.toml).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the reports as JSON.")] = False,
    cache_dir: Annotated[
        Path | None, typer.Option(help="Preprocessing cache folder.", callback=named_folder)
    ] = None,
) -> None:
    """Validate sites before they join. Exit 0 ready, 1 problems found, 2 unusable manifest."""
    from medfed.data.cache import TensorCache, default_cache_dir
    from medfed.data.checks import check_manifests, overall_exit_code

    cache = TensorCache(cache_dir or default_cache_dir())
    reports = check_manifests(list(manifests), cache)
    if as_json:
        typer.echo(json.dumps([r.to_dict() for r in reports], indent=2))
    else:
        for report in reports:
            _print_report(report)
    raise typer.Exit(overall_exit_code(reports))


def _print_report(report: Any) -> None:
    if report.unusable:
        typer.echo(f"[UNUSABLE] {report.manifest}\n  {report.unusable}\n")
        return
    status = "READY" if report.ready else "PROBLEMS"
    typer.echo(f"[{status}] site {report.site} ({report.modality}, layout {report.layout})")
    typer.echo(f"  manifest: {report.manifest}\n  root: {report.root}")
    typer.echo(f"  scans: {report.n_records} listed, {report.n_readable} readable")
    for split, per in report.counts.items():
        typer.echo(f"  {split}: " + ", ".join(f"{k}={v}" for k, v in per.items()))
    if report.sizes:
        typer.echo(f"  sizes: {report.sizes}")
    if report.intensity:
        typer.echo(f"  intensity: {report.intensity}")
    for other, d in report.distances.items():
        typer.echo(f"  distance to {other} (MMD): {d:.4f}")
    for warning in report.warnings:
        typer.echo(f"  warning: {warning}")
    if report.problems:
        typer.echo(f"  {len(report.problems)} problem(s):")
        for problem in report.problems:
            typer.echo(f"    - {problem}")
    typer.echo("")


@sites_app.command("card")
@friendly
def sites_card(
    manifest: Annotated[Path, typer.Argument(help="The site's manifest (*.toml).")],
    others: Annotated[
        list[Path] | None, typer.Option("--other", help="Other sites, for the distance section.")
    ] = None,
    out_dir: Annotated[
        Path, typer.Option(help="Folder for the card.", callback=named_folder)
    ] = Path("data_cards"),
    cache_dir: Annotated[
        Path | None, typer.Option(help=CACHE_DIR_HELP, callback=named_folder)
    ] = None,
) -> None:
    """Write data_cards/<id>.md for a site: counts, ratio, acquisition, shifts, licence, ethics."""
    from medfed.config import load_manifest
    from medfed.data.cache import TensorCache, default_cache_dir
    from medfed.data.cards import check_card_dir, write_card
    from medfed.data.checks import check_manifests

    check_card_dir(out_dir)
    site = load_manifest(manifest)
    seen = {site.id: manifest}
    for other in others or []:
        try:
            other_id = load_manifest(other).id
        except ManifestError:
            continue  # the check below reports it as unusable
        if other_id in seen:
            raise ManifestError(
                f"{other}: site id {other_id!r} is also the id of {seen[other_id]}; "
                "give each site once (--other names the other sites)"
            )
        seen[other_id] = other
    cache = TensorCache(cache_dir or default_cache_dir())
    reports = check_manifests([manifest, *(others or [])], cache)
    if reports[0].unusable:
        raise MedfedError(reports[0].unusable)
    for other in reports[1:]:
        if other.unusable:
            typer.echo(
                f"warning: {other.manifest} is left out of the distance section: {other.unusable}",
                err=True,
            )
    path = write_card(site, reports[0], out_dir)
    typer.echo(f"wrote {path}")


def resolved_train_config(config: TrainConfig) -> TrainConfig:
    """``config`` with every algorithm parameter spelled out, defaults included, so that the
    run's config.toml re-runs the same training even after a default changes."""
    from medfed.algorithms import make_algorithm

    algorithm = make_algorithm(config.algorithm, config.params)
    resolve = getattr(algorithm, "resolved_params", None)
    params = resolve() if callable(resolve) else dataclasses.asdict(algorithm.params)
    return dataclasses.replace(config, params=dict(params))


def _init_source(text: str | None) -> str | None:
    """--init as the run records it: a path made absolute (so resuming from elsewhere finds
    it), a ``torchvision:NAME`` as given."""
    if text is None or not text.strip():
        return None if text is None else ""
    if text.startswith("torchvision:"):
        return text
    return str(Path(text).expanduser().resolve())


def _with_init_normalization(normalization: str | None, init_normalization: str | None):
    """--init-normalization is --normalization for pretrained starts; both must agree."""
    if init_normalization is None:
        return normalization
    if init_normalization not in ("imagenet", "site"):
        raise ConfigError(
            f"--init-normalization must be imagenet or site, got {init_normalization!r}"
        )
    if normalization is not None and normalization != init_normalization:
        raise ConfigError(
            f"--normalization {normalization} and --init-normalization {init_normalization} "
            "disagree; give one of them"
        )
    return init_normalization


def _given(**options: Any) -> dict[str, Any]:
    """The options given on the command line (typer leaves the others None)."""
    return {name: value for name, value in options.items() if value is not None}


def _stored_manifests(stored: RunConfigFile) -> list[SiteManifest]:
    """The sites a run configuration lists: from each manifest file when it is still there,
    otherwise rebuilt from the resolved manifest the file stores."""
    from medfed.config import load_manifest
    from medfed.serving.bundle import manifest_from_dict

    manifests = []
    for data in stored.sites:
        path = str(data.get("manifest_path") or "")
        if path and Path(path).is_file():
            manifests.append(load_manifest(path))
            continue
        try:
            manifest = manifest_from_dict(data)
        except ManifestError as exc:
            raise ManifestError(f"{stored.path}: site {data.get('id', '?')!r}: {exc}") from None
        # Keep where it came from, so a resumed run's config.toml lists the same sites.
        manifests.append(dataclasses.replace(manifest, manifest_path=Path(path) if path else None))
    return manifests


@app.command(cls=_with_registries("algorithms", "backbones", "wire precisions"))
@friendly
def train(
    sites: Annotated[
        list[Path] | None,
        typer.Option("--sites", help="Site manifests (*.toml); default: the sites --config lists."),
    ] = None,
    more_sites: Annotated[
        list[Path] | None, typer.Argument(help="More manifests: --sites a.toml b.toml c.toml")
    ] = None,
    config_file: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="A run's config.toml (or a TOML file with a 'train' table) to train again; "
            "options given here override its settings.",
        ),
    ] = None,
    algorithm: Annotated[
        str | None, typer.Option(help="Algorithm (listed below); required without --config.")
    ] = None,
    rounds: Annotated[
        int | None, typer.Option(help=f"Communication rounds {_default('rounds')}.")
    ] = None,
    local_steps: Annotated[
        int | None,
        typer.Option(help=f"Local optimizer steps per round {_default('local_steps')}."),
    ] = None,
    seed: Annotated[int | None, typer.Option(help=f"Random seed {_default('seed')}.")] = None,
    out: Annotated[
        Path, typer.Option(help="Run directory to write.", callback=named_folder)
    ] = Path("runs/latest"),
    resume: Annotated[bool, typer.Option(help="Continue a killed run in --out.")] = False,
    device: Annotated[
        str | None, typer.Option(help=f"{', '.join(DEVICES)} {_default('device')}.")
    ] = None,
    backbone: Annotated[
        str | None, typer.Option(help=f"Backbone (listed below) {_default('backbone')}.")
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(
            help="Sites trained at once in this process, the cores divided between them (CPU) "
            "or on their own CUDA streams; 0: auto (every site of the round at once for 2-D "
            "scans on a CPU of 2+ cores; one by one for CT volumes and on a GPU); 1: one by one."
        ),
    ] = None,
    batch_size: Annotated[
        int | None, typer.Option(help=f"Local minibatch size {_default('batch_size')}.")
    ] = None,
    optimizer: Annotated[
        str | None,
        typer.Option(help=f"adam (AdamW) or sgd (momentum 0.9) {_default('optimizer')}."),
    ] = None,
    lr: Annotated[
        float | None,
        typer.Option(
            help="Initial learning rate, cosine decay (default: the modality's, 0.002 for "
            "fundus, 0.0003 for CT)."
        ),
    ] = None,
    client_fraction: Annotated[
        float | None,
        typer.Option(help=f"Share of sites per round {_default('client_fraction')}."),
    ] = None,
    min_sites: Annotated[
        int | None,
        typer.Option(help=f"Fewest usable updates to aggregate {_default('min_sites')}."),
    ] = None,
    site_timeout: Annotated[
        float | None,
        typer.Option(help=f"Seconds per site per round, 0: none {_default('site_timeout_s')}."),
    ] = None,
    wire_precision: Annotated[
        str | None,
        typer.Option(help=f"Update encoding (listed below) {_default('wire_precision')}."),
    ] = None,
    wire_delta: Annotated[
        bool | None,
        typer.Option(
            help=f"Send differences to the global state each site holds {_default('wire_delta')}."
        ),
    ] = None,
    augment: Annotated[
        str | None,
        typer.Option(
            help="Training augmentation: flip (left-right, fundus only) or none "
            f"{_default('augment')}."
        ),
    ] = None,
    normalization: Annotated[
        str | None,
        typer.Option(
            help="site (each site's own training statistics), federation (statistics pooled "
            "over the sites: counts and sums travel, never scans) or imagenet (fixed, for "
            f"ImageNet weights) {_default('normalization')}."
        ),
    ] = None,
    operating_point: Annotated[
        str | None,
        typer.Option(
            help="Each site's threshold, chosen on its validation split: specificity:0.90, "
            f"youden or threshold:0.5 {_default('operating_point')}."
        ),
    ] = None,
    init: Annotated[
        str | None,
        typer.Option(
            help="Starting weights: a finished run's folder (its global weights), a "
            ".safetensors or state-dict file (.pt/.pth, tensors only), or torchvision:resnet18 "
            "from the local torch hub cache (never downloaded); default: seeded random."
        ),
    ] = None,
    init_strict: Annotated[
        bool | None,
        typer.Option(help="Refuse to start when --init leaves any backbone tensor unloaded."),
    ] = None,
    init_normalization: Annotated[
        str | None,
        typer.Option(
            help="imagenet (the fixed statistics ImageNet weights were trained with) or site "
            "(each site's own; the default); sets --normalization."
        ),
    ] = None,
    dp_epsilon: Annotated[
        float | None,
        typer.Option(
            help="Differential privacy: each site's budget epsilon (DP-SGD through Opacus; the "
            "noise is set to spend it over the planned run, and a site stops before it "
            "would overspend)."
        ),
    ] = None,
    dp_delta: Annotated[
        float | None,
        typer.Option(help="Differential privacy: delta (default: 0.1 / each site's n train)."),
    ] = None,
    dp_clip: Annotated[
        float | None,
        typer.Option(
            help=f"Differential privacy: per-scan gradient norm bound {_default('dp_clip')}."
        ),
    ] = None,
    dp_noise: Annotated[
        float | None,
        typer.Option(
            help="Differential privacy: noise multiplier sigma (default: from --dp-epsilon); "
            "with --dp-epsilon too, sites stop once their budget is spent."
        ),
    ] = None,
    dp_accountant: Annotated[
        str | None,
        typer.Option(help=f"Differential privacy: rdp or prv {_default('dp_accountant')}."),
    ] = None,
    param: Annotated[
        list[str] | None,
        typer.Option(
            help="Algorithm parameter NAME=VALUE (repeatable; merged over --config's params)."
        ),
    ] = None,
    inject_fault: Annotated[
        list[str] | None,
        typer.Option(
            help=f"Resilience drill ROUND:SITE:KIND, KIND one of {', '.join(FAULT_KINDS)} "
            "(repeatable)."
        ),
    ] = None,
    cache_dir: Annotated[
        Path | None, typer.Option(help="Preprocessing cache folder.", callback=named_folder)
    ] = None,
    progress: Annotated[bool, typer.Option(help="Show progress bars.")] = True,
) -> None:
    """Train a federation over the given sites and write the run directory."""
    from medfed.config import load_run_config, merge_train_settings
    from medfed.data.cache import TensorCache, default_cache_dir
    from medfed.data.sitedata import load_site
    from medfed.federation.training import load_sites
    from medfed.federation.training import train as run_training
    from medfed.runs.report import federation_lines, site_table

    stored = load_run_config(config_file) if config_file is not None else None
    if stored is not None and stored.medfed_version not in (None, __version__):
        typer.echo(
            f"note: {stored.path} was written by medfed {stored.medfed_version}; "
            f"this is {__version__}",
            err=True,
        )
    given = _given(
        algorithm=algorithm,
        params=_parse_params(param) if param else None,
        rounds=rounds,
        local_steps=local_steps,
        batch_size=batch_size,
        optimizer=optimizer,
        lr=lr,
        seed=seed,
        backbone=backbone,
        device=device,
        concurrency=concurrency,
        client_fraction=client_fraction,
        min_sites=min_sites,
        site_timeout_s=site_timeout,
        wire_precision=wire_precision,
        wire_delta=wire_delta,
        augment=augment,
        normalization=_with_init_normalization(normalization, init_normalization),
        operating_point=operating_point,
        faults=tuple(inject_fault) if inject_fault else None,
        init=_init_source(init),
        init_strict=init_strict,
        dp_epsilon=dp_epsilon,
        dp_delta=dp_delta,
        dp_clip=dp_clip,
        dp_noise=dp_noise,
        dp_accountant=dp_accountant,
    )
    where = str(stored.path) if stored else None
    config = merge_train_settings(stored.train if stored else {}, given, where=where)
    config = resolved_train_config(config)
    check_out_folder(out)  # before the sites are loaded: that can take minutes
    if config.init:
        from medfed.federation.pretrained import resolve_init

        resolve_init(config.init)  # a missing file or unfinished run: said before the sites load
    show = progress and sys.stderr.isatty()
    paths = [*(sites or []), *(more_sites or [])]
    if paths:
        loaded = load_sites(paths, cache_dir, progress=show)
    elif stored is not None and stored.sites:
        cache = TensorCache(cache_dir if cache_dir is not None else default_cache_dir())
        loaded = [load_site(m, cache, progress=show) for m in _stored_manifests(stored)]
    else:
        where_sites = f"{stored.path} lists no [[sites]]; " if stored else ""
        raise ConfigError(
            f"no sites to train on: {where_sites}pass --sites a.toml b.toml "
            "(or --config RUN/config.toml, which lists the sites of that run)"
        )
    import math
    import time

    from medfed.data.modality import modality_spec
    from medfed.data.sitedata import no_validation_warning
    from medfed.runs import RunDir

    if "lr" not in given and "lr" not in (stored.train if stored else {}):
        config = dataclasses.replace(config, lr=modality_spec(loaded[0].manifest.modality).lr)

    for site in loaded:
        words = no_validation_warning(site, config.operating_point)
        if words:
            typer.echo(f"warning: {words}", err=True)
    started = time.perf_counter()
    summary = run_training(loaded, config, out, resume=resume, progress=show, echo=typer.echo)
    seconds = time.perf_counter() - started
    typer.echo(site_table(summary))
    typer.echo("\n".join(federation_lines(summary)))
    typer.echo(f"run directory: {out}")
    last = [r for r in RunDir(out).read_metrics() if r.round == summary.rounds]
    aucs = [r.validation.auc for r in last if r.validation and r.validation.auc is not None]
    aucs = [a for a in aucs if math.isfinite(a)]
    val = f"mean val AUC {sum(aucs) / len(aucs):.3f} (last round)" if aucs else "no val AUC"
    typer.echo(f"trained {summary.rounds} rounds in {seconds:.1f} s; {val}")


@app.command()
@friendly
def evaluate(
    run: Annotated[Path, typer.Argument(help="A run directory written by 'medfed train'.")],
    as_json: Annotated[
        bool, typer.Option("--json", help="Print summary.json (every figure, CIs and counts).")
    ] = False,
) -> None:
    """Print each site's AUC with its 95% CI, operating points, calibration, the federation
    figures, the cross-site matrix and every router under both protocols."""
    from medfed.runs import RunDir
    from medfed.runs.report import evaluation_text

    run_dir = RunDir(run).require()
    summary = run_dir.read_summary()
    run_dir.verify_model()  # a damaged model/ makes the run unusable, whatever it measured
    if as_json:
        typer.echo(json.dumps(summary.to_dict(), indent=2, sort_keys=True, allow_nan=False))
        return
    typer.echo(evaluation_text(summary))


@app.command()
@friendly
def report(
    runs: Annotated[
        list[Path],
        typer.Argument(help="Run directories, one per method, trained on the same sites."),
    ],
    out: Annotated[Path, typer.Option(help="The HTML file to write.")] = Path("report.html"),
    title: Annotated[
        str | None, typer.Option(help="Title (default: the modality, sites and methods).")
    ] = None,
) -> None:
    """Write one self-contained HTML report for the study's clinicians: sites and data, AUCs
    with CIs, operating points, calibration, cross-site matrix, routing, traffic. It loads
    nothing from a network and opens from a USB stick. Runs whose routed scans clinicians have
    read ('medfed review') get a prospective review section."""
    from medfed.runs.study import write_study_report
    from medfed.serving.review import prospective_rows

    if not out.is_dir():  # (a folder is refused by the report, with its own words)
        check_out_folder(out.parent, f"--out {out}: its folder")
    prospective = {run: rows for run in runs if (rows := prospective_rows(run))}
    # each run's model/ checked too
    written = write_study_report(runs, out, title=title, prospective=prospective)
    typer.echo(
        f"wrote {written.path}: {len(written.methods)} method(s) "
        f"({', '.join(written.methods)}) on {len(written.sites)} site(s)"
    )


@app.command()
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
) -> None:
    """Clinician review of routed scans: print the prospective figures (per site and for the
    system, each with its 95% CI and n) and the scans whose readers disagree; exchange reads
    with sites that read outside the dashboard (--export, --import)."""
    from medfed.runs import RunDir
    from medfed.runs.report import PROSPECTIVE_LEGEND, prospective_table
    from medfed.serving.review import Review, ReviewError, Window, queue_text, write_figures_csv

    if export is not None and import_ is not None:
        raise ConfigError("give --export or --import, not both: export after the import instead")
    RunDir(run).require()
    window = Window(since, until, by)  # type: ignore[arg-type]  (checked by Window)
    work = Review(run)
    labels = work.labels
    if export is not None:
        check_out_folder(export.parent, f"--export {export}: its folder")
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
    typer.echo(
        f"prospective review of {run} ({window.describe()}): {result.n_reads} read(s) of "
        f"{result.n_scans} scan(s); classes {', '.join(labels.classes)}"
        + (f", positive {labels.positive}" if labels.positive else "")
    )
    if not work.log.path.is_file():
        typer.echo(f"no scan has been routed with {run} yet; route scans with 'medfed route'")
    else:
        typer.echo(prospective_table(result.rows()))
        typer.echo(PROSPECTIVE_LEGEND)
        typer.echo(f"reads: {result.blinding()}")
    for d in work.disagreements(window):
        reads = ", ".join(f"{who}: {what}" for who, what in d.reads.items())
        typer.echo(f"readers disagree on scan {d.scan_id} ({d.file}): {reads}")
    if figures is not None:
        check_out_folder(figures.parent, f"--figures {figures}: its folder")
        write_figures_csv(result, figures)
        typer.echo(f"wrote {figures}")
    if import_ is not None and done.refused:
        raise ReviewError(
            f"{import_}: {len(done.refused)} line(s) refused (above); fix them and "
            "import the file again (the lines already imported stay unchanged)"
        )


@app.command(cls=_with_registries("routers"))
@friendly
def route(
    run: Annotated[Path, typer.Argument(help="A run directory written by 'medfed train'.")],
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
            "chosen_site, site_probs, prediction, prediction_prob, ood_score and reason; "
            "a value that is missing or not a number is null.",
        ),
    ] = False,
    device: Annotated[str, typer.Option(help=f"{', '.join(DEVICES)}.")] = "auto",
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
    from medfed.names import printable
    from medfed.serving.bundle import TrainedFederation
    from medfed.serving.routers import make_router
    from medfed.serving.service import distinct, route_files

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


@app.command()
@friendly
def demo(
    out: Annotated[
        Path, typer.Option(help="Folder for the data and the runs.", callback=named_folder)
    ] = Path("demo_out"),
    quick: Annotated[bool, typer.Option(help="A smaller budget (under 3 minutes).")] = False,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    modality: Annotated[
        str,
        typer.Option(
            help="fundus (three sites), ct (two CT sites) or all (each into OUT/fundus, OUT/ct)."
        ),
    ] = "fundus",
    update_readme: Annotated[
        Path | None, typer.Option(help="Write the table into this README's demo section.")
    ] = None,
) -> None:
    """Synthesize a federation, train FedDRM and baselines, print the comparison."""
    from medfed.experiments.demo import DEMO_MARKERS, demo_modalities, run_demos

    for chosen in demo_modalities(modality):
        _check_readme(update_readme, DEMO_MARKERS[chosen])
    check_out_folder(out)
    run_demos(out, modality, quick=quick, seed=seed, echo=typer.echo, readme=update_readme)


@app.command()
@friendly
def compare(
    methods: Annotated[
        list[str] | None,
        typer.Option(
            "--method",
            help="NAME[:KEY=VALUE,...][@PRECISION[+delta]], repeatable; default: the "
            "communication comparison (FedAvg, FedDRM, int8, FedALS, LoRA).",
        ),
    ] = None,
    out: Annotated[
        Path, typer.Option(help="Folder for the data and the runs.", callback=named_folder)
    ] = Path("compare_out"),
    quick: Annotated[bool, typer.Option(help="The smaller demo budget.")] = False,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    update_readme: Annotated[
        Path | None, typer.Option(help="Write the tables into this README's compare section.")
    ] = None,
    reference: Annotated[
        str | None,
        typer.Option(
            help="The method every other is compared with (paired differences with 95% CIs); "
            "default: fedavg when it runs (the communication baseline), else the first method."
        ),
    ] = None,
) -> None:
    """Train several methods on the synthetic fundus federation; accuracy and bytes per round."""
    _check_readme(update_readme, "compare-table")
    check_out_folder(out)
    from medfed.experiments.demo import COMMUNICATION_METHODS, run_demo

    chosen = tuple(methods or COMMUNICATION_METHODS)
    _check_methods(chosen, seed)
    if reference is None:
        reference = "fedavg" if "fedavg" in chosen else chosen[0]
    run_demo(
        out,
        quick=quick,
        seed=seed,
        methods=chosen,
        marker="compare-table",
        command="medfed compare",
        echo=typer.echo,
        readme=update_readme,
        reference=reference,
    )


@app.command()
@friendly
def transfer(
    out: Annotated[
        Path,
        typer.Option(help="Folder for the data, the runs and the results.", callback=named_folder),
    ] = Path("transfer_out"),
    quick: Annotated[
        bool, typer.Option(help="A smaller budget (about 5 minutes on 2 cores).")
    ] = False,
    update_readme: Annotated[
        Path | None,
        typer.Option(help="Write the results into this README's transfer section, with the plot."),
    ] = None,
) -> None:
    """A FedAvg base from one synthetic federation as the start of LoRA and FedDRM on another,
    against random weights: curves, 95% CIs and paired comparisons (OUT/transfer.md)."""
    _check_readme(update_readme, "transfer")
    check_out_folder(out)
    from medfed.experiments.transfer import run_transfer

    run_transfer(out, quick=quick, echo=typer.echo, readme=update_readme)


@app.command("gpu-check")
@friendly
def gpu_check(
    out: Annotated[
        Path, typer.Option(help="Folder for the data, runs and results.", callback=named_folder)
    ] = Path("gpu_check_out"),
    short: Annotated[
        bool,
        typer.Option(help="Tiny data, no bench: checks the check itself (a minute on a CPU)."),
    ] = False,
    bench: Annotated[
        bool | None,
        typer.Option(help="Run the bench's quick table too (default: yes, unless --short)."),
    ] = None,
    algorithm: Annotated[
        list[str] | None,
        typer.Option(help="Check only this algorithm (repeatable; default: every one)."),
    ] = None,
    modality: Annotated[
        list[str] | None, typer.Option(help="fundus and/or ct (repeatable; default: both).")
    ] = None,
    device: Annotated[
        str | None,
        typer.Option(help="The device to check against the CPU (default: cuda, else cpu-bf16)."),
    ] = None,
) -> None:
    """Check the GPU path end to end: every algorithm on the GPU against the CPU (same seed,
    figures within tolerance), images per second per backbone, peak GPU memory, the bench's
    quick table; OUT/gpu_check.json and OUT/gpu_check.md. Exits 1 when anything failed."""
    check_out_folder(out)
    from medfed.experiments.gpucheck import FULL, MODALITIES, SHORT, run_gpu_check

    budget = SHORT if short else FULL
    if bench is not None:
        budget = dataclasses.replace(budget, bench=bench)
    results = run_gpu_check(
        out,
        budget=budget,
        algorithms=algorithm or None,
        modalities=tuple(modality or MODALITIES),
        device=device,
        echo=typer.echo,
    )
    if not results["ok"]:
        raise typer.Exit(1)


@app.command("bench-deploy")
@friendly
def bench_deploy(
    out: Annotated[
        Path, typer.Option(help="Folder for data, runs and results.", callback=named_folder)
    ] = Path("bench_deploy_out"),
    rounds: Annotated[
        int, typer.Option(help="Rounds of each run (the first and the last are left out).")
    ] = 5,
    local_steps: Annotated[int, typer.Option(help="Local steps per round.")] = 10,
    backbone: Annotated[str, typer.Option(help="The model (a fundus backbone).")] = "cnn-gn",
    image_size: Annotated[int, typer.Option(help="Fundus input size in pixels.")] = 128,
    without_workers: Annotated[
        bool, typer.Option(help="Also measure the deployment without resident workers.")
    ] = True,
    task_poll: Annotated[
        float | None,
        typer.Option(
            help="Seconds between each SuperExec's looks for a task to start "
            "(FLWR_SUPEREXEC_TASK_POLL_INTERVAL) [default: 0.1; Flower's own: 1]",
            show_default=False,
        ),
    ] = None,
    update_readme: Annotated[
        Path | None, typer.Option(help="Write the table into this README's deploy-bench section.")
    ] = None,
    n_per_site: Annotated[int, typer.Option(hidden=True, help="Scans per site (tests).")] = 64,
) -> None:
    """A deployed round on loopback (a SuperLink and a SuperNode per site, on Flower) against
    the same round in one process, side by side; writes OUT/deploy-bench.json and .md."""
    require_extra("flwr", "flower", "medfed bench-deploy")
    _check_readme(update_readme, "deploy-bench")
    check_out_folder(out)
    if not 3 <= rounds <= 1000:
        raise ConfigError(
            f"--rounds must be 3..1000 (the first and the last rounds are left out), got {rounds}"
        )
    if not 32 <= image_size <= 1024:
        raise ConfigError(f"--image-size must be 32..1024 pixels, got {image_size}")
    if task_poll is not None and not 0.01 <= task_poll <= 60:  # what Flower 1.42 accepts
        raise ConfigError(f"--task-poll must be 0.01..60 seconds, got {task_poll:g}")
    from medfed.experiments.deploy_speed import MARKER, DeployBenchPlan, markdown, run_deploy_bench
    from medfed.runs.report import replace_marked_section

    plan = DeployBenchPlan(
        n_per_site=n_per_site,
        image_size=image_size,
        backbone=backbone,
        rounds=rounds,
        local_steps=local_steps,
        without_workers=without_workers,
        **({} if task_poll is None else {"task_poll_s": task_poll}),
    )
    plan.config()  # a bad backbone or budget is refused before anything starts
    results = run_deploy_bench(out, plan)
    typer.echo(markdown(results))
    if update_readme is not None:
        text = update_readme.read_text(encoding="utf-8")
        update_readme.write_text(
            replace_marked_section(text, MARKER, markdown(results)), encoding="utf-8"
        )
        typer.echo(f"updated the {MARKER} section of {update_readme}")


@app.command("privacy-curve")
@friendly
def privacy_curve(
    out: Annotated[
        Path,
        typer.Option(help="Folder for the data, the runs and the results.", callback=named_folder),
    ] = Path("privacy_out"),
    quick: Annotated[
        bool, typer.Option(help="A smaller budget, one seed (about 10 minutes on 2 cores).")
    ] = False,
    update_readme: Annotated[
        Path | None,
        typer.Option(help="Write the results into this README's privacy section, with the plot."),
    ] = None,
) -> None:
    """What differential privacy costs: FedAvg and FedDRM at epsilon 1, 3, 8 and without DP,
    worst-site AUC with 95% CIs and paired differences (OUT/privacy.md, OUT/privacy.png)."""
    _check_readme(update_readme, "privacy")
    check_out_folder(out)
    from medfed.experiments.privacy_curve import run_privacy_curve

    run_privacy_curve(out, quick=quick, echo=typer.echo, readme=update_readme)


@app.command()
@friendly
def bench(
    quick: Annotated[
        bool, typer.Option(help="Smaller budgets and 2 seeds (about 19 minutes on 2 cores).")
    ] = False,
    seeds: Annotated[
        int | None, typer.Option(help="Seeds 0..N-1 (default 3, or 2 with --quick).")
    ] = None,
    out: Annotated[
        Path, typer.Option(help="Folder for data, runs and results.", callback=named_folder)
    ] = Path("bench_out"),
    as_json: Annotated[bool, typer.Option("--json", help="Print results.json.")] = False,
    modality: Annotated[str, typer.Option(help="fundus, ct or all.")] = "all",
    update_readme: Annotated[
        Path | None,
        typer.Option(help="Write the tables into this README's bench section, with plots."),
    ] = None,
    fundus_budget: Annotated[
        str | None, typer.Option(hidden=True, help="SCANSxROUNDSxSTEPS (tests).")
    ] = None,
    ct_budget: Annotated[str | None, typer.Option(hidden=True, help="SCANSxROUNDSxSTEPS.")] = None,
    image_size: Annotated[
        int | None, typer.Option(hidden=True, help="Native fundus image height (tests).")
    ] = None,
    speed_rounds: Annotated[
        int | None, typer.Option(hidden=True, help="Rounds of the engine-overhead runs.")
    ] = None,
    backbone_rounds: Annotated[
        int | None, typer.Option(hidden=True, help="Timed rounds per CT backbone (default 3).")
    ] = None,
    memory_patients: Annotated[
        int | None,
        typer.Option(help="Patients of the CT site whose loading memory is measured (500)."),
    ] = None,
    methods: Annotated[
        list[str] | None,
        typer.Option(
            "--method",
            help="Train only these methods, named as the bench's tables name them (repeatable; "
            "fedavg among them); default: every method.",
        ),
    ] = None,
) -> None:
    """Every method on the synthetic fundus and CT federations over several seeds, with speed
    figures; writes OUT/results.json, OUT/results.md and PNG plots."""
    from medfed.experiments.bench import BenchPlan, run_bench

    plan = BenchPlan.make(
        quick=quick,
        seeds=seeds,
        modalities=tuple(map(str, Modality)) if modality == "all" else (modality,),
        fundus_budget=fundus_budget,
        ct_budget=ct_budget,
        image_size=image_size,
        speed_rounds=speed_rounds,
        backbone_rounds=backbone_rounds,
        memory_patients=memory_patients,
        methods=tuple(methods or ()),
    )
    _check_methods(plan.methods, 0)
    _check_readme(update_readme, plan.marker)
    check_out_folder(out)
    echo = functools.partial(typer.echo, err=as_json)
    results = run_bench(out, plan, echo=echo, readme=update_readme)
    if as_json:
        typer.echo(json.dumps(results, indent=2))


@app.command()
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
) -> None:
    """Open the clinician dashboard (Streamlit, on 127.0.0.1 only) over run directories."""
    require_extra("streamlit", "dashboard", "medfed dashboard")
    from medfed.dashboard.launch import launch

    launch(runs or [Path("demo_out")], port, echo=typer.echo, reviewer=reviewer_header)


deploy_app = typer.Typer(
    help="Run a federation across real machines on Flower (SuperLink + one SuperNode per site)."
)
app.add_typer(deploy_app, name="deploy")


@deploy_app.command("app", cls=_with_registries("algorithms"))
@friendly
def deploy_app_folder(
    out: Annotated[Path, typer.Argument(help="Folder to write (then: flwr run OUT CONNECTION).")],
    site: Annotated[list[str], typer.Option(help="Site ids in order (repeat), as in manifests.")],
    run_dir: Annotated[str, typer.Option(help="Run directory on the SuperLink's machine.")],
    algorithm: Annotated[
        str | None,
        typer.Option(help="Algorithm (listed below); default: --train-config's, else feddrm."),
    ] = None,
    rounds: Annotated[
        int | None,
        typer.Option(help=f"Communication rounds {_default('rounds', '--train-config')}."),
    ] = None,
    local_steps: Annotated[
        int | None,
        typer.Option(help=f"Local steps per round {_default('local_steps', '--train-config')}."),
    ] = None,
    seed: Annotated[
        int | None, typer.Option(help=f"Random seed {_default('seed', '--train-config')}.")
    ] = None,
    param: Annotated[
        list[str] | None,
        typer.Option(
            help="Algorithm parameter NAME=VALUE (repeatable; merged over --train-config's params)."
        ),
    ] = None,
    train_config: Annotated[
        Path | None,
        typer.Option(help="TOML with a 'train' table (any training setting, as in config.toml)."),
    ] = None,
    wait: Annotated[float, typer.Option(help="Seconds to wait for every site to connect.")] = 300,
    reply_timeout: Annotated[
        float, typer.Option(help="Seconds a round waits for a site's reply.")
    ] = 600,
    resume: Annotated[bool, typer.Option(help="Continue the run in --run-dir.")] = False,
    secure_aggregation: Annotated[
        bool,
        typer.Option(
            help="SecAgg+: the server learns only the weighted mean of each round's updates "
            "(3 or more sites; README, 'Threat model')."
        ),
    ] = False,
    secure_bound: Annotated[
        float | None,
        typer.Option(
            help="With --secure-aggregation: how far one weight may move in a round before its "
            "site clips the difference (counted in metrics.jsonl) [default: 1.0]."
        ),
    ] = None,
) -> None:
    """Write the Flower app folder of one run: medfed's ServerApp, ClientApp and settings."""
    from medfed.config import merge_train_settings

    for module in ("flwr", "cryptography"):
        require_extra(module, "flower", "medfed deploy app")
    from medfed.flower.deploy import write_app
    from medfed.flower.node import train_config_from_toml

    if str(out) in ("", "."):
        raise ConfigError("OUT is empty (or '.'): give the app folder by name, e.g. pilot_app")
    if secure_bound is not None and not secure_aggregation:
        raise ConfigError(
            "--secure-bound sets secure aggregation's clipping; add --secure-aggregation, or "
            "leave --secure-bound out"
        )
    if algorithm is not None and not algorithm.strip():
        raise ConfigError("--algorithm is empty: name one (listed in --help), or leave it out")
    stored: dict[str, Any] = {}
    if train_config is not None:
        if train_config.is_dir():
            raise ConfigError(
                f"--train-config {train_config} is a folder: give the TOML file with the "
                "'train' table"
            )
        if not train_config.is_file():
            raise ConfigError(f"--train-config {train_config}: no such file")
        try:
            text = train_config.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"--train-config {train_config}: not UTF-8 text ({exc})") from None
        stored = train_config_from_toml(text, str(train_config)).to_dict()
    given = _given(
        algorithm=algorithm or (None if stored else "feddrm"),
        rounds=rounds,
        local_steps=local_steps,
        seed=seed,
        params=_parse_params(param) if param else None,
    )
    where = str(train_config) if train_config is not None else None
    config = resolved_train_config(merge_train_settings(stored, given, where=where))
    from medfed.algorithms import make_algorithm

    try:
        config.check_faults(
            site, communicates=make_algorithm(config.algorithm, config.params).communicates
        )
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}" if where else str(exc)) from None
    path = write_app(
        out,
        config,
        site,
        run_dir,
        wait_s=wait,
        reply_timeout_s=reply_timeout,
        resume=resume,
        lr_from_modality="lr" not in stored,  # CT and fundus differ (see medfed train --lr)
        secure_aggregation=secure_aggregation,
        **({"secure_bound": secure_bound} if secure_bound is not None else {}),
    )
    typer.echo(f"wrote {path}")
    typer.echo(f"submit it with: flwr run {out} <connection> --stream")


@deploy_app.command("pki")
@friendly
def deploy_pki(
    out: Annotated[Path, typer.Argument(help="Folder for the certificates and keys.")],
    host: Annotated[list[str], typer.Option(help="SuperLink host name or IP (repeatable).")],
    site: Annotated[list[str], typer.Option(help="One authentication key pair per site id.")],
    days: Annotated[int, typer.Option(help="Validity of the certificates.")] = 365,
) -> None:
    """A pilot's CA, the SuperLink's TLS certificate and one key pair per SuperNode."""
    require_extra("cryptography", "flower", "medfed deploy pki")
    if str(out) in ("", "."):
        raise ConfigError("OUT is empty (or '.'): give the PKI folder by name, e.g. pki")
    from medfed.flower.deploy import write_pki

    pki = write_pki(out, host, site, days)
    typer.echo(f"CA certificate (give to every SuperNode and flwr user): {pki.ca_cert}")
    typer.echo(f"SuperLink certificate and key: {pki.server_cert}, {pki.server_key}")
    for name, (private, public) in pki.node_keys.items():
        typer.echo(f"site {name}: private key {private} (stays at the site), public key {public}")


@deploy_app.command("worker")
@friendly
def deploy_worker(
    socket_path: Annotated[
        Path, typer.Argument(help="Unix socket to serve on (a folder only this account writes).")
    ],
) -> None:
    """A hospital's resident worker: answers its SuperNode's training and evaluation messages
    from one process, so PyTorch and the site's scans load once, not once per message. Start it
    beside the SuperNode, under the same account, and add worker="SOCKET" to the SuperNode's
    --node-config; stop it with Ctrl-C or SIGTERM."""
    require_extra("flwr", "flower", "medfed deploy worker")
    import signal

    from medfed.flower import client_work  # noqa: F401  (PyTorch now, not at the first message)
    from medfed.flower.worker import WorkerServer

    server = WorkerServer(socket_path)

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    typer.echo(f"medfed worker serving on {socket_path}")
    typer.echo(f'add worker="{socket_path}" to the SuperNode\'s --node-config')
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        typer.echo("medfed worker stopped")
    finally:
        server.server_close()


# --- checks made before long work starts -------------------------------------------------------


def _check_readme(readme: Path | None, marker: str) -> None:
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


def _check_methods(methods: tuple[str, ...], seed: int) -> None:
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


if __name__ == "__main__":
    app()
