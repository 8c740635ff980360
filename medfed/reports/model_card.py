"""The model card of a trained run: ``RUN/model/MODEL_CARD.md`` and the report's section.

Built only from what the run folder holds (``summary.json``, ``config.toml``, ``events.jsonl``,
``site_overview/``), so it can be written again for an old run (``medfed evaluate RUN
--model-card``). Its sections follow the TRIPOD+AI items that apply to a federated image
classifier (each section names the items it reports): what the model is, what it is for and
for whom, the sites and their data, each site's performance with its 95% CI and the worst
site, calibration and operating points, routing and abstention, privacy, and known limits.
The same sections render as markdown (the file) and as HTML (a section of report.html).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from medfed import __version__
from medfed.core.errors import RunDirError
from medfed.core.fileio import atomic_write
from medfed.core.manifest import TRIPOD_FIELDS
from medfed.reports.card_flags import FLAG_RULES, site_flags
from medfed.reports.evaluation import (
    AT_OPERATING,
    PRIVACY_COLUMNS,
    auc_text,
    calibration_rows,
    class_counts,
    operating_point_rows,
    privacy_cells,
)
from medfed.reports.html import Html, join, table, tag
from medfed.reports.markdown import markdown_table
from medfed.reports.routing import CALIBRATION_HEADER, posterior_rows
from medfed.reports.text import NA, UNRELIABLE_MARK, ci_text, fmt, pooled_text, rate_text
from medfed.runs.rundir import RunDir
from medfed.runs.schema import Summary

MODEL_CARD = "MODEL_CARD.md"
"""The card's file name inside ``RUN/model/``."""

SMALL_TEST_SPLIT = 50
"""A site tested on fewer scans than this is named among the limits (its intervals are wide)."""

SYNTHETIC_WORDS = ("synthetic", "medfed.data.synth")
"""Words of a site's declared facts that mark its data as generated, not patients'."""

FACT_KEYS = ("description", "source", "licence", "ethics", "known_shifts")


@dataclass(frozen=True)
class CardTable:
    """A table of the card: a header and rows of values (formatted by the renderers)."""

    header: list[str]
    rows: list[list[Any]]


Block = str | list[str] | CardTable
"""A paragraph, a bullet list, or a table."""


@dataclass(frozen=True)
class CardSection:
    title: str
    tripod: str  # the TRIPOD+AI items this section reports
    blocks: list[Block]


@dataclass(frozen=True)
class CardInputs:
    """What the card is built from: one finished run's files."""

    path: Path
    summary: Summary
    config: dict[str, Any]
    events: list[dict[str, Any]]
    overview: dict[str, Any] | None

    @classmethod
    def read(cls, run_dir: str | Path) -> CardInputs:
        """A finished run's files (RunDirError names what is missing or damaged)."""
        from medfed.reports.study_runs import read_overview

        run = RunDir(run_dir).require()
        summary = run.read_summary()
        try:
            events = run.read_events()
        except RunDirError:
            events = []  # the card then says nothing of secure aggregation or the engine
        return cls(run.path, summary, run.read_config(), events, read_overview(run.path))

    @property
    def site_facts(self) -> dict[str, dict[str, Any]]:
        sites = self.config.get("sites")
        if not isinstance(sites, list):
            return {}
        return {str(s["id"]): dict(s) for s in sites if isinstance(s, Mapping) and "id" in s}

    @property
    def start_event(self) -> dict[str, Any]:
        return next((e for e in self.events if e.get("event") == "start"), {})


# ---------------------------------------------------------------------------- the sections
def _positive_class(facts: Mapping[str, dict[str, Any]]) -> tuple[str, str]:
    """The negative and positive class names (the label map's 0 and 1), or n/a."""
    for site in facts.values():
        labels = site.get("labels")
        if isinstance(labels, Mapping) and len(labels) == 2:
            by_index = {v: str(k) for k, v in labels.items()}
            return by_index.get(0, NA), by_index.get(1, NA)
    return NA, NA


