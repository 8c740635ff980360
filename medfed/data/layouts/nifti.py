"""NIfTI CT: ``*.nii`` / ``*.nii.gz`` at any depth under the root, labels.csv per patient."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from medfed.config import SiteManifest
from medfed.data.io import NIFTI_SUFFIXES, nifti_header_problem
from medfed.data.layouts._common import (
    LINE,
    check_options,
    is_clutter,
    is_inside,
    labels_file,
    read_patient_labels,
    resolve_under,
    site_files,
)
from medfed.data.records import LayoutScan, Problem, Record

STRAY_NIFTI = "not a *.nii / *.nii.gz file; ignored"


def nifti_stem(path: Path) -> str | None:
    """The file name without .nii / .nii.gz, or None when it is not a NIfTI file name."""
    name = path.name
    for suffix in NIFTI_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return None


def scan(manifest: SiteManifest) -> LayoutScan:
    """List one record per labelled patient: its NIfTI file (header read, pixels not)."""
    check_options(manifest, {"labels_file"})
    table = labels_file(manifest)
    every, problems = site_files(manifest.root)
    every = [p for p in every if p != table]
    files = [p for p in every if nifti_stem(p) and not is_clutter(p)]
    known = set(files)
    strays = [Problem(str(p), STRAY_NIFTI) for p in every if p not in known]
    if not files:
        problems.append(Problem(str(manifest.root), "no *.nii / *.nii.gz files found"))
    labels, label_problems = read_patient_labels(manifest, table, optional=("file",))
    problems.extend(label_problems)
    if labels is None:
        return LayoutScan([], problems, strays)
    by_stem: dict[str, list[Path]] = defaultdict(list)
    for path in files:
        by_stem[str(nifti_stem(path))].append(path)
    records: list[Record] = []
    used: set[Path] = set()
    for patient, (label, row) in sorted(labels.items()):
        path = _file_of(manifest.root, patient, row, by_stem, table, problems)
        if path is None:
            continue
        if path in used:
            problems.append(Problem(str(table), f"patient {patient!r}: {path} is already used"))
            continue
        used.add(path)
        meta = read_header(path, problems)
        if meta is not None:
            meta["source_file"] = _relative(path, manifest.root)
            records.append(Record(path=path, label=label, patient_id=patient, meta=meta))
    problems.extend(
        Problem(str(p), f"file has no row in {table}; not used", f"add a row for {p.name}")
        for p in files
        if p not in used
    )
    return LayoutScan(sorted(records, key=lambda r: r.path), problems, strays)


def _file_of(
    root: Path,
    patient: str,
    row: dict[str, str],
    by_stem: dict[str, list[Path]],
    table: Path,
    problems: list[Problem],
) -> Path | None:
    """The patient's file: the row's 'file' column, else the one file named after the patient."""
    file = row.get("file", "")
    if file:
        path = resolve_under(root, file)
        place = f"{table}:{row[LINE]}" if LINE in row else str(table)
        if not is_inside(root, path):
            problems.append(
                Problem(
                    place,
                    f"patient {patient!r}: file {file!r} points outside the site root {root}; "
                    "not used",
                    "move the file under the root and give its path relative to the root",
                )
            )
            return None
        if path.is_file():
            return path
        problems.append(
            Problem(place, f"patient {patient!r}: file {file!r} does not exist under {root}")
        )
        return None
    candidates = by_stem.get(patient, [])
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        message = f"patient {patient!r} is listed but no {patient}.nii(.gz) exists under the root"
    else:
        message = f"patient {patient!r} matches several files {[str(c) for c in candidates]}"
    problems.append(
        Problem(str(table), message, "add a 'file' column with the path relative to the root")
    )
    return None


def read_header(path: Path, problems: list[Problem]) -> dict[str, Any] | None:
    """Shape and voxel size from the NIfTI header, or None (and a problem) if it is unusable."""
    import nibabel as nib

    problem = nifti_header_problem(path)
    if problem is not None:
        problems.append(Problem(str(path), f"{problem}; not used"))
        return None
    try:
        image = nib.load(path)
        shape = tuple(int(n) for n in image.shape)
        zooms = tuple(float(z) for z in image.header.get_zooms()[:3])
    except Exception as exc:  # nibabel raises many unrelated types on damaged files
        problems.append(
            Problem(
                str(path),
                f"NIfTI header cannot be read ({exc}); not used",
                "replace the file with an intact copy",
            )  # fmt: skip
        )
        return None
    spatial = shape[:3] if all(n == 1 for n in shape[3:]) else shape
    if len(spatial) != 3:
        problems.append(
            Problem(
                str(path),
                f"image has shape {shape}; a CT volume must be 3-D; not used",
                "store one 3-D volume per file",
            )  # fmt: skip
        )
        return None
    return {"shape": spatial, "voxel_size": zooms}


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)
