"""``medfed demo``: synthesize a fundus federation, train FedDRM and baselines, and compare them
with 95% confidence intervals (one seed)."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medfed.config import NORMALIZATIONS, TrainConfig
from medfed.core.errors import ConfigError
from medfed.experiments.harness import Trained, synthesize_federation, train_run, train_seeds
from medfed.experiments.paired import (
    N_BOOT,
    ORIGIN_KNOWN,
    ORIGIN_UNKNOWN,
    PROTOCOLS,
    compare_methods,
)
from medfed.federation.training import train
from medfed.reports.comparisons import ci_cell, comparison_rows, verdict_lines
from medfed.reports.evaluation import AT_ARGMAX, AT_OPERATING, communication_table, rules_note
from medfed.reports.markdown import markdown_table, replace_marked_section
from medfed.reports.text import fmt
from medfed.runs import Summary
from medfed.runs.schema import RouterFigures, SiteFigures

DEMO_METHODS = ("feddrm", "fedavgft", "fedbn", "local")
COMMUNICATION_METHODS = (
    "fedavg",
    "feddrm",
    "fedavg@int8",
    "feddrm@int8+delta",
    "fedals:base=feddrm,alpha=5",
    "fedals:base=feddrm,alpha=10",
    "fedals:base=feddrm,alpha=5@int8+delta",
    "lora [warm-up base]",
    "lora@int8+delta [warm-up base]",
)


# `` [federation norm]`` after a method: trained and evaluated with normalization = "federation".
_NORM_SUFFIX = re.compile(r"\s*\[(\w+) norm\]$")
# `` [warm-up base]``: the method starts from a FedAvg run trained first (see WarmupBase).
WARMUP_BASE = "[warm-up base]"


def with_normalization(method: str, normalization: str) -> str:
    """The method's label when trained with ``normalization`` (``fedavg [federation norm]``)."""
    return method if normalization == "site" else f"{method} [{normalization} norm]"


@dataclass(frozen=True)
class MethodSpec:
    """``NAME[:KEY=VALUE,...][@PRECISION[+delta]][ [NORMALIZATION norm]]``, e.g.
    ``fedals:base=feddrm,alpha=5@int8`` or ``fedavg [federation norm]`` (the sites normalize
    with statistics pooled over the federation instead of their own)."""

    label: str
    algorithm: str
    params: dict[str, str]
    wire_precision: str = "float32"
    wire_delta: bool = False
    normalization: str = "site"
    warmup_base: bool = False  # starts from the federation's FedAvg warm-up base

    @classmethod
    def parse(cls, text: str) -> MethodSpec:
        label = text
        warmup_base = WARMUP_BASE in text
        text = text.replace(WARMUP_BASE, "").strip()
        found = _NORM_SUFFIX.search(text)
        normalization = found.group(1) if found else "site"
        if normalization not in NORMALIZATIONS:
            raise ConfigError(
                f"method {text!r}: normalization {normalization!r} is not one of "
                f"{list(NORMALIZATIONS)}"
            )
        spec = text[: found.start()].strip() if found else text
        head, _, wire_text = spec.partition("@")
        name, _, param_text = head.partition(":")
        params = {}
        for item in filter(None, param_text.split(",")):
            key, sep, value = item.partition("=")
            if not sep:
                raise ConfigError(f"method {text!r}: parameter {item!r} must be KEY=VALUE")
            params[key] = value
        precision, _, delta = wire_text.partition("+")
        if delta not in ("", "delta"):
            raise ConfigError(f"method {text!r}: after '+' only 'delta' is understood")
        return cls(
            label,
            name,
            params,
            precision or "float32",
            delta == "delta",
            normalization,
            warmup_base,
        )

    @property
    def dirname(self) -> str:
        """The label as a run-directory name (``fedavg_federation_norm``)."""
        head = _NORM_SUFFIX.sub("", self.label.replace(WARMUP_BASE, "").strip()).strip()
        suffix = "" if self.normalization == "site" else f"_{self.normalization}_norm"
        suffix += "_warmup_base" if self.warmup_base else ""
        return re.sub(r"[:,@=+]", "_", head) + suffix

    def config(self, budget: Budget, seed: int) -> TrainConfig:
        """The training config of this method at ``budget``."""
        return TrainConfig(
            algorithm=self.algorithm,
            params=self.params,
            rounds=budget.rounds,
            local_steps=budget.local_steps,
            seed=seed,
            device="auto",
            wire_precision=self.wire_precision,
            wire_delta=self.wire_delta,
            normalization=self.normalization,
        )


