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
        # A message whose first clause already names its file ("FILE: ...", as decoders' errors
        # start, or "no camera field found in FILE: ...") is not prefixed with it again.
        head = self.message.split(": ", 1)[0]
        named = bool(self.file) and (
            head == self.file
            or head.endswith(f" {self.file}")
            or head.startswith(f"{self.file.rstrip('/')}/")  # a file in the record's folder
        )
        text = self.message if named else f"{self.file}: {self.message}"
        return f"{text} ({self.hint})" if self.hint else text


@dataclass
class LayoutScan:
    """What a layout reader found: the records, the problems it met on the way, and warnings.

    Problems block training until fixed; warnings (stray files that are not scans, ignored)
    are listed by ``medfed sites check`` but do not stop the site from joining.
    """

    records: list[Record]
    problems: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
