"""What ``medfed evaluate``, ``train``, ``compare`` and the demo print of run summaries: plain-text
and markdown tables with each figure's 95% CI and counts where the run holds them; a figure the
run predates reads ``n/a``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from medfed.core.units import human_bytes
from medfed.reports.grading import grading_text
from medfed.reports.markdown import markdown_table
from medfed.reports.routing import routing_calibration_text
from medfed.reports.text import (
    UNRELIABLE_MARK,
    ci_text,
    count_text,
    fmt,
    operating_cells,
    pooled_text,
    rate_text,
)
from medfed.runs.schema import Evaluation, PrivacySpent, RouterFigures, SiteFigures, Summary

ORIGIN_UNKNOWN = "origin unknown"
ORIGIN_KNOWN = "origin known"
PROTOCOLS: dict[str, str] = {
    ORIGIN_UNKNOWN: "each candidate site normalizes the scan with its own statistics",
    ORIGIN_KNOWN: "the scan is normalized with its own site's statistics",
}
"""The two routing protocols of :class:`~medfed.runs.schema.Evaluation`, in words."""

AT_OPERATING = "at op. point"
AT_ARGMAX = "at argmax"
RULES: dict[str, str] = {
    AT_OPERATING: "each site's model calls a scan positive at the threshold chosen on its "
    "validation split (the class of highest probability where a site has no threshold), the "
    "rule the routed system answers by",
    AT_ARGMAX: "the class of highest probability, whatever the site's threshold",
}
"""The decision rules an accuracy is taken at, as table headers name them, and in words."""


def rules_note() -> str:
    """One sentence naming each decision rule of the accuracy columns."""
    return "Accuracy " + "; ".join(f"{rule}: {words}" for rule, words in RULES.items()) + "."


NO_CI = "fewer than 2 positives or negatives"


def auc_text(m: SiteFigures, *, mark: bool = True) -> str:
    """A site's AUC with its CI (``0.840 (0.780–0.900)``), the plain AUC when the run has no CI,
    or ``n/a (reason)``; ``mark`` adds :data:`UNRELIABLE_MARK` to an unreliable figure."""
    if m.auc is None:
        return f"n/a ({m.auc_reason or 'undefined'})"
    if m.auc_ci is not None:
        text = ci_text(m.auc_ci)
    elif m.n_pos is not None:  # a run with CIs, but too few scans of a class to bound this one
        text = f"{fmt(m.auc)} (no CI: {NO_CI})"
    else:
        text = fmt(m.auc)
    return f"{text} {UNRELIABLE_MARK}" if mark and m.unreliable else text


def class_counts(m: SiteFigures) -> str:
    """``34/26`` (positives/negatives of the test split), or ``n/a``."""
    if m.n_pos is None or m.n_neg is None:
        return "n/a"
    return count_text(m.n_pos, m.n_neg)


def unreliable_notes(summary: Evaluation) -> list[str]:
    """One line per site whose figures rest on too few positives or negatives."""
    return [
        f"{UNRELIABLE_MARK} unreliable at {site}: {m.unreliable}"
        for site, m in summary.sites.items()
        if m.unreliable
    ]


def site_table(summary: Summary) -> str:
    """Per-site rows of one run: AUC with its 95% CI and method, the test split's size and
    classes, accuracies and each site's traffic per round; notes below for unreliable sites."""
    rows = []
    for site, m in summary.sites.items():
        t = summary.bytes_per_round_by_site.get(site)
        up, down = ("n/a", "n/a") if t is None else (human_bytes(t.up), human_bytes(t.down))
        method = m.auc_ci.method if m.auc_ci is not None else "n/a"
        rows.append(
            [
                site,
                auc_text(m),
                method,
                m.n_test,
                class_counts(m),
                m.operating_accuracy,
                m.accuracy,
                m.balanced_accuracy,
                up,
                down,
            ]
        )
    header = ["site", "AUC (95% CI)", "CI method", "n test", "pos/neg"]
    header += [f"accuracy {AT_OPERATING}", f"accuracy {AT_ARGMAX}"]
    header += [f"balanced acc. {AT_ARGMAX}", "sent/round", "received/round"]
    return "\n".join([markdown_table(header, rows), *unreliable_notes(summary)])


def operating_point_table(summary: Evaluation) -> str:
    """Each site's operating point on its test split: the threshold its rule chose on the
    validation split, then sensitivity, specificity, PPV and NPV with Wilson CIs and k/n."""
    return markdown_table(*operating_point_rows(summary))


