"""The study report: one self-contained HTML file for a study's clinicians, over one or more run
directories (several methods trained on the same sites).

    medfed report runs/feddrm runs/fedavg --out report.html

It shows the sites and their data, each site's AUC with its 95% CI (a table, and a forest plot
per method), the operating points, calibration (reliability diagrams), the cross-site matrix,
routing under both protocols, what each method sent over the network, the paired comparisons
written beside the runs, and the prospective review and reader disagreements of a run whose
routed scans clinicians have read (figures the caller passes in; this module does not read the
audit log, which belongs to serving). The plots are inline
SVG drawn here; the file loads nothing (no script, stylesheet, font or image from elsewhere, and
its content security policy forbids it), so it opens from a USB stick. Every string read from a
run's files is escaped.

Read from each run: ``summary.json``; ``config.toml`` (the sites' declared facts: description,
source, acquisition, known shifts, licence, ethics, labels); ``site_overview/overview.json`` when
present (class counts per split, distances between sites); ``events.jsonl`` (when training
finished). A figure a run predates reads ``n/a``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medfed import __version__
from medfed.core.errors import ConfigError
from medfed.core.fileio import atomic_write
from medfed.core.units import human_bytes
from medfed.reports.evaluation import (
    AT_ARGMAX,
    AT_OPERATING,
    CALIBRATION_HEADER,
    ORIGIN_KNOWN,
    ORIGIN_UNKNOWN,
    PRIVACY_COLUMNS,
    PROTOCOLS,
    auc_text,
    calibration_row,
    class_counts,
    latency_text,
    privacy_cells,
    system_by_site_rows,
)
from medfed.reports.grading import grading_tables
from medfed.reports.html import (
    Cell,
    Html,
    bytes_chart,
    esc,
    fig,
    flagged,
    forest_plot,
    join,
    rate_cell,
    reliability_diagram,
    table,
    tag,
)
from medfed.reports.model_card import MODEL_CARD_SECTION, model_card_section
from medfed.reports.prospective import prospective_grid, prospective_notes
from medfed.reports.study_checks import (
    comparisons_section,
    disagreements_section,
    posterior_tables,
    read_comparisons,
)
from medfed.reports.study_runs import StudyRun, load_study
from medfed.reports.study_sections import (
    COMPARISONS_SECTION,
    DISAGREEMENTS_SECTION,
    GRADING_SECTION,
    INTRO,
    PRIVACY_SECTION,
    REVIEW_SECTION,
    SECTIONS,
)
from medfed.reports.text import UNRELIABLE_MARK, ci_text, fmt, pooled_text
from medfed.runs.schema import ROUTER_RATES, RouterFigures, SiteFigures, Summary

RATE_NAMES = {
    "system_accuracy": f"system accuracy {AT_OPERATING}",
    "routing_accuracy": "routing accuracy",
    "abstain_rate": "abstain rate",
    "answered_accuracy": f"accuracy on answered scans {AT_OPERATING}",
    "sensitivity": "sensitivity",
    "specificity": "specificity",
}

CARD_FACTS = (
    ("description", "Description"),
    ("source", "Source"),
    ("acquisition", "Acquisition"),
    ("known_shifts", "Known shifts"),
    ("licence", "Licence"),
    ("ethics", "Ethics"),
)


# ---------------------------------------------------------------------------- sections
def _sites_of(runs: Sequence[StudyRun]) -> list[str]:
    order: list[str] = []
    for run in runs:
        order += [s for s in run.summary.sites if s not in order]
    return order


def _first(runs: Sequence[StudyRun], site: str) -> SiteFigures | None:
    return next((r.summary.sites[site] for r in runs if site in r.summary.sites), None)


def _positive_class(facts: Mapping[str, Any]) -> str:
    labels = facts.get("labels")
    if not isinstance(labels, Mapping) or len(labels) != 2:
        return "n/a"
    positive = [name for name, index in labels.items() if index == 1]
    return str(positive[0]) if positive else "n/a"


def _facts_of(runs: Sequence[StudyRun], site: str) -> dict[str, Any]:
    return next((dict(r.site_facts[site]) for r in runs if site in r.site_facts), {})


def _overview_site(runs: Sequence[StudyRun], site: str) -> dict[str, Any] | None:
    for run in runs:
        entry = (run.overview or {}).get("sites", {}).get(site)
        if isinstance(entry, Mapping):
            return dict(entry)
    return None


def _split_cell(n: int | None, counts: Any) -> Html:
    """``144`` with its classes under it (``glaucoma 82 · normal 62``) where the run lists them."""
    if not isinstance(counts, Mapping) or not counts:
        return esc(n)
    per = " \u00b7 ".join(f"{name} {k}" for name, k in sorted(counts.items()))
    return join([n, tag("span", per, class_="counts")])


def _study_notes(runs: Sequence[StudyRun], sites: list[str]) -> list[Html]:
    """Warnings when the runs do not describe the same sites and splits."""
    notes = []
    for run in runs:
        missing = [s for s in sites if s not in run.summary.sites]
        if missing:
            notes.append(f"{run.label} has no figures for site(s) {', '.join(missing)}.")
    for site in sites:
        sizes = {
            (m.n_train, m.n_val, m.n_test)
            for r in runs
            if (m := r.summary.sites.get(site)) is not None
        }
        if len(sizes) > 1:
            notes.append(
                f"Site {site}: the runs used different splits (train/val/test "
                f"{'; '.join('/'.join(map(str, s)) for s in sorted(sizes))}); "
                "compare its figures across methods with care."
            )
    return [tag("p", note, class_="warning") for note in notes]


def _glance(runs: Sequence[StudyRun]) -> Html:
    rows = []
    for run in runs:
        s = run.summary
        worst = s.worst_site_auc_ci
        worst_text = ci_text(worst) if worst is not None else fmt(s.federation.worst_site_auc)
        pooled = s.pooled_auc
        rows.append(
            [
                run.label,
                fig(pooled_text(pooled)),
                join([s.federation.worst_site or "n/a", ": ", fig(worst_text)]),
                _system_cell(s.routers, s.routing_method),
                _system_cell(s.routers_origin_known, s.routing_method),
                human_bytes(s.bytes_per_round),
            ]
        )
    header = ["method", "pooled AUC (95% CI), I\u00b2", "worst site: AUC (95% CI)"]
    header += [
        f"system accuracy {AT_OPERATING}, {ORIGIN_UNKNOWN}",
        f"system accuracy {AT_OPERATING}, {ORIGIN_KNOWN}",
        "sent per round",
    ]
    return table(header, rows, class_="glance")


def _system_cell(routers: Mapping[str, RouterFigures], name: str) -> Html:
    r = routers.get(name)
    if r is None:
        return esc("n/a")
    return rate_cell(r.rates.get("system_accuracy"), r.system_accuracy, name)


def _runs_section(runs: Sequence[StudyRun]) -> Html:
    rows = []
    for run in runs:
        s = run.summary
        params = ", ".join(f"{k}={v}" for k, v in sorted(s.params.items())) or "none"
        rows.append(
            [
                run.label,
                s.algorithm,
                params,
                f"{s.rounds} \u00d7 {s.local_steps}",
                s.seed,
                s.backbone,
                s.normalization,
                s.augment,
                s.operating_rule or "n/a",
                s.wire.label if s.wire is not None else "n/a",
                f"{s.dropouts}"
                + (f", rounds skipped {s.skipped_rounds}" if s.skipped_rounds else ""),
                run.finished or "n/a",
                str(run.path),
            ]
        )
    header = ["method", "algorithm", "parameters", "rounds \u00d7 local steps", "seed"]
    header += ["backbone", "normalization", "augmentation", "operating rule", "wire"]
    header += ["dropouts", "finished", "run directory"]
    return table(header, rows)


def _sites_section(runs: Sequence[StudyRun], sites: list[str]) -> list[Html]:
    rows = []
    for site in sites:
        m = _first(runs, site)
        facts = _facts_of(runs, site)
        ov = _overview_site(runs, site) or {}
        counts = ov.get("counts") if isinstance(ov.get("counts"), Mapping) else {}
        ratio = ov.get("class_ratio")
        share = (
            ", ".join(
                f"{name} {100 * v:.0f}%"
                for name, v in sorted(ratio.items())
                if isinstance(v, int | float)
            )
            if isinstance(ratio, Mapping)
            else ""
        ) or "n/a"
        rows.append(
            [
                site,
                facts.get("modality") or (run_modality(runs)),
                _positive_class(facts),
                _split_cell(None if m is None else m.n_train, counts.get("train")),
                _split_cell(None if m is None else m.n_val, counts.get("val")),
                _split_cell(None if m is None else m.n_test, counts.get("test")),
                "n/a" if m is None else flagged(class_counts(m), m.unreliable),
                share,
            ]
        )
    header = ["site", "modality", "positive class", "train", "validation", "test"]
    header += ["test positives/negatives", "class share (all splits)"]
    out = [table(header, rows, caption="Scans per split (and per class, where the run lists them)")]
    cards = []
    for site in sites:
        facts = _facts_of(runs, site)
        items = []
        for key, name in CARD_FACTS:
            value = facts.get(key)
            if isinstance(value, str) and value.strip():
                items += [tag("dt", name), tag("dd", value)]
        labels = facts.get("labels")
        if isinstance(labels, Mapping) and labels:
            text = ", ".join(f"{n} = {i}" for n, i in sorted(labels.items(), key=lambda t: t[1]))
            items += [tag("dt", "Labels"), tag("dd", text)]
        if facts.get("layout"):
            items += [tag("dt", "On-disk layout"), tag("dd", facts["layout"])]
        body = tag("dl", join(items)) if items else tag("p", "No data card facts in the runs.")
        cards.append(tag("div", join([tag("h3", f"Data card: {site}"), body]), class_="card"))
    out.append(tag("div", join(cards), class_="cards"))
    distances = next((r.overview.get("distances") for r in runs if r.overview), None)
    if isinstance(distances, Mapping) and isinstance(distances.get("matrix"), list):
        names = [str(s) for s in distances.get("sites", [])]
        matrix = distances["matrix"]
        if len(matrix) == len(names) and all(isinstance(row, list) for row in matrix):
            rows = [
                [name, *(fmt(v, 4) if isinstance(v, int | float) else v for v in row)]
                for name, row in zip(names, matrix, strict=True)
            ]
            method = distances.get("method") or "appearance features"
            out.append(
                table(
                    ["site", *names],
                    rows,
                    caption=f"How different the sites' scans look ({method}; 0: alike)",
                )
            )
    return out


def run_modality(runs: Sequence[StudyRun]) -> str:
    return runs[0].summary.modality if runs else "n/a"


def _discrimination_section(runs: Sequence[StudyRun], sites: list[str]) -> list[Html]:
    rows = []
    for site in sites:
        m = _first(runs, site)
        n = "n/a" if m is None else f"{m.n_test} ({class_counts(m)})"
        cells: list[Any] = [site, n]
        for run in runs:
            f = run.summary.sites.get(site)
            cells.append(
                "not in this run" if f is None else flagged(auc_text(f, mark=False), f.unreliable)
            )
        rows.append(cells)
    rows.append(
        ["pooled (random effects)", "", *(fig(pooled_text(r.summary.pooled_auc)) for r in runs)]
    )
    rows.append(["worst site", "", *(_worst(r.summary) for r in runs)])
    header = ["site", "test scans (positives/negatives)", *(r.label for r in runs)]
    out = [table(header, rows, caption="AUC (95% CI) of each site's model on its own test split")]
    out.append(tag("ul", join(_ci_methods(run) for run in runs), class_="methods"))
    for run in runs:
        figures = {site: run.summary.sites.get(site) for site in sites}
        plot = forest_plot(run.label, figures, run.summary.pooled_auc)
        caption = tag("figcaption", f"AUC per site with 95% CI, {run.label}")
        out.append(tag("figure", join([plot, caption])))
    return out


def _ci_methods(run: StudyRun) -> Html:
    """How a run's intervals were made: each CI method with the sites it served, the pool's."""
    by_method: dict[str, list[str]] = {}
    for site, m in run.summary.sites.items():
        if m.auc_ci is not None:
            by_method.setdefault(m.auc_ci.method, []).append(site)
    items = [tag("li", f"{method}: {', '.join(sites)}") for method, sites in by_method.items()]
    pooled = run.summary.pooled_auc
    if pooled is not None:
        items.append(tag("li", f"pooled over {pooled.n_sites} sites: {pooled.method}"))
    if not items:
        items.append(tag("li", "n/a (this run has no CIs)"))
    return tag("li", join([f"{run.label}, intervals by method:", tag("ul", join(items))]))


def _worst(s: Summary) -> Html:
    if s.federation.worst_site is None:
        return esc("n/a")
    value = (
        ci_text(s.worst_site_auc_ci) if s.worst_site_auc_ci else fmt(s.federation.worst_site_auc)
    )
    return join([s.federation.worst_site, ": ", fig(value)])


def _operating_section(runs: Sequence[StudyRun], sites: list[str]) -> list[Html]:
    out = []
    for run in runs:
        rows = []
        for site in sites:
            m = run.summary.sites.get(site)
            op = None if m is None else m.operating_point
            if op is None:
                rows.append([site, *["n/a"] * 7, "no operating point in this run"])
                continue
            reason = m.unreliable if m is not None else None
            rows.append(
                [
                    site,
                    op.rule,
                    fmt(op.threshold),
                    *(
                        rate_cell(getattr(op, name), unreliable=reason)
                        for name in ("sensitivity", "specificity", "ppv", "npv")
                    ),
                    f"{op.tp} / {op.fp} / {op.tn} / {op.fn}",
                    op.note or "",
                ]
            )
        header = ["site", "rule", "threshold", "sensitivity", "specificity", "PPV", "NPV"]
        header += ["TP / FP / TN / FN", "note"]
        rule = run.summary.operating_rule or "n/a"
        out.append(table(header, rows, caption=f"{run.label} (rule {rule})"))
    return out


def _calibration_section(runs: Sequence[StudyRun], sites: list[str]) -> list[Html]:
    out = []
    for run in runs:
        figures = {site: run.summary.sites.get(site) for site in sites}
        rows = [
            calibration_row(site, None if m is None else m.calibration)
            for site, m in figures.items()
        ]
        header = list(CALIBRATION_HEADER)
        plot = reliability_diagram(run.label, figures)
        caption = tag("figcaption", f"Reliability diagram, {run.label}")
        out.append(
            tag(
                "div",
                join(
                    [table(header, rows, caption=run.label), tag("figure", join([plot, caption]))]
                ),
                class_="pair",
            )
        )
    return out


def _cross_site_section(runs: Sequence[StudyRun]) -> list[Html]:
    out = []
    for run in runs:
        cross = run.summary.cross_site
        if not cross:
            out.append(tag("p", f"{run.label}: n/a (this run predates the cross-site matrix)."))
            continue
        data = list(run.summary.sites)
        for row in cross.values():
            data += [d for d in row if d not in data]
        rows = []
        for model, row in cross.items():
            cells: list[Any] = [model]
            for d in data:
                cell = row.get(d)
                if cell is None:
                    cells.append("n/a")
                    continue
                auc = "n/a" if cell.auc is None else fmt(cell.auc)
                detail = f"accuracy {AT_ARGMAX} {fmt(cell.accuracy)} \u00b7 n {cell.n}"
                if cell.auc is None and cell.auc_reason:
                    detail += f" \u00b7 {cell.auc_reason}"
                content = join([auc, tag("span", detail, class_="counts")])
                own = "own" if model == d else None
                cells.append(Cell(content, {"style": _heat(cell.auc), "class_": own}))
            rows.append(cells)
        header = ["model of \u2193 / test split of \u2192", *data]
        out.append(table(header, rows, caption=run.label, class_="matrix"))
        system_header, system_rows = system_by_site_rows(run.summary)
        if system_rows:
            caption = f"{run.label}: the routed system on each site's test scans"
            out.append(table(system_header, system_rows, caption=caption))
    return out


def _heat(auc: float | None) -> str:
    if auc is None:
        return "background: #eeeeee"
    t = min(max((auc - 0.5) / 0.5, 0.0), 1.0)
    low, high = (247, 247, 247), (33, 102, 172)
    r, g, b = (round(a + (z - a) * t) for a, z in zip(low, high, strict=True))
    ink = "#ffffff" if t > 0.55 else "#111111"
    return f"background: rgb({r}, {g}, {b}); color: {ink}"


def _routing_section(runs: Sequence[StudyRun]) -> list[Html]:
    out = []
    for run in runs:
        s = run.summary
        for protocol, words in PROTOCOLS.items():
            routers = s.routers if protocol == ORIGIN_UNKNOWN else s.routers_origin_known
            caption = f"{run.label}, {protocol}: {words}"
            if not routers:
                out.append(tag("p", f"{caption}: n/a (not in this run)."))
                continue
            rows = []
            for name, r in routers.items():
                label = f"{name} (default)" if name == s.routing_method else name
                rows.append(
                    [
                        label,
                        *(rate_cell(r.rates.get(k), getattr(r, k, None)) for k in ROUTER_RATES),
                        r.forward_passes,
                        latency_text(r),
                    ]
                )
            header = ["router", *(RATE_NAMES.get(k, k) for k in ROUTER_RATES)]
            header += ["forward passes", "ms per scan (95% CI)"]
            out.append(table(header, rows, caption=caption))
        out += posterior_tables(run.label, run.summary)
    return out


def _privacy_section(runs: Sequence[StudyRun]) -> list[Html]:
    out = []
    for run in runs:
        spent = run.summary.privacy
        if not spent:
            continue
        rows = [[site, *privacy_cells(p, run.summary.rounds)] for site, p in spent.items()]
        header = ["site", *PRIVACY_COLUMNS]
        out.append(table(header, rows, caption=run.label))
    return out


def _network_section(runs: Sequence[StudyRun], sites: list[str]) -> list[Html]:
    rows = []
    for run in runs:
        s = run.summary
        per_site = []
        for site in sites:
            t = s.bytes_per_round_by_site.get(site)
            if t is not None:
                per_site.append(f"{site}: {human_bytes(t.up)} sent, {human_bytes(t.down)} received")
        rows.append(
            [
                run.label,
                s.wire.label if s.wire is not None else "n/a",
                human_bytes(s.bytes_per_round),
                join(per_site, "<br>") if per_site else "n/a",
                s.rounds,
                human_bytes(s.bytes_per_round * s.rounds),
            ]
        )
    header = ["method", "wire encoding", "per round, all sites", "per round, each site"]
    header += ["rounds", "whole run (about)"]
    figure = tag(
        "figure",
        join(
            [bytes_chart(runs), tag("figcaption", "Bytes per round (sent + received, all sites)")]
        ),
    )
    return [table(header, rows), figure]


# ---------------------------------------------------------------------------- the page
STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif;
  margin: 2rem auto; max-width: 90rem; padding: 0 1rem; color: #111; line-height: 1.45; }
h1 { font-size: 1.6rem; margin-bottom: 0.2rem; } h2 { margin-top: 2.2rem;
  border-bottom: 2px solid #ddd; padding-bottom: 0.2rem; } h3 { margin: 0.6rem 0 0.3rem; }
p.lead { color: #444; margin-top: 0; } p.warning { background: #fff4e5;
  border-left: 4px solid #e69f00; padding: 0.4rem 0.7rem; }
nav ol { columns: 2; } table { border-collapse: collapse; margin: 0.8rem 0 1.2rem;
  font-variant-numeric: tabular-nums; font-size: 0.92rem; }
caption { caption-side: top; text-align: left; font-weight: 600; padding: 0.3rem 0; }
th, td { border: 1px solid #ccc; padding: 0.3rem 0.55rem; text-align: left;
  vertical-align: top; } thead th { background: #f2f2f2; }
tbody th { font-weight: 600; white-space: nowrap; }
.fig { white-space: nowrap; } .scroll { overflow-x: auto; max-width: 100%; }
.counts { display: block; color: #555; font-size: 0.82rem; }
table.matrix td { min-width: 7rem; } table.matrix td .counts { color: inherit; opacity: 0.85; }
td.own { outline: 3px solid #111; outline-offset: -3px; font-weight: 600; }
.flag { color: #b35806; font-weight: 600; white-space: nowrap; margin-left: 0.25em; }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(20rem, 1fr));
  gap: 0.8rem; } .card { border: 1px solid #ddd; border-radius: 6px; padding: 0.3rem 0.8rem; }
dl { margin: 0.3rem 0; } dt { font-weight: 600; } dd { margin: 0 0 0.4rem 0; }
figure { margin: 0.6rem 0 1.4rem; } figcaption { color: #444; font-size: 0.9rem; }
.pair { display: flex; flex-wrap: wrap; gap: 1.5rem; align-items: flex-start; }
svg.plot { max-width: 100%; height: auto; font-size: 13px; }
svg .small { font-size: 11px; fill: #444; } svg .muted { fill: #777; font-style: italic; }
svg .bold { font-weight: 600; } svg .chance { stroke: #999; stroke-dasharray: 4 3; }
svg .axis { stroke: #333; } svg .grid { stroke: #eee; } svg .frame { fill: none; stroke: #333; }
svg .ci { stroke: #222; stroke-width: 1.5; } svg rect.solid { fill: #0072B2; }
svg rect.hollow { fill: #fff; stroke: #b35806; stroke-width: 2; }
svg polygon { fill: #D55E00; } svg .series { fill: none; stroke-width: 2; }
footer { margin-top: 3rem; color: #666; font-size: 0.85rem; }
@media print { body { margin: 0; max-width: none; font-size: 10pt; }
  h2 { break-before: page; } table, figure { break-inside: avoid; }
  table { font-size: 8pt; } .scroll { overflow: visible; } nav { display: none; }
  .fig { white-space: normal; } th, td { overflow-wrap: anywhere; } }
"""