def _starting_weights(config: Mapping[str, Any], seed: int) -> str:
    init = config.get("init")
    if not isinstance(init, Mapping) or not init.get("source"):
        return f"random initialization (seed {seed})"
    if init.get("encoder") and not init.get("loaded"):  # it went into the frozen encoder only
        check = f"; {init['hash_check']}" if init.get("hash_check") else ""
        return (
            f"{init.get('source')}: {init['encoder']} tensors into the frozen encoder{check}; "
            f"what trains starts at random (seed {seed})"
        )
    sha = str(init.get("sha256") or NA)
    return f"{init.get('source')} (sha256 {sha})"


def _augmentation(config: Mapping[str, Any], summary: Any) -> str:
    train = config.get("train")
    if isinstance(train, Mapping) and train.get("frozen_encoder"):
        return "none (the frozen encoder's features, computed once per scan)"
    return str(summary.augment)


def _frozen_encoder(config: Mapping[str, Any]) -> list[str]:
    """The frozen-encoder mode's line (none without it)."""
    train = config.get("train")
    if not isinstance(train, Mapping) or not train.get("frozen_encoder"):
        return []
    blocks = int(train.get("unfreeze_blocks") or 0)
    trained = f"the last {blocks} blocks, a trunk and the heads" if blocks else "a trunk and heads"
    return [
        f"frozen encoder: the backbone's ImageNet weights ({train.get('init')}) stay fixed and "
        f"compute each scan's features once (model/encoder.safetensors); {trained} train on them"
    ]


def _finished(events: Sequence[Mapping[str, Any]]) -> str:
    times = [e.get("time") for e in events if e.get("event") == "finish"]
    times = [t for t in times if isinstance(t, int | float)]
    if not times:
        return NA
    return datetime.fromtimestamp(times[-1], UTC).strftime("%Y-%m-%d %H:%M UTC")


def model_section(inputs: CardInputs) -> CardSection:
    s = inputs.summary
    params = ", ".join(f"{k}={v}" for k, v in sorted(s.params.items())) or "defaults"
    engine = "Flower deployment" if s.engine == "flower" else "in-process"
    wire = s.wire.label if s.wire is not None else "float32"
    facts = [
        f"algorithm: {s.algorithm} ({params})",
        f"backbone: {s.backbone}; modality: {s.modality}",
        *_frozen_encoder(inputs.config),
        f"training: {s.rounds} rounds of {s.local_steps} local steps, seed {s.seed}",
        f"normalization: {s.normalization}; augmentation: {_augmentation(inputs.config, s)}",
        f"starting weights: {_starting_weights(inputs.config, s.seed)}",
        f"engine: {engine}; updates on the wire: {wire}; device: {s.device}",
        f"training finished: {_finished(inputs.events)}",
        "weights: this folder (one safetensors file per site, each listed with its sha256 in "
        "files.json); model.json says how to load them",
    ]
    return CardSection("Model", "title; model specification; analytical methods", [facts])


def intended_use_section(inputs: CardInputs) -> CardSection:
    s = inputs.summary
    negative, positive = _positive_class(inputs.site_facts)
    sites = ", ".join(s.sites)
    routes = s.routing_method != "majority_vote"
    answer = (
        f"it is sent to the site whose model fits it best ({s.routing_method}), whose "
        "model answers, or the federation abstains"
        if routes
        else "every site's model answers and the majority decides"
    )
    blocks: list[Block] = [
        f"Task: classify a {s.modality} scan as {positive} (positive) or {negative} "
        f"(negative). Each member site ({sites}) has a model of its own; for a new patient's "
        f"scan, {answer}.",
        "Intended users: the member sites' clinicians, as decision support beside their own "
        "reading, and the federation's researchers. It is not a diagnosis and was not "
        "validated prospectively.",
        "Intended population: patients like those of the member sites, as their data cards "
        "below describe them (source, acquisition, known shifts). A scan from another "
        "population, device or protocol is outside it, whatever the router answers.",
        "Contraindications: a scan of another modality or of a device, protocol or population "
        "the sites' data cards do not describe; a scan the federation abstains on (it gives "
        "no answer then); use as the only reading of a scan. The sites recorded no others.",
        "Regulatory status: not recorded for this model. medfed is research software and "
        "makes no regulatory claim; a model used in care needs the clearance its jurisdiction "
        "asks for, obtained by whoever deploys it.",
    ]
    return CardSection(
        "Intended use and population",
        "healthcare context; intended purpose and users; target population",
        blocks,
    )


