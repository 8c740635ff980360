"""Experiments: ``medfed demo``, ``bench``, ``transfer``, ``privacy-curve``, ``gpu-check``,
``bench-deploy``, ``bench-throughput``, ``scenarios`` and ``real-study``."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from pathlib import Path
from typing import Annotated

import typer

from medfed.cli.common import (
    DEVICE_OPTION,
    EXPERIMENTS,
    DeviceOpt,
    OutFolderOpt,
    QuickOpt,
    SeedOpt,
    UpdateReadmeOpt,
    adder,
    check_methods,
    check_outputs,
    friendly,
    update_section,
)
from medfed.cli.tracking import TrackOption, planned_tracking, track_finished
from medfed.config import Modality
from medfed.core.errors import ConfigError, require_extra

# Options several experiments share; what differs per command, its docstring says.
LocalStepsOpt = Annotated[int, typer.Option(help="Local steps per round.")]
MethodOpt = Annotated[
    list[str] | None, typer.Option(help="Only these methods (repeat); FedDRM always trains.")
]
N_BOOT = typer.Option(help="Bootstrap resamples of every interval.")
ReuseRunsOpt = Annotated[
    bool,
    typer.Option(
        help="Read runs that finished in OUT with the same settings instead of training them "
        "again (an interrupted sweep or study continues; a finished one is re-rendered)."
    ),
]
SeedsOpt = Annotated[int | None, typer.Option(help="Seeds 0..N-1 (default: see above).")]


@friendly
def demo(
    out: OutFolderOpt = Path("demo_out"),
    quick: QuickOpt = False,
    seed: SeedOpt = 0,
    modality: Annotated[
        str,
        typer.Option(
            help="fundus (three sites), ct (two CT sites) or all (each into OUT/fundus, OUT/ct)."
        ),
    ] = "fundus",
    update_readme: UpdateReadmeOpt = None,
) -> None:
    """Synthesize a federation, train FedDRM and baselines, print the comparison.

    --quick: under 3 minutes; --update-readme: the table, into the demo section of README.md
    (fundus) or docs/ct.md (ct)."""
    from medfed.experiments.demo import DEMO_MARKERS, demo_modalities, run_demos

    check_outputs(out, update_readme, *(DEMO_MARKERS[m] for m in demo_modalities(modality)))
    run_demos(out, modality, quick=quick, seed=seed, echo=typer.echo, readme=update_readme)


@friendly
def bench(
    quick: QuickOpt = False,
    seeds: SeedsOpt = None,
    out: OutFolderOpt = Path("bench_out"),
    as_json: Annotated[bool, typer.Option("--json", help="Print results.json.")] = False,
    modality: Annotated[str, typer.Option(help="fundus, ct or all.")] = "all",
    update_readme: UpdateReadmeOpt = None,
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
    track: TrackOption = None,
) -> None:
    """Every method on the synthetic fundus and CT federations over several seeds.

    With speed figures; writes OUT/results.json, OUT/results.md and PNG plots.

    --quick: smaller budgets and 2 seeds (about 19 minutes on 2 cores); --seeds: default 3, or
    2 with --quick; --update-readme: the tables and plots, into docs/benchmarks.md's bench
    section."""
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
    check_methods(plan.methods, 0)
    check_outputs(out, update_readme, plan.marker)
    tracking = planned_tracking(track, out)
    echo = functools.partial(typer.echo, err=as_json)
    results = run_bench(out, plan, echo=echo, readme=update_readme)
    track_finished(out, tracking)
    if as_json:
        typer.echo(json.dumps(results, indent=2))


@friendly
def transfer(
    out: OutFolderOpt = Path("transfer_out"),
    quick: QuickOpt = False,
    update_readme: UpdateReadmeOpt = None,
) -> None:
    """LoRA and FedDRM started from a FedAvg base trained on another federation.

    A FedAvg base from one synthetic federation as the start of LoRA and FedDRM on another,
    against random weights: curves, 95% CIs and paired comparisons (OUT/transfer.md).

    --quick: about 5 minutes on 2 cores; --update-readme: the results and the plot, into
    docs/training.md's transfer section."""
    check_outputs(out, update_readme, "transfer")
    from medfed.experiments.transfer import run_transfer

    run_transfer(out, quick=quick, echo=typer.echo, readme=update_readme)


