"""Reads exchanged as CSV with sites that read outside the dashboard: the worksheet's columns,
writing it (spreadsheet formulas neutralised), reading it back with every line checked, and the
figures CSV.

A worksheet is blinded by default: it holds no model answer (``prediction``,
``prediction_prob``), so a reader filling it in has not seen it; the reads of a worksheet with
those columns are recorded as made after seeing the model's answer.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from medfed.clinic.audit import AuditEntry
from medfed.clinic.review_figures import FIGURE_COLUMNS, Prospective, ReviewError
from medfed.core.fileio import atomic_write

READ_COLUMNS: tuple[str, ...] = ("scan_id", "read_id", "reader", "read", "note", "time")
"""Columns an imported reads file may hold besides the context ones; scan_id, reader and read
are required."""
ANSWER_COLUMNS: tuple[str, ...] = ("prediction", "prediction_prob")
"""The model's answer: in a worksheet only when exported unblinded."""
EXPORT_COLUMNS: tuple[str, ...] = (
    "scan_id",
    "routed_time",
    "file",
    "sha256",
    "status",
    "chosen_site",
    "read_id",
    "reader",
    "read",
    "note",
    "time",
)
"""Columns of an exported (blinded) reads file: one row per reader's current read, and one
blank row per scan not yet read (fill in reader and read). Import identifies a read by read_id
(when given) or by its scan and reader, checks sha256 against the log where given, and ignores
the other context columns."""
UNBLINDED_COLUMNS: tuple[str, ...] = (*EXPORT_COLUMNS[:6], *ANSWER_COLUMNS, *EXPORT_COLUMNS[6:])
"""Columns of a reads file exported with the model's answer (``--unblinded``)."""
REQUIRED_COLUMNS: tuple[str, ...] = ("scan_id", "reader", "read")
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
"""How a cell that a spreadsheet would run as a formula starts; such a cell is written with a
leading ``'`` (shown, not run), which import takes off again."""
FIX_CSV = "Correct the line and import the file again"
FIX_CSV_FILE = "Correct the file and import it again; nothing was imported."


def neutralised(value: Any) -> Any:
    """A text cell a spreadsheet would take for a formula, led by ``'``; anything else as is."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def restored(text: str) -> str:
    """A cell as it was before :func:`neutralised` wrote it."""
    if text.startswith("'") and text[1:].startswith(FORMULA_STARTS):
        return text[1:]
    return text


@dataclass(frozen=True)
class ImportResult:
    """What an import did with each line: ``new`` reads written, ``unchanged`` lines (reads the
    log already holds as given), ``amended`` reads (a reader's changed read, written as a new
    read that names the one it amends), ``blank`` worksheet rows, and ``refused`` lines (CSV
    line, why), of which nothing was written."""

    new: int = 0
    unchanged: int = 0
    amended: int = 0
    blank: int = 0
    refused: tuple[tuple[int, str], ...] = field(default=())

    @property
    def added(self) -> int:
        """Reads written (new and amended)."""
        return self.new + self.amended

    @property
    def skipped(self) -> int:
        """Lines that wrote nothing and were not refused (blank and unchanged)."""
        return self.blank + self.unchanged

    def describe(self) -> str:
        """``2 new, 1 unchanged, 0 amended, 0 refused (3 blank rows skipped)``."""
        text = (
            f"{self.new} new, {self.unchanged} unchanged, {self.amended} amended, "
            f"{len(self.refused)} refused"
        )
        if self.refused:
            text += f" (line {', '.join(str(line) for line, _ in self.refused)})"
        return text + (f"; {self.blank} blank row(s) skipped" if self.blank else "")


def export_row(
    scan_id: int, e: AuditEntry, read: Mapping[str, Any], *, unblinded: bool = False
) -> dict[str, Any]:
    """One worksheet row: the scan's context, then ``read`` (read_id, reader, read, note,
    time; empty for a scan to read); the model's answer only when ``unblinded``."""
    row = {
        "scan_id": scan_id,
        "routed_time": e.time,
        "file": e.file,
        "sha256": e.sha256,
        "status": e.status,
        "chosen_site": e.chosen_site or "",
        **{c: read.get(c, "") for c in ("read_id", "reader", "read", "note", "time")},
    }
    if unblinded:
        prob = e.to_dict()["prediction_prob"]
        row["prediction"] = e.prediction or ""
        row["prediction_prob"] = "" if prob is None else f"{prob:.4f}"
    return row


# ---------------------------------------------------------------------------- CSV files
def write_csv(path: Path, columns: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> None:
    """Write ``rows`` as CSV, every text cell a spreadsheet would run neutralised."""
    if path.is_dir():
        raise ReviewError(f"{path} is a folder; give the CSV file to write")
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: "" if row.get(c) is None else neutralised(row[c]) for c in columns})
    atomic_write(path, buffer.getvalue())


def write_figures_csv(figures: Prospective, path: str | Path) -> int:
    """Write the figures (:data:`FIGURE_COLUMNS`, one row per scope and figure); returns the
    rows written."""
    rows = figures.rows()
    write_csv(Path(path), FIGURE_COLUMNS, rows)
    return len(rows)


def read_csv(path: Path) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    """The header and the rows (with their line numbers) of a reads file, its columns checked."""
    if path.is_dir():
        raise ReviewError(f"{path} is a folder; give the reads CSV file to import")
    if not path.is_file():
        raise ReviewError(f"{path}: no such file; give the reads CSV to import")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ReviewError(f"{path}: not UTF-8 text ({exc}); save the file as UTF-8 CSV") from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        header = [str(h).strip() for h in (reader.fieldnames or [])]
        reader.fieldnames = header
        rows = [(reader.line_num, row) for row in reader]
    except csv.Error as exc:
        raise ReviewError(
            f"{path}, line {reader.line_num}: not valid CSV ({exc}). {FIX_CSV_FILE}"
        ) from None
    if not header:
        raise ReviewError(
            f"{path}: empty file; give a CSV with the columns {', '.join(REQUIRED_COLUMNS)} "
            "(and optionally read_id, note, time), e.g. from 'medfed review RUN --export'"
        )
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise ReviewError(
            f"{path}, line 1: missing column(s) {', '.join(missing)}; the header must name "
            f"{', '.join(REQUIRED_COLUMNS)} (and optionally read_id, note, time). {FIX_CSV_FILE}"
        )
    unknown = [c for c in header if c not in UNBLINDED_COLUMNS]
    repeated = sorted({c for c in header if header.count(c) > 1})
    if unknown or repeated:
        what = f"unknown column(s) {', '.join(map(repr, unknown))}" if unknown else ""
        what += ("; " if what else "") + (
            f"repeated column(s) {', '.join(repeated)}" if repeated else ""
        )
        raise ReviewError(
            f"{path}, line 1: {what}; accepted columns: {', '.join(UNBLINDED_COLUMNS)}. "
            + FIX_CSV_FILE
        )
    for line, row in rows:
        if None in row:  # more cells than the header names
            raise ReviewError(
                f"{path}, line {line}: more cells than the header has columns; quote cells "
                f'that hold commas ("a, b"). {FIX_CSV_FILE}'
            )
    return header, rows
