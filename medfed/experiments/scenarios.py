"""``medfed scenarios``: FedDRM's published ablations, run on synthetic DR-grading federations
with FedDRM and the paper's baselines that medfed has, and read off intervals.

The FedDRM paper reports, on CIFAR-10/100 split over clients with label and covariate shift
(and on its RETINA federation), that system accuracy (a scan's origin unknown) rises with the
strength of covariate shift while average accuracy falls slightly; that its weight lambda peaks
near 0.8; that it leads the next methods under Dirichlet 0.3 and few-classes-per-site label
shift; and that with more clients system accuracy falls but FedDRM stays ahead. Each ablation
here is one of those, on medfed's synthetic ICDR grading federation
(:mod:`medfed.data.synth_dr`), whose knobs set the shifts:

* ``covariate``: camera shift low / mid / high;
* ``lambda``: FedDRM's lambda over 0.1 ... 0.95 on one federation;
* ``label``: grade mixes drawn from Dirichlet(0.3) against sites that see only 2 grades;
* ``concept``: every site grading alike, against one site calling an eye referable from grade 3;
* ``clients``: 8, 16 and 32 sites sharing one pool of photos (at most 8 train in a round:
  client sampling).

Every method of one seed and level trains on the same federation with the same budget (rounds,
local steps, scans per site) and is tested on the same scans, so FedDRM's differences from each
baseline are paired (:func:`medfed.experiments.paired.compare`); a trend across levels compares
different federations and gets an unpaired interval
(:func:`medfed.experiments.paired.level_difference`). Each claim's verdict comes from those
intervals: "reproduced in direction", "not reproduced" (the interval on the other side of 0) or
"no difference detected". These are synthetic scenarios: they say in which regime a method wins
on medfed's generator, not what a hospital's data will show.
"""

from __future__ import annotations

import dataclasses
import json
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tomli_w
import torch

from medfed.algorithms import recorded_params
from medfed.algorithms.feddrm import FedDRMParams
from medfed.config import TrainConfig
from medfed.core.errors import ConfigError
from medfed.core.fileio import fresh_folder
from medfed.data.synth import synthesize
from medfed.data.synth_dr import DRShift
from medfed.experiments.demo import Budget, MethodSpec
from medfed.experiments.harness import Docs, Trained, resamples, size, train_run
from medfed.experiments.paired import (
    AVERAGE_ACCURACY,
    FIGURES_BY_KEY,
    Figure,
    Scans,
    load_scans,
)
from medfed.experiments.scenario_tables import ScenarioBudget, scenario_markdown, sweep_file
from medfed.experiments.scenario_verdicts import (
    ADJUSTMENT,
    ALPHA,
    NOT_MEASURED,
    PAPER,
    REFERENCE,
    VARIANT_NAMES,
    VARIANTS,
    adjust_table,
    bootstraps,
    claim_verdict,
    curve,
    decide,
    level_table,
    mean_curve,
    unpaired,
)
from medfed.federation.training import load_sites
from medfed.metrics import Interval
from medfed.metrics.seeds import SeedBootstrap
from medfed.reports.heterogeneity import label_shift

# Both FedDRM variants, then the paper's baselines that medfed has.
METHODS = (REFERENCE, PAPER, "fedavgft", "fedprox", "fedbn", "fedrep", "ditto", "local")
# The method specs a name stands for (medfed.experiments.demo.MethodSpec), where not itself:
# the paper's FedDRM normalizes with shared layers and trains its client head by gradient.
SPECS = {PAPER: "feddrm:private_norms=false,client=trained"}
SYSTEM = FIGURES_BY_KEY["system_accuracy"]
# Sites that train in one round, at most (the rest wait: client sampling).
SITES_PER_ROUND = 8
# Scans per router whose routing latency a sweep's run times (MEDFED_LATENCY_SCANS): the sweep
# reports none, so the fewest the median's CI needs.
SWEEP_LATENCY_SCANS = 6
# What each method trains beyond the shared budget (stated beside every table).
EXTRA_STEPS = {
    "ditto": "Ditto takes twice the local steps per round (its global and its personal model)",
    "fedavgft": "FedAvg+FT adds 2 rounds' worth of local fine-tuning steps per site at the end",
}


