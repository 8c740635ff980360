"""Errors a user can act on: each names the file or setting and what to do."""

from __future__ import annotations


class MedfedError(Exception):
    """Base class for errors shown to the user without a traceback."""

    exit_code = 2


class ManifestError(MedfedError):
    """A site manifest is unusable (missing root, unknown layout, bad field)."""

    exit_code = 2


class ConfigError(MedfedError):
    """A training or run setting is invalid."""

    exit_code = 2


class DataError(MedfedError):
    """Site data cannot be used as it is (unreadable file, no usable records)."""

    exit_code = 1


class RunDirError(MedfedError):
    """A run directory is missing, incomplete or inconsistent."""

    exit_code = 2


def require_extra(module: str, extra: str, feature: str) -> None:
    """Refuse ``feature`` with the install command when its optional package is missing."""
    from importlib.util import find_spec

    try:
        found = find_spec(module) is not None
    except (ImportError, ValueError):  # a broken install counts as a missing one
        found = False
    if not found:
        raise ConfigError(
            f"{feature} needs the {module!r} package, which is not installed; "
            f"install it with: pip install 'medfed[{extra}]'"
        )
