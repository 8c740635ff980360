"""Where a deployed run goes and how long it waits: the waits' defaults, bound and check, and
the part of an app folder's run config every deployed run holds (sites, run folder, name,
waits), read in one place.

Nothing but the standard library and the settings, so that the command line reads its options'
defaults here without importing Flower. Each wait is a run config key too: ``wait-s``,
``reply-timeout-s``."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from medfed.config import valid_site_id
from medfed.core.errors import ConfigError

WAIT_S = 300  # seconds for every site to connect (--wait)
REPLY_TIMEOUT_S = 600  # seconds one exchange waits for the sites' replies (--reply-timeout)
MAX_WAIT_S = 7 * 24 * 3600.0  # the longest of either a deployment accepts: a week


def run_seconds(run_config: dict[str, Any], key: str, default: float) -> float:
    """The run config's ``key`` (``wait-s``, ``reply-timeout-s``) in seconds, ``default`` when
    it is not given; ConfigError naming the key when it is no number in (0, MAX_WAIT_S]."""
    value = run_config.get(key, default)
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if isinstance(value, bool) or not 0 < seconds <= MAX_WAIT_S:
        raise ConfigError(
            f"run config {key!r} must be a number of seconds > 0 and at most "
            f"{MAX_WAIT_S:.0f} (a week), got {value!r}"
        )
    return seconds


def run_target(run_config: dict[str, Any], needs: tuple[str, ...], command: str) -> dict[str, Any]:
    """The sites (in order), run folder, run name and waits of a deployed run's config, checked:
    ConfigError naming the key, and ``command`` (which writes the app folder) when ``needs``
    lacks a key. The run config is the operator's own (the app folder), never a site's."""
    missing = [k for k in needs if k not in run_config]
    if missing:
        raise ConfigError(
            f"the Flower run config lacks {missing}; write the app folder with '{command}'"
        )
    sites = [s.strip() for s in str(run_config["sites"]).split(",") if s.strip()]
    if not sites:
        raise ConfigError("run config 'sites' names no site; give the site ids, in order")
    if not all(valid_site_id(s) for s in sites) or len(set(sites)) != len(sites):
        raise ConfigError(
            f"run config 'sites' {sites}: site ids must be unique letters, digits, '.', '_' or '-'"
        )
    run_dir = Path(str(run_config["run-dir"])).expanduser()
    return {
        "sites": sites,
        "run_dir": run_dir,
        "run_name": str(run_config.get("run-name") or run_dir.name),
        "wait_s": run_seconds(run_config, "wait-s", WAIT_S),
        "reply_timeout_s": run_seconds(run_config, "reply-timeout-s", REPLY_TIMEOUT_S),
    }