@dataclass
class WarmupBase:
    """The FedAvg run that ``[warm-up base]`` methods start from: half the budget's rounds
    of FedAvg, trained once (on first use) into ``folder``; each such method then runs the
    other half from it, so that it costs the same rounds in all as every other method."""

    folder: Path
    budget: Budget
    seed: int
    trained: bool = False

    @property
    def rounds(self) -> int:
        return self.budget.rounds // 2

    def config(
        self, method: MethodSpec, sites: list[Any], echo: Callable[[str], Any]
    ) -> TrainConfig:
        """``method``'s training config, starting from this base when it asks for it."""
        # no learning rate: the sites' modality sets it, as `medfed train` does
        config = method.config(self.budget, self.seed)
        if not method.warmup_base:
            return config
        if self.rounds < 1:
            raise ConfigError(
                f"method {method.label!r}: a warm-up base takes half of the rounds, and "
                f"{self.budget.rounds} round(s) leave none; give at least 2 rounds"
            )
        if not self.trained:
            if self.folder.exists():
                shutil.rmtree(self.folder)
            echo(f"training the warm-up base: fedavg, {self.rounds} rounds, into {self.folder}")
            base = Budget(self.budget.n_per_site, self.rounds, self.budget.local_steps)
            base_config = MethodSpec.parse("fedavg").config(base, self.seed)
            train(sites, base_config, self.folder)
            self.trained = True
        return dataclasses.replace(
            config, init=str(self.folder.resolve()), rounds=self.budget.rounds - self.rounds
        )


@dataclass(frozen=True)
class Budget:
    n_per_site: int
    rounds: int
    local_steps: int


FULL = Budget(n_per_site=240, rounds=60, local_steps=3)
QUICK = Budget(n_per_site=240, rounds=30, local_steps=3)
# CT: 200 patients per site give 95% CIs of about +-0.1 on each site's test AUC; the lesion task
# needs about 100 local steps before it is learned (FedAvg at 20 rounds x 5 steps: worst-site AUC
# 0.72; at 8 steps a round the validation AUCs passed 0.93 by round 15).
CT_FULL = Budget(n_per_site=200, rounds=30, local_steps=8)
CT_QUICK = Budget(n_per_site=120, rounds=15, local_steps=8)
BUDGETS = {"fundus": (FULL, QUICK), "ct": (CT_FULL, CT_QUICK)}
DEMO_MODALITIES = ("fundus", "ct", "all")
# The README section each modality's demo table goes to.
DEMO_MARKERS = {"fundus": "demo-table", "ct": "demo-ct-table"}


REFERENCE = "feddrm"


def _reference(methods: Sequence[str]) -> str:
    """The method the others are compared with: FedDRM when it ran, else the first."""
    return REFERENCE if REFERENCE in methods else methods[0]


def _auc_cell(figures: SiteFigures) -> str:
    flag = " \u2020" if figures.unreliable else ""
    if figures.auc_ci is not None:
        return ci_cell(figures.auc_ci.to_dict(), flag=flag)
    if figures.auc is None:
        return f"n/a ({figures.auc_reason or 'undefined'})"
    return f"{figures.auc:.2f}{flag}"


def _rate_cell(routers: Mapping[str, RouterFigures], router: str) -> str:
    """``0.76 (0.69–0.82) 137/180``: system accuracy with its Wilson CI and its counts."""
    figures = routers.get(router)
    if figures is None:
        return "n/a"
    rate = figures.rates.get("system_accuracy")
    if rate is None or rate.interval is None:
        return fmt(figures.system_accuracy)
    return f"{ci_cell(rate.interval.to_dict())} {rate.k}/{rate.n}"


def _site_header(site: str, figures: SiteFigures) -> str:
    if figures.n_pos is None:
        return f"AUC {site} (n={figures.n_test})"
    return f"AUC {site} (n={figures.n_test}, {figures.n_pos} pos)"


