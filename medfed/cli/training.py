"""Training and evaluation: ``medfed train``, ``evaluate``, ``report`` and ``compare``."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from medfed import __version__
from medfed.cli.common import (
    TRAINING,
    CacheDirOpt,
    OutFolderOpt,
    QuickOpt,
    SeedOpt,
    TrainedRunArg,
    UpdateReadmeOpt,
    adder,
    check_methods,
    check_outputs,
    friendly,
    named_folder,
    with_registries,
)
from medfed.cli.settings import given_settings, training_options
from medfed.cli.tracking import (
    ExperimentOption,
    TrackOption,
    planned_tracking,
    register_commands,
    track_finished,
)
from medfed.core.errors import ConfigError, ManifestError
from medfed.core.fileio import check_not_in_run, check_out_file, check_out_folder
from medfed.core.progress import lines_instead

if TYPE_CHECKING:
    from medfed.config import RunConfigFile, SiteManifest
    from medfed.data.sitedata import SiteData


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


def _stored_manifests(stored: RunConfigFile) -> list[SiteManifest]:
    """The sites a run configuration lists: from each manifest file when it is still there,
    otherwise rebuilt from the resolved manifest the file stores."""
    from medfed.config import load_manifest
    from medfed.routing.bundle import manifest_from_dict

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


def _load_sites(
    paths: list[Path], stored: RunConfigFile | None, cache_dir: Path | None, show: bool
) -> list[SiteData]:
    """The sites named on the command line, else those the run configuration lists."""
    from medfed.data.cache import TensorCache, default_cache_dir
    from medfed.data.sitedata import load_site
    from medfed.federation.training import load_sites

    if paths:
        return load_sites(paths, cache_dir, progress=show)
    if stored is not None and stored.sites:
        cache = TensorCache(cache_dir if cache_dir is not None else default_cache_dir())
        return [load_site(m, cache, progress=show) for m in _stored_manifests(stored)]
    where_sites = f"{stored.path} lists no [[sites]]; " if stored else ""
    raise ConfigError(
        f"no sites to train on: {where_sites}pass --sites a.toml b.toml "
        "(or --config RUN/config.toml, which lists the sites of that run)"
    )


def _print_outcome(summary: Any, out: Path, seconds: float) -> None:
    """The run's site table and federation figures, then its last round's validation AUC."""
    import math

    from medfed.reports.evaluation import federation_lines, site_table
    from medfed.runs import RunDir

    typer.echo(site_table(summary))
    typer.echo("\n".join(federation_lines(summary)))
    typer.echo(f"run directory: {out}")
    last = [r for r in RunDir(out).read_metrics() if r.round == summary.rounds]
    aucs = [r.validation.auc for r in last if r.validation and r.validation.auc is not None]
    aucs = [a for a in aucs if math.isfinite(a)]
    val = f"mean val AUC {sum(aucs) / len(aucs):.3f} (last round)" if aucs else "no val AUC"
    typer.echo(f"trained {summary.rounds} rounds in {seconds:.1f} s; {val}")


@friendly
@training_options(config="--config")
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
    out: Annotated[
        Path, typer.Option(help="Run directory to write.", callback=named_folder)
    ] = Path("runs/latest"),
    resume: Annotated[bool, typer.Option(help="Continue a killed run in --out.")] = False,
    settings: dict[str, Any] | None = None,  # the settings' options go here (training_options)
    init_normalization: Annotated[
        str | None,
        typer.Option(
            help="imagenet (the fixed statistics ImageNet weights were trained with) or site "
            "(each site's own; the default); sets --normalization."
        ),
    ] = None,
    cache_dir: CacheDirOpt = None,
    progress: Annotated[bool, typer.Option(help="Show progress bars.")] = True,
    track: TrackOption = None,
    experiment: ExperimentOption = None,
) -> None:
    """Train a federation over the given sites and write the run directory."""
    import time

    from medfed.config import load_run_config, merge_train_settings
    from medfed.federation.training import train as run_training

    stored = load_run_config(config_file) if config_file is not None else None
    tracking = planned_tracking(track, out, experiment, config_file)
    if stored is not None and stored.medfed_version not in (None, __version__):
        typer.echo(
            f"note: {stored.path} was written by medfed {stored.medfed_version}; "
            f"this is {__version__}",
            err=True,
        )
    settings = dict(settings or {})
    settings["normalization"] = _with_init_normalization(
        settings.get("normalization"), init_normalization
    )
    given = given_settings(settings)
    where = str(stored.path) if stored else None
    config = merge_train_settings(stored.train if stored else {}, given, where=where)
    from medfed.federation.plan import resolved_settings

    config = resolved_settings(config, where=where)
    check_out_folder(out)  # before the sites are loaded: that can take minutes
    check_not_in_run(out, may_be_run=True)
    if config.init:
        from medfed.federation.pretrained import resolve_init

        resolve_init(config.init)  # a missing file or unfinished run: said before the sites load
    show = progress and sys.stderr.isatty()
    loaded = _load_sites([*(sites or []), *(more_sites or [])], stored, cache_dir, show)
    from medfed.data.sitedata import no_validation_warning

    for site in loaded:
        words = no_validation_warning(site, config.operating_point)
        if words:
            typer.echo(f"warning: {words}", err=True)
    started = time.perf_counter()
    summary = run_training(
        loaded,
        config,
        out,
        resume=resume,
        progress=show,
        echo=typer.echo,
        # No bar in a log file or a pipe: a line per round (or every few) instead of silence.
        say=lines_instead(progress),
        cache_dir=cache_dir,  # the frozen encoder's features sit beside the decoded photos
    )
    _print_outcome(summary, out, time.perf_counter() - started)
    track_finished(out, tracking)


@friendly
def evaluate(
    run: TrainedRunArg,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print summary.json (every figure, CIs and counts).")
    ] = False,
    model_card: Annotated[
        bool,
        typer.Option(
            "--model-card", help="Write RUN/model/MODEL_CARD.md again from the run's files."
        ),
    ] = False,
) -> None:
    """Print a run's figures: each site's AUC with its 95% CI, operating points, calibration.

    Then the federation figures, the cross-site matrix and every router under both
    protocols."""
    from medfed.reports.evaluation import evaluation_text
    from medfed.reports.model_card import write_model_card
    from medfed.runs import RunDir

    run_dir = RunDir(run).require()
    summary = run_dir.read_summary()
    run_dir.verify_model()  # a damaged model/ makes the run unusable, whatever it measured
    if model_card:
        typer.echo(f"wrote {write_model_card(run_dir.path)}", err=as_json)
    if as_json:
        typer.echo(json.dumps(summary.to_dict(), indent=2, sort_keys=True, allow_nan=False))
        return
    typer.echo(evaluation_text(summary))


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
    """Write one self-contained HTML report of a study for its clinicians.

    Sites and data, AUCs with CIs, operating points, calibration, cross-site matrix, routing,
    traffic. It loads nothing from a network and opens from a USB stick. Runs whose routed
    scans clinicians have read ('medfed review') get a prospective review section and the scans
    their readers disagree on; the paired comparisons 'medfed demo' or 'medfed compare' wrote
    beside the runs get their own."""
    from medfed.clinic.review import disagreement_rows, prospective_rows
    from medfed.reports.study import write_study_report

    if not out.is_dir():  # (a folder is refused by the report, with its own words)
        check_out_file(out, "--out")
    prospective = {run: rows for run in runs if (rows := prospective_rows(run))}
    disagree = {run: rows for run in runs if (rows := disagreement_rows(run))}
    # each run's model/ checked too
    written = write_study_report(
        runs, out, title=title, prospective=prospective, disagreements=disagree
    )
    typer.echo(
        f"wrote {written.path}: {len(written.methods)} method(s) "
        f"({', '.join(written.methods)}) on {len(written.sites)} site(s)"
    )


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
    out: OutFolderOpt = Path("compare_out"),
    quick: QuickOpt = False,
    seed: SeedOpt = 0,
    update_readme: UpdateReadmeOpt = None,
    reference: Annotated[
        str | None,
        typer.Option(
            help="The method every other is compared with (paired differences with 95% CIs); "
            "default: fedavg when it runs (the communication baseline), else the first method."
        ),
    ] = None,
    track: TrackOption = None,
) -> None:
    """Train several methods on the synthetic fundus federation; accuracy and bytes per round.

    --quick: the smaller demo budget; --update-readme: the tables, into docs/training.md's
    compare section."""
    check_outputs(out, update_readme, "compare-table")
    tracking = planned_tracking(track, out)
    from medfed.experiments.demo import COMMUNICATION_METHODS, run_demo

    chosen = tuple(methods or COMMUNICATION_METHODS)
    check_methods(chosen, seed)
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
    track_finished(out, tracking)


def register(app: typer.Typer) -> None:
    add = adder(app, TRAINING)
    add(train, cls=with_registries("algorithms", "backbones", "wire precisions"))
    add(evaluate)
    add(report)
    add(compare)
    register_commands(app)