def operating_point_rows(summary: Evaluation) -> tuple[list[str], list[list[Any]]]:
    """The header and rows of :func:`operating_point_table` (for markdown or HTML)."""
    header = ["site", "rule", "threshold", "sensitivity", "specificity", "PPV", "NPV"]
    header += ["TP/FP/TN/FN", "note"]
    rows = []
    for site, m in summary.sites.items():
        op = m.operating_point
        if op is None:
            rows.append([site, *["n/a"] * 7, "no operating point in this run"])
            continue
        rows.append([site, *operating_cells(op, f" {UNRELIABLE_MARK}" if m.unreliable else "")])
    return header, rows


def calibration_table(summary: Evaluation) -> str:
    """Brier score, ECE, calibration intercept and slope of each site's model on its test split."""
    return markdown_table(*calibration_rows(summary))


SLOPE_HEADER = "slope (95% CI; ideal 1)"


def slope_text(c: Any) -> str:
    """A calibration's slope with its Wald 95% interval: ``0.82 (0.61-1.05)``; the slope alone
    for a summary written before the interval was recorded; n/a without a slope."""
    if c is None or c.slope is None:
        return "n/a"
    ci = getattr(c, "slope_ci", None)
    return f"{c.slope:.3f}" if ci is None else f"{c.slope:.3f} ({ci[0]:.2f}-{ci[1]:.2f})"


CALIBRATION_HEADER = ("site", "n", "Brier", "ECE", "intercept (ideal 0)", SLOPE_HEADER, "note")


def calibration_row(site: str, c: Any) -> list[Any]:
    """One site's row of :data:`CALIBRATION_HEADER` (n/a where the run has no calibration)."""
    if c is None:
        return [site, *["n/a"] * 5, "no calibration in this run"]
    return [site, c.n, c.brier, c.ece, c.intercept, slope_text(c), c.reason or ""]


def calibration_rows(summary: Evaluation) -> tuple[list[str], list[list[Any]]]:
    """The header and rows of :func:`calibration_table` (for markdown or HTML)."""
    rows = [calibration_row(site, m.calibration) for site, m in summary.sites.items()]
    return list(CALIBRATION_HEADER), rows


def federation_lines(summary: Summary) -> list[str]:
    """The federation's figures, one ``name: value`` line each (CIs where the run has them)."""
    pooled = summary.pooled_auc
    worst = summary.worst_site_auc_ci
    system = summary.routers.get(summary.routing_method)
    system_rate = system.rates.get("system_accuracy") if system is not None else None
    fed = summary.federation
    pairs: list[tuple[str, Any]] = [
        ("mean site AUC", fed.mean_site_auc),
        (
            "pooled AUC (random effects)",
            "n/a" if pooled is None else f"{pooled_text(pooled, sites=True)} [{pooled.method}]",
        ),
        (
            "worst site AUC",
            fed.worst_site_auc if worst is None else f"{ci_text(worst)} [{worst.method}]",
        ),
        ("worst site", fed.worst_site),
        ("AUC spread (std)", fed.auc_std),
        ("AUC Gini", fed.auc_gini),
        (
            f"average accuracy {AT_OPERATING} (weighted by test scans)",
            summary.average_accuracy_operating,
        ),
        (
            f"average accuracy {AT_OPERATING} (weighted by training scans)",
            summary.average_accuracy_operating_by_train,
        ),
        (f"average accuracy {AT_ARGMAX} (weighted by test scans)", fed.average_accuracy),
        (
            f"average accuracy {AT_ARGMAX} (weighted by training scans)",
            fed.average_accuracy_by_train,
        ),
        (f"mean accuracy {AT_ARGMAX} (sites weighted equally)", fed.mean_accuracy),
        (
            f"system accuracy {AT_OPERATING} ({summary.routing_method})",
            summary.system_accuracy if system_rate is None else rate_text(system_rate),
        ),
        ("routing accuracy", summary.routing_accuracy),
        ("abstain rate", summary.abstain_rate),
        ("bytes per round", human_bytes(summary.bytes_per_round)),
        ("seconds per round", summary.seconds_per_round),
        ("dropouts", summary.dropouts),
    ]
    lines = [f"{name}: {fmt(value)}" for name, value in pairs]
    lines += privacy_lines(summary)
    if any(m.unreliable for m in summary.sites.values()):
        lines += unreliable_notes(summary)
    return lines


PRIVACY_COLUMNS: tuple[str, ...] = (
    "epsilon spent", "budget", "delta", "noise multiplier", "sampling rate", "clip", "steps",
    "accountant", "stopped (budget spent)",
)  # fmt: skip


def stopped_text(spent: PrivacySpent, rounds: int) -> str | None:
    """When a site's budget stopped it: ``in round 3``, ``before fine-tuning``; None: never."""
    if spent.stopped_round is None:
        return None
    if spent.stopped_round > rounds:
        return "before fine-tuning"
    return f"in round {spent.stopped_round}"


