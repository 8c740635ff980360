"""What ``medfed scenarios`` writes from its results: the docs section's tables and the sweep
file the heterogeneity report reads (:func:`medfed.reports.heterogeneity.read_sweep`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from medfed.experiments.harness import seeds_text
from medfed.experiments.scenario_verdicts import (
    ALPHA,
    MARGIN,
    PAPER,
    REFERENCE,
    SYSTEM,
    VARIANT_NAMES,
    VARIANTS,
)
from medfed.reports.comparisons import ci_cell, difference_cell
from medfed.reports.heterogeneity import SWEEP_FORMAT

# The tables' reference row: what answering without a model scores (its seed's most common
# grade for every scan).
CONSTANT_ROW = "(most common grade)"


def sweep_file(results: Mapping[str, Any]) -> dict[str, Any]:
    """The ablation's levels as the heterogeneity report reads a sweep: each level's regime
    (covariate level, label-shift regime, concept shift, number of sites), whether the gate
    found it informative (with the majority rate and why not), its methods ranked by system
    accuracy, origin unknown (point estimates; no ranking at an uninformative level), and
    medfed's FedDRM minus each other method as a paired interval with its Holm-adjusted
    verdict."""
    scenarios = []
    for level in results["levels"]:
        gate = level["gate"]
        accuracy = {m: (f[SYSTEM] or {}).get("estimate") for m, f in level["methods"].items()}
        ranked = sorted(
            (m for m in accuracy if accuracy[m] is not None), key=lambda m: -accuracy[m]
        )
        differences = {
            m: {"interval": d[SYSTEM], "verdict": d["verdict"]}
            for m, d in level["differences"].get(REFERENCE, {}).items()
        }
        scenarios.append(
            {
                "level": f"{results['ablation']}: {level['label']}",
                "covariate": level["shift"]["covariate"],
                "label": level["label_regime"],
                "concept": bool(level["shift"]["concept"]),
                "n_sites": level["shift"]["n_sites"],
                "informative": gate["informative"],
                "majority_rate": gate["majority_rate"],
                "gate": gate["why"],
                "ranking": ranked if gate["informative"] else [],
                "system_accuracy": {m: accuracy[m] for m in ranked},
                "reference": REFERENCE,
                "differences": differences,
            }
        )
    return {
        "format": SWEEP_FORMAT,
        "source": f"{results['command']} ({results['ablation']}, seeds {results['seeds']})",
        "adjustment": results["adjustment"]["name"],
        "scenarios": scenarios,
    }


@dataclass(frozen=True)
class ScenarioBudget:
    """Every method's budget in every scenario: scans per site, rounds, local steps, the
    native height of the synthetic photos, and the start (``init``; with ``frozen_encoder``
    the pretrained encoder stays fixed, its features computed once per photo, and the heads
    train federatedly)."""

    n_per_site: int
    rounds: int
    local_steps: int
    image_size: int
    init: str = "random"
    frozen_encoder: bool = False

    def text(self) -> str:
        start = (
            f"frozen {self.init} encoder (features cached), heads trained"
            if self.frozen_encoder
            else f"trained from {self.init} weights"
        )
        return (
            f"{self.n_per_site} photos per site at {self.image_size} px, {self.rounds} rounds of "
            f"{self.local_steps} local steps, {start}"
        )


def _signed(interval: Mapping[str, Any] | None) -> str:
    """``+0.095 (-0.119 to +0.310)``: a difference with its interval; ``n/a`` without one."""
    return difference_cell({"interval": interval, "verdict": "n/a"}).removesuffix(" n/a")


def _difference(level: Mapping[str, Any], variant: str, method: str) -> str:
    found = level["differences"].get(variant, {}).get(method)
    if found is None:
        return "—"
    return f"{_signed(found[SYSTEM])} {found['verdict']}"


def _header(results: Mapping[str, Any]) -> list[str]:
    budget = ScenarioBudget(**results["budget"])
    machine = results["device"].get("cpu") or results["device"].get("gpu") or "this machine"
    extra = "; ".join(results.get("extra_steps", {}).values())
    reused = results.get("reused_runs", 0)
    shared = (
        f"; {reused} runs read from earlier invocations on the same federations" if (reused) else ""
    )
    return [
        f"{results['title']}. {results['task']}; {budget.text()}; "
        f"{seeds_text(results['seeds'])}; the same budget for every method"
        f"{' (' + extra + ')' if extra else ''}; {machine}; "
        f"{results['seconds'] / 60:.0f} minutes{shared} (`{results['command']}`).",
        "",
        *([results["about"], ""] if results.get("about") else []),
    ]


def _level_rows(results: Mapping[str, Any]) -> list[str]:
    variants = [v for v in VARIANTS if v in results["methods"]]
    heads = [f"{VARIANT_NAMES[v]} minus it" for v in variants if len(results["methods"]) > 1]
    lines = [
        "| level | method | system acc., origin unknown (95% CI) | system acc., origin known "
        "(95% CI) | average acc. (95% CI) |" + "".join(f" {h} |" for h in heads),
        "| --- | --- | --- | --- | --- |" + " --- |" * len(heads),
    ]
    for level in results["levels"]:
        for method, figures in level["methods"].items():
            cells = [_difference(level, v, method) for v in variants] if heads else []
            lines.append(
                f"| {level['label']} | {method} | {ci_cell(figures[SYSTEM], 3)} | "
                f"{ci_cell(figures['system_accuracy_origin_known'], 3)} | "
                f"{ci_cell(figures['average_accuracy'], 3)} |" + "".join(f" {c} |" for c in cells)
            )
        constant = level.get("constant")
        if constant and constant["system"] is not None:
            lines.append(
                f"| {level['label']} | {CONSTANT_ROW} | {ci_cell(constant['system'], 3)} | "
                f"{ci_cell(constant['system_origin_known'], 3)} | {constant['average']:.3f} |"
                + " — |"
                * len(heads)
            )
    return lines


def _gate_rows(results: Mapping[str, Any]) -> list[str]:
    lines = [
        "| level | pooled test scans | majority rate | gate | shared with |",
        "| --- | --- | --- | --- | --- |",
    ]
    for level in results["levels"]:
        gate = level["gate"]
        rate = "n/a" if gate["majority_rate"] is None else f"{gate['majority_rate']:.3f}"
        word = "informative" if gate["informative"] else "uninformative: " + "; ".join(gate["why"])
        shared = ", ".join(level.get("shared_with", [])) or "—"
        scans = (level.get("constant") or {}).get("n_test", "n/a")
        lines.append(f"| {level['label']} | {scans} | {rate} | {word} | {shared} |")
    return lines


def _curve_rows(results: Mapping[str, Any]) -> list[str]:
    rounds = results["budget"]["rounds"]
    marks = [max(1, rounds // 3), max(1, 2 * rounds // 3), rounds]
    lines = [
        "| level | method | " + " | ".join(f"round {r}" for r in marks) + " |",
        "| --- | --- |" + " --- |" * len(marks),
    ]
    for level in results["levels"]:
        for method, values in level.get("curves", {}).items():
            cells = ["n/a" if v is None else f"{v:.3f}" for v in values]
            lines.append(f"| {level['label']} | {method} | " + " | ".join(cells) + " |")
    return lines


def _claim_rows(results: Mapping[str, Any]) -> list[str]:
    if not results["claims"]:
        return [results.get("note") or "No claim of the paper is tested here."]
    count = sum(
        1
        for c in results["claims"]
        for v in c["variants"].values()
        for r in v["rows"]
        if r.get("p") is not None and not r.get("uninformative")
    )
    lines = [
        "| the paper's claim | the paper's figures | FedDRM | medfed (95% CI) | verdict "
        f"({results['adjustment']['name']} over {count} comparisons) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for claim in results["claims"]:
        for variant, found in claim["variants"].items():
            shown = "; ".join(f"{r['what']}: {_signed(r['interval'])}" for r in found["rows"])
            lines.append(
                f"| {claim['text']} | {claim['paper']} | {VARIANT_NAMES[variant]} | "
                f"{shown or found['why']} | {found['verdict']} |"
            )
    return lines


def scenario_markdown(results: Mapping[str, Any], image_prefix: str = "") -> str:
    """The ablation's tables: each method's figures per level with both FedDRM variants'
    paired differences, the gate per level, the validation curves, then the paper's claims
    beside medfed's intervals and verdicts."""
    adjustment = results["adjustment"]
    lines = _header(results) + _level_rows(results)
    lines += ["", *_gate_rows(results), "", *_curve_rows(results), "", *_claim_rows(results)]
    lines += [
        "",
        f"Intervals: {results['levels'][0].get('method', 'two-level bootstrap')}; every "
        "figure is the mean over the seeds. "
        f"{CONSTANT_ROW}: no model, every scan answered with its seed's most common grade "
        "(pooled: the majority rate; origin known and average: each site's own). Gate: a level "
        "is informative when every baseline's lower bound on system accuracy, origin unknown, "
        f"is above the majority rate + {MARGIN:g} and no baseline answers all of a seed's "
        "scans with one grade; an uninformative level gets no verdict and no ranking. "
        f"Differences: paired on the same draws; verdicts decided by {adjustment['name']}'s "
        f"adjustment at family-wise {ALPHA:g} over the level table's "
        f"{adjustment['table_comparisons']} comparisons and, separately, over the claims "
        f"table's. {VARIANT_NAMES[REFERENCE]}: private normalization layers, its default "
        f"client head and lambda; {VARIANT_NAMES[PAPER]}: shared normalization, the client "
        "head trained by gradient, lambda 0.8. Validation accuracy: each site's own model on "
        "its validation scans, mean over sites and seeds, after the rounds shown.",
        "",
        "Guidance from synthetic scenarios: the paper's figures are on CIFAR and its RETINA "
        "federation, medfed's on its synthetic DR federation, so directions are compared, not "
        "values.",
    ]
    return "\n".join(lines) + "\n"
