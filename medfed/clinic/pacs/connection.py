"""One HTTP session to a PACS: its credentials, the CA that signed its TLS certificate, and
the errors of a PACS that cannot be reached said as what to check.

Every request of the DICOMweb client and of Orthanc's REST API (the change feed) goes through
this session, so both carry the same credentials and check the same certificate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from medfed.clinic.bearer import is_loopback
from medfed.clinic.pacs.credentials import PacsCredentials
from medfed.core.errors import ConfigError, MedfedError

__all__ = ["TIMEOUT_S", "PacsUnreachable", "call", "check_url", "make_session"]

TIMEOUT_S = 20.0  # one request; the next poll is the retry


class PacsUnreachable(MedfedError):
    """The PACS did not answer, or refused (network, TLS, HTTP error): nothing is recorded, the
    poll is retried; the command exits 3 so that cron and systemd notice."""

    exit_code = 3


def check_url(url: str, option: str = "--dicomweb") -> str:
    """``url`` when it is http(s); plain http only to a loopback host (TLS everywhere else)."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(f"{option} {url!r}: not an http(s) URL of a DICOMweb service")
    if parsed.username or parsed.password:
        raise ConfigError(
            f"{option}: the URL holds a user or password, which every user of this machine "
            "can read; give them with --basic-auth-file or --basic-auth-env"
        )
    try:
        port = parsed.port  # a port above 65535 or not a number raises here
    except ValueError as exc:
        raise ConfigError(f"{option} {url}: {exc} (a port is 1 to 65535)") from None
    if port == 0:
        raise ConfigError(f"{option} {url}: port 0 (a port is 1 to 65535)")
    if parsed.scheme == "http" and not is_loopback(parsed.hostname):
        raise ConfigError(
            f"{option} {url}: plain http to another machine would send scans unencrypted; "
            "use https (TLS), e.g. through the PACS's reverse proxy"
        )
    return url.rstrip("/")


def make_session(creds: PacsCredentials, ca_file: str | None) -> Any:  # a requests.Session
    """A session that signs every request with ``creds`` and checks TLS against ``ca_file``
    (the system's authorities when None)."""
    import requests

    session = requests.Session()
    session.trust_env = False  # no proxy or .netrc from the environment: only what was given
    if creds.token:
        session.headers["Authorization"] = f"Bearer {creds.token}"
    elif creds.user is not None:
        session.auth = (creds.user, creds.password or "")
    if ca_file is not None:
        session.verify = ca_file
    return session


def _why(exc: Exception) -> str:
    """What to check for a failed request, in words."""
    import requests

    status = getattr(getattr(exc, "response", None), "status_code", None)
    if status in (401, 403):
        return (
            f"the PACS refused medfed's credentials (HTTP {status}); check --basic-auth-file, "
            "--basic-auth-env or --token-file, and the account's rights."
        )
    if isinstance(exc, requests.exceptions.SSLError):
        return (
            f"the PACS's TLS certificate could not be checked ({exc}); give the certificate "
            "of the authority that signed it with --ca-file."
        )
    if status is not None:
        return f"the PACS answered HTTP {status} ({exc}); is the URL its DICOMweb root?"
    return f"{exc}; is the PACS up and the URL right?"


def call(source: str, what: str, request: Callable[[], Any]) -> Any:
    """``request()``; PacsUnreachable naming ``source``, ``what`` and what to check otherwise."""
    import requests

    try:
        return request()
    except (requests.RequestException, OSError) as exc:
        raise PacsUnreachable(
            f"{source}: {what} failed: {_why(exc)} Nothing was recorded; the next poll tries again"
        ) from exc
