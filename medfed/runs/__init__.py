"""Run directories: where training writes and every reader (evaluate, route, bench, dashboard)
reads, with a typed, versioned schema (:mod:`medfed.runs.schema`). Weights live in
:mod:`medfed.runs.weights`, the only module here that needs torch."""

from medfed.core.versions import SCHEMA_VERSION
from medfed.runs.rundir import RunDir, read_json, write_json
from medfed.runs.schema import (
    Dropout,
    Evaluation,
    RocPoints,
    RoundRecord,
    RouterFigures,
    RunCosts,
    SiteFigures,
    SiteTraffic,
    Summary,
    Validation,
    WireSettings,
)

__all__ = [
    "SCHEMA_VERSION",
    "Dropout",
    "Evaluation",
    "RocPoints",
    "RoundRecord",
    "RouterFigures",
    "RunCosts",
    "RunDir",
    "SiteFigures",
    "SiteTraffic",
    "Summary",
    "Validation",
    "WireSettings",
    "read_json",
    "write_json",
]
