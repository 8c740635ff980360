"""Image folder: ``<split>/<class>/<image>``, e.g. ``RIM/{Training,Testing}/{glaucoma,normal}``."""

from __future__ import annotations

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


def scan(manifest: SiteManifest) -> LayoutScan:
    """List ``root/<split>/<class>/<image>`` records; class folders must be declared labels."""
    check_options(manifest, {"splits", "patient_regex"})
    splits = split_folders(manifest)
    patient_ids = PatientIds(manifest)
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
            result.problems.append(
                Problem(
                    str(folder),
                    "not a split folder; ignored",
                    f"layout 'imagefolder' expects root/<split>/<class>/<image> with split "
                    f"folders {sorted(splits)} (set layout_options.splits to map other names)",
                )
            )
            continue
        found = scan_class_folders(manifest, folder, split, patient_ids)
        result.records.extend(found.records)
        result.problems.extend(found.problems)
        result.warnings.extend(found.warnings)
    if not result.records:
        result.problems.append(
            Problem(str(manifest.root), "no labelled images found under the site root")
        )
    result.records.sort(key=lambda r: r.path)
    return result
