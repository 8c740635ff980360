"""DICOM instances as medfed reads them: which modality they are, their identifiers, and the
file (a photo) or folder (a CT series) that routing reads.

A fundus photo arrives as a DICOM object (Ophthalmic Photography, Secondary Capture): its
pixels are written as a PNG beside it, which is what a site's photos are trained on; a CT
series is written as its DICOM files, one folder per series.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from medfed.core.errors import DataError
from medfed.core.fileio import private_dir, private_file

if TYPE_CHECKING:
    from pydicom.dataset import Dataset

# DICOM Modality (0008,0060) values read as each of medfed's modalities.
PHOTO_MODALITIES = frozenset({"OP", "XC", "OT", "SC"})
DICOM_MODALITIES = {"fundus": PHOTO_MODALITIES, "ct": frozenset({"CT"})}
# Objects medfed itself writes or that carry no image: never routed.
NOT_IMAGES = frozenset({"SR", "DOC", "PR", "KO", "REG", "SEG"})
_UID = re.compile(r"^[0-9.]{1,64}$")
PACS_PREFIX = "pacs:"  # how the audit log names a scan from a PACS: pacs:STUDY/SERIES[/SOP]


@dataclass(frozen=True)
class Ids:
    """Where a scan sits in the PACS: its study, series and (for a photo) instance."""

    study: str
    series: str
    instance: str | None = None

    @property
    def key(self) -> str:
        """What is answered once: a CT series, or one photo."""
        return f"{self.study}/{self.series}" + (f"/{self.instance}" if self.instance else "")

    @property
    def name(self) -> str:
        """The scan's name in the audit log (and so on the dashboard's pages)."""
        return PACS_PREFIX + self.key


def ids_from_name(name: str) -> Ids | None:
    """The identifiers in an audit log name written by :attr:`Ids.name`, else None (an upload
    or a file routed by path)."""
    if not name.startswith(PACS_PREFIX):
        return None
    parts = name[len(PACS_PREFIX) :].split("/")
    if len(parts) not in (2, 3) or not all(_UID.match(p) for p in parts):
        return None
    return Ids(parts[0], parts[1], parts[2] if len(parts) == 3 else None)


def with_pacs_ids(table: Any, run: Path | None = None) -> Any:
    """``table`` (a DataFrame with a ``file`` column, as the dashboard's Routing and Review
    pages show) with what a clinician finds each scan from a PACS by beside its file: its
    accession number, patient identifier (by the run's ``--patient-ids`` policy) and study
    date as ``run``'s PACS log recorded them, then its study UID (blank for uploads and files);
    unchanged when none came from a PACS."""
    ids = [ids_from_name(str(name)) for name in table["file"]]
    if not any(ids):
        return table
    visits = run_visits(run) if run is not None else {}
    found = [visits.get(i.key) if i else None for i in ids]
    at = list(table.columns).index("file") + 1
    table = table.copy()
    columns = {
        "accession": [v.accession if v else "" for v in found],
        "patient": [v.patient if v else "" for v in found],
        "study date": [v.study_date if v else "" for v in found],
        "study": [i.study if i else "" for i in ids],
    }
    for offset, (name, values) in enumerate(columns.items()):
        table.insert(at + offset, name, values)
    return table


def run_visits(run: Path) -> dict[str, Any]:
    """Scan key -> its :class:`medfed.clinic.pacs.visits.Visit`, from the run's PACS log (empty when
    it has none or it cannot be read: the table then shows the UIDs alone)."""
    from medfed.clinic.pacs.records import PacsLog
    from medfed.clinic.pacs.visits import Visit
    from medfed.core.errors import MedfedError

    try:
        scans = PacsLog(run).scans()
    except MedfedError:
        return {}
    return {s.key: Visit(s.accession, s.patient, s.study_date) for s in scans}


def uid(value: object, what: str) -> str:
    """A DICOM UID as text; DataError when it is missing or malformed (it must not name a path)."""
    text = str(value or "").strip()
    if not _UID.match(text):
        raise DataError(f"the {what} {text!r} is not a DICOM UID (digits and dots, at most 64)")
    return text


def modality_of(ds: Dataset) -> str:
    return str(ds.get("Modality", "") or "").strip().upper()


def kind_of(modality: str) -> str | None:
    """medfed's modality for a DICOM Modality value, or None when medfed routes no such scan."""
    for kind, values in DICOM_MODALITIES.items():
        if modality in values:
            return kind
    return None


def photo_pixels(ds: Dataset, where: str) -> np.ndarray:
    """A photo's pixels as uint8 RGB (height, width, 3); DataError naming ``where`` otherwise."""
    try:
        pixels = np.asarray(ds.pixel_array)
    except Exception as exc:  # pydicom raises many kinds on missing or undecodable pixel data
        raise DataError(f"{where}: the photo's pixels cannot be decoded ({exc})") from exc
    interpretation = str(ds.get("PhotometricInterpretation", "")).upper()
    if interpretation.startswith("YBR") and pixels.ndim == 3:
        from pydicom.pixels import convert_color_space

        pixels = convert_color_space(pixels, interpretation, "RGB")
    if pixels.ndim == 2:
        pixels = np.repeat(pixels[..., None], 3, axis=-1)
    if pixels.ndim != 3 or pixels.shape[-1] != 3:
        raise DataError(
            f"{where}: a photo of shape {pixels.shape} (several frames?); medfed routes one "
            "RGB or greyscale photo per instance"
        )
    if pixels.dtype != np.uint8:
        top = float(pixels.max()) or 1.0
        pixels = np.clip(pixels.astype(np.float64) / top * 255.0, 0, 255).astype(np.uint8)
    return pixels


def write_photo(ds: Dataset, folder: Path, where: str) -> Path:
    """The photo ``ds`` as ``folder/photo.png``."""
    from PIL import Image

    private_dir(folder)
    path = folder / "photo.png"
    Image.fromarray(photo_pixels(ds, where)).save(path)
    return private_file(path)


def write_series(datasets: list[Dataset], folder: Path) -> Path:
    """A CT series' instances as DICOM files in ``folder`` (the folder routing reads)."""
    private_dir(folder)
    for i, ds in enumerate(datasets):
        ds.save_as(folder / f"{i:05d}.dcm", enforce_file_format=True)
        private_file(folder / f"{i:05d}.dcm")
    return folder