def _card_path(inputs: CardInputs, site: str) -> str:
    """The site's data card as the run keeps it, relative to the run folder, or why none."""
    entry = (inputs.overview or {}).get("sites", {}).get(site)
    card = entry.get("card") if isinstance(entry, Mapping) else None
    if isinstance(card, str) and (inputs.path / "site_overview" / card).is_file():
        return f"site_overview/{card}"
    return "kept at the site (not in this run folder)"


def sites_section(inputs: CardInputs) -> CardSection:
    s, facts = inputs.summary, inputs.site_facts
    rows = []
    for site, m in s.sites.items():
        f = facts.get(site, {})
        rows.append(
            [
                site,
                str(f.get("source") or NA),
                f"{m.n_train}/{m.n_val}/{m.n_test}",
                class_counts(m),
                str(f.get("licence") or NA),
                str(f.get("ethics") or NA),
                _card_path(inputs, site),
            ]
        )
    header = ["site", "source", "scans train/val/test", "test pos/neg", "licence", "ethics"]
    header.append("data card")
    described = [
        f"{site}: {facts[site]['description']}"
        for site in s.sites
        if facts.get(site, {}).get("description")
    ]
    blocks: list[Block] = [
        "Each site's scans were split by patient into training, validation (threshold and "
        "calibration choices) and test splits; the test split was used for nothing else.",
        CardTable(header, rows),
    ]
    if described:
        blocks.append(described)
    return CardSection(
        "Sites and their data", "data sources; participants; sample size; outcome", blocks
    )


NOT_RECORDED = "not recorded"


def data_items_section(inputs: CardInputs) -> CardSection:
    """The TRIPOD+AI items each site declares in its manifest (its data card shows them too),
    "not recorded" where it declared none."""
    facts = inputs.site_facts
    rows = [
        [site] + [str(facts.get(site, {}).get(key) or NOT_RECORDED) for key in TRIPOD_FIELDS]
        for site in inputs.summary.sites
    ]
    return CardSection(
        "Reference standard, eligibility and data governance",
        "reference standard; eligibility criteria; data dates; data controller and retention",
        [
            "As each site declared them in its manifest (fields reference_standard, "
            "inclusion, exclusion, data_dates, data_controller, retention); "
            f"'{NOT_RECORDED}' where it declared none.",
            CardTable(["site", *TRIPOD_FIELDS.values()], rows),
        ],
    )


def _worst_note(site: str, worst: str | None, unreliable: str | None) -> str:
    notes = ["worst site"] if site == worst else []
    if unreliable:
        notes.append(f"{UNRELIABLE_MARK} {unreliable}")
    return "; ".join(notes)