# The full budget learns on 2 cores: every method's validation accuracy has flattened well
# before its last round (the tables show it), from ImageNet features of torchvision's
# MobileNetV2 file (TORCH_HOME's hub cache). The quick one runs the same path on a toy budget.
START = "torchvision:mobilenet_v2"
BUDGETS = {
    "full": ScenarioBudget(150, 30, 5, 64, START, True),
    "quick": ScenarioBudget(30, 3, 2, 48, START, True),
}
SEEDS = {"full": 8, "quick": 2}


@dataclass(frozen=True)
class Level:
    """One level of an ablation: its federation's shift, FedDRM's lambda where it varies, and
    the photos per site where they vary (the clients ablation splits one pool)."""

    label: str
    shift: DRShift
    lam: float | None = None
    n_per_site: int | None = None  # photos per site where the level sets them (else the budget's)

    @property
    def client_fraction(self) -> float:
        return min(1.0, SITES_PER_ROUND / self.shift.n_sites)

    def method_label(self, method: str) -> str:
        """The method as trained at this level: its spec (:data:`SPECS`), each FedDRM variant
        with this level's lambda where the level sets one."""
        spec = SPECS.get(method, method)
        if self.lam is not None and method in VARIANTS:
            return f"{spec}{',' if ':' in spec else ':'}lam={self.lam:g}"
        return spec

    def run_name(self, method: str) -> str:
        """The run's folder name: a FedDRM variant at its default lambda is the plain run
        that other ablations share."""
        if self.lam is not None and method in VARIANTS and self.lam != FedDRMParams.lam:
            return f"{method}_lam{self.lam:g}"
        return method


@dataclass(frozen=True)
class Claim:
    """One of the paper's findings and how an interval decides it.

    ``kind``: ``rise`` / ``fall`` (FedDRM's ``figure`` from level ``span[0]`` to ``span[1]``,
    unpaired), ``ahead`` (FedDRM minus the ``rivals`` strongest baselines of each level, paired)
    or ``peak`` (FedDRM at level ``span[0]`` minus every other level, paired)."""

    text: str
    paper: str
    kind: str
    figure: Figure = SYSTEM
    span: tuple[str, ...] = ()
    rivals: int = 1


@dataclass(frozen=True)
class Ablation:
    name: str
    title: str
    levels: tuple[Level, ...]
    claims: tuple[Claim, ...]
    methods: tuple[str, ...] = METHODS
    note: str = ""  # said in place of the claims table where the paper makes none
    about: str = ""  # what a reader needs before the tables, said under the header
    judged: tuple[str, ...] = VARIANTS  # the FedDRM variants whose claims are judged

    def level(self, label: str) -> Level:
        return next(lv for lv in self.levels if lv.label == label)


def _covariate() -> Ablation:
    levels = tuple(Level(c, DRShift(covariate=c)) for c in ("low", "mid", "high"))
    return Ablation(
        "covariate",
        "Covariate shift: camera shift low / mid / high",
        levels,
        (
            Claim(
                "FedDRM's system accuracy rises with covariate shift",
                "46.90 (low), 54.61 (mid), 63.80 (high)",
                "rise",
                span=("low", "high"),
            ),
            Claim(
                "FedDRM's average accuracy falls slightly with covariate shift",
                "81.78 (low) to 80.25 (high)",
                "fall",
                AVERAGE_ACCURACY,
                span=("low", "high"),
            ),
        ),
    )


def _lambda() -> Ablation:
    lams = (0.1, 0.3, 0.5, 0.8, 0.95)
    return Ablation(
        "lambda",
        "FedDRM's lambda (target head's weight against the client head's)",
        tuple(Level(f"{lam:g}", DRShift(), lam=lam) for lam in lams),
        (
            Claim(
                "system accuracy peaks near lambda = 0.8",
                "peak near 0.8 (swept 0.1 to 0.95)",
                "peak",
                span=("0.8",),
            ),
        ),
        methods=VARIANTS,
        about="In the frozen-encoder mode medfed's FedDRM sets its client head in closed form "
        "(Fisher's discriminant on the sites' feature statistics) and trains the target head "
        "alone, so lambda does not enter its training: its rows are one run per seed, repeated "
        "at every level as the reference. The claim is the paper's FedDRM's, whose client "
        "head trains by gradient with weight 1 - lambda: it alone is judged.",
        judged=(PAPER,),
    )


def _label() -> Ablation:
    return Ablation(
        "label",
        "Label shift: Dirichlet 0.3 against 2 grades per site",
        (
            Level("Dirichlet 0.3", DRShift(label_alpha=0.3)),
            Level("2 grades per site", DRShift(classes_per_site=2)),
        ),
        (
            Claim(
                "FedDRM ahead of the strongest baseline under both label shifts",
                "Dir-0.3: 62.78 vs 61.33 (FedALA); 5-SPC: 58.50 vs 57.17 (FedBABU), CIFAR-10",
                "ahead",
            ),
        ),
    )