@friendly
def privacy_curve(
    out: OutFolderOpt = Path("privacy_out"),
    quick: QuickOpt = False,
    update_readme: UpdateReadmeOpt = None,
) -> None:
    """What differential privacy costs: FedAvg and FedDRM at epsilon 1, 3, 8 and without DP.

    Worst-site AUC with 95% CIs and paired differences (OUT/privacy.md, OUT/privacy.png).

    --quick: one seed (about 10 minutes on 2 cores); --update-readme: the results and the
    plot, into docs/privacy.md's privacy section."""
    check_outputs(out, update_readme, "privacy")
    from medfed.experiments.privacy_curve import run_privacy_curve

    run_privacy_curve(out, quick=quick, echo=typer.echo, readme=update_readme)


@friendly
def gpu_check(
    out: OutFolderOpt = Path("gpu_check_out"),
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
    device: Annotated[str | None, DEVICE_OPTION] = None,
) -> None:
    """Check the GPU path end to end against the CPU. Exits 1 when anything failed.

    Every algorithm on the GPU against the CPU (same seed, figures within tolerance), images
    per second per backbone, peak GPU memory, the bench's quick table; OUT/gpu_check.json and
    OUT/gpu_check.md.

    --device: the device checked against the CPU (default: cuda, else cpu-bf16)."""
    check_outputs(out)
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


@friendly
def bench_deploy(
    out: OutFolderOpt = Path("bench_deploy_out"),
    rounds: Annotated[
        int, typer.Option(help="Rounds of each run (the first and the last are left out).")
    ] = 5,
    local_steps: LocalStepsOpt = 10,
    backbone: Annotated[str, typer.Option(help="The model (a fundus backbone).")] = "cnn-gn",
    image_size: Annotated[int, typer.Option(help="Fundus input size in pixels.")] = 128,
    without_workers: Annotated[
        bool, typer.Option(help="Also measure the deployment without resident workers.")
    ] = True,
    # \[ : rich help would read a bare [default: ...] as a style tag and drop it.
    task_poll: Annotated[
        float | None,
        typer.Option(
            help="Seconds between each SuperExec's looks for a task to start "
            "(FLWR_SUPEREXEC_TASK_POLL_INTERVAL) \\[default: 0.1; Flower's own: 1]",
            show_default=False,
        ),
    ] = None,
    update_readme: UpdateReadmeOpt = None,
    n_per_site: Annotated[int, typer.Option(hidden=True, help="Scans per site (tests).")] = 64,
    sheet_algorithm: Annotated[
        list[str] | None,
        typer.Option(
            help="An algorithm whose bytes the 20/100-site sheet lists (repeatable; default: "
            "fedavg fedbn feddrm fedrep lora; each but fedavg trains two rounds in process)."
        ),
    ] = None,
) -> None:
    """A deployed round on loopback against the same round in one process.

    A SuperLink and a SuperNode per site, on Flower, side by side with the in-process engine;
    writes OUT/deploy-bench.json and .md.

    --update-readme: the table, into docs/deployment.md's deploy-bench section."""
    require_extra("flwr", "flower", "medfed bench-deploy")
    check_outputs(out, update_readme, "deploy-bench")
    if not 3 <= rounds <= 1000:
        raise ConfigError(
            f"--rounds must be 3..1000 (the first and the last rounds are left out), got {rounds}"
        )
    if not 32 <= image_size <= 512:
        raise ConfigError(f"--image-size must be 32..512 pixels, got {image_size}")
    if task_poll is not None and not 0.01 <= task_poll <= 60:  # what Flower 1.42 accepts
        raise ConfigError(f"--task-poll must be 0.01..60 seconds, got {task_poll:g}")
    from medfed.experiments.deploy_speed import MARKER, DeployBenchPlan, markdown, run_deploy_bench

    plan = DeployBenchPlan(
        n_per_site=n_per_site,
        image_size=image_size,
        backbone=backbone,
        rounds=rounds,
        local_steps=local_steps,
        without_workers=without_workers,
        **({} if task_poll is None else {"task_poll_s": task_poll}),
        **({} if not sheet_algorithm else {"algorithms": tuple(dict.fromkeys(sheet_algorithm))}),
    )
    from medfed.algorithms import make_algorithm

    for name in plan.algorithms:  # an unknown name is refused before anything starts
        try:
            make_algorithm(name)
        except ConfigError as exc:
            raise ConfigError(f"--sheet-algorithm {name!r}: {exc}") from None
    from medfed.federation.plan import resolved_settings

    resolved_settings(plan.config())  # a bad backbone or budget is refused before anything starts
    results = run_deploy_bench(out, plan)
    typer.echo(markdown(results))
    update_section(update_readme, MARKER, markdown(results))


