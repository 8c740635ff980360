"""The routing service's bearer token: generated once, stored owner-only (0600)."""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from medfed.core.errors import ConfigError

LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})
TOKEN_FILE = "serve.token"


def is_loopback(host: str) -> bool:
    return host.strip().lower() in LOOPBACK or host.startswith("127.")


def bearer_token(path: Path) -> tuple[str, bool]:
    """The token in ``path``, made (owner-only) when missing; and whether it was just made.

    ConfigError when the file may be read by others, or is empty."""
    if path.is_dir():
        raise ConfigError(f"{path}: is a folder, not a token file; name a file (made if missing)")
    if not path.exists():
        token = secrets.token_urlsafe(32)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(token + "\n")
        return token, True
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"{path}: the token file may be read by others (mode {stat.filemode(mode)}); "
            f"make it owner-only: chmod 600 {path}"
        )
    token = path.read_text(encoding="utf-8").strip()
    if not token:
        raise ConfigError(f"{path}: the token file is empty; delete it and a new one is made")
    return token, False