def privacy_cells(spent: PrivacySpent, rounds: int) -> list[str]:
    """One site's row of the privacy tables, in the order of PRIVACY_COLUMNS."""
    return [
        f"{spent.epsilon:.2f}",
        "none" if spent.budget is None else f"{spent.budget:g}",
        f"{spent.delta:.1e}",
        f"{spent.noise_multiplier:.2f}",
        f"{spent.sample_rate:.3f}",
        f"{spent.clip:g}",
        f"{spent.steps} of {spent.planned_steps}",
        spent.accountant.upper(),
        stopped_text(spent, rounds) or "no",
    ]


def privacy_lines(summary: Summary) -> list[str]:
    """One line per site of a differentially private run: epsilon spent (of its budget) at its
    delta, the mechanism, and whether the site stopped early; none for other runs."""
    if not summary.privacy:
        return []
    lines = []
    for site, p in summary.privacy.items():
        budget = f" of budget {p.budget:g}" if p.budget is not None else ""
        when = stopped_text(p, summary.rounds)
        stopped = f"; stopped {when} (budget spent)" if when else ""
        lines.append(
            f"differential privacy, {site}: epsilon {p.epsilon:.2f}{budget} at delta "
            f"{p.delta:.1e} ({p.accountant.upper()}; noise multiplier {p.noise_multiplier:.2f}, "
            f"sampling rate {p.sample_rate:.3f}, clip {p.clip:g}, {p.steps} steps){stopped}"
        )
    return lines


def cross_site_table(summary: Evaluation, figure: str = "auc") -> str:
    """Every site's model (rows) on every site's test split (columns): ``auc`` or ``accuracy``;
    the diagonal is each model on its own site. ``n/a`` for a cell the run does not hold."""
    if figure not in ("auc", "accuracy"):
        raise ValueError(f"figure must be 'auc' or 'accuracy'; got {figure!r}")
    models = list(summary.cross_site)
    data = list(summary.sites) or models
    for row in summary.cross_site.values():
        data += [d for d in row if d not in data]
    rows = []
    for model in models:
        cells = []
        for d in data:
            cell = summary.cross_site[model].get(d)
            cells.append(None if cell is None else getattr(cell, figure))
        rows.append([model, *cells])
    name = "AUC" if figure == "auc" else f"accuracy {AT_ARGMAX}"
    return markdown_table([f"{name}: model \\ test data", *data], rows)


SYSTEM_KEYS: dict[str, str] = {ORIGIN_UNKNOWN: "origin_unknown", ORIGIN_KNOWN: "origin_known"}
"""Each protocol's key in :attr:`~medfed.runs.schema.Evaluation.system_by_site`."""


def system_by_site_rows(summary: Evaluation) -> tuple[list[str], list[list[str]]]:
    """The routed system (the default router) on each site's test scans, one row per protocol:
    accuracy with its Wilson CI and k/n; no rows for a run that predates these figures."""
    sites = list(summary.sites)
    rows = []
    for protocol, key in SYSTEM_KEYS.items():
        rates = summary.system_by_site.get(key)
        if rates:
            label = f"routed system ({summary.routing_method}), {protocol}"
            rows.append([label, *(rate_text(rates.get(site)) for site in sites)])
    return [f"system accuracy {AT_OPERATING} \\ test data", *sites], rows


def routers_table(summary: Evaluation, protocol: str = ORIGIN_UNKNOWN) -> str:
    """Every router's system accuracy, routing accuracy, abstain rate, answered accuracy,
    sensitivity and specificity (each with its Wilson CI and k/n where the run has them),
    forward passes and latency, under ``protocol`` (:data:`ORIGIN_UNKNOWN` or
    :data:`ORIGIN_KNOWN`)."""
    routers = _routers(summary, protocol)
    header = ["router", f"system acc. {AT_OPERATING}", "routing acc.", "abstain rate"]
    header += [f"answered acc. {AT_OPERATING}"]
    header += ["sensitivity", "specificity", "forward passes", "ms per scan (95% CI)"]
    rows = []
    for name, r in routers.items():
        rows.append(
            [
                name,
                rate_text(r.rates.get("system_accuracy"), r.system_accuracy),
                rate_text(r.rates.get("routing_accuracy"), r.routing_accuracy),
                rate_text(r.rates.get("abstain_rate"), r.abstain_rate),
                rate_text(r.rates.get("answered_accuracy"), r.answered_accuracy),
                rate_text(r.rates.get("sensitivity")),
                rate_text(r.rates.get("specificity")),
                r.forward_passes,
                latency_text(r),
            ]
        )
    return markdown_table(header, rows)


