"""The steps every experiment shares: plan (budget, seeds and bootstrap resamples),
synthesize a federation, train each method on each seed's federation, collect the trained runs'
test scans for the intervals and the paired comparisons on those same scans
(:mod:`medfed.experiments.paired`), then write OUT/STEM.json and OUT/STEM.md, the plots and the
README's marked section.

An experiment (``medfed bench``, ``demo``, ``compare``, ``transfer``, ``privacy-curve``) only
declares what differs: its methods, how it trains one of them, and its tables.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from medfed.config import TrainConfig
from medfed.core.errors import ConfigError
from medfed.core.fileio import fresh_folder
from medfed.core.progress import lines_instead
from medfed.data.synth import synthesize
from medfed.experiments.paired import (
    FIGURES_BY_KEY,
    Scans,
    compare_methods,
    figure_intervals,
    load_scans,
)
from medfed.federation.training import load_sites, train
from medfed.reports.markdown import update_readme_section, write_results
from medfed.runs import Summary

# Bootstrap resamples of every interval (per-method figures and paired differences).
N_BOOT = {"full": 2000, "quick": 1000}
# The test figures an experiment of each site's model on its own scans reports and compares.
AUC_KEYS = ("worst_site_auc", "mean_site_auc")
AUC_FIGURES = tuple(FIGURES_BY_KEY[key] for key in AUC_KEYS)

F = TypeVar("F")
K = TypeVar("K")


# ---------------------------------------------------------------------------- plan
def size(quick: bool) -> str:
    """The budget's name: ``quick`` or ``full``."""
    return "quick" if quick else "full"


def resamples(n_boot: int | None, quick: bool) -> int:
    """``n_boot``, or the quick or full default; ConfigError below 1."""
    n_boot = n_boot or N_BOOT[size(quick)]
    if n_boot < 1:
        raise ConfigError(f"bootstrap resamples must be at least 1, got {n_boot}")
    return n_boot


def seed_range(first: int, count: int) -> list[int]:
    """``count`` consecutive seeds from ``first``: one federation and training seed each."""
    return [first + k for k in range(count)]


# ---------------------------------------------------------------------------- synthesize
@dataclass(frozen=True)
class Federation:
    """A synthesized federation: its sites' manifests and the sites loaded from them."""

    manifests: list[Path]
    sites: list[Any]


def synthesize_federation(
    out: Path, folder: Path, modality: str, budget: Any, seed: int, image_size: int | None
) -> Federation:
    """Synthesize ``modality``'s federation of ``budget.n_per_site`` per site into ``folder``
    and load its sites (cached in OUT/cache, shared by every federation of the experiment)."""
    manifests = list(
        synthesize(
            folder,
            modality=modality,
            n_per_site=budget.n_per_site,
            seed=seed,
            image_size=image_size,
        )
    )
    # Preprocessing every scan into the cache can take minutes: a bar says so on a terminal
    # (medfed.core.progress shows none in a log file or a pipe).
    return Federation(manifests, load_sites(manifests, out / "cache", progress=True))


def fundus_sites(
    out: Path, folder: str, budget: Any, seed: int, echo: Callable[[str], Any], name: str = ""
) -> list[Any]:
    """The sites of a synthetic fundus federation of ``budget``'s ``n_per_site`` and
    ``image_size``, written to OUT/data/FOLDER (cached in OUT/cache); ``name`` names it in the
    message."""
    named = f" {name}" if name else ""
    echo(f"synthesizing fundus federation{named} (seed {seed}, {budget.n_per_site} per site)")
    return synthesize_federation(
        out, out / "data" / folder, "fundus", budget, seed, budget.image_size
    ).sites


# ---------------------------------------------------------------------------- train
@dataclass(frozen=True)
class Trained:
    """One method trained on one seed's federation: its summary, its folder, its test scans."""

    summary: Summary
    folder: Path
    scans: Scans = field(default_factory=dict)


def budget_config(
    budget: Any, algorithm: str, rounds: int, seed: int, backbone: str, **extra: Any
) -> TrainConfig:
    """A run of ``rounds`` rounds of ``budget.local_steps`` local steps, on the best device."""
    return TrainConfig(
        algorithm=algorithm,
        rounds=rounds,
        local_steps=budget.local_steps,
        seed=seed,
        backbone=backbone,
        device="auto",
        **extra,
    )


def train_run(sites: list[Any], config: TrainConfig, folder: Path) -> Trained:
    """Train into ``folder``, emptied first of what an earlier run left there."""
    # a rounds bar, as above; a line every few rounds where no bar can show
    summary = train(sites, config, fresh_folder(folder), progress=True, say=lines_instead())
    return Trained(summary, folder, load_scans(folder))


@dataclass
class SeedRuns(Generic[F, K]):
    """What training every method on every seed's federation left behind."""

    # method -> seed -> its trained run, the methods in the order they were given
    runs: dict[K, dict[int, Trained]]
    # The first seed's federation, kept for measurements after training (a later seed's is
    # let go once its methods have trained).
    first: F | None = None
    seconds: float = 0.0

    def scans(self, method: K) -> dict[int, Scans]:
        """``method``'s test scans by seed."""
        return {seed: run.scans for seed, run in self.runs[method].items()}


