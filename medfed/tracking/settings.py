"""Where runs are tracked: the tracking URI, the experiment and the registry name."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from medfed.core.errors import ConfigError

# RUN/tracking.json: the MLflow run a run folder was logged as (the dashboard reads it too)
TRACKING_FILE = "tracking.json"
SCHEMES = ("http", "https", "sqlite", "file")
DEFAULT_EXPERIMENT = "medfed"
INSTALL = "pip install 'medfed[mlflow]'"


@dataclass(frozen=True)
class TrackSettings:
    """An MLflow tracking URI (a server, a SQLite file or a folder), the experiment runs go
    to, and the registered model name (None: the model is logged, not registered)."""

    uri: str
    experiment: str = DEFAULT_EXPERIMENT
    register: str | None = None

    @property
    def is_server(self) -> bool:
        return urlparse(self.uri).scheme in ("http", "https")


def local_store(beside: Path) -> str:
    """The default store: a SQLite file in the folder that holds the run(s)."""
    return f"sqlite:///{(beside.resolve() / 'mlflow.db').as_posix()}"


def checked_uri(text: str, where: str = "--track") -> str:
    """``text`` as a tracking URI MLflow can use, or a ConfigError naming ``where``."""
    value = text.strip()
    parsed = urlparse(value)
    if parsed.scheme not in SCHEMES:
        raise ConfigError(
            f"{where} {text!r}: not a tracking URI; give an MLflow server "
            "(http://host:5000 or https://...), a SQLite file (sqlite:////path/mlflow.db) or "
            "a folder (file:///path/mlruns), or 'local' for a SQLite file beside the runs"
        )
    if parsed.scheme in ("http", "https") and not parsed.netloc:
        raise ConfigError(f"{where} {text!r}: the server's host is missing (http://host:5000)")
    if parsed.scheme == "sqlite" and not value.startswith("sqlite:///"):
        raise ConfigError(f"{where} {text!r}: a SQLite store is sqlite:////absolute/path.db")
    return value


def tracking_settings(
    track: str | None,
    beside: Path,
    *,
    experiment: str | None = None,
    register: str | None = None,
    settings_file: Path | None = None,
) -> TrackSettings | None:
    """The tracking the command asks for: ``--track`` (``local`` for the default store beside
    the runs), else the ``[tracking]`` table of the settings file; None when neither does."""
    table = _file_table(settings_file) if settings_file is not None else {}
    # a [tracking] table without a uri: the local store
    text = track if track is not None else table.get("uri", "local" if table else None)
    if text is None:
        return None
    where = "--track" if track is not None else f"{settings_file} [tracking] uri"
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"{where}: give a tracking URI or 'local', got {text!r}")
    uri = local_store(beside) if text.strip() == "local" else checked_uri(text, where)
    name = experiment if experiment is not None else table.get("experiment", DEFAULT_EXPERIMENT)
    registered = register if register is not None else table.get("register")
    for label, value in (("experiment", name), ("register", registered)):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ConfigError(f"tracking {label}: give a name, got {value!r}")
    return TrackSettings(uri=uri, experiment=name, register=registered)


def _file_table(path: Path) -> dict:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return {}  # the settings file's own reader reports what is wrong with it
    table = data.get("tracking", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tracking] must be a table (uri, experiment, register)")
    unknown = set(table) - {"uri", "experiment", "register"}
    if unknown:
        raise ConfigError(
            f"{path}: [tracking] has no setting(s) {sorted(unknown)}; known: uri, experiment, "
            "register"
        )
    return table


def require_mlflow():
    """The mlflow module, or a ConfigError saying how to install it."""
    try:
        import mlflow
    except ImportError:
        raise ConfigError(f"tracking needs MLflow, which is not installed: {INSTALL}") from None
    return mlflow


def metric_name(text: str) -> str:
    """``text`` with what MLflow refuses in a metric, parameter or tag name replaced."""
    return re.sub(r"[^0-9A-Za-z_\-. /]", "_", text)
