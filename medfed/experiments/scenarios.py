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
* ``clients``: 3, 8, 16 and 32 sites (at most 8 train in a round: client sampling).

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
from medfed.config import TrainConfig
from medfed.data.synth import synthesize
from medfed.data.synth_dr import DRShift
from medfed.errors import ConfigError
from medfed.experiments.demo import Budget, MethodSpec
from medfed.experiments.harness import (
    Docs,
    Trained,
    resamples,
    seeds_text,
    size,
    train_run,
)
from medfed.experiments.paired import (
    AVERAGE_ACCURACY,
    FIGURES_BY_KEY,
    Figure,
    Scans,
    accuracy_interval,
    compare,
    level_difference,
    load_scans,
)
from medfed.federation.plan import default_lr
from medfed.federation.training import load_sites
from medfed.fileio import fresh_folder
from medfed.metrics import Interval, wilson
from medfed.reports.comparisons import ci_cell, difference_cell
from medfed.reports.heterogeneity import SWEEP_FORMAT, label_shift

REFERENCE = "feddrm"
# The paper's baselines that medfed has, with FedDRM first.
METHODS = ("feddrm", "fedavgft", "fedprox", "fedbn", "fedrep", "ditto", "local")
SYSTEM = FIGURES_BY_KEY["system_accuracy"]
SYSTEM_KNOWN = FIGURES_BY_KEY["system_accuracy_origin_known"]
FIGURES: tuple[Figure, ...] = (SYSTEM, SYSTEM_KNOWN, AVERAGE_ACCURACY)
# Sites that train in one round, at most (the rest wait: client sampling).
SITES_PER_ROUND = 8
# Scans per router whose routing latency a sweep's run times (MEDFED_LATENCY_SCANS): the sweep
# reports none, so the fewest the median's CI needs.
SWEEP_LATENCY_SCANS = 6
REPRODUCED, NOT_REPRODUCED, NO_DIFFERENCE = (
    "reproduced in direction",
    "not reproduced",
    "no difference detected",
)
NOT_MEASURED = "not measured"
# The tables' reference row: what answering without a model scores (see constant_answer).
CONSTANT_ROW = "(most common grade)"


@dataclass(frozen=True)
class ScenarioBudget:
    """Every method's budget in every scenario: scans per site, rounds, local steps, and the
    native height of the synthetic photos."""

    n_per_site: int
    rounds: int
    local_steps: int
    image_size: int

    def text(self) -> str:
        return (
            f"{self.n_per_site} photos per site at {self.image_size} px, {self.rounds} rounds of "
            f"{self.local_steps} local steps"
        )


BUDGETS = {
    "full": ScenarioBudget(n_per_site=150, rounds=20, local_steps=3, image_size=64),
    "quick": ScenarioBudget(n_per_site=30, rounds=2, local_steps=1, image_size=48),
}
SEEDS = {"full": 3, "quick": 2}


@dataclass(frozen=True)
class Level:
    """One level of an ablation: its federation's shift, and FedDRM's lambda where it varies."""

    label: str
    shift: DRShift
    lam: float | None = None

    @property
    def client_fraction(self) -> float:
        return min(1.0, SITES_PER_ROUND / self.shift.n_sites)

    def method_label(self, method: str) -> str:
        """The method as trained at this level (FedDRM with this level's lambda)."""
        if self.lam is not None and method == REFERENCE:
            return f"{REFERENCE}:lam={self.lam:g}"
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
        methods=(REFERENCE,),
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
        (
            Claim(
                "FedDRM ahead of the strongest baseline with and without concept shift",
                "not in the paper (no concept-shift ablation)",
                "ahead",
            ),
        ),
    )


