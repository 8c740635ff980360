"""REFUGE: ``Training400/<class folder>/*.jpg`` plus image sets labelled by .csv/.xlsx tables."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medfed.config import SiteManifest
from medfed.core.errors import DataError, ManifestError
from medfed.data.disc import META_KEY, DiscPosition, parse_coordinate
from medfed.data.io import IMAGE_SUFFIXES
from medfed.data.layouts._common import (
    PatientIds,
    check_options,
    list_images,
    make_record,
    match_label_rows,
    option_table,
    parse_split,
    read_table,
    require_classes,
    resolve_inside,
    resolve_under,
    scan_class_folders,
    where,
)
from medfed.data.records import LayoutScan, Problem, Record, Split

TRAIN_FOLDER = "Training400"
DEFAULT_CLASS_FOLDERS = {"Glaucoma": "glaucoma", "Non-Glaucoma": "normal"}
DEFAULT_LABEL_VALUES = {"1": "glaucoma", "0": "normal"}
DEFAULT_LABEL_FILES: tuple[dict[str, str], ...] = (
    {"images": "Validation400", "file": "Validation400-GT/labels.xlsx", "split": "val"},
    {"images": "Test400", "file": "Test400-GT/labels.csv", "split": "test"},
)
_LABEL_FILE_KEYS = {
    "images",
    "file",
    "image_column",
    "label_column",
    "split",
    "disc_x_column",
    "disc_y_column",
}


@dataclass(frozen=True)
class LabelFile:
    """An image folder whose labels are in a table, one row per image."""

    images: str
    file: str
    split: Split
    image_column: str = "ImgName"
    label_column: str = "Glaucoma Label"
    declared: bool = True  # listed in the manifest, so its folder must exist
    # Columns giving each photo's optic disc centre in pixels ("": the table gives none)
    disc_x_column: str = ""
    disc_y_column: str = ""


def label_files(manifest: SiteManifest) -> list[LabelFile]:
    """layout_options.label_files, validated; the REFUGE defaults when absent."""
    declared = "label_files" in manifest.layout_options
    entries: Any = manifest.layout_options.get("label_files", DEFAULT_LABEL_FILES)
    if not isinstance(entries, list | tuple):
        raise ManifestError(
            f"{where(manifest)}: layout_options.label_files must be an array of tables, e.g. "
            '[{images = "Validation400", file = "Validation400-GT/labels.xlsx", split = "val"}]'
        )
    return [_label_file(manifest, entry, i, declared) for i, entry in enumerate(entries)]


def _label_file(manifest: SiteManifest, entry: object, i: int, declared: bool) -> LabelFile:
    setting = f"layout_options.label_files[{i}]"
    if not isinstance(entry, Mapping):
        raise ManifestError(f"{where(manifest)}: {setting} must be a table, got {entry!r}")
    unknown = set(entry) - _LABEL_FILE_KEYS
    missing = {"images", "file", "split"} - set(entry)
    if unknown or missing:
        raise ManifestError(
            f"{where(manifest)}: {setting} has unknown key(s) {sorted(unknown)} and lacks "
            f"{sorted(missing)}; keys: {sorted(_LABEL_FILE_KEYS)} (images, file, split required)"
        )
    texts = {k: v for k, v in entry.items() if k != "split"}
    if not all(isinstance(v, str) and v for v in texts.values()):
        raise ManifestError(f"{where(manifest)}: {setting}: {sorted(texts)} must be non-empty text")
    split = parse_split(manifest, entry["split"], f"{setting}.split")
    if ("disc_x_column" in entry) != ("disc_y_column" in entry):
        raise ManifestError(
            f"{where(manifest)}: {setting} names one disc column; give both disc_x_column and "
            "disc_y_column (the disc centre's pixels), or neither"
        )
    return LabelFile(**texts, split=split, declared=declared)


def scan(manifest: SiteManifest) -> LayoutScan:
    """List REFUGE images: the class-folder training set and every labelled image set."""
    check_options(
        manifest, {"class_folders", "label_files", "label_values", "patient_regex", "disc_masks"}
    )
    class_folders = option_table(manifest, "class_folders", DEFAULT_CLASS_FOLDERS)
    require_classes(manifest, class_folders.values(), "layout_options.class_folders")
    label_values = option_table(manifest, "label_values", DEFAULT_LABEL_VALUES)
    require_classes(manifest, label_values.values(), "layout_options.label_values")
    sets = label_files(manifest)
    patient_ids = PatientIds(manifest)

    result = LayoutScan([], [])
    train = manifest.root / TRAIN_FOLDER
    if train.is_dir():
        found = scan_class_folders(manifest, train, Split.TRAIN, patient_ids, class_folders)
        result.records.extend(found.records)
        result.problems.extend(found.problems)
        result.warnings.extend(found.warnings)
    else:
        result.problems.append(_missing(train, f"{TRAIN_FOLDER}/<class folder>/*.jpg"))
    for i, spec in enumerate(sets):
        setting = f"layout_options.label_files[{i}]"
        folder = resolve_inside(manifest, spec.images, f"{setting}.images")
        resolve_inside(manifest, spec.file, f"{setting}.file")
        if folder.is_dir():
            _scan_labelled_set(manifest, spec, folder, label_values, patient_ids, result)
        elif spec.declared:
            result.problems.append(_missing(folder, "each images folder of label_files"))
    masks = manifest.layout_options.get("disc_masks")
    if masks is not None:
        _add_disc_masks(manifest, masks, result)
    result.records.sort(key=lambda r: r.path)
    return result


def _add_disc_masks(manifest: SiteManifest, masks: object, out: LayoutScan) -> None:
    """Give each record without a table's disc position its disc mask: the image file of the
    same stem anywhere under the ``disc_masks`` folder. A photo without one is a problem."""
    if not isinstance(masks, str) or not masks:
        raise ManifestError(
            f"{where(manifest)}: layout_options.disc_masks must be a folder name, e.g. "
            'disc_masks = "Disc_Cup_Masks"'
        )
    folder = resolve_inside(manifest, masks, "layout_options.disc_masks")
    if not folder.is_dir():
        out.problems.append(_missing(folder, "the disc_masks folder"))
        return
    by_stem: dict[str, list[Path]] = {}
    for path in sorted(folder.rglob("*")):
        if path.suffix.lower() in IMAGE_SUFFIXES and path.is_file():
            by_stem.setdefault(path.stem, []).append(path)
    for record in out.records:
        if META_KEY in record.meta:
            continue  # the table's position comes first
        found = by_stem.get(record.path.stem, [])
        if len(found) == 1:
            record.meta[META_KEY] = DiscPosition(str(found[0]), mask=found[0])
            continue
        message = (
            f"no disc mask named {record.path.stem}.* under {folder}"
            if not found
            else f"{len(found)} disc masks named {record.path.stem}.* under {folder}"
        )
        out.problems.append(
            Problem(
                str(record.path),
                message,
                "add its mask (one per photo), or drop disc_masks from layout_options",
            )
        )


def _missing(expected: Path, what: str) -> Problem:
    return Problem(
        str(expected),
        f"expected folder {expected} is missing",
        f"layout 'refuge' expects {what} under the site root; check 'root' and [layout_options]",
    )


def _scan_labelled_set(
    manifest: SiteManifest,
    spec: LabelFile,
    folder: Path,
    label_values: dict[str, str],
    patient_ids: PatientIds,
    out: LayoutScan,
) -> None:
    """Add the records of one table-labelled image folder, and every mismatch, to ``out``."""
    images, problems, strays = list_images(folder)
    out.problems.extend(problems)
    out.warnings.extend(strays)
    table = resolve_under(manifest.root, spec.file)
    disc_columns = [c for c in (spec.disc_x_column, spec.disc_y_column) if c]
    try:
        rows = read_table(table, [spec.image_column, spec.label_column, *disc_columns])
    except DataError as exc:
        out.problems.append(_table_problem(table, exc, len(images), folder))
        return
    by_name: dict[str, dict[str, str]] = {}
    for row in rows:
        by_name.setdefault(row[spec.image_column], row)

    def accept(place: str, image: Path, name: str, value: str) -> bool:
        if value not in label_values:
            out.problems.append(_bad_value(place, name, value, label_values))
            return False
        class_name = label_values[value]
        record = make_record(manifest, image, class_name, spec.split, patient_ids, out.problems)
        if disc_columns:
            try:
                _add_table_disc(record, by_name[name], spec, place)
            except DataError as exc:
                out.problems.append(Problem(place, str(exc).removeprefix(f"{place}: ")))
                return False
        out.records.append(record)
        return True

    columns = (spec.image_column, spec.label_column)
    match_label_rows(rows, images, (table, folder), columns, accept, out.problems)


def _table_problem(table: Path, exc: DataError, n_images: int, folder: Path) -> Problem:
    message = "label file not found" if not table.is_file() else str(exc).removeprefix(f"{table}: ")
    return Problem(
        str(table),
        f"{message}; the {n_images} image(s) in {folder} are not used",
        "fix the table, or its 'file' / column names in layout_options.label_files",
    )


def _bad_value(place: str, name: str, value: str, label_values: dict[str, str]) -> Problem:
    return Problem(
        place,
        f"image {name!r} has label value {value!r}, which layout_options.label_values does not "
        f"map to a class (known values: {sorted(label_values)}); not used",
        "fix the value, or add it to layout_options.label_values",
    )


def _add_table_disc(record: Record, row: dict[str, str], spec: LabelFile, place: str) -> None:
    """The disc centre a table row gives ``record`` (both cells empty: none, estimated)."""
    x, y = row[spec.disc_x_column].strip(), row[spec.disc_y_column].strip()
    if not x and not y:
        return
    position = DiscPosition(
        place,
        x=parse_coordinate(x, spec.disc_x_column, place),
        y=parse_coordinate(y, spec.disc_y_column, place),
    )
    record.meta[META_KEY] = position
