"""The Review page's tables and the reader's name (no Streamlit): the queue, the reads, the
disagreements, and the name a sign-in proxy sends."""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from medfed.clinic.audit import AuditEntry

if TYPE_CHECKING:  # the Review page's types; the module itself loads only with that page
    from medfed.clinic.audit import ReadEntry
    from medfed.clinic.review import Disagreement, QueueItem

ABSTAINED_MARK = "abstained: not an answer"
"""How a table marks the models' outputs for a scan the federation abstained on."""


def answer_text(status: str, prediction: str | None) -> str:
    """A routed scan's prediction as tables show it; an abstained scan has none (marked so)."""
    if status == "abstained":
        return ABSTAINED_MARK
    return prediction or ""


def _number(value: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return math.nan


QUEUE_COLUMNS = [
    "scan",
    "priority",
    "routed (UTC)",
    "file",
    "chosen site",
    "top-2 margin",
    "reads",
]


def queue_frame(items: Sequence[QueueItem]) -> pd.DataFrame:
    """The review queue as a table, in queue order (one row per scan), without the model's
    answer: a read is made before seeing it."""
    rows = []
    for item in items:
        rows.append(
            {
                "scan": item.scan_id,
                "priority": item.priority,
                "routed (UTC)": item.time,
                "file": item.file,
                "chosen site": item.chosen_site or "abstain",
                "top-2 margin": _number(item.margin),
                "reads": len(item.reads),
            }
        )
    return pd.DataFrame(rows, columns=QUEUE_COLUMNS)


READS_COLUMNS = [
    "scan",
    "file",
    "chosen site",
    "prediction",
    "reader",
    "read",
    "note",
    "read (UTC)",
    "recorded (UTC)",
    "source",
]


HIDDEN_ANSWER = "hidden until you read it"
"""What a table shows for the model's answer of a scan the reader has not read yet."""


def _answer(entry: AuditEntry | None, scan: int, shown: Collection[int] | None) -> str:
    if entry is None:
        return ""
    if shown is not None and scan not in shown:
        return HIDDEN_ANSWER
    return answer_text(entry.status, entry.prediction)


def reads_frame(
    reads: Sequence[ReadEntry],
    scans: Mapping[int, AuditEntry],
    shown: Collection[int] | None = None,
) -> pd.DataFrame:
    """Every read, newest first, beside the routing answer of the scan it reads; with
    ``shown``, only those scans' answers (the others' stay hidden from a reader yet to read
    them)."""
    rows = []
    for r in reversed(reads):
        entry = scans.get(r.routed_id)
        rows.append(
            {
                "scan": r.routed_id,
                "file": entry.file if entry else "",
                "chosen site": (entry.chosen_site or "abstain") if entry else "",
                "prediction": _answer(entry, r.routed_id, shown),
                "reader": r.reader,
                "read": r.read,
                "note": r.note or "",
                "read (UTC)": r.time,
                "recorded (UTC)": r.recorded,
                "source": r.source,
            }
        )
    return pd.DataFrame(rows, columns=READS_COLUMNS)


def disagreements_frame(
    disagreements: Sequence[Disagreement], shown: Collection[int] | None = None
) -> pd.DataFrame:
    """Scans whose readers disagree: the routing answer (with ``shown``, only of those scans)
    and each reader's latest read."""

    def answer(d: Disagreement) -> str:
        if shown is not None and d.scan_id not in shown:
            return HIDDEN_ANSWER
        return (d.prediction or "") if d.chosen_site else "none (abstained)"

    rows = [
        {
            "scan": d.scan_id,
            "file": d.file,
            "chosen site": d.chosen_site or "abstain",
            "model's answer": answer(d),
            "reads (latest per reader)": read_list(d.reads),
        }
        for d in disagreements
    ]
    columns = ["scan", "file", "chosen site", "model's answer", "reads (latest per reader)"]
    return pd.DataFrame(rows, columns=columns)


def review_csv(write: Callable[[Path], Any]) -> str:
    """The CSV ``write(path)`` writes (the review module's writers, as 'medfed review' uses
    them), as text for a download; the file lives in a temporary folder only meanwhile."""
    with tempfile.TemporaryDirectory(prefix="medfed-review-") as folder:
        path = Path(folder) / "review.csv"
        write(path)
        return path.read_text(encoding="utf-8")


def read_list(reads: Mapping[str, str]) -> str:
    """``dr.a: glaucoma; dr.b: normal``."""
    return "; ".join(f"{reader}: {read}" for reader, read in reads.items())
