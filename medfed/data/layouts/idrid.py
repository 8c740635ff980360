"""IDRiD disease grading: ``B. Disease Grading/1. Original Images/{a. Training Set,b. Testing
Set}/IDRiD_NNN.jpg`` graded by the two CSV files under ``2. Groundtruths`` (columns
``Image name``, ``Retinopathy grade``: ICDR grade 0-4). The layout's own train/test split
is kept."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from medfed.config import SiteManifest
from medfed.data.layouts._common import check_options
from medfed.data.layouts._graded import GRADED_OPTIONS, GradedSet, scan_graded_set
from medfed.data.records import LayoutScan, Problem, Split

BASE = "B. Disease Grading"
IMAGES = "1. Original Images"
TRUTHS = "2. Groundtruths"
SETS = (
    ("a. Training Set", "a. IDRiD_Disease Grading_Training Labels.csv", Split.TRAIN),
    ("b. Testing Set", "b. IDRiD_Disease Grading_Testing Labels.csv", Split.TEST),
)
IMAGE_COLUMN, GRADE_COLUMN = "Image name", "Retinopathy grade"
EDEMA_COLUMN = "Risk of macular edema "  # the trailing space is the published file's


def patient_of(folder: str, image: Path) -> str:
    """``a-IDRiD_001``: both sets number their images from IDRiD_001, and they are other
    patients, so the set's letter keeps them apart."""
    return f"{folder[0]}-{image.stem}"


def scan(manifest: SiteManifest) -> LayoutScan:
    """List the IDRiD grading images of both sets with their grades and split."""
    check_options(manifest, GRADED_OPTIONS)
    base = manifest.root / BASE
    result = LayoutScan([], [])
    if not base.is_dir():
        result.problems.append(
            Problem(
                str(base),
                f"expected folder {base} is missing",
                f"layout 'idrid' expects root/{BASE}/{{{IMAGES},{TRUTHS}}}; check 'root'",
            )
        )
        return result
    for folder, table, split in SETS:
        spec = GradedSet(
            base / IMAGES / folder,
            base / TRUTHS / table,
            IMAGE_COLUMN,
            GRADE_COLUMN,
            split,
            "idrid",
        )
        scan_graded_set(manifest, spec, result, patient_of=partial(patient_of, folder))
    result.records.sort(key=lambda r: r.path)
    return result
