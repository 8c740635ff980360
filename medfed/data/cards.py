"""Data cards: one markdown page per site, next to the data code (data_cards/<id>.md)."""

from __future__ import annotations

from pathlib import Path

from medfed.config import Modality, SiteManifest
from medfed.core.errors import ConfigError
from medfed.core.manifest import TRIPOD_FIELDS
from medfed.data.checks import SiteReport

TO_FILL = "_to fill in by the site_"


def _field(text: str) -> str:
    return text.strip() or TO_FILL


def render_card(manifest: SiteManifest, report: SiteReport) -> str:
    """The card's markdown text, from the manifest (declared facts) and the check (measured)."""
    classes = sorted(manifest.labels, key=lambda name: (manifest.labels[name], name))
    lines = [
        f"# Data card: {manifest.id}",
        "",
        f"{_field(manifest.description)}",
        "",
        "| field | value |",
        "| --- | --- |",
        f"| site id | `{manifest.id}` |",
        f"| modality | {manifest.modality} |",
        f"| on-disk layout | `{manifest.layout}` |",
        f"| source | {_field(manifest.source)} |",
        f"| labels | {', '.join(f'{n} = {manifest.labels[n]}' for n in classes)} |",
        *(
            [f"| classes held | {', '.join(manifest.classes_held)} |"]
            if manifest.classes_held
            else []
        ),
        f"| scans | {report.n_records} listed, {report.n_readable} readable |",
        *([f"| optic disc position | {report.disc_text()} |"] if report.disc else []),
        f"| ready to join | {'yes' if report.ready else 'no: see problems below'} |",
        "",
        "## Counts per split and class",
        "",
    ]
    # Classes in the order 'medfed sites check' prints them (the manifest's label order).
    names = list(dict.fromkeys(c for per in report.counts.values() for c in per))
    lines += ["| split | " + " | ".join(names) + " | total |", "|---" * (len(names) + 2) + "|"]
    totals = dict.fromkeys(names, 0)
    for split in ("train", "val", "test"):
        per = report.counts.get(split, {})
        row = [per.get(n, 0) for n in names]
        for n, v in zip(names, row, strict=True):
            totals[n] += v
        lines.append(f"| {split} | " + " | ".join(map(str, row)) + f" | {sum(row)} |")
    lines.append(
        "| all | " + " | ".join(str(totals[n]) for n in names) + f" | {sum(totals.values())} |"
    )
    if len(classes) == 2 and all(totals.get(n, 0) > 0 for n in classes):
        negative, positive = classes  # label 0 first: the ratio reads positive:negative
        ratio = totals[positive] / totals[negative]
        lines += ["", f"Class ratio {positive}:{negative} = {ratio:.2f}"]
    if manifest.provenance.strip():  # optional: where the files came from, and how
        lines += ["", "## Provenance", "", manifest.provenance.strip()]
    lines += [
        "",
        "## Acquisition",
        "",
        _field(manifest.acquisition),
        "",
        f"- image sizes: {report.sizes_text()}",
        f"- intensity before preprocessing: {report.intensity_text()}",
        *_orientation_lines(manifest, report),
        "",
        "## Preprocessing",
        "",
        f"`{manifest.preprocess}`",
        "",
        "## Known shifts",
        "",
        _field(manifest.known_shifts),
    ]
    if report.distances:  # in the order the sites were given, as 'medfed sites check' shows
        lines += ["", "Distance to other sites (MMD on simple appearance features):", ""]
        lines += [f"- {other}: {d:.4f}" for other, d in report.distances.items()]
    if report.warnings:
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in report.warnings]
    lines += ["", "## Reference standard, eligibility and governance", ""]
    lines += ["| item | as the site declares it |", "| --- | --- |"]
    lines += [
        f"| {name} | {_field(getattr(manifest, key)).replace('|', '/')} |"
        for key, name in TRIPOD_FIELDS.items()
    ]
    lines += ["", "## Licence", "", _field(manifest.licence), "", "## Ethics", ""]
    lines += [_field(manifest.ethics), ""]
    if report.problems:
        lines += ["## Open problems", ""] + [f"- {p}" for p in report.problems] + [""]
    return "\n".join(lines)


def _orientation_lines(manifest: SiteManifest, report: SiteReport) -> list[str]:
    """How the site's volumes were oriented when read, with counts when they differ."""
    counts = report.orientation
    if not counts:
        if manifest.modality != Modality.CT:
            return []
        return ["- orientation: not recorded here (`medfed sites card` reads it from the files)"]
    if len(counts) == 1:
        ((how, n),) = counts.items()
        lines = [f"- orientation: {how}, all {n} scan(s)"]
    else:
        lines = [
            "- orientation: " + "; ".join(f"{how} for {n} scan(s)" for how, n in counts.items())
        ]
    if any("oblique" in how for how in counts):
        lines.append(
            "  (oblique volumes are turned to the nearest RAS axes by swaps and flips only; "
            "their tilt is kept, not resampled away)"
        )
    return lines


def check_card_dir(out_dir: Path) -> None:
    """The cards' folder is a folder, or not there yet (it is created)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--out-dir {out_dir} is a file; give a folder for the data cards")


def write_card(manifest: SiteManifest, report: SiteReport, out_dir: Path) -> Path:
    check_card_dir(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{manifest.id}.md"
    path.write_text(render_card(manifest, report), encoding="utf-8")
    return path