def performance_section(inputs: CardInputs) -> CardSection:
    s = inputs.summary
    fed = s.federation
    header = ["site", "AUC (95% CI)", "CI method", "n test", "pos/neg"]
    header += [f"accuracy {AT_OPERATING}", "note"]
    rows = [
        [
            site,
            auc_text(m),
            m.auc_ci.method if m.auc_ci is not None else NA,
            m.n_test,
            class_counts(m),
            m.operating_accuracy,
            _worst_note(site, fed.worst_site, m.unreliable),
        ]
        for site, m in s.sites.items()
    ]
    worst = s.worst_site_auc_ci
    worst_text = fmt(fed.worst_site_auc) if worst is None else ci_text(worst)
    if worst is None and fed.worst_site in s.sites:  # the site's own text says why no CI
        worst_text = auc_text(s.sites[fed.worst_site], mark=False)
    pooled = s.pooled_auc
    lines = [
        f"worst site: {fed.worst_site or NA}, AUC {worst_text}",
        f"mean site AUC: {fmt(fed.mean_site_auc)}",
        "pooled AUC (random effects): "
        + (NA if pooled is None else pooled_text(pooled, sites=True)),
    ]
    return CardSection(
        "Performance at each site",
        "performance measures with their uncertainty; heterogeneity across sites",
        [
            "Each site's model on its own test split. AUC with its 95% confidence interval; "
            f"{UNRELIABLE_MARK} marks a figure resting on fewer than 10 positives or negatives.",
            CardTable(header, rows),
            lines,
        ],
    )


def calibration_section(inputs: CardInputs) -> CardSection:
    s = inputs.summary
    rule = s.operating_rule or NA
    blocks: list[Block] = [
        f"Operating points: each site's threshold chosen on its validation split by the rule "
        f"{rule}, applied to its test split (Wilson 95% CIs, counts k/n).",
        CardTable(*operating_point_rows(s)),
        "Calibration of each site's model on its test split (Brier score, ECE; intercept 0 "
        "and slope 1 are ideal).",
        CardTable(*calibration_rows(s)),
        "Sites flagged by these rules: " + "; ".join(FLAG_RULES) + ".",
        site_flags(s.sites, s.operating_rule) or ["no site flagged"],
    ]
    return CardSection(
        "Calibration and operating points", "calibration; model output and thresholds", blocks
    )


def routing_section(inputs: CardInputs) -> CardSection:
    s = inputs.summary
    router = s.routers.get(s.routing_method)
    rates = router.rates if router is not None else {}
    lines = [
        f"default router: {s.routing_method}",
        f"system accuracy {AT_OPERATING}: "
        + rate_text(rates.get("system_accuracy"), s.system_accuracy),
        "routing accuracy (scans sent to their own site): "
        + rate_text(rates.get("routing_accuracy"), s.routing_accuracy),
        "abstain rate: " + rate_text(rates.get("abstain_rate"), s.abstain_rate),
        f"accuracy on answered scans {AT_OPERATING}: "
        + rate_text(rates.get("answered_accuracy"), router.answered_accuracy if router else None),
    ]
    blocks: list[Block] = [
        "The federation answering every site's test scans pooled, as a new patient's scan of "
        "unknown origin meets it.",
        lines,
    ]
    rows = posterior_rows(s)
    if rows:
        blocks += [
            "How far the router's site probabilities can be trusted (pooled test scans):",
            CardTable(list(CALIBRATION_HEADER), rows),
        ]
    return CardSection("Routing and abstention", "model output; intended use in practice", blocks)


def privacy_section(inputs: CardInputs) -> CardSection:
    s = inputs.summary
    start = inputs.start_event
    secure = start.get("secure_aggregation")
    blocks: list[Block] = []
    if s.privacy:
        rows = [[site, *privacy_cells(p, s.rounds)] for site, p in s.privacy.items()]
        blocks += [
            "Differential privacy (DP-SGD at every site), epsilon spent per site:",
            CardTable(["site", *PRIVACY_COLUMNS], rows),
        ]
    else:
        blocks.append(
            "No differential privacy: the weights each site sent carry no bound on what they "
            "reveal about one patient (epsilon unbounded)."
        )
    lines = [
        "secure aggregation: "
        + (
            f"{secure} (the coordinator saw only each round's sum of the updates)"
            if secure
            else "no (the coordinator saw each site's update)"
        ),
        "left each site: model updates (the algorithm's shared weights, "
        f"{fmt(s.bytes_per_round / 1e6, 2)} MB per round over all sites), validation and test "
        + (
            "figures (counts and sums only: each site kept its test scans' predictions in its "
            "own state folder, STATE_DIR/RUN/SITE/predictions.csv); never a scan"
            if s.predictions == "sites"
            else "figures, and each test scan's prediction (RUN/predictions.csv); never a scan"
        ),
    ]
    if s.suppressed:
        lines.append(
            f"withheld by the sites' policies (outputs.min_count): {len(s.suppressed)} figure(s) "
            f"on too few scans, e.g. {next(iter(s.suppressed))}"
        )
    blocks.append(lines)
    return CardSection("Privacy and what left the sites", "data sharing; ethics", blocks)


