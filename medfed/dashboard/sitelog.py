"""A SuperNode's audit log (``STATE_DIR/audit.jsonl``, :mod:`medfed.governance.records`) as the
Site audit page's table, without Streamlit: every message the site received and sent, with the
policy's decision, filtered by run and decision."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from medfed.dashboard import STATE_ENV
from medfed.governance.records import AUDIT, read_audit

COLUMNS = [
    "time (UTC)", "run", "round", "kind", "direction", "bytes", "sha256", "decision", "rule",
    "reason",
]  # fmt: skip
NO_RUN = "(no run)"


def state_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """The state folder ``medfed dashboard --state-dir`` was given, or None."""
    value = (os.environ if environ is None else environ).get(STATE_ENV, "")
    return Path(value) if value else None


def audit_path(folder: Path) -> Path:
    return folder / AUDIT


def records(folder: Path) -> list[dict[str, Any]]:
    """Every line of the site's audit log ([] when it has none yet); RunDirError naming the
    line that is not a record medfed wrote."""
    return read_audit(folder)


def _run(record: Mapping[str, Any]) -> str:
    return str(record.get("run") or NO_RUN)


def runs(entries: Iterable[Mapping[str, Any]]) -> list[str]:
    """The runs the log names, in the order they first appear."""
    return list(dict.fromkeys(_run(r) for r in entries))


def decisions(entries: Iterable[Mapping[str, Any]]) -> list[str]:
    return list(dict.fromkeys(str(r.get("decision") or "none") for r in entries))


def audit_frame(
    entries: Sequence[Mapping[str, Any]],
    *,
    run: str | None = None,
    decision: Sequence[str] | None = None,
) -> pd.DataFrame:
    """The log as a table, newest last; only ``run`` (None: every run) and the ``decision``
    values given (None: all)."""
    rows = []
    for r in entries:
        if run is not None and _run(r) != run:
            continue
        if decision is not None and str(r.get("decision") or "none") not in decision:
            continue
        stamp = r.get("time")
        when = (
            time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(stamp)))
            if isinstance(stamp, int | float) and not isinstance(stamp, bool)
            else ""
        )
        rows.append(
            [
                when,
                _run(r),
                "" if r.get("round") is None else str(r.get("round")),
                str(r.get("kind") or ""),
                str(r.get("direction") or ""),
                "" if r.get("bytes") is None else str(r.get("bytes")),
                str(r.get("sha256") or "")[:12],
                str(r.get("decision") or "none"),
                str(r.get("rule") or ""),
                str(r.get("reason") or ""),
            ]
        )
    return pd.DataFrame(rows, columns=COLUMNS)


def refusals(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows where the site's policy refused a message (received), with the rule."""
    return frame[(frame["decision"] == "refused") & (frame["direction"] == "received")]


def highlighted(frame: pd.DataFrame) -> Any:
    """The table with refused rows highlighted (a pandas Styler)."""

    def colour(row: pd.Series) -> list[str]:
        mark = "background-color: #f8d7da" if row["decision"] == "refused" else ""
        return [mark] * len(row)

    return frame.style.apply(colour, axis=1)
