"""EyePACS (Kaggle DR detection 2015): ``train/<patient>_<left|right>.jpeg`` graded by
``trainLabels.csv`` (columns ``image``, ``level``: ICDR grade 0-4). Both eyes of a patient
share its patient id, so splits and patient-level intervals keep them together."""

from __future__ import annotations

from pathlib import Path

from medfed.config import SiteManifest
from medfed.data.layouts._common import check_options
from medfed.data.layouts._graded import GRADED_OPTIONS, GradedSet, scan_graded_set
from medfed.data.records import LayoutScan

IMAGES = "train"
TABLE = "trainLabels.csv"
IMAGE_COLUMN, GRADE_COLUMN = "image", "level"
EYES = ("_left", "_right")


def patient_of(image: Path) -> str:
    """``10_left.jpeg`` -> ``10``; a name without an eye suffix is its own patient."""
    stem = image.stem
    for eye in EYES:
        if stem.endswith(eye):
            return stem[: -len(eye)]
    return stem


def scan(manifest: SiteManifest) -> LayoutScan:
    """List the EyePACS training images with their grades; no pixels are decoded."""
    check_options(manifest, GRADED_OPTIONS)
    spec = GradedSet(
        manifest.root / IMAGES, manifest.root / TABLE, IMAGE_COLUMN, GRADE_COLUMN, None, "eyepacs"
    )
    result = LayoutScan([], [])
    scan_graded_set(manifest, spec, result, patient_of=patient_of)
    result.records.sort(key=lambda r: r.path)
    return result