def ci_table(summaries: Mapping[str, Summary]) -> str:
    """One row per method (one seed): each site's AUC with its 95% CI, the worst site with its
    CI, average accuracy weighted two ways and system accuracy with its Wilson CI and counts
    under both protocols, all at the operating point; routing accuracy; then the average
    accuracy at argmax, in columns of its own."""
    first = next(iter(summaries.values()))
    site_ids = list(first.sites)
    header = ["method", "answered by", *(_site_header(s, first.sites[s]) for s in site_ids)]
    header += ["worst site: AUC"]
    header += [f"avg acc. {AT_OPERATING} (by {w})" for w in ("test scans", "training scans")]
    header += [f"system acc. {AT_OPERATING} ({p})" for p in (ORIGIN_UNKNOWN, ORIGIN_KNOWN)]
    header += [f"routing acc. ({ORIGIN_UNKNOWN})"]
    header += [f"avg acc. {AT_ARGMAX} (by {w})" for w in ("test scans", "training scans")]
    rows = []
    for name, s in summaries.items():
        worst = "n/a"
        if s.federation.worst_site is not None:
            interval = s.worst_site_auc_ci
            flag = " \u2020" if s.sites[s.federation.worst_site].unreliable else ""
            value = ci_cell(interval.to_dict()) if interval else fmt(s.federation.worst_site_auc, 2)
            worst = f"{s.federation.worst_site} {value}{flag}"
        rows.append(
            [
                name,
                s.routing_method,
                *(_auc_cell(s.sites[sid]) for sid in site_ids),
                worst,
                fmt(s.average_accuracy_operating),
                fmt(s.average_accuracy_operating_by_train),
                _rate_cell(s.routers, s.routing_method),
                _rate_cell(s.routers_origin_known, s.routing_method),
                fmt(s.routing_accuracy),
                fmt(s.federation.average_accuracy),
                fmt(s.federation.average_accuracy_by_train),
            ]
        )
    return markdown_table(header, rows)


def ci_notes(summaries: Mapping[str, Summary]) -> str:
    """How the table's intervals were formed, what the protocols are, and which figures rest
    on too few scans."""
    methods = sorted(
        {
            f.auc_ci.method.split(" (")[0]
            for s in summaries.values()
            for f in s.sites.values()
            if f.auc_ci is not None
        }
    )
    unreliable = {
        site: f.unreliable
        for s in summaries.values()
        for site, f in s.sites.items()
        if f.unreliable
    }
    lines = [
        "95% CIs: each site's AUC by "
        + (" or ".join(methods) if methods else "n/a (no site has both classes)")
        + " over its test scans (summary.json names each interval's method); the worst "
        "site's AUC with that site's CI; system accuracy with its Wilson "
        "interval and counts (correct / pooled test scans). Average accuracy weights the sites "
        "by their test scans, or by their training scans.",
        rules_note(),
        f"Protocols: site AUCs are each site's model on its own test scans ({ORIGIN_KNOWN}); "
        f"system accuracy {ORIGIN_UNKNOWN}: {PROTOCOLS[ORIGIN_UNKNOWN]}; {ORIGIN_KNOWN}: "
        f"{PROTOCOLS[ORIGIN_KNOWN]}.",
    ]
    if unreliable:
        reasons = "; ".join(f"{site}: {why}" for site, why in unreliable.items())
        lines.append(f"\u2020 unreliable, too few scans of a class: {reasons}.")
    return "\n\n".join(lines)


def comparisons_markdown(comparisons: Mapping[str, Any], where: str) -> str:
    """The table of paired differences, how they were formed, and the verdict lines."""
    header, rows = comparison_rows(comparisons)
    parts = [
        f"{comparisons['ci']}; {comparisons['verdict_rule']}.",
        markdown_table(header, rows),
        "\n".join(verdict_lines(comparisons, where)),
    ]
    return "\n\n".join(p for p in parts if p)


