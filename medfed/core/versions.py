"""The schema version every file medfed writes into a run directory carries, and its check.

Kept below every package (it imports only the errors) so that the run directory's writers and
the site overview the data layer writes share one version and one rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from medfed.core.errors import RunDirError

SCHEMA_VERSION = 1
"""The run-directory schema this medfed writes; it reads this one and every older one."""
VERSION_KEY = "schema_version"
REDO = "the file is damaged or was not written by medfed; train the run again to rewrite it"


def check_version(data: Mapping[str, Any], where: str) -> int:
    """The schema version of one file or record (1 when it has none), if this medfed reads it."""
    version = data.get(VERSION_KEY, 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise RunDirError(f"{where}: schema_version {version!r} is not a positive integer; {REDO}")
    if version > SCHEMA_VERSION:
        raise RunDirError(
            f"{where}: written with schema_version {version}, newer than this medfed reads "
            f"(up to {SCHEMA_VERSION}); upgrade medfed (pip install -U medfed) to read this run"
        )
    return version


def versioned(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` stamped with the schema version it is written in."""
    return {VERSION_KEY: SCHEMA_VERSION, **{k: v for k, v in data.items() if k != VERSION_KEY}}


def unversioned(data: Any, where: str) -> dict[str, Any]:
    """A file's JSON object without its ``schema_version``, once the version is known readable."""
    if not isinstance(data, Mapping):
        raise RunDirError(f"{where}: expected a JSON object, got {type(data).__name__}; {REDO}")
    check_version(data, where)
    return {k: v for k, v in data.items() if k != VERSION_KEY}
