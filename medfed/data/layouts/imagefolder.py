"""Image folder: ``<split>/<class>/<image>`` (e.g. ``RIM/{Training,Testing}/{glaucoma,normal}``)
or, without split folders, ``<class>/<image>`` (e.g. ``odir/{normal,glaucoma,cataract}``).

With split folders the layout's split is kept (see [split] use_layout_split); with class folders
directly under the root no scan has a layout split, and medfed's own patient-level split assigns
train, validation and test. Which of the two a root holds is read from its folder names: the root
holds class folders when none of its folders is a split folder and at least one is a class that
[labels] declares.
"""

from __future__ import annotations

from pathlib import Path

from medfed.config import SiteManifest
from medfed.data.layouts._common import (
    STRAY_FILE,
    PatientIds,
    check_options,
    is_clutter,
    option_table,
    parse_split,
    scan_class_folders,
)
from medfed.data.records import LayoutScan, Problem, Split

DEFAULT_SPLITS = {
    "train": "train",
    "training": "train",
    "val": "val",
    "validation": "val",
    "test": "test",
    "testing": "test",
}


def split_folders(manifest: SiteManifest) -> dict[str, Split]:
    """Folder name (case-insensitive) -> split, from layout_options.splits or the defaults."""
    table = option_table(manifest, "splits", DEFAULT_SPLITS)
    return {
        folder.casefold(): parse_split(manifest, value, f"layout_options.splits.{folder}")
        for folder, value in table.items()
    }


def holds_class_folders(manifest: SiteManifest, splits: dict[str, Split]) -> bool:
    """Whether the root holds ``<class>/<image>`` rather than ``<split>/<class>/<image>``."""
    folders = [p for p in manifest.root.iterdir() if p.is_dir() and not is_clutter(p)]
    if any(p.name.casefold() in splits for p in folders):
        return False
    return any(p.name in manifest.labels for p in folders)


def scan(manifest: SiteManifest) -> LayoutScan:
    """List ``root/<split>/<class>/<image>`` or ``root/<class>/<image>`` records; class folders
    must be declared labels."""
    check_options(manifest, {"splits", "patient_regex"})
    splits = split_folders(manifest)
    patient_ids = PatientIds(manifest)
    if holds_class_folders(manifest, splits):
        result = scan_class_folders(manifest, manifest.root, None, patient_ids)
    else:
        result = _scan_split_folders(manifest, splits, patient_ids)
    if not result.records:
        result.problems.append(
            Problem(str(manifest.root), "no labelled images found under the site root")
        )
    result.records.sort(key=lambda r: r.path)
    return result


def _scan_split_folders(
    manifest: SiteManifest, splits: dict[str, Split], patient_ids: PatientIds
) -> LayoutScan:
    result = LayoutScan([], [])
    for folder in sorted(manifest.root.iterdir()):
        if folder.is_file():
            result.warnings.append(
                Problem(str(folder), STRAY_FILE, "split folders hold the images")
            )
            continue
        if is_clutter(folder):
            continue
        split = splits.get(folder.name.casefold())
        if split is None or not folder.is_dir():
            result.problems.append(_not_a_split_folder(manifest, folder, splits))
            continue
        found = scan_class_folders(manifest, folder, split, patient_ids)
        result.records.extend(found.records)
        result.problems.extend(found.problems)
        result.warnings.extend(found.warnings)
    return result


def _not_a_split_folder(manifest: SiteManifest, folder: Path, splits: dict[str, Split]) -> Problem:
    return Problem(
        str(folder),
        "not a split folder; ignored",
        f"layout 'imagefolder' expects root/<split>/<class>/<image> with split folders "
        f"{sorted(splits)} (set layout_options.splits to map other names), or root/<class>/"
        f"<image> with class folders named as [labels] declares them ({sorted(manifest.labels)})",
    )
