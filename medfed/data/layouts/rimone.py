"""RIM-ONE DL: ``<partition>/{training_set,test_set}/<class>/*.png``."""

from __future__ import annotations

from pathlib import Path

from medfed.config import SiteManifest
from medfed.core.errors import ManifestError
from medfed.data.layouts._common import (
    STRAY_FILE,
    PatientIds,
    check_options,
    is_clutter,
    scan_class_folders,
    where,
)
from medfed.data.records import LayoutScan, Problem, Split

PARTITIONS = ("partitioned_by_hospital", "partitioned_randomly")
SPLIT_FOLDERS = {"training_set": Split.TRAIN, "test_set": Split.TEST}


def scan(manifest: SiteManifest) -> LayoutScan:
    """List the RIM-ONE DL images of one partition with labels and the layout's own split."""
    options = check_options(manifest, {"partition", "patient_regex"})
    partition = options.get("partition", PARTITIONS[0])
    if partition not in PARTITIONS:
        raise ManifestError(
            f"{where(manifest)}: layout_options.partition = {partition!r} is not a RIM-ONE DL "
            f"partition; use one of {list(PARTITIONS)}"
        )
    patient_ids = PatientIds(manifest)
    base = manifest.root / partition
    if not base.is_dir():
        return LayoutScan([], [_missing(base, manifest)])
    result = LayoutScan([], *_unexpected(base))
    for name, split in SPLIT_FOLDERS.items():
        folder = base / name
        if not folder.is_dir():
            result.problems.append(_missing(folder, manifest))
            continue
        found = scan_class_folders(manifest, folder, split, patient_ids)
        result.records.extend(found.records)
        result.problems.extend(found.problems)
        result.warnings.extend(found.warnings)
    if not result.records:
        result.problems.append(Problem(str(base), "no labelled images found in this partition"))
    result.records.sort(key=lambda r: r.path)
    return result


def _unexpected(base: Path) -> tuple[list[Problem], list[Problem]]:
    """Problems for unknown folders in the partition, warnings for stray files."""
    problems, strays = [], []
    for p in sorted(base.iterdir()):
        if p.is_file():
            strays.append(Problem(str(p), STRAY_FILE, f"expected {list(SPLIT_FOLDERS)} folders"))
        elif p.name not in SPLIT_FOLDERS and not is_clutter(p):
            problems.append(
                Problem(
                    str(p),
                    "not a RIM-ONE DL split folder; ignored",
                    f"expected {list(SPLIT_FOLDERS)}",
                )
            )
    return problems, strays


def _missing(expected: Path, manifest: SiteManifest) -> Problem:
    return Problem(
        str(expected),
        f"expected folder {expected} is missing",
        f"layout 'rimone' expects root/<partition>/{{training_set,test_set}}/<class>/*.png "
        f"under root {manifest.root}; check 'root' and layout_options.partition",
    )