@friendly
def bench_throughput(
    out: OutFolderOpt = Path("throughput_out"),
    backbone: Annotated[str, typer.Option(help="A torchvision-shaped backbone.")] = "tv-resnet18",
    image_size: Annotated[int, typer.Option(help="Training resolution in pixels.")] = 224,
    batch_size: Annotated[int, typer.Option(help="Batch size of both loops.")] = 8,
    steps: Annotated[int, typer.Option(help="Steps of each warm measurement.")] = 4,
    scans: Annotated[int, typer.Option(help="Photos of the synthetic site.")] = 48,
    repeats: Annotated[int, typer.Option(help="Warm repeats, the two sides back to back.")] = 5,
    workers: Annotated[int, typer.Option(help="The plain loop's DataLoader workers.")] = 2,
    device: DeviceOpt = "cpu",
    compiled: Annotated[
        bool,
        typer.Option(help="Also time medfed's worker with torch.compile (compile = true)."),
    ] = False,
    dp_steps: Annotated[
        int,
        typer.Option(help="Also time DP-SGD: steps of each of four loops (0: not)."),
    ] = 2,
    dp_backbone: Annotated[
        str, typer.Option(help="The GroupNorm backbone DP-SGD is timed on.")
    ] = "tv-resnet18-gn",
    memory_scans: Annotated[
        int,
        typer.Option(help="Also measure the peak RSS of a site of this many photos (0: not)."),
    ] = 5000,
    update_readme: UpdateReadmeOpt = None,
) -> None:
    """Local training images/s: medfed's site worker against a plain torchvision loop.

    Same model, resolution, batch and photos, warm (cached tensors) and cold (nothing cached);
    DP-SGD's cost per step against a plain Opacus loop; and the peak memory of loading a large
    site. Writes OUT/throughput.json and .md.

    --update-readme: the table, into the page's throughput section."""
    from medfed.experiments.throughput import MARKER, ThroughputPlan
    from medfed.experiments.throughput_report import full_report

    check_outputs(out, update_readme, MARKER)
    if memory_scans and memory_scans < 8:
        raise ConfigError(f"--memory-scans must be 0 or at least 8, got {memory_scans}")
    plan = ThroughputPlan(
        backbone=backbone,
        image_size=image_size,
        batch_size=batch_size,
        steps=steps,
        scans=scans,
        repeats=repeats,
        workers=workers,
        device=device,
        compiled=compiled,
    )
    if dp_steps < 0:
        raise ConfigError(f"--dp-steps must be 0 or more, got {dp_steps}")
    if dp_steps:
        from medfed.experiments.dpcost import checked_backbone

        checked_backbone(dp_backbone)
    text = full_report(
        out, plan, memory_scans, echo=typer.echo, dp_steps=dp_steps, dp_backbone=dp_backbone
    )
    typer.echo(text)
    update_section(update_readme, MARKER, text)


MAX_SCENARIO_SEEDS = 100
MAX_RESAMPLES = 100_000


def _check_scenario_counts(seeds: int | None, n_boot: int | None) -> None:
    """--seeds and --n-boot within what a sweep can finish (each seed trains every method)."""
    if seeds is not None and not 1 <= seeds <= MAX_SCENARIO_SEEDS:
        raise ConfigError(
            f"--seeds must be 1..{MAX_SCENARIO_SEEDS} (each seed trains every method at every "
            f"level), got {seeds}"
        )
    if n_boot is not None and not 1 <= n_boot <= MAX_RESAMPLES:
        raise ConfigError(f"--n-boot must be 1..{MAX_RESAMPLES} resamples, got {n_boot}")