def _clients() -> Ablation:
    return Ablation(
        "clients",
        f"Number of sites m = 3, 8, 16, 32 (at most {SITES_PER_ROUND} train in a round)",
        tuple(Level(f"m = {m}", DRShift(n_sites=m)) for m in (3, 8, 16, 32)),
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
def _federation(out: Path, plan: ScenarioPlan, shift: DRShift, seed: int) -> list[Any]:
    key = f"m{shift.n_sites}_{shift.covariate}_a{shift.label_alpha}_k{shift.classes_per_site}"
    folder = out / "data" / f"{key}{'_concept' if shift.concept else ''}_seed{seed}"
    manifests = synthesize(
        folder,
        modality="fundus",
        n_per_site=plan.budget.n_per_site,
        seed=seed,
        image_size=plan.budget.image_size,
        task="dr",
        shift=shift,
    )
    return load_sites(manifests, out / "cache")


def _config(
    level: Level, method: str, plan: ScenarioPlan, seed: int, sites: list[Any]
) -> TrainConfig:
    budget = Budget(plan.budget.n_per_site, plan.budget.rounds, plan.budget.local_steps)
    config = MethodSpec.parse(level.method_label(method)).config(budget, seed)
    return dataclasses.replace(
        config,
        lr=default_lr(sites[0].manifest.modality),
        client_fraction=level.client_fraction,
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


def train_scenarios(
    out: Path, plan: ScenarioPlan, echo: Callable[[str], Any], reuse: bool = False
) -> tuple[dict[str, dict[str, dict[int, Scans]]], dict[str, str], int]:
    """Every method at every level on every seed's federation: level -> method -> seed ->
    test scans, each level's label-shift regime (on its first seed's federation), and how
    many runs were read back rather than trained. Levels that share a federation (lambda's)
    synthesize it once per seed. With ``reuse``, a run that finished in OUT with the same
    settings (an earlier, interrupted or re-rendered invocation) is read from its folder."""
    found: dict[str, dict[str, dict[int, Scans]]] = {
        lv.label: {m: {} for m in plan.methods} for lv in plan.levels
    }
    regimes: dict[str, str] = {}
    reused = 0
    for seed in range(plan.seeds):
        shared: tuple[DRShift, list[Any]] | None = None
        for level in plan.levels:
            if shared is None or shared[0] != level.shift:
                echo(f"[{level.label}, seed {seed}] synthesizing {level.shift.n_sites} sites")
                shared = (level.shift, _federation(out, plan, level.shift, seed))
            sites = shared[1]
            regimes.setdefault(level.label, label_regime(sites))
            for method in plan.methods:
                config = _config(level, method, plan, seed, sites)
                name = level.method_label(method).replace(":", "_").replace("=", "")
                folder = out / "runs" / _slug(level.label) / f"seed{seed}" / name
                if reuse and finished_run(folder, config):
                    found[level.label][method][seed] = load_scans(folder)
                    reused += 1
                    echo(
                        f"[{level.label}, seed {seed}] {level.method_label(method)}: read "
                        f"from {folder}"
                    )
                    continue
                run: Trained = train_run(sites, config, fresh_folder(folder))
                echo(
                    f"[{level.label}, seed {seed}] {level.method_label(method)}: system "
                    f"accuracy {run.summary.system_accuracy:.3f}"
                )
                found[level.label][method][seed] = run.scans
    return found, regimes, reused


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in ".-" else "_" for c in text)


# ---------------------------------------------------------------------------- figures
def _interval(iv: Interval | None) -> dict[str, Any] | None:
    return None if iv is None else iv.to_dict()


def level_figures(scans: Mapping[str, Mapping[int, Scans]], n_boot: int) -> dict[str, Any]:
    """One level: each method's figures with CIs, and FedDRM minus each other method (paired)."""
    methods = {
        m: {f.key: _interval(accuracy_interval(by_seed, f, n_boot=n_boot)) for f in FIGURES}
        for m, by_seed in scans.items()
    }
    differences = {
        m: {
            f.key: compare(scans[REFERENCE], by_seed, (REFERENCE, m), f, n_boot=n_boot).to_dict()
            for f in FIGURES
        }
        for m, by_seed in scans.items()
        if m != REFERENCE
    }
    return {
        "methods": methods,
        "differences": differences,
        "constant": constant_answer(scans[REFERENCE]),
    }


def constant_answer(by_seed: Mapping[int, Scans]) -> dict[str, Any]:
    """What answering without a model scores on these test scans: each seed's federation's most
    common grade for every one of its scans (system accuracy, origin unknown), each site's most
    common grade for its scans (origin known), and the mean over sites and seeds of the latter
    (average accuracy). A method at these figures has learned nothing beyond the grade mix.
    Wilson 95% CIs on the scans of every seed pooled."""
    grades: dict[int, int] = {}
    hits = own_hits = total = 0
    shares = []
    for seed, scans in by_seed.items():
        pooled: dict[int, int] = {}
        for site in scans.values():
            if not len(site.y):
                continue
            found, counts = np.unique(site.y, return_counts=True)
            for g, n in zip(found, counts, strict=True):
                pooled[int(g)] = pooled.get(int(g), 0) + int(n)
            own_hits += int(counts.max())
            total += len(site.y)
            shares.append(counts.max() / len(site.y))
        if pooled:
            grades[seed] = max(pooled, key=lambda g: (pooled[g], -g))
            hits += pooled[grades[seed]]
    if not total:
        return {"grades": {}, "system": None, "system_origin_known": None, "average": None}
    return {
        "grades": {str(seed): g for seed, g in grades.items()},
        "system": wilson(hits, total).interval.to_dict(),
        "system_origin_known": wilson(own_hits, total).interval.to_dict(),
        "average": float(np.mean(shares)),
    }


def _word(interval: Interval | Mapping[str, Any] | None, rising: bool = True) -> str:
    if interval is None:
        return NOT_MEASURED
    low, high = (
        (interval.low, interval.high)
        if isinstance(interval, Interval)
        else (interval["low"], interval["high"])
    )
    if (low > 0) if rising else (high < 0):
        return REPRODUCED
    if (high < 0) if rising else (low > 0):
        return NOT_REPRODUCED
    return NO_DIFFERENCE


def _worst(words: Sequence[str]) -> str:
    for word in (NOT_REPRODUCED, NOT_MEASURED, NO_DIFFERENCE):
        if word in words:
            return word
    return REPRODUCED if words else NOT_MEASURED


def judge(
    claim: Claim,
    plan: ScenarioPlan,
    scans: Mapping[str, Mapping[str, Mapping[int, Scans]]],
    levels: Mapping[str, Any],
) -> dict[str, Any]:
    """A claim's intervals and verdict (see :class:`Claim`)."""
    out: dict[str, Any] = {"text": claim.text, "paper": claim.paper, "figure": claim.figure.key}
    present = [lv.label for lv in plan.levels]
    if claim.kind in ("rise", "fall"):
        start, end = claim.span
        if start not in present or end not in present:
            return out | {"verdict": NOT_MEASURED, "why": f"needs levels {start} and {end}"}
        iv = level_difference(
            scans[end][REFERENCE], scans[start][REFERENCE], claim.figure, n_boot=plan.n_boot
        )
        return out | {
            "rows": [{"what": f"{end} minus {start}", "interval": iv.to_dict()}],
            "verdict": _word(iv, rising=claim.kind == "rise"),
        }
    if claim.kind == "peak":
        (top,) = claim.span
        if top not in present or len(present) < 2:
            return out | {"verdict": NOT_MEASURED, "why": f"needs level {top} and another"}
        rows = []
        for other in present:
            if other == top:
                continue
            found = compare(
                scans[top][REFERENCE],
                scans[other][REFERENCE],
                (f"lambda {top}", f"lambda {other}"),
                claim.figure,
                n_boot=plan.n_boot,
            )
            rows.append({"what": f"{top} minus {other}", "interval": _interval(found.interval)})
        return out | {"rows": rows, "verdict": _worst([_word(r["interval"]) for r in rows])}
    rows = []
    for label in present:
        table = levels[label]
        rivals = sorted(
            table["differences"],
            key=lambda m: (
                -(table["methods"][m][claim.figure.key] or {"estimate": -1.0})["estimate"]
            ),
        )[: claim.rivals]
        for rival in rivals:
            iv = table["differences"][rival][claim.figure.key]["interval"]
            rows.append({"what": f"{label}: FedDRM minus {rival}", "interval": iv})
    if not rows:
        return out | {"verdict": NOT_MEASURED, "why": "no baseline trained"}
    return out | {"rows": rows, "verdict": _worst([_word(r["interval"]) for r in rows])}


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
    scans, regimes, reused = train_scenarios(out, plan, echo, reuse)
    levels = {label: level_figures(by_method, plan.n_boot) for label, by_method in scans.items()}
    results = {
        "command": plan.command,
        "ablation": plan.ablation.name,
        "title": plan.ablation.title,
        "task": "synthetic ICDR grading (5 grades), medfed.data.synth_dr",
        "budget": dataclasses.asdict(plan.budget),
        "seeds": list(range(plan.seeds)),
        "n_boot": plan.n_boot,
        "methods": list(plan.methods),
        "levels": [
            {
                "label": lv.label,
                "shift": lv.shift.to_dict(),
                "client_fraction": lv.client_fraction,
                "lambda": lv.lam,
                "label_regime": regimes[lv.label],
                **levels[lv.label],
            }
            for lv in plan.levels
        ],
        "claims": [judge(c, plan, scans, levels) for c in plan.ablation.claims],
        "device": device_info(),
        "seconds": _wall_time(time.perf_counter() - start, earlier, reused, plan),
        "reused_runs": reused,
    }
    if len(plan.methods) > 1:
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
            [f"{c['text']}: {c['verdict']}" for c in results["claims"]] + [f"wrote {written}"]
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


def sweep_file(results: Mapping[str, Any]) -> dict[str, Any]:
    """The ablation's levels as the heterogeneity report reads a sweep
    (:func:`medfed.reports.heterogeneity.read_sweep`): each level's regime (covariate level,
    label-shift regime, concept shift, number of sites), its methods ranked by system accuracy,
    origin unknown (point estimates), and FedDRM minus each other method on that figure as a
    paired interval with its verdict, so that a ranking is never read as more than its
    intervals show."""
    key = SYSTEM.key
    scenarios = []
    for level in results["levels"]:
        accuracy = {m: (f[key] or {}).get("estimate") for m, f in level["methods"].items()}
        ranked = sorted(
            (m for m in accuracy if accuracy[m] is not None), key=lambda m: -accuracy[m]
        )
        differences = {
            m: {"interval": d[key]["interval"], "verdict": d[key]["verdict"]}
            for m, d in level["differences"].items()
        }
        scenarios.append(
            {
                "level": f"{results['ablation']}: {level['label']}",
                "covariate": level["shift"]["covariate"],
                "label": level["label_regime"],
                "concept": bool(level["shift"]["concept"]),
                "n_sites": level["shift"]["n_sites"],
                "ranking": ranked,
                "system_accuracy": {m: accuracy[m] for m in ranked},
                "reference": REFERENCE,
                "differences": differences,
            }
        )
    return {
        "format": SWEEP_FORMAT,
        "source": f"{results['command']} ({results['ablation']}, seeds {results['seeds']})",
        "scenarios": scenarios,
    }


# ---------------------------------------------------------------------------- tables
def _signed(interval: Mapping[str, Any] | None) -> str:
    """``+0.095 (-0.119 to +0.310)``: a difference with its interval; ``n/a`` without one."""
    return difference_cell({"interval": interval, "verdict": "n/a"}).removesuffix(" n/a")


def scenario_markdown(results: Mapping[str, Any], image_prefix: str = "") -> str:
    """The ablation's tables: each method's figures per level, FedDRM's paired differences,
    then the paper's claims beside medfed's intervals and verdicts."""
    minutes = results["seconds"] / 60
    budget = ScenarioBudget(**results["budget"])
    machine = results["device"].get("cpu") or results["device"].get("gpu") or "this machine"
    lines = [
        f"{results['title']}. {results['task']}; {budget.text()}; "
        f"{seeds_text(results['seeds'])}; the same budget for every method; {machine}; "
        f"{minutes:.0f} minutes (`{results['command']}`).",
        "",
        "| level | method | system acc., origin unknown (95% CI) | system acc., origin known "
        "(95% CI) | average acc. (95% CI) | FedDRM minus it: system acc., origin unknown |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for level in results["levels"]:
        for method, figures in level["methods"].items():
            diff = level["differences"].get(method)
            lines.append(
                f"| {level['label']} | {method} | {ci_cell(figures['system_accuracy'], 3)} | "
                f"{ci_cell(figures['system_accuracy_origin_known'], 3)} | "
                f"{ci_cell(figures['average_accuracy'], 3)} | "
                f"{'—' if diff is None else difference_cell(diff['system_accuracy'])} |"
            )
        constant = level.get("constant")
        if constant and constant["system"] is not None:
            lines.append(
                f"| {level['label']} | {CONSTANT_ROW} | {ci_cell(constant['system'], 3)} | "
                f"{ci_cell(constant['system_origin_known'], 3)} | {constant['average']:.3f} | "
                "— |"
            )
    lines += [
        "",
        "| the paper's claim | the paper's figures | medfed (95% CI) | verdict |",
        "| --- | --- | --- | --- |",
    ]
    for claim in results["claims"]:
        found = "; ".join(
            f"{r['what']}: {_signed(r['interval'])}" for r in claim.get("rows", [])
        ) or claim.get("why", "")
        lines.append(f"| {claim['text']} | {claim['paper']} | {found} | {claim['verdict']} |")
    lines += [
        "",
        f"{CONSTANT_ROW}: no model; every scan answered with the most common grade of its "
        "seed's pooled test scans (origin unknown) or of its own site's (origin known, "
        "average); a method at this row has learned nothing beyond the grade mix.",
        "",
        "Guidance from synthetic scenarios: the paper's figures are on CIFAR and its RETINA "
        "federation, medfed's on its synthetic DR federation, so directions are compared, not "
        "values. Verdicts: reproduced in direction (the interval on the paper's side of 0), not "
        "reproduced (on the other side), no difference detected (it holds 0).",
    ]
    return "\n".join(lines) + "\n"