def _synthetic_sites(facts: Mapping[str, Mapping[str, Any]]) -> list[str]:
    return [
        site
        for site, f in facts.items()
        if any(word in str(f.get(key, "")).lower() for key in FACT_KEYS for word in SYNTHETIC_WORDS)
    ]


def _weakest_transfer(s: Summary) -> str | None:
    cells = [
        (cell.auc, model, data)
        for model, row in s.cross_site.items()
        for data, cell in row.items()
        if model != data and cell.auc is not None
    ]
    if not cells:
        return None
    auc, model, data = min(cells)
    return (
        f"models travel unevenly: {model}'s model on {data}'s test scans has AUC {fmt(auc)}; "
        "a site's model is for its own patients"
    )


def limits(inputs: CardInputs) -> list[str]:
    """The run's known limits, each in one line (synthetic data, small sites, unreliable or
    missing figures, lost sites, what was not measured)."""
    s = inputs.summary
    out = []
    synthetic = _synthetic_sites(inputs.site_facts)
    if synthetic:
        out.append(
            f"synthetic data at {', '.join(synthetic)} (as the data cards declare): the figures "
            "describe the method on generated images, not its performance on patients"
        )
    for site, m in s.sites.items():
        if m.n_test < SMALL_TEST_SPLIT:
            out.append(f"small site: {site} was tested on {m.n_test} scans; its intervals are wide")
        if m.unreliable:
            out.append(f"{UNRELIABLE_MARK} unreliable figures at {site}: {m.unreliable}")
        if m.auc is None:
            out.append(f"no AUC at {site}: {m.auc_reason or 'undefined'}")
    refused = inputs.start_event.get("refused_sites")
    if isinstance(refused, Mapping):
        for site, rules in refused.items():
            rule = rules[0].get("rule") if isinstance(rules, list) and rules else "?"
            out.append(f"site refused the run by its policy (rule {rule}): {site}; not trained")
    for site, reason in (s.lost_sites or {}).items():
        out.append(f"site lost before publishing its model: {site} ({reason})")
    if s.dropouts:
        out.append(f"{s.dropouts} site-round(s) dropped during training (see events.jsonl)")
    if s.skipped_rounds:
        out.append(f"rounds that did not aggregate: {', '.join(map(str, s.skipped_rounds))}")
    weakest = _weakest_transfer(s)
    if weakest:
        out.append(weakest)
    out += [
        "internal validation only: each site's held-out test split; no external site and no "
        "prospective validation",
        "no subgroup figures (age, sex, ethnicity): the sites' manifests record none, so "
        "differences between patient groups are unmeasured",
    ]
    return out


def limits_section(inputs: CardInputs) -> CardSection:
    return CardSection("Known limits", "limitations; fairness; interpretation", [limits(inputs)])


SECTIONS = (
    model_section,
    intended_use_section,
    sites_section,
    data_items_section,
    performance_section,
    calibration_section,
    routing_section,
    privacy_section,
    limits_section,
)


def build_card(inputs: CardInputs) -> list[CardSection]:
    return [make(inputs) for make in SECTIONS]


def card_title(summary: Summary) -> str:
    return (
        f"Model card: {summary.algorithm} federation of {len(summary.sites)} "
        f"{summary.modality} sites"
    )