def run_demo(
    out: Path,
    *,
    quick: bool = False,
    seed: int = 0,
    methods: tuple[str, ...] = DEMO_METHODS,
    marker: str = "demo-table",
    command: str = "medfed demo",
    budget: Budget | None = None,
    echo: Callable[[str], Any] = print,
    readme: Path | None = None,
    n_boot: int = N_BOOT,
    image_size: int | None = None,
    reference: str | None = None,
    modality: str = "fundus",
) -> dict[str, Summary]:
    """Run the demo end to end on ``modality``'s synthetic federation (fundus: three sites,
    ct: two); returns each method's summary.

    The table shows every figure with its 95% CI; the other methods are compared with
    ``reference`` (default: FedDRM when it ran, else the first method) by paired differences
    on the same test scans, with their verdicts (also written to OUT/MARKER.json)."""
    if reference is not None and reference not in methods:
        raise ConfigError(f"reference {reference!r} is not among the methods {list(methods)}")
    if modality not in BUDGETS:
        raise ConfigError(f"modality {modality!r}: choose one of {', '.join(BUDGETS)}")
    budget = budget or BUDGETS[modality][1 if quick else 0]
    start = time.perf_counter()
    data = out / "data"

    def federation(seed: int) -> tuple[list[Any], WarmupBase]:
        what = "3 fundus sites (scans" if modality == "fundus" else "2 CT sites (patients"
        echo(f"synthesizing {what}: {budget.n_per_site} each) into {data} ...")
        sites = synthesize_federation(out, data, modality, budget, seed, image_size).sites
        return sites, WarmupBase(out / "runs" / "warmup_base", budget, seed)

    def train_one(found: tuple[list[Any], WarmupBase], seed: int, text: str) -> Trained:
        sites, base = found
        method = MethodSpec.parse(text)
        config = base.config(method, sites, echo)
        echo(f"training {method.label} ({config.rounds} rounds x {budget.local_steps} steps) ...")
        return train_run(sites, config, out / "runs" / method.dirname)

    trained = train_seeds([seed], federation, methods, train_one)
    # The summary as training returns it keeps the sites in federation order (the table's
    # columns); summary.json on disk lists them sorted.
    summaries = {label: runs[seed].summary for label, runs in trained.runs.items()}
    scans = {label: trained.scans(label) for label in trained.runs}
    table = ci_table(summaries) + "\n\n" + ci_notes(summaries)
    comparisons = None
    if len(summaries) > 1:
        reference = reference or _reference(list(summaries))
        echo(f"comparing {reference} with each method on the same test scans ...")
        comparisons = compare_methods(scans, reference, n_boot=n_boot, seed=seed)
        table += "\n\n" + comparisons_markdown(comparisons, f"seed {seed}")
    record = {"command": command, "seed": seed, "methods": list(summaries)}
    record["comparisons"] = comparisons
    (out / f"{marker}.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    if "fedavg" in summaries:
        table += "\n\n" + communication_table(summaries, baseline="fedavg")
    seconds = time.perf_counter() - start
    caption = (
        f"`{command}{'' if modality == 'fundus' else f' --modality {modality}'}"
        f"{' --quick' if quick else ''}` (seed {seed}, {budget.n_per_site} "
        f"{'scans' if modality == 'fundus' else 'patients'} per site, "
        f"{budget.rounds} rounds x {budget.local_steps} local steps, "
        f"{next(iter(summaries.values())).device}, {seconds:.0f} s in all)"
    )
    (out / f"{marker}.md").write_text(f"{table}\n\n{caption}\n", encoding="utf-8")
    echo("")
    echo(table)
    echo("")
    echo(f"finished in {seconds:.0f} s; table saved to {out / f'{marker}.md'}")
    if readme is not None:
        text = readme.read_text(encoding="utf-8")
        readme.write_text(
            replace_marked_section(text, marker, f"{table}\n\n{caption}"), encoding="utf-8"
        )
        echo(f"updated the {marker} section of {readme}")
    first_run = out / "runs" / MethodSpec.parse(next(iter(summaries))).dirname
    echo(f"inspect a run: medfed evaluate {first_run}")
    make = "make dashboard" + ("" if out == Path("demo_out") else f" RUNS={out}")
    echo(f"open the dashboard: medfed dashboard {out}  (or {make})")
    return summaries


def demo_modalities(modality: str) -> list[str]:
    """The modalities ``--modality`` names (``all``: every one); ConfigError for another."""
    if modality not in DEMO_MODALITIES:
        raise ConfigError(f"--modality {modality!r}: choose one of {', '.join(DEMO_MODALITIES)}")
    return list(BUDGETS) if modality == "all" else [modality]


def run_demos(
    out: Path,
    modality: str,
    *,
    quick: bool = False,
    seed: int = 0,
    echo: Callable[[str], Any] = print,
    readme: Path | None = None,
) -> dict[str, dict[str, Summary]]:
    """``medfed demo --modality M``: one modality into ``out``, or with ``all`` each modality
    into its own folder ``out/fundus``, ``out/ct``; each table goes to its README section."""
    chosen = demo_modalities(modality)
    return {
        m: run_demo(
            out / m if modality == "all" else out,
            quick=quick,
            seed=seed,
            echo=echo,
            readme=readme,
            marker=DEMO_MARKERS[m],
            modality=m,
        )
        for m in chosen
    }
