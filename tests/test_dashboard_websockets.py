"""The dashboard's server (Streamlit on uvicorn) keeps its WebSocket behind a sign-in proxy.

uvicorn below 0.52 with websockets 16.1 or 17+ decodes headers as latin-1 and aborts the page's
WebSocket handshake when the proxy forwards a non-ASCII user name (docs/dashboard.md's setup);
Streamlit warns of that pairing at every start. flwr 1.42 holds uvicorn below 0.50, so the
dashboard extra keeps websockets at 16.1.1 or later below 17."""

from __future__ import annotations

import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

pytest.importorskip("streamlit")


def _affected(websockets: Version) -> bool:
    return websockets >= Version("17") or Version("16.1") <= websockets < Version("16.1.1")


def test_installed_websockets_and_uvicorn_keep_the_proxied_stream() -> None:
    websockets, uvicorn = Version(version("websockets")), Version(version("uvicorn"))
    assert not (_affected(websockets) and uvicorn < Version("0.52")), (
        f"websockets {websockets} with uvicorn {uvicorn}: Streamlit's stream aborts behind a proxy"
    )


def test_the_dashboard_extra_excludes_the_affected_websockets() -> None:
    extras = tomllib.loads(Path("pyproject.toml").read_text(encoding="utf-8"))["project"][
        "optional-dependencies"
    ]
    pins = [r for r in extras["dashboard"] if r.startswith("websockets")]
    assert pins, "the dashboard extra names no websockets range"
    allowed = SpecifierSet(pins[0].removeprefix("websockets"))
    for candidate in ("16.1", "17.0", "17.4"):
        assert Version(candidate) not in allowed
    assert Version("16.1.1") in allowed