# Nothing may be fetched: inline styles and data: images only.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def default_title(runs: Sequence[StudyRun]) -> str:
    sites = _sites_of(runs)
    methods = ", ".join(r.label for r in runs)
    return f"Study report: {run_modality(runs)}, {len(sites)} sites, methods {methods}"


def _grading_section(runs: Sequence[StudyRun]) -> list[Html]:
    """Each graded run's macro AUC and kappa per site, each class against the rest, the
    referable endpoint at its operating point, and the routed system's kappa."""
    parts: list[Html] = []
    for run in runs:
        graded = grading_tables(run.summary)
        if graded is None:
            continue
        parts += [tag("h3", run.label), table(*graded.sites)]
        parts.append(table(*graded.classes, caption="Each grade against the rest (AUC, 95% CI)"))
        referable = graded.referable
        if referable is not None:
            parts.append(table(*referable.table, caption=referable.heading))
            notes = referable.notes
            parts += [tag("ul", join(tag("li", n) for n in notes), class_="notes")] if notes else []
        if graded.system_kappa is not None:
            parts.append(tag("p", graded.system_kappa))
    return parts


def _review_section(
    runs: Sequence[StudyRun], prospective: Mapping[Path, Sequence[Mapping[str, Any]]]
) -> list[Html]:
    """Each run's prospective figures (rows of ``medfed.clinic.review``), when it has reads."""
    figures = {Path(path).resolve(): rows for path, rows in prospective.items()}
    parts: list[Html] = []
    for run in runs:
        rows = figures.get(run.path.resolve())
        if rows:
            header, grid = prospective_grid(rows)
            notes = [tag("li", note) for note in prospective_notes(rows)]
            parts += [tag("h3", run.label), table(header, grid)]
            parts += [tag("ul", join(notes), class_="notes")] if notes else []
    return parts


