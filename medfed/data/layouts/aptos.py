"""APTOS 2019 blindness detection: ``train_images/<id_code>.png`` graded by ``train.csv``
(columns ``id_code``, ``diagnosis``: ICDR grade 0-4). One image per patient."""

from __future__ import annotations

from medfed.config import SiteManifest
from medfed.data.layouts._common import check_options
from medfed.data.layouts._graded import GRADED_OPTIONS, GradedSet, scan_graded_set
from medfed.data.records import LayoutScan

IMAGES = "train_images"
TABLE = "train.csv"
IMAGE_COLUMN, GRADE_COLUMN = "id_code", "diagnosis"


def scan(manifest: SiteManifest) -> LayoutScan:
    """List the APTOS training images with their grades; no pixels are decoded."""
    check_options(manifest, GRADED_OPTIONS)
    spec = GradedSet(
        manifest.root / IMAGES, manifest.root / TABLE, IMAGE_COLUMN, GRADE_COLUMN, None, "aptos"
    )
    result = LayoutScan([], [])
    scan_graded_set(manifest, spec, result)
    result.records.sort(key=lambda r: r.path)
    return result
