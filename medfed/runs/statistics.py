"""A statistics-only run's ``statistics.json``: written once by the coordinator, read by the
dashboard's Sites page (:class:`~medfed.runs.schema.FederationStatistics`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from medfed.core.errors import RunDirError
from medfed.core.fileio import atomic_write
from medfed.core.versions import unversioned, versioned
from medfed.runs.schema import STATISTICS_FILE, FederationStatistics


def statistics_path(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / STATISTICS_FILE


def write_statistics(run_dir: str | os.PathLike[str], statistics: FederationStatistics) -> Path:
    """Write ``RUN/statistics.json`` (whole or not at all)."""
    path = statistics_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(versioned(statistics.to_dict()), indent=2, allow_nan=False) + "\n"
    atomic_write(path, text)
    return path


def read_statistics(run_dir: str | os.PathLike[str]) -> FederationStatistics | None:
    """The run's statistics, None when it has none; RunDirError naming the file when damaged."""
    path = statistics_path(run_dir)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RunDirError(
            f"{path}: not valid JSON ({exc}); run the statistics run again "
            "('medfed deploy stats', then flwr run) to rewrite it"
        ) from None
    where = str(path)
    return FederationStatistics.from_dict(unversioned(data, where), where)