@friendly
def scenarios(
    ablation: Annotated[
        str,
        typer.Option(help="covariate, lambda, label, concept or clients (FedDRM's ablations)."),
    ],
    out: OutFolderOpt = Path("scenarios_out"),
    quick: QuickOpt = False,
    seeds: SeedsOpt = None,
    method: MethodOpt = None,
    level: Annotated[
        list[str] | None, typer.Option(help="Only these levels of the ablation (repeat).")
    ] = None,
    n_boot: Annotated[int | None, N_BOOT] = None,
    update_readme: UpdateReadmeOpt = None,
    reuse_runs: ReuseRunsOpt = False,
    track: TrackOption = None,
) -> None:
    """One of FedDRM's published ablations on synthetic DR-grading federations.

    FedDRM and the paper's baselines medfed has, the same budget each, over several seeds:
    every figure with its 95% CI, FedDRM's paired differences, and the paper's claims beside
    medfed's intervals with a verdict each (OUT/scenario-ABLATION.md).

    --quick: a toy budget (the test suite's form); --seeds: of the federation and the training,
    default 8, quick 2; --update-readme: the tables, into docs/scenarios.md's scenario section."""
    from medfed.experiments.scenarios import (
        SWEEP_LATENCY_SCANS,
        ScenarioPlan,
        marker,
        run_scenarios,
    )
    from medfed.routing.evaluation import LATENCY_ENV

    _check_scenario_counts(seeds, n_boot)
    plan = ScenarioPlan.make(
        ablation, quick=quick, seeds=seeds, methods=method or (), n_boot=n_boot, levels=level or ()
    )
    check_outputs(out, update_readme, marker(ablation))
    tracking = planned_tracking(track, out)
    # The sweep reports no routing latency: its runs time the fewest scans the median's CI needs
    # (each timed scan is a forward pass of every site's model; a 32-site level pays 32).
    os.environ.setdefault(LATENCY_ENV, str(SWEEP_LATENCY_SCANS))
    run_scenarios(out, plan, echo=typer.echo, readme=update_readme, reuse=reuse_runs)
    track_finished(out, tracking)


@friendly
def real_study(
    site: Annotated[
        list[Path],
        typer.Option(help="A real site's manifest (repeat), e.g. sites/real/*.toml."),
    ],
    out: OutFolderOpt = Path("real_study_out"),
    init: Annotated[
        str, typer.Option(help="The frozen encoder's ImageNet weights (--init of medfed train).")
    ] = "torchvision:mobilenet_v2",
    seeds: Annotated[int, typer.Option(help="Training seeds (the split is the manifests').")] = 5,
    rounds: Annotated[int, typer.Option(help="Rounds of every run.")] = 40,
    local_steps: LocalStepsOpt = 10,
    method: MethodOpt = None,
    n_boot: Annotated[int, N_BOOT] = 1000,
    outside: Annotated[
        bool, typer.Option(help="Also leave each source out and measure the flag rates.")
    ] = True,
    update_readme: UpdateReadmeOpt = None,
    reuse_runs: ReuseRunsOpt = False,
    track: TrackOption = None,
) -> None:
    """Every method on real sites with the frozen ImageNet encoder, over several seeds.

    Per-site macro AUC, the worst site, ODIR's glaucoma AUC, system and routing accuracy with
    intervals over seeds and patients, FedDRM's paired verdicts (Holm), a centralized
    reference, and how photos from a source no site has seen are flagged.

    --update-readme: the tables, into docs/real-data.md's sections."""
    from medfed.experiments.realdata import CENTRAL, METHODS, REFERENCE, StudyPlan
    from medfed.experiments.realstudy import MARKERS, run_real_study

    for name, value in (("--seeds", seeds), ("--rounds", rounds), ("--local-steps", local_steps)):
        if value < 1:
            raise ConfigError(f"{name} must be at least 1, got {value}")
    if n_boot < 1:
        raise ConfigError(f"--n-boot must be at least 1, got {n_boot}")
    methods = tuple(dict.fromkeys([REFERENCE, *(method or [*METHODS, CENTRAL])]))
    plan = StudyPlan(
        manifests=tuple(site),
        init=init,
        seeds=tuple(range(seeds)),
        rounds=rounds,
        local_steps=local_steps,
        methods=methods,
        n_boot=n_boot,
    )
    check_outputs(out, update_readme, *(MARKERS if outside else MARKERS[:1]))
    tracking = planned_tracking(track, out)
    run_real_study(
        plan, out, echo=typer.echo, readme=update_readme, outside=outside, reuse=reuse_runs
    )
    track_finished(out, tracking)


def register(app: typer.Typer) -> None:
    add = adder(app, EXPERIMENTS)
    add(demo)
    add(bench)
    add(transfer)
    add(privacy_curve, "privacy-curve")
    add(gpu_check, "gpu-check")
    add(bench_deploy, "bench-deploy")
    add(bench_throughput, "bench-throughput")
    add(scenarios)
    add(real_study, "real-study")