def latency_text(r: RouterFigures) -> str:
    """``3.29 (3.10–3.52)``: the median milliseconds per scan with its 95% interval."""
    if r.latency_ms_low is None or r.latency_ms_high is None:
        return fmt(r.latency_ms_per_scan, 2)
    low, high = fmt(r.latency_ms_low, 2), fmt(r.latency_ms_high, 2)
    return f"{fmt(r.latency_ms_per_scan, 2)} ({low}\u2013{high})"


def _routers(summary: Evaluation, protocol: str) -> dict[str, RouterFigures]:
    if protocol == ORIGIN_UNKNOWN:
        return summary.routers
    if protocol == ORIGIN_KNOWN:
        return summary.routers_origin_known
    raise ValueError(f"protocol must be {ORIGIN_UNKNOWN!r} or {ORIGIN_KNOWN!r}; got {protocol!r}")


def evaluation_text(summary: Summary) -> str:
    """Everything ``medfed evaluate`` prints: each table under its heading, ``n/a`` where the run
    predates a figure."""
    parts = [
        f"{summary.algorithm} | {summary.rounds} rounds | seed {summary.seed} | "
        f"{summary.modality} | normalization: {summary.normalization}",
        "",
        "Per site (each site's model on its own test split; AUC with 95% CI)",
        site_table(summary),
        rules_note(),
    ]
    rule = summary.operating_rule or "n/a"
    if any(m.operating_point is not None for m in summary.sites.values()):
        parts += ["", f"Operating points (rule {rule}, chosen on each site's validation split)"]
        parts.append(operating_point_table(summary))
    else:
        parts += ["", "Operating points: n/a (not in this run)"]
    if any(m.calibration is not None for m in summary.sites.values()):
        parts += ["", "Calibration (test split)", calibration_table(summary)]
    else:
        parts += ["", "Calibration: n/a (not in this run)"]
    parts += grading_text(summary)
    parts += ["", "Federation", *federation_lines(summary)]
    if summary.cross_site:
        parts += ["", "Cross-site matrix (rows: model of site, columns: test split of site)"]
        parts += [cross_site_table(summary, "auc"), "", cross_site_table(summary, "accuracy")]
        header, rows = system_by_site_rows(summary)
        if rows:
            parts += ["", markdown_table(header, rows)]
    else:
        parts += ["", "Cross-site matrix: n/a (not in this run)"]
    for protocol, words in PROTOCOLS.items():
        routers = _routers(summary, protocol)
        title = f"Routers, {protocol} ({words})"
        if routers:
            parts += ["", title, routers_table(summary, protocol)]
        else:
            parts += ["", f"{title}: n/a (not in this run)"]
    if summary.routing_method != "majority_vote":
        parts += ["", *routing_calibration_text(summary)]
    return "\n".join(parts)


def methods_table(summaries: Mapping[str, Summary]) -> str:
    """One row per method: each site's AUC, worst-site AUC, average and system accuracy (both at
    the operating point)."""
    site_ids = list(next(iter(summaries.values())).sites)
    header = ["method", *(f"AUC {s}" for s in site_ids), "worst-site AUC"]
    header += [f"avg accuracy {AT_OPERATING}", f"system accuracy {AT_OPERATING}"]
    header += ["answered by", "routing acc."]
    rows = []
    for name, s in summaries.items():
        rows.append(
            [
                name,
                *(s.sites[sid].auc for sid in site_ids),
                s.federation.worst_site_auc,
                s.average_accuracy_operating,
                s.system_accuracy,
                s.routing_method,
                s.routing_accuracy,
            ]
        )
    return markdown_table(header, rows)


def communication_table(summaries: Mapping[str, Summary], baseline: str) -> str:
    """Bytes per round against ``baseline`` (FedAvg, float32) and what the savings cost."""
    base = summaries[baseline]
    header = ["method", "bytes per round", "fewer than " + baseline]
    header += [f"system accuracy {AT_OPERATING}"]
    header += ["change (points)", "mean site AUC", "worst-site AUC"]
    rows = []
    for name, s in summaries.items():
        ratio = base.bytes_per_round / s.bytes_per_round if s.bytes_per_round else None
        change = _points(s.system_accuracy, base.system_accuracy)
        rows.append(
            [
                name,
                human_bytes(s.bytes_per_round),
                f"{ratio:.1f}x" if ratio else "n/a",
                s.system_accuracy,
                change,
                s.federation.mean_site_auc,
                s.federation.worst_site_auc,
            ]
        )
    return markdown_table(header, rows)


def _points(value: float | None, baseline: float | None) -> str:
    """The change from ``baseline`` in percentage points, signed."""
    if value is None or baseline is None:
        return "n/a"
    return f"{100 * (value - baseline):+.1f}"
