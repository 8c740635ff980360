"""DICOM CT: slice files at any depth under the root, one series per patient, labels.csv."""

from __future__ import annotations

import contextlib
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from medfed.config import SiteManifest
from medfed.data.io import DICOM_SUFFIX, dicom_read_error, permission_denied, probe_dicom
from medfed.data.layouts._common import (
    STRAY_FILE,
    check_options,
    is_clutter,
    labels_file,
    read_patient_labels,
    site_files,
)
from medfed.data.records import LayoutScan, Problem, Record

STRAY_DICOM = "neither *.dcm nor extension-less DICOM; ignored"
# DICOMDIR indexes a medium; it is DICOM but holds no image
_NOT_SLICES = frozenset({"dicomdir"})
_HEADER_TAGS = [
    "PatientID", "SeriesInstanceUID", "StudyInstanceUID", "Modality", "Manufacturer",
    "SeriesDescription", "Rows", "Columns", "SliceThickness", "NumberOfFrames",
]  # fmt: skip


@dataclass
class Series:
    """The header facts of one series, gathered slice by slice."""

    uid: str
    patient_id: str
    files: list[Path] = field(default_factory=list)
    grids: set[tuple[int, int]] = field(default_factory=set)
    header: dict[str, Any] = field(default_factory=dict)

    @property
    def folder(self) -> Path:
        """The deepest folder holding every slice."""
        return Path(os.path.commonpath([f.parent for f in self.files]))


def scan(manifest: SiteManifest) -> LayoutScan:
    """List one record per patient (their DICOM series) with the label from labels.csv."""
    check_options(manifest, {"labels_file"})
    table = labels_file(manifest)
    files, problems, strays = find_slice_files(manifest.root, skip=table)
    series = group_series(files, problems)
    by_patient = one_series_per_patient(series, problems)
    labels, label_problems = read_patient_labels(manifest, table)
    problems.extend(label_problems)
    if labels is None:
        return LayoutScan([], problems, strays)
    records = []
    for patient, chosen in sorted(by_patient.items()):
        if patient not in labels:
            problems.append(
                Problem(
                    str(chosen.folder),
                    f"series of patient {patient!r} has no row in {table}; not used",
                    f"add the row '{patient},<label>' to {table.name}",
                )
            )
            continue
        records.append(_record(chosen, labels[patient][0]))
    problems.extend(
        Problem(str(table), f"patient {p!r} is listed but has no DICOM series under the root")
        for p in sorted(set(labels) - set(by_patient))
    )
    return LayoutScan(sorted(records, key=lambda r: r.path), problems, strays)


def find_slice_files(root: Path, skip: Path) -> tuple[list[Path], list[Problem], list[Problem]]:
    """Candidate slices (``*.dcm`` and extension-less DICOM files, sorted), problems, and a
    warning for each other file (ignored)."""
    found: list[Path] = []
    strays: list[Problem] = []
    every, loops = site_files(root)
    for path in every:
        if path == skip or path.name.lower() in _NOT_SLICES:
            continue
        if is_clutter(path):
            strays.append(Problem(str(path), STRAY_FILE))
        elif path.suffix.lower() == DICOM_SUFFIX or (path.suffix == "" and probe_dicom(path)):
            found.append(path)
        else:
            strays.append(
                Problem(
                    str(path),
                    STRAY_DICOM,
                    "remove them, or give DICOM slices the .dcm extension",
                )
            )
    problems = list(loops)
    if not found:
        problems.append(Problem(str(root), "no DICOM slice files found under the site root"))
    return found, problems, strays


def group_series(files: list[Path], problems: list[Problem]) -> list[Series]:
    """Group slice files by SeriesInstanceUID; unreadable or odd files become problems."""
    series: dict[str, Series] = {}
    for path in files:
        header = read_header(path, problems)
        if header is None:
            continue
        uid, patient = str(header["SeriesInstanceUID"]), str(header["PatientID"])
        current = series.setdefault(uid, Series(uid=uid, patient_id=patient, header=header))
        if patient != current.patient_id:
            problems.append(
                Problem(
                    str(path),
                    f"PatientID {patient!r} differs from {current.patient_id!r} of other slices "
                    f"in series {uid}; slice ignored",
                )
            )
            continue
        current.files.append(path)
        current.grids.add((int(header["Rows"]), int(header["Columns"])))
    return [s for s in series.values() if _consistent(s, problems)]


