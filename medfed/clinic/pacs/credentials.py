"""How medfed proves who it is to a PACS, and how it checks the PACS is the one it expects.

A bearer token (``--token-file``) or HTTP Basic credentials (``--basic-auth-file`` holding
``USER:PASSWORD``, or the environment variables ``MEDFED_PACS_USER`` and
``MEDFED_PACS_PASSWORD`` with ``--basic-auth-env``); never a secret on the command line,
where every user of the machine can read it (``ps``). Files holding a secret must be
owner-only (0600). ``--ca-file`` names the certificate authority (PEM) that signed the PACS's
TLS certificate, for a hospital's own CA.
"""

from __future__ import annotations

import os
import ssl
import stat
from dataclasses import dataclass
from pathlib import Path

from medfed.core.errors import ConfigError

__all__ = ["PacsCredentials", "check_ca_file", "check_tls_pair", "credentials", "secret_file"]

USER_ENV, PASSWORD_ENV = "MEDFED_PACS_USER", "MEDFED_PACS_PASSWORD"
_MAX_SECRET = 64 * 1024  # a token or a USER:PASSWORD line; anything larger is the wrong file


@dataclass(frozen=True)
class PacsCredentials:
    """What each request to the PACS carries: a bearer token, or a Basic user and password."""

    token: str | None = None
    user: str | None = None
    password: str | None = None

    def __repr__(self) -> str:  # never print a secret, even in a debugger
        kind = "bearer" if self.token else "basic" if self.user else "none"
        return f"PacsCredentials({kind})"


def secret_file(path: Path, option: str) -> str:
    """The first line of the owner-only file ``path``; ConfigError naming ``option`` otherwise."""
    if path.is_dir():
        raise ConfigError(f"{option} {path}: is a folder; give the file holding the secret")
    if not path.is_file():
        raise ConfigError(f"{option} {path}: no such file")
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"{option} {path}: the file may be read by others (mode {stat.filemode(mode)}); "
            f"make it owner-only: chmod 600 {path}"
        )
    if path.stat().st_size > _MAX_SECRET:
        raise ConfigError(f"{option} {path}: {path.stat().st_size} bytes; not a secret's file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{option} {path}: cannot be read as UTF-8 text ({exc})") from None
    lines = text.strip().splitlines()
    if not lines or not lines[0].strip():
        raise ConfigError(f"{option} {path}: the file is empty")
    return lines[0].strip()


def _basic(user: str, password: str, where: str) -> PacsCredentials:
    if not user or ":" in user or any(ord(c) < 32 for c in user + password):
        raise ConfigError(
            f"{where}: the user name is empty, holds a ':' or a control character; "
            "write USER:PASSWORD on one line"
        )
    if not password:
        raise ConfigError(f"{where}: the password is empty; write USER:PASSWORD on one line")
    return PacsCredentials(user=user, password=password)


def _basic_from_env() -> PacsCredentials:
    user, password = os.environ.get(USER_ENV, ""), os.environ.get(PASSWORD_ENV, "")
    missing = [name for name, value in ((USER_ENV, user), (PASSWORD_ENV, password)) if not value]
    if missing:
        raise ConfigError(
            f"--basic-auth-env: {' and '.join(missing)} not set (or empty); set both, or give "
            "--basic-auth-file"
        )
    return _basic(user, password, f"--basic-auth-env ({USER_ENV})")


def credentials(
    token_file: Path | None, basic_file: Path | None, basic_env: bool
) -> PacsCredentials:
    """The credentials the options name (at most one kind); none when no option is given."""
    given = [n for n, v in (("--token-file", token_file), ("--basic-auth-file", basic_file),
                            ("--basic-auth-env", basic_env)) if v]  # fmt: skip
    if len(given) > 1:
        raise ConfigError(f"{' and '.join(given)}: give one way to sign in to the PACS")
    if token_file is not None:
        token = secret_file(token_file, "--token-file")
        if any(ord(c) < 33 for c in token):
            raise ConfigError(f"--token-file {token_file}: the token holds spaces or controls")
        return PacsCredentials(token=token)
    if basic_file is not None:
        user, colon, password = secret_file(basic_file, "--basic-auth-file").partition(":")
        if not colon:
            raise ConfigError(
                f"--basic-auth-file {basic_file}: no ':' in the first line; write USER:PASSWORD"
            )
        return _basic(user, password, f"--basic-auth-file {basic_file}")
    if basic_env:
        return _basic_from_env()
    return PacsCredentials()


def check_ca_file(path: Path | None, url: str) -> str | None:
    """``path`` as text when it holds PEM certificates usable to check the PACS's TLS."""
    if path is None:
        return None
    if not url.lower().startswith("https://"):
        raise ConfigError(f"--ca-file {path}: the PACS URL {url} is not https; TLS is not used")
    if path.is_dir():
        raise ConfigError(f"--ca-file {path}: is a folder; give a PEM file of CA certificates")
    if not path.is_file():
        raise ConfigError(f"--ca-file {path}: no such file (a PEM file of CA certificates)")
    try:
        ssl.create_default_context(cafile=str(path))
    except (ssl.SSLError, ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"--ca-file {path}: not a PEM file of CA certificates ({exc}); give the "
            "certificate of the authority that signed the PACS's TLS certificate"
        ) from None
    return str(path)


def check_tls_pair(cert: Path | None, key: Path | None) -> ssl.SSLContext | None:
    """A server's TLS context from ``--tls-cert`` and ``--tls-key``, naming the file at fault."""
    if (cert is None) != (key is None):
        raise ConfigError("give --tls-cert and --tls-key together")
    if cert is None or key is None:
        return None
    for option, path in (("--tls-cert", cert), ("--tls-key", key)):
        if path.is_dir():
            raise ConfigError(f"{option} {path}: is a folder; give a PEM file")
        if not path.is_file():
            raise ConfigError(f"{option} {path}: no such file (a PEM file is needed)")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:  # the certificate alone first, so that a bad one is not blamed on the key
        ssl.create_default_context().load_verify_locations(cafile=str(cert))
    except (ssl.SSLError, ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"--tls-cert {cert}: not a PEM certificate ({exc}); give the server's certificate "
            "(-----BEGIN CERTIFICATE-----)"
        ) from None
    try:
        context.load_cert_chain(str(cert), str(key))
    except (ssl.SSLError, ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"--tls-key {key}: not a PEM private key for --tls-cert {cert} ({exc}); give the "
            "unencrypted private key (-----BEGIN PRIVATE KEY-----) the certificate was made for"
        ) from None
    return context