def train_seeds(
    seeds: Iterable[int],
    federation: Callable[[int], F],
    methods: Sequence[K],
    train_one: Callable[[F, int, K], Trained],
) -> SeedRuns[F, K]:
    """For each seed, its federation (``federation(seed)``) then every method trained on it
    (``train_one(federation, seed, method)``): every method of a seed sees the same scans."""
    start = time.perf_counter()
    found: SeedRuns[F, K] = SeedRuns({method: {} for method in methods})
    for seed in seeds:
        fed = federation(seed)
        if found.first is None:
            found.first = fed
        for method in methods:
            found.runs[method][seed] = train_one(fed, seed, method)
    found.seconds = time.perf_counter() - start
    return found


# ---------------------------------------------------------------------------- figures
def auc_intervals(scans: Mapping[int, Scans], n_boot: int, seed: int) -> dict[str, Any]:
    """The worst-site and mean site test AUC with their 95% CIs, the seeds' scans pooled."""
    intervals = figure_intervals(scans, n_boot=n_boot, seed=seed)
    return {key: intervals[key] for key in AUC_KEYS}


def auc_comparisons(
    scans: Mapping[str, Mapping[int, Scans]], reference: str, n_boot: int, seed: int
) -> dict[str, Any]:
    """``reference`` minus every other method of ``scans`` on the worst-site and mean site
    test AUC, paired on the same test scans."""
    return compare_methods(scans, reference, figures=AUC_FIGURES, n_boot=n_boot, seed=seed)


def seeds_text(seeds: Sequence[int]) -> str:
    """``seed 2`` or ``seeds 2..4``."""
    return f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {seeds[0]}..{seeds[-1]}"


def machine_text(device: Mapping[str, Any]) -> str:
    """The GPU's name, else the CPU's (empty when neither is known)."""
    return device.get("gpu") or device.get("cpu") or ""


def image_size_text(budget: Mapping[str, Any]) -> str:
    """``, fundus images 96 px``, or "" at the generator's default size."""
    size = budget["image_size"]
    return "" if size is None else f", fundus images {size} px"


def run_text(results: Mapping[str, Any]) -> str:
    """The end of a caption: ``backbone cnn-gn; cpu, <machine>; 120 s in all``."""
    d = results["device"]
    where = machine_text(d)
    return (
        f"backbone {results['backbone']}; {d['run']}{', ' + where if where else ''}; "
        f"{results['seconds_total']:.0f} s in all"
    )


# ---------------------------------------------------------------------------- write
@dataclass(frozen=True)
class Docs:
    """Where an experiment's results go: OUT/STEM.json and OUT/STEM.md, and with
    ``--update-readme`` the README section between the ``marker`` lines, its plots copied
    into ``plot_dir`` beside the README."""

    stem: str
    marker: str
    plot_dir: Path

    def publish(
        self,
        out: Path,
        results: dict[str, Any],
        markdown: Callable[..., str],
        plots: list[Path],
        *,
        echo: Callable[[str], Any],
        readme: Path | None,
        summary: Callable[[str], Sequence[str]],
        readme_style: Mapping[str, Any] | None = None,
    ) -> None:
        """Write the results and their markdown (``markdown(results)``), echo the lines of
        ``summary(written)``, and with ``readme`` its section (``markdown(results,
        image_prefix=..., **readme_style)``, the plots named relative to the README)."""
        written = write_results(out, self.stem, results, markdown(results))
        for line in summary(written):
            echo(line)
        if readme is None:
            return
        prefix = f"{self.plot_dir.as_posix()}/"
        body = markdown(results, image_prefix=prefix, **(readme_style or {}))
        update_readme_section(readme, self.marker, body, plots, self.plot_dir)
        which = "plots" if len(plots) > 1 else "plot"
        echo(
            f"updated the {self.marker} section of {readme} ({which} in "
            f"{readme.parent / self.plot_dir})"
        )

    def publish_plot(
        self,
        out: Path,
        results: dict[str, Any],
        markdown: Callable[..., str],
        plot: Callable[[Mapping[str, Any], Path], Path],
        *,
        start: float,
        verdicts: Sequence[str],
        echo: Callable[[str], Any],
        readme: Path | None,
        readme_style: Mapping[str, Any] | None = None,
    ) -> None:
        """Draw OUT/STEM.png (``plot(results, path)``), record the seconds since ``start``,
        then :meth:`publish` with the ``verdicts`` and where everything was written."""
        path = out / f"{self.stem}.png"
        results["plot"] = plot(results, path).name
        results["seconds_total"] = time.perf_counter() - start
        self.publish(
            out,
            results,
            markdown,
            [path],
            echo=echo,
            readme=readme,
            summary=lambda written: [
                "",
                "\n".join(verdicts),
                f"finished in {results['seconds_total']:.0f} s; wrote {written} and {path}",
            ],
            readme_style=readme_style,
        )
