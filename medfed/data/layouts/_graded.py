"""Helpers of the DR grading layouts (APTOS, EyePACS, IDRiD): an image folder labelled by a
table whose grade column holds ICDR grades 0-4."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from medfed.config import SiteManifest
from medfed.core.errors import DataError
from medfed.data.grading import DEFAULT_GRADE_NAMES
from medfed.data.layouts._common import (
    PatientIds,
    list_images,
    match_label_rows,
    option_table,
    read_table,
    require_classes,
    where,
)
from medfed.data.records import LayoutScan, Problem, Record, Split

GRADED_OPTIONS = {"grade_names", "patient_regex"}


def grade_names(manifest: SiteManifest) -> dict[str, str]:
    """layout_options.grade_names (grade value -> class), the ICDR names by default."""
    names = option_table(manifest, "grade_names", DEFAULT_GRADE_NAMES)
    require_classes(manifest, names.values(), "layout_options.grade_names")
    return names


@dataclass(frozen=True)
class GradedSet:
    """One image folder and the table that grades it."""

    folder: Path
    table: Path
    image_column: str
    grade_column: str
    split: Split | None
    layout: str
    suffix_in_table: bool = False  # whether the table's image names carry the file suffix


def scan_graded_set(
    manifest: SiteManifest,
    spec: GradedSet,
    out: LayoutScan,
    patient_of: Callable[[Path], str] | None = None,
) -> None:
    """Add the records of ``spec`` to ``out``, and every mismatch as a problem.

    ``patient_of``: the layout's own patient id rule (EyePACS: ``10_left`` -> ``10``); used
    unless layout_options.patient_regex is set.
    """
    names = grade_names(manifest)
    patient_ids = PatientIds(manifest)
    if not spec.folder.is_dir():
        out.problems.append(_missing(spec.folder, spec.layout))
        return
    images, problems, strays = list_images(spec.folder)
    out.problems.extend(problems)
    out.warnings.extend(strays)
    try:
        rows = read_table(spec.table, [spec.image_column, spec.grade_column])
    except DataError as exc:
        out.problems.append(_table_problem(spec, exc, len(images)))
        return

    def accept(place: str, image: Path, name: str, value: str) -> bool:
        if value not in names:
            out.problems.append(_bad_grade(manifest, place, name, value, names))
            return False
        out.records.append(
            _record(manifest, image, names[value], value, spec.split, patient_ids, patient_of, out)
        )
        return True

    columns = (spec.image_column, spec.grade_column)
    found_in = (spec.table, spec.folder)
    match_label_rows(rows, images, found_in, columns, accept, out.problems, what="grade")


def _record(
    manifest: SiteManifest,
    image: Path,
    class_name: str,
    grade: str,
    split: Split | None,
    patient_ids: PatientIds,
    patient_of: Callable[[Path], str] | None,
    out: LayoutScan,
) -> Record:
    if patient_of is not None and patient_ids.pattern is None:
        patient_id = patient_of(image)
    else:
        patient_id, problem = patient_ids(image)
        if problem is not None:
            out.problems.append(problem)
    return Record(
        path=image,
        label=manifest.labels[class_name],
        patient_id=patient_id,
        split=split,
        meta={"source_file": image.name, "class_name": class_name, "grade": grade},
    )


def _missing(folder: Path, layout: str) -> Problem:
    return Problem(
        str(folder),
        f"expected folder {folder} is missing",
        f"layout {layout!r} expects its images there; check 'root' in the manifest",
    )


def _table_problem(spec: GradedSet, exc: DataError, n_images: int) -> Problem:
    table = spec.table
    message = "label file not found" if not table.is_file() else str(exc).removeprefix(f"{table}: ")
    return Problem(
        str(table),
        f"{message}; the {n_images} image(s) in {spec.folder} are not used",
        f"layout {spec.layout!r} expects a table with columns {spec.image_column!r} and "
        f"{spec.grade_column!r}; fix the table or 'root'",
    )


def _bad_grade(
    manifest: SiteManifest, place: str, name: str, value: str, names: dict[str, str]
) -> Problem:
    return Problem(
        place,
        f"image {name!r} has grade {value!r}, which is not one of {sorted(names)}; not used",
        f"fix the grade, or map it to a class in layout_options.grade_names of {where(manifest)}",
    )