def render_study(
    runs: Sequence[StudyRun],
    title: str | None = None,
    prospective: Mapping[Path, Sequence[Mapping[str, Any]]] | None = None,
    *,
    comparisons: Mapping[Path, Mapping[str, Any]] | None = None,
    disagreements: Mapping[Path, Sequence[Mapping[str, Any]]] | None = None,
) -> str:
    """The report's HTML text (one document, nothing loaded from elsewhere).

    ``prospective``: each run's prospective review figures by run path (the rows of
    ``medfed.clinic.review.Prospective.rows``); a "Prospective review" section shows them.
    ``comparisons``: the paired comparisons by file (:func:`read_comparisons`);
    ``disagreements``: each run's scans read differently, by run path; each has its section
    when present.
    """
    if not runs:
        raise ConfigError("the study report needs at least one run directory")
    title = title or default_title(runs)
    sites = _sites_of(runs)
    bodies: dict[str, list[Html]] = {
        "glance": [_glance(runs), *_study_notes(runs, sites)],
        "methods": [_runs_section(runs)],
        "sites": _sites_section(runs, sites),
        "discrimination": _discrimination_section(runs, sites),
        "operating": _operating_section(runs, sites),
        "calibration": _calibration_section(runs, sites),
        "cross-site": _cross_site_section(runs),
        "routing": _routing_section(runs),
        "network": _network_section(runs, sites),
    }
    notes = _unreliable_list(runs, sites)
    if notes:
        bodies["discrimination"].insert(1, notes)
    shown = list(SECTIONS)
    privacy = _privacy_section(runs)
    if privacy:
        bodies["privacy"] = privacy
        shown.append(PRIVACY_SECTION)
    extra = {
        GRADING_SECTION: _grading_section(runs),
        COMPARISONS_SECTION: comparisons_section(comparisons or {}),
        REVIEW_SECTION: _review_section(runs, prospective or {}),
        DISAGREEMENTS_SECTION: disagreements_section(runs, disagreements or {}),
        MODEL_CARD_SECTION: model_card_section([(r.label, r.path) for r in runs]),
    }
    for section, body in extra.items():
        if body:
            bodies[section[0]] = body
            shown.append(section)
    nav = tag(
        "nav",
        tag("ol", join(tag("li", tag("a", name, href=f"#{key}")) for key, name in shown)),
    )
    sections = [
        tag(
            "section",
            join([tag("h2", name), tag("p", INTRO[key]), *bodies[key]]),
            id=key,
        )
        for key, name in shown
    ]
    lead = (
        f"{len(runs)} method(s) on {len(sites)} site(s): {', '.join(sites)}. Every figure is on "
        "the sites' test splits, with its 95% confidence interval and counts where the runs "
        "hold them; n/a marks a figure a run does not hold."
    )
    head = join(
        [
            Html('<meta charset="utf-8">'),
            Html(f'<meta http-equiv="Content-Security-Policy" content="{esc(CSP)}">'),
            Html('<meta name="viewport" content="width=device-width, initial-scale=1">'),
            tag("title", title),
            tag("style", Html(STYLE)),
        ]
    )
    folders = "run directory" if len(runs) == 1 else "run directories"
    footer = tag("footer", f"Written by medfed {__version__} from {len(runs)} {folders}.")
    body = join([tag("h1", title), tag("p", lead, class_="lead"), nav, *sections, footer])
    return f'<!DOCTYPE html>\n<html lang="en">\n<head>{head}</head>\n<body>{body}</body>\n</html>\n'


