"""The record every layout reader yields, and the problems it may report."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any


class Split(StrEnum):
    TRAIN = "train"
    VAL = "val"
    TEST = "test"


@dataclass(frozen=True)
class Record:
    """One scan of one patient.

    ``path`` is an image file, a NIfTI file, or a DICOM series folder (then ``files`` lists the
    slice files). ``split`` is the split the on-disk layout itself declares (for example RIM-ONE's
    ``test_set``), or ``None`` when the layout has no split of its own.
    """

    path: Path
    label: int
    patient_id: str
    split: Split | None = None
    files: tuple[Path, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def content_files(self) -> tuple[Path, ...]:
        """The files whose bytes make up this scan."""
        return self.files or (self.path,)


@dataclass(frozen=True)
class Problem:
    """Something wrong with a site's data: which file, what, and what to do."""

    file: str
    message: str
    hint: str = ""

    def __str__(self) -> str:
        text = f"{self.file}: {self.message}"
        return f"{text} ({self.hint})" if self.hint else text


@dataclass
class LayoutScan:
    """What a layout reader found: the records, and the problems it met on the way."""

    records: list[Record]
    problems: list[Problem] = field(default_factory=list)