def read_header(path: Path, problems: list[Problem]) -> dict[str, Any] | None:
    """The header tags the layout needs, or None (and a problem) when they cannot be had."""
    import pydicom

    try:
        ds = pydicom.dcmread(path, stop_before_pixels=True, specific_tags=_HEADER_TAGS)
        header = {tag: ds.get(tag) for tag in _HEADER_TAGS}
    except PermissionError:
        problems.append(Problem(str(path), permission_denied(path).removeprefix(f"{path}: ")))
        return None
    except Exception as exc:  # pydicom raises many unrelated types on damaged files
        problems.append(
            Problem(
                str(path),
                f"DICOM header cannot be read ({dicom_read_error(exc)}); file ignored",
                "replace the file with an intact copy, or remove it if it is not DICOM",
            )
        )
        return None
    missing = [t for t in ("PatientID", "SeriesInstanceUID", "Rows", "Columns") if not header[t]]
    if missing:
        problems.append(
            Problem(
                str(path),
                f"DICOM header lacks {missing}; file ignored",
                "a CT slice needs PatientID and SeriesInstanceUID to be grouped, Rows/Columns "
                "to be an image",
            )
        )
        return None
    if int(header["NumberOfFrames"] or 1) > 1:
        problems.append(
            Problem(
                str(path),
                "multi-frame (enhanced) DICOM is not supported; file ignored",
                "convert the series to single-frame slices or to NIfTI (e.g. with dcm2niix)",
            )
        )
        return None
    return header


def _consistent(series: Series, problems: list[Problem]) -> bool:
    if len(series.grids) == 1:
        return True
    problems.append(
        Problem(
            str(series.folder),
            f"series {series.uid} mixes slice sizes {sorted(series.grids)} (rows, columns); "
            "series not used",
            "export the series again; its slices must share one grid",
        )
    )
    return False


def one_series_per_patient(series: list[Series], problems: list[Problem]) -> dict[str, Series]:
    """Keep each patient's series with the most slices; report the others."""
    by_patient: dict[str, list[Series]] = defaultdict(list)
    for s in series:
        by_patient[s.patient_id].append(s)
    chosen = {}
    for patient, candidates in by_patient.items():
        candidates.sort(key=lambda s: (-len(s.files), s.uid))
        chosen[patient] = candidates[0]
        for dropped in candidates[1:]:
            problems.append(
                Problem(
                    str(dropped.folder),
                    f"patient {patient!r} has another series ({len(dropped.files)} slices, "
                    f"uid {dropped.uid}); the one with {len(candidates[0].files)} slices in "
                    f"{candidates[0].folder} is used",
                    "keep one series per patient under the site root",
                )
            )
    return chosen


def _record(series: Series, label: int) -> Record:
    header = series.header
    meta: dict[str, Any] = {
        "series_uid": series.uid,
        "n_slices": len(series.files),
        "rows": int(header["Rows"]),
        "columns": int(header["Columns"]),
    }
    for key, tag in (
        ("study_uid", "StudyInstanceUID"),
        ("manufacturer", "Manufacturer"),
        ("dicom_modality", "Modality"),
        ("series_description", "SeriesDescription"),
    ):
        if header[tag]:
            meta[key] = str(header[tag])
    # absent or malformed thickness is no loss: the decoder measures spacing from positions
    with contextlib.suppress(TypeError, ValueError):
        meta["slice_thickness"] = float(header["SliceThickness"])
    return Record(
        path=series.folder,
        label=label,
        patient_id=series.patient_id,
        files=tuple(sorted(series.files)),
        meta=meta,
    )
