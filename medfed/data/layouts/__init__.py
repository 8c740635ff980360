"""Layout readers: one module per on-disk layout, each with ``scan(manifest) -> LayoutScan``.

A reader lists the scans of a site and their labels; it does not decode pixels (that is
``medfed.data.io``). Problems it meets (an empty class folder, a label file naming a missing
image) are returned, never swallowed. Labels come only from what the manifest declares.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module

from medfed.config import LAYOUTS_BY_MODALITY, SiteManifest
from medfed.core.errors import DataError, ManifestError
from medfed.data.records import LayoutScan

# Every layout a manifest may name (config.LAYOUTS_BY_MODALITY), each a module of this package.
LAYOUT_MODULES = tuple(layout for names in LAYOUTS_BY_MODALITY.values() for layout in names)


def get_reader(layout: str) -> Callable[[SiteManifest], LayoutScan]:
    """The ``scan`` function of a layout's module."""
    if layout not in LAYOUT_MODULES:
        raise ManifestError(f"unknown layout {layout!r}; choose one of {list(LAYOUT_MODULES)}")
    return import_module(f"medfed.data.layouts.{layout}").scan


def scan_site(manifest: SiteManifest) -> LayoutScan:
    """List a site's records. Raises ManifestError when the root itself is missing."""
    where = manifest.manifest_path or manifest.id
    if not manifest.root.exists():
        raise ManifestError(
            f"{where}: data root {manifest.root} does not exist; fix 'root' in the manifest "
            "(or set the environment variable it uses)"
        )
    if not manifest.root.is_dir():
        raise ManifestError(f"{where}: data root {manifest.root} is not a folder")
    reader = get_reader(manifest.layout)
    try:
        return reader(manifest)
    except PermissionError as exc:
        raise DataError(
            f"{exc.filename or manifest.root}: permission denied while listing the site's files; "
            "give this user read access to every folder and file under the root"
        ) from exc