def _unreliable_list(runs: Sequence[StudyRun], sites: list[str]) -> Html | None:
    seen: dict[tuple[str, str], list[str]] = {}
    for run in runs:
        for site in sites:
            m = run.summary.sites.get(site)
            if m is not None and m.unreliable:
                seen.setdefault((site, m.unreliable), []).append(run.label)
    if not seen:
        return None
    items = [
        tag("li", f"{site}: {reason} ({', '.join(labels)})")
        for (site, reason), labels in seen.items()
    ]
    return join([tag("p", f"{UNRELIABLE_MARK} unreliable figures:"), tag("ul", join(items))])


@dataclass(frozen=True)
class WrittenReport:
    path: Path
    methods: list[str]
    sites: list[str]


def write_study_report(
    paths: Sequence[str | Path],
    out: str | Path,
    *,
    title: str | None = None,
    prospective: Mapping[Path, Sequence[Mapping[str, Any]]] | None = None,
    disagreements: Mapping[Path, Sequence[Mapping[str, Any]]] | None = None,
) -> WrittenReport:
    """Read the runs and the comparisons written beside them, render the report and write it
    to ``out`` atomically (``prospective``, ``disagreements``: see :func:`render_study`)."""
    runs = load_study(paths, models=True)
    out = Path(out)
    if out.is_dir():
        raise ConfigError(f"--out {out} is a folder; give the HTML file to write")
    html = render_study(
        runs,
        title,
        prospective,
        comparisons=read_comparisons(runs),
        disagreements=disagreements,
    )
    atomic_write(out, html)
    return WrittenReport(out, [r.label for r in runs], _sites_of(runs))
