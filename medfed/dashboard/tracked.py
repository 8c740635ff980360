"""The MLflow run a run folder was logged as (RUN/tracking.json, written by medfed.tracking),
read without MLflow."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TRACKING_FILE = "tracking.json"


def tracking_record(run: Path) -> dict[str, Any] | None:
    """RUN/tracking.json, or None when the run was never tracked (or the file is unreadable)."""
    try:
        record = json.loads((run / TRACKING_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("run_id"), str):
        return None
    return record


def tracking_line(label: str, record: dict[str, Any]) -> str:
    """A markdown line linking ``label`` to its MLflow run (a link where it has a URL)."""
    run_id = str(record["run_id"])
    where = f"experiment {record.get('experiment', '?')} in {record.get('tracking_uri', '?')}"
    url = record.get("url")
    shown = f"[{run_id}]({url})" if isinstance(url, str) and url.startswith("http") else run_id
    return f"**{label}**: MLflow run {shown} ({where})"
