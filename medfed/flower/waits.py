"""How long a deployed run waits: its defaults, its bound and its check, in one place.

Nothing but the standard library, so that the command line reads its options' defaults here
without importing Flower. Each is a run config key too: ``wait-s``, ``reply-timeout-s``."""

from __future__ import annotations

import math
from typing import Any

from medfed.errors import ConfigError

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
