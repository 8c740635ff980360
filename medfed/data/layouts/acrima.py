"""ACRIMA: every JPEG directly in the root; glaucoma iff the file name contains ``_g_``."""

from __future__ import annotations

from medfed.config import SiteManifest
from medfed.data.layouts._common import (
    PatientIds,
    check_options,
    list_images,
    make_record,
    require_classes,
)
from medfed.data.records import LayoutScan, Problem

GLAUCOMA_MARK = "_g_"


def class_of(file_name: str) -> str:
    """ACRIMA's naming rule: ``Im310_g_ACRIMA.jpg`` is glaucoma, ``Im001_ACRIMA.jpg`` normal."""
    return "glaucoma" if GLAUCOMA_MARK in file_name.lower() else "normal"


def scan(manifest: SiteManifest) -> LayoutScan:
    """List the ACRIMA images of a site with their labels; no pixels are decoded."""
    check_options(manifest, {"patient_regex"})
    require_classes(manifest, ("glaucoma", "normal"), "layout 'acrima'")
    patient_ids = PatientIds(manifest)
    images, problems, strays = list_images(manifest.root)
    if not images:
        problems.append(
            Problem(
                str(manifest.root),
                "no images found directly in the site root",
                "layout 'acrima' expects files like Im001_ACRIMA.jpg and Im310_g_ACRIMA.jpg "
                "in the root itself; check 'root' in the manifest",
            )
        )
    records = [
        make_record(manifest, image, class_of(image.name), None, patient_ids, problems)
        for image in images
    ]
    return LayoutScan(sorted(records, key=lambda r: r.path), problems, strays)