# ---------------------------------------------------------------------------- rendering
def _cell(value: Any) -> str:
    return fmt(value).replace("|", "/").replace("\n", " ")


def _block_data(block: Block) -> dict[str, Any]:
    if isinstance(block, CardTable):
        rows = [[_cell(v) for v in r] for r in block.rows]
        return {"table": {"header": list(block.header), "rows": rows}}
    if isinstance(block, list):
        return {"list": list(block)}
    return {"text": block}


def card_document(inputs: CardInputs) -> dict[str, Any]:
    """The card as plain data (title, intro, sections of text, lists and tables whose cells are
    the figures as written, each with its rule and interval): ``/model-card?format=json`` serves
    it and :func:`render_markdown` writes MODEL_CARD.md from it, so the two cannot differ."""
    intro = (
        f"Written by medfed {__version__} from the run folder `{inputs.path.name}` "
        "(summary.json, config.toml, events.jsonl, site_overview/). Laid out after the "
        "TRIPOD+AI items that apply to a federated image classifier; each section names the "
        "items it reports."
    )
    sections = [
        {"title": s.title, "tripod": s.tripod, "blocks": [_block_data(b) for b in s.blocks]}
        for s in build_card(inputs)
    ]
    return {"title": card_title(inputs.summary), "intro": intro, "sections": sections}


def _markdown_of(block: Mapping[str, Any]) -> str:
    if "table" in block:
        return markdown_table(block["table"]["header"], block["table"]["rows"])
    if "list" in block:
        return "\n".join(f"- {line}" for line in block["list"])
    return str(block["text"])


def markdown_of(document: Mapping[str, Any]) -> str:
    """The markdown of a :func:`card_document`: a title, how it was written, then each section."""
    parts = [f"# {document['title']}", document["intro"]]
    for section in document["sections"]:
        parts += [f"## {section['title']}", f"_TRIPOD+AI: {section['tripod']}_"]
        parts += [_markdown_of(b) for b in section["blocks"]]
    return "\n\n".join(parts) + "\n"


def render_markdown(inputs: CardInputs) -> str:
    """The card as markdown (MODEL_CARD.md), written from :func:`card_document`."""
    return markdown_of(card_document(inputs))


def write_model_card(run_dir: str | Path) -> Path:
    """Write ``RUN/model/MODEL_CARD.md`` of a finished run (again, for an old run)."""
    inputs = CardInputs.read(run_dir)
    model = RunDir(run_dir).model_dir
    if not model.is_dir():
        raise RunDirError(
            f"{model}: missing, so the run has no model to describe; train the run to its end"
        )
    path = model / MODEL_CARD
    atomic_write(path, render_markdown(inputs))
    return path


def _html_block(block: Block) -> Html:
    if isinstance(block, CardTable):
        return table(block.header, block.rows)
    if isinstance(block, list):
        return tag("ul", join(tag("li", line) for line in block))
    return tag("p", block)


def card_html(inputs: CardInputs) -> Html:
    """The card's sections as HTML (each under an ``h4``), for report.html."""
    parts: list[Html] = []
    for section in build_card(inputs):
        parts += [
            tag("h4", section.title),
            tag("p", f"TRIPOD+AI: {section.tripod}", class_="counts"),
        ]
        parts += [_html_block(b) for b in section.blocks]
    return join(parts)


MODEL_CARD_SECTION = ("model-card", "Model cards")
MODEL_CARD_INTRO = (
    "Each method's model card, as written beside its weights (RUN/model/MODEL_CARD.md): what "
    "the model is for and for whom, its sites, performance with CIs and the worst site, "
    "calibration, routing, privacy and known limits, laid out after TRIPOD+AI."
)


def model_card_section(runs: Sequence[tuple[str, Path]]) -> list[Html]:
    """One card per run (its label and folder), each under an ``h3``."""
    parts: list[Html] = []
    for label, path in runs:
        parts += [tag("h3", label), card_html(CardInputs.read(path))]
    return parts