def _concept() -> Ablation:
    return Ablation(
        "concept",
        "Concept shift: every site grading alike, against one site calling referable from grade 3",
        (Level("off", DRShift()), Level("on", DRShift(concept=True))),
        (),
        note="medfed's own scenario, no paper claim: the FedDRM paper has no concept-shift "
        "ablation, so this section reports the figures and the paired differences only.",
    )


# The clients ablation's pool: the paper splits one dataset among more clients, so each holds
# less; 640 photos give 80, 40 and 20 per site at m = 8, 16 and 32 (20: the least a synthetic
# site may hold, every split and grade present).
POOL = 640


def _clients() -> Ablation:
    sizes = (8, 16, 32)
    return Ablation(
        "clients",
        f"Number of sites m = 8, 16, 32 sharing one pool of {POOL} photos (at most "
        f"{SITES_PER_ROUND} train in a round)",
        tuple(Level(f"m = {m}", DRShift(n_sites=m), n_per_site=POOL // m) for m in sizes),
        (
            Claim(
                "FedDRM's system accuracy falls with more sites",
                "59.59 (m = 8) to 46.62 (m = 32)",
                "fall",
                span=("m = 8", "m = 32"),
            ),
            Claim(
                "FedDRM stays ahead of the next two methods at every m",
                "ahead at m = 8, 16, 32",
                "ahead",
                rivals=2,
            ),
        ),
        about=f"As in the paper, one pool is split among the sites: {POOL} photos, "
        + ", ".join(f"{POOL // m} per site at m = {m}" for m in sizes)
        + "; the budget's photos per site do not apply here, its other settings do.",
    )


ABLATIONS: dict[str, Ablation] = {
    a.name: a for a in (_covariate(), _lambda(), _label(), _concept(), _clients())
}


def marker(ablation: str) -> str:
    """The docs section an ablation's tables go to."""
    return f"scenario-{ablation}"


@dataclass(frozen=True)
class ScenarioPlan:
    """What one ``medfed scenarios`` run trains."""

    ablation: Ablation
    budget: ScenarioBudget
    seeds: int
    methods: tuple[str, ...]
    n_boot: int
    quick: bool = False
    command: str = "medfed scenarios"
    levels: tuple[Level, ...] = field(default=())

    @classmethod
    def make(
        cls,
        ablation: str,
        *,
        quick: bool = False,
        seeds: int | None = None,
        methods: Sequence[str] = (),
        n_boot: int | None = None,
        levels: Sequence[str] = (),
    ) -> ScenarioPlan:
        """The quick or full plan of ``ablation``; ``methods`` and ``levels`` narrow it
        (FedDRM always trains: every verdict is about it)."""
        if ablation not in ABLATIONS:
            raise ConfigError(
                f"--ablation {ablation!r}: unknown; choose one of {sorted(ABLATIONS)}"
            )
        found = ABLATIONS[ablation]
        chosen = tuple(dict.fromkeys(methods)) if methods else found.methods
        unknown = [m for m in chosen if m not in found.methods]
        if unknown:
            raise ConfigError(
                f"--method {unknown[0]!r}: not a method of the {ablation} ablation; choose "
                f"among {list(found.methods)}"
            )
        if REFERENCE not in chosen:
            chosen = (REFERENCE, *chosen)
        labels = [lv.label for lv in found.levels]
        bad = [lv for lv in levels if lv not in labels]
        if bad:
            raise ConfigError(
                f"--level {bad[0]!r}: not a level of {ablation}; choose among {labels}"
            )
        count = seeds if seeds is not None else SEEDS[size(quick)]
        if count < 1:
            raise ConfigError(f"--seeds must be at least 1, got {count}")
        parts = ["medfed scenarios", f"--ablation {ablation}"]
        parts += ["--quick"] if quick else []
        parts += [f"--seeds {seeds}"] if seeds is not None else []
        parts += [f"--method {m}" for m in methods]
        parts += [f"--level '{lv}'" for lv in levels]
        return cls(
            found,
            BUDGETS[size(quick)],
            count,
            chosen,
            resamples(n_boot, quick),
            quick,
            " ".join(parts),
            tuple(lv for lv in found.levels if not levels or lv.label in levels),
        )


# ---------------------------------------------------------------------------- train
def federation_key(level: Level) -> str:
    """The synthetic federation's name: levels of different ablations with one shift (and
    photos per site) share its data and its runs (trained once, read by each)."""
    shift = level.shift
    key = f"m{shift.n_sites}_{shift.covariate}_a{shift.label_alpha}_k{shift.classes_per_site}"
    key += f"_n{level.n_per_site}" if level.n_per_site is not None else ""
    return f"{key}{'_concept' if shift.concept else ''}"


def shared_levels(level: Level) -> list[str]:
    """Every ablation level trained on the federation of ``level`` ("covariate: mid", ...)."""
    key = federation_key(level)
    return [
        f"{a.name}: {lv.label}"
        for a in ABLATIONS.values()
        for lv in a.levels
        if federation_key(lv) == key
    ]


def _per_site(level: Level, plan: ScenarioPlan) -> int:
    return level.n_per_site if level.n_per_site is not None else plan.budget.n_per_site


def _federation(out: Path, plan: ScenarioPlan, level: Level, seed: int) -> list[Any]:
    folder = out / "data" / f"{federation_key(level)}_seed{seed}"
    manifests = synthesize(
        folder,
        modality="fundus",
        n_per_site=_per_site(level, plan),
        seed=seed,
        image_size=plan.budget.image_size,
        task="dr",
        shift=level.shift,
    )
    return load_sites(manifests, out / "cache")


def _config(
    level: Level, method: str, plan: ScenarioPlan, seed: int, sites: list[Any]
) -> TrainConfig:
    budget = Budget(_per_site(level, plan), plan.budget.rounds, plan.budget.local_steps)
    config = MethodSpec.parse(level.method_label(method)).config(budget, seed)
    return dataclasses.replace(
        config,
        client_fraction=level.client_fraction,
        init=plan.budget.init,
        frozen_encoder=plan.budget.frozen_encoder,
    )


def label_regime(sites: Sequence[Any]) -> str:
    """The label shift the heterogeneity report reads off these sites' class counts (none,
    weak, moderate or strong), so that a sweep's levels and a real federation are named alike."""
    totals = {}
    for site in sites:
        grades, counts = np.unique(torch.cat(list(site.y.values())).numpy(), return_counts=True)
        totals[site.id] = {str(int(g)): int(n) for g, n in zip(grades, counts, strict=True)}
    return label_shift(totals)["level"]


def finished_run(folder: Path, config: TrainConfig) -> bool:
    """Whether ``folder`` holds a run that finished (summary and predictions written) with
    exactly ``config``'s settings (its config.toml)."""
    if not ((folder / "summary.json").is_file() and (folder / "predictions.csv").is_file()):
        return False
    try:
        stored = tomllib.loads((folder / "config.toml").read_text(encoding="utf-8"))["train"]
    except (OSError, UnicodeDecodeError, KeyError, TypeError, tomllib.TOMLDecodeError):
        return False
    # config.toml holds the algorithm's parameters resolved (typed, defaults filled in)
    resolved = recorded_params(config.algorithm, config.params, config.frozen_encoder)
    planned = tomllib.loads(tomli_w.dumps(config.to_dict() | {"params": resolved}))
    return all(stored.get(name) == value for name, value in planned.items())


@dataclass
class Trainings:
    """What a sweep's runs gave: level -> method -> seed -> test scans, each level's
    label-shift regime, each level's and method's validation curve per seed, and how many
    runs were read back rather than trained."""

    scans: dict[str, dict[str, dict[int, Scans]]]
    regimes: dict[str, str] = field(default_factory=dict)
    curves: dict[str, dict[str, list[list[float | None]]]] = field(default_factory=dict)
    reused: int = 0


def train_scenarios(
    out: Path, plan: ScenarioPlan, echo: Callable[[str], Any], reuse: bool = False
) -> Trainings:
    """Every method at every level on every seed's federation (see :class:`Trainings`).
    Levels that share a federation synthesize it once per seed; runs go to
    OUT/runs/FEDERATION/seedS/METHOD, so that levels of other ablations on the same federation
    (:func:`shared_levels`) share them. With ``reuse``, a run that finished in OUT with the
    same settings (an earlier, interrupted or re-rendered invocation, or another ablation's)
    is read from its folder."""
    found = Trainings({lv.label: {m: {} for m in plan.methods} for lv in plan.levels})
    regimes, curves = found.regimes, found.curves
    for seed in range(plan.seeds):
        shared: tuple[str, list[Any]] | None = None
        for level in plan.levels:
            if shared is None or shared[0] != federation_key(level):
                echo(f"[{level.label}, seed {seed}] synthesizing {level.shift.n_sites} sites")
                shared = (federation_key(level), _federation(out, plan, level, seed))
            sites = shared[1]
            regimes.setdefault(level.label, label_regime(sites))
            for method in plan.methods:
                config = _config(level, method, plan, seed, sites)
                folder = (out / "runs" / federation_key(level) / f"seed{seed}") / _slug(
                    level.run_name(method)
                )
                where = f"[{level.label}, seed {seed}] {level.method_label(method)}"
                if reuse and finished_run(folder, config):
                    found.scans[level.label][method][seed] = load_scans(folder)
                    found.reused += 1
                    echo(f"{where}: read from {folder}")
                else:
                    run: Trained = train_run(sites, config, fresh_folder(folder))
                    echo(f"{where}: system accuracy {run.summary.system_accuracy:.3f}")
                    found.scans[level.label][method][seed] = run.scans
                by_level = curves.setdefault(level.label, {})
                by_level.setdefault(method, []).append(curve(folder, config.rounds))
    return found


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in ".-" else "_" for c in text)


# ---------------------------------------------------------------------------- claims
def _rows(
    claim: Claim,
    plan: ScenarioPlan,
    found: Trainings,
    levels: Mapping[str, Mapping[str, Any]],
    boots: Mapping[str, Mapping[str, SeedBootstrap]],
    variant: str,
) -> tuple[list[dict[str, Any]], str | None]:
    """One claim's comparisons for one FedDRM variant: each with its interval, unadjusted
    p-value, the paper's direction (``sign``) and whether it rests on an uninformative level;
    or why it cannot be measured."""
    present = [lv.label for lv in plan.levels]
    key = claim.figure.key
    blind = {label for label in present if not levels[label]["gate"]["informative"]}

    def row(what: str, iv: Interval | None, p: float, sign: bool, used: set[str]) -> dict:
        return {
            "what": what,
            "interval": None if iv is None else iv.to_dict(),
            "p": p if iv is not None and np.isfinite(p) else None,
            "sign": sign,
            "uninformative": sorted(used & blind),
        }

    if claim.kind in ("rise", "fall"):
        start, end = claim.span
        if start not in present or end not in present:
            return [], f"needs levels {start} and {end}"
        iv, p = unpaired(found.scans[end][variant], found.scans[start][variant], key, plan.n_boot)
        return [row(f"{end} minus {start}", iv, p, claim.kind == "rise", {start, end})], None
    if claim.kind == "peak":
        (top,) = claim.span
        if top not in present or len(present) < 2:
            return [], f"needs level {top} and another"
        peak = bootstraps({lv: found.scans[lv][variant] for lv in present}, plan.n_boot)[key]
        return [
            row(
                f"{top} minus {other}",
                peak.difference(top, other),
                peak.p_value(top, other),
                True,
                {top, other},
            )
            for other in present
            if other != top
        ], None
    rows = []
    for label in present:
        table, boot = levels[label], boots[label][key]
        rivals = sorted(
            (m for m in table["methods"] if m not in VARIANTS),
            key=lambda m: -((table["methods"][m][key] or {}).get("estimate", -1.0)),
        )[: claim.rivals]
        for rival in rivals:
            rows.append(
                row(
                    f"{label}: minus {rival}",
                    boot.difference(variant, rival),
                    boot.p_value(variant, rival),
                    True,
                    {label},
                )
            )
    return rows, (None if rows else "no baseline trained")


def judge_claims(
    plan: ScenarioPlan,
    found: Trainings,
    levels: Mapping[str, Mapping[str, Any]],
    boots: Mapping[str, Mapping[str, SeedBootstrap]],
) -> list[dict[str, Any]]:
    """Every claim for each FedDRM variant trained, its rows Holm-adjusted as one family (the
    claims table's), a verdict per claim and variant (:func:`claim_verdict`)."""
    claims = []
    for claim in plan.ablation.claims:
        out = {"text": claim.text, "paper": claim.paper, "figure": claim.figure.key}
        out["variants"] = {}
        for variant in (v for v in plan.ablation.judged if v in plan.methods):
            rows, why = _rows(claim, plan, found, levels, boots, variant)
            out["variants"][variant] = {"rows": rows, "why": why}
        claims.append(out)
    family = [r for c in claims for v in c["variants"].values() for r in v["rows"]]
    decide([r for r in family if not r["uninformative"]])
    for c in claims:
        for v in c["variants"].values():
            v["verdict"] = claim_verdict(v["rows"]) if v["why"] is None else NOT_MEASURED
    return claims


def run_scenarios(
    out: Path,
    plan: ScenarioPlan,
    *,
    echo: Callable[[str], Any] = print,
    readme: Path | None = None,
    reuse: bool = False,
) -> dict[str, Any]:
    """Train the ablation, compute its figures and verdicts, write OUT/scenario-NAME.json and
    .md (and with ``readme`` that page's ``scenario-NAME`` section). With ``reuse``, finished
    runs of the same settings in OUT are read instead of trained (:func:`train_scenarios`);
    the wall time stated is then the earlier invocation's (OUT/scenario-NAME.json) when it
    trained them all, both added when this one trained the rest."""
    from medfed.experiments.speed import device_info

    start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    earlier = _earlier_seconds(out / f"scenario-{plan.ablation.name}.json") if reuse else 0.0
    found = train_scenarios(out, plan, echo, reuse)
    levels, boots = {}, {}
    for label, by_method in found.scans.items():
        levels[label], boots[label] = level_table(by_method, plan.n_boot)
        levels[label]["curves"] = {m: mean_curve(c) for m, c in found.curves[label].items()}
    family = adjust_table(levels)
    results = {
        "command": plan.command,
        "ablation": plan.ablation.name,
        "title": plan.ablation.title,
        "task": "synthetic ICDR grading (5 grades), medfed.data.synth_dr",
        "budget": dataclasses.asdict(plan.budget),
        "extra_steps": {m: EXTRA_STEPS[m] for m in plan.methods if m in EXTRA_STEPS},
        "seeds": list(range(plan.seeds)),
        "n_boot": plan.n_boot,
        "methods": list(plan.methods),
        "levels": [
            {
                "label": lv.label,
                "shift": lv.shift.to_dict(),
                "client_fraction": lv.client_fraction,
                "lambda": lv.lam,
                "label_regime": found.regimes[lv.label],
                "federation": federation_key(lv),
                "n_per_site": _per_site(lv, plan),
                "shared_with": [
                    other
                    for other in shared_levels(lv)
                    if other != f"{plan.ablation.name}: {lv.label}"
                ],
                **levels[lv.label],
            }
            for lv in plan.levels
        ],
        "adjustment": {"name": ADJUSTMENT, "alpha": ALPHA, "table_comparisons": family},
        "claims": judge_claims(plan, found, levels, boots),
        "note": plan.ablation.note,
        "about": plan.ablation.about,
        "device": device_info(),
        "seconds": _wall_time(time.perf_counter() - start, earlier, found.reused, plan),
        "reused_runs": found.reused,
    }
    if any(m not in VARIANTS for m in plan.methods):
        path = out / f"sweep-{plan.ablation.name}.json"
        path.write_text(json.dumps(sweep_file(results), indent=2) + "\n", encoding="utf-8")
        echo(f"wrote {path} (medfed sites heterogeneity --sweep reads it)")
    docs = Docs(f"scenario-{plan.ablation.name}", marker(plan.ablation.name), Path("scenarios"))
    docs.publish(
        out,
        results,
        scenario_markdown,
        [],
        echo=echo,
        readme=readme,
        summary=lambda written: (
            [
                f"{c['text']} ({VARIANT_NAMES[v]}): {got['verdict']}"
                for c in results["claims"]
                for v, got in c["variants"].items()
            ]
            + [f"wrote {written}"]
        ),
    )
    return results


def _wall_time(now: float, earlier: float, reused: int, plan: ScenarioPlan) -> float:
    """The sweep's training wall time: this invocation's when it trained everything; the
    earlier one's when every run was read back (re-rendering costs no training); both when
    it continued an earlier, interrupted invocation."""
    if not reused:
        return now
    runs = plan.seeds * len(plan.levels) * len(plan.methods)
    return earlier if reused == runs and earlier else now + earlier


def _earlier_seconds(path: Path) -> float:
    """The wall time an earlier invocation recorded in ``path`` (0 when there is none)."""
    try:
        seconds = json.loads(path.read_text(encoding="utf-8")).get("seconds")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return 0.0
    return float(seconds) if isinstance(seconds, int | float) and seconds >= 0 else 0.0
