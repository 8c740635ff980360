"""Sites: ``medfed synth`` and ``medfed sites check|card|stats|heterogeneity``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from medfed.cli.common import SITES, CacheDirOpt, adder, friendly, named_folder
from medfed.core.errors import ManifestError, MedfedError


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
    task: Annotated[
        str,
        typer.Option(
            help="binary: glaucoma and CT lesion sites; dr: diabetic-retinopathy grading "
            "(ICDR 0-4) in the APTOS, EyePACS and IDRiD layouts."
        ),
    ] = "binary",
    n_sites: Annotated[
        int | None,
        typer.Option(help="Number of glaucoma or DR sites, 3 to 32 (default 3)."),
    ] = None,
    covariate_shift: Annotated[
        str | None,
        typer.Option(help="Camera differences between glaucoma or DR sites: low, mid or high."),
    ] = None,
    label_alpha: Annotated[
        float | None,
        typer.Option(
            help="Draw each site's class mix from Dirichlet(alpha * pooled mix) (glaucoma: "
            "Beta around 0.5); small alpha, strong label shift (default: each site's own mix)."
        ),
    ] = None,
    classes_per_site: Annotated[
        int | None, typer.Option(help="DR only: each site sees only its N most frequent grades.")
    ] = None,
    concept_shift: Annotated[
        bool,
        typer.Option(
            help="The second site labels by another rule: glaucoma from a vertical "
            "cup-to-disc ratio of 0.7 (the others 0.6); DR referable from grade 3."
        ),
    ] = False,
    image_size: Annotated[
        int | None,
        typer.Option(
            help="Native height in pixels of the largest fundus camera, 48 to 2048 (default "
            "224); the other cameras keep their relative sizes. Smaller photos synthesize and "
            "train faster."
        ),
    ] = None,
) -> None:
    """Write synthetic sites in real on-disk layouts, with their manifests under OUT/sites/."""
    from medfed.data.synth import GlaucomaShift, SynthesisError, synthesize
    from medfed.data.synth_dr import DRShift

    knobs = {
        "--n-sites": n_sites,
        "--covariate-shift": covariate_shift,
        "--label-alpha": label_alpha,
        "--concept-shift": concept_shift or None,
    }
    given = [name for name, value in knobs.items() if value is not None]
    settings = {
        "n_sites": 3 if n_sites is None else n_sites,
        "covariate": covariate_shift or "mid",
        "label_alpha": label_alpha,
        "concept": concept_shift,
    }
    shift: DRShift | GlaucomaShift | None = None
    if task == "dr":
        shift = DRShift(classes_per_site=classes_per_site, **settings)
    elif classes_per_site is not None:
        raise SynthesisError("--classes-per-site applies to --task dr only; add --task dr")
    elif given:  # the glaucoma sites, planned; without a knob the three hand-made ones
        shift = GlaucomaShift(**settings)
    manifests = synthesize(
        out,
        modality=modality,
        n_per_site=n_per_site,
        seed=seed,
        image_size=image_size,
        task=task,
        shift=shift,
    )
    typer.echo(f"wrote {len(manifests)} site(s) under {out}:")
    for path in manifests:
        typer.echo(f"  {path}")
    typer.echo(f"next: medfed sites check {out}/sites/*.toml")


@friendly
def sites_check(
    manifests: Annotated[list[Path], typer.Argument(help="Site manifests (*.toml).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the reports as JSON.")] = False,
    cache_dir: CacheDirOpt = None,
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
        typer.echo(f"  sizes: {report.sizes_text()}")
    if report.intensity:
        typer.echo(f"  intensity: {report.intensity_text()}")
    if report.disc:
        typer.echo(f"  optic disc position: {report.disc_text()}")
    for other, d in report.distances.items():
        typer.echo(f"  distance to {other} (MMD): {d:.4f}")
    for warning in report.warnings:
        typer.echo(f"  warning: {warning}")
    if report.problems:
        typer.echo(f"  {len(report.problems)} problem(s):")
        for problem in report.problems:
            typer.echo(f"    - {problem}")
    typer.echo("")


@friendly
def sites_card(
    manifest: Annotated[Path, typer.Argument(help="The site's manifest (*.toml).")],
    others: Annotated[
        list[Path] | None, typer.Option("--other", help="Other sites, for the distance section.")
    ] = None,
    out_dir: Annotated[
        Path, typer.Option(help="Folder for the card.", callback=named_folder)
    ] = Path("data_cards"),
    cache_dir: CacheDirOpt = None,
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
    # Every scan is read (minutes for a large site): said first, whether or not a bar shows.
    typer.echo(
        f"checking site {site.id}"
        + (f" and {len(others)} other site(s) for the distances" if others else "")
        + ": reading every scan ...",
        err=True,
    )
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


@friendly
def sites_stats(
    manifests: Annotated[list[Path], typer.Argument(help="Site manifests (*.toml).")],
    out: Annotated[
        Path, typer.Option(help="Run directory for statistics.json.", callback=named_folder)
    ],
    min_count: Annotated[int, typer.Option(help="Suppress every count under this many scans.")] = 0,
    noise: Annotated[
        str, typer.Option(help="Noise on every count: none, laplace or gaussian.")
    ] = "none",
    epsilon: Annotated[float, typer.Option(help="With --noise: the budget per site.")] = 0.0,
    delta: Annotated[
        float | None, typer.Option(help="With --noise gaussian \\[default: 1e-05].")
    ] = None,
    cache_dir: CacheDirOpt = None,
) -> None:
    """The federation overview of a statistics run, from manifests on this machine.

    The same statistics, suppression and noise as 'medfed deploy stats' (without a
    deployment, and without site policies): OUT/statistics.json, shown on the dashboard's Sites
    page."""
    from medfed.data.cache import TensorCache, default_cache_dir
    from medfed.data.checks import check_manifests
    from medfed.governance.disclosure import federation_statistics, release, site_entry
    from medfed.governance.statistics import (
        DEFAULT_DELTA,
        StatisticsSettings,
        make_statistics_plan,
    )
    from medfed.runs.schema import SiteStatistics
    from medfed.runs.statistics import write_statistics

    if delta is None:
        delta = DEFAULT_DELTA if noise == "gaussian" else 0.0
    settings = StatisticsSettings(min_count=min_count, noise=noise, epsilon=epsilon, delta=delta)
    reports = check_manifests(list(manifests), TensorCache(cache_dir or default_cache_dir()))
    sites = {}
    for report in reports:
        name = report.site or str(report.manifest)
        if report.unusable:
            sites[name] = SiteStatistics(status="failed", reason=report.unusable)
        else:
            sites[name] = site_entry(release(report.to_dict(), settings))
    plan = make_statistics_plan(settings, list(sites), run_name=out.name)
    stats = federation_statistics(settings, sites, run_name=out.name, plan=plan,
                                  engine="in-process")  # fmt: skip
    path = write_statistics(out, stats)
    typer.echo(f"wrote {path} ({settings.words()})")


@friendly
def sites_heterogeneity(
    sites_dir: Annotated[
        Path | None,
        typer.Option(
            help="A federation's folder: its manifests in DIR/sites/*.toml (as medfed synth "
            "writes them) or DIR/*.toml. Default: the sites of --run, from its site overview.",
            callback=named_folder,
        ),
    ] = None,
    run: Annotated[
        Path | None,
        typer.Option(
            help="A trained run of these sites: its cross-site matrix gives the "
            "concept-shift indicator."
        ),
    ] = None,
    modality: Annotated[
        str | None, typer.Option(help="fundus or ct: which sites, when the folder holds both.")
    ] = None,
    sweep: Annotated[
        list[Path] | None,
        typer.Option(
            help="A scenario sweep's result file (medfed scenarios' OUT/sweep-ABLATION.json; "
            "repeat for several): the method ranking per regime. Default: the sweeps measured "
            "for docs/scenarios.md, shipped with medfed."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    cache_dir: CacheDirOpt = None,
) -> None:
    """Label, covariate and concept shift between sites; the synthetic scenario they resemble."""
    from medfed.cli.heterogeneity import run_figures, site_figures
    from medfed.reports.heterogeneity import (
        heterogeneity,
        heterogeneity_text,
        measured_sweep,
        read_sweeps,
    )

    if sites_dir is None and run is None:
        raise MedfedError("give --sites-dir DIR (a federation's sites) or --run RUN (or both)")
    counts, distances, task = site_figures(sites_dir, run, modality, cache_dir)
    cross, sizes = run_figures(run, list(counts)) if run is not None else (None, None)
    found = read_sweeps(sweep) if sweep else measured_sweep()
    report = heterogeneity(counts, distances, task, cross, found, sizes)
    if as_json:
        typer.echo(json.dumps(report, indent=2, allow_nan=False))
        return
    typer.echo(heterogeneity_text(report))


def register(app: typer.Typer) -> None:
    adder(app, SITES)(synth)
    sites_app = typer.Typer(
        help="Onboard sites: validate them and write their data cards.",
        suggest_commands=False,  # click suggests (see medfed.cli.app)
    )
    app.add_typer(sites_app, name="sites", rich_help_panel=SITES)
    add = adder(sites_app)
    add(sites_check, "check")
    add(sites_card, "card")
    add(sites_stats, "stats")
    add(sites_heterogeneity, "heterogeneity")
