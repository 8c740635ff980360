"""systemd units for ``medfed serve``, ``medfed pacs watch``, ``medfed pacs listen`` and
``medfed dashboard``: each runs as an unprivileged user, restarts when it fails (not when its
settings are wrong: exit 2), may write only to the run directory and its own state folder, and
is sandboxed (no new privileges, a read-only system, no devices, no capabilities).
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from medfed.core.errors import ConfigError

__all__ = ["UnitSettings", "check_user", "in_tmp", "unit_files"]

STATE = "/var/lib/medfed"  # StateDirectory=medfed: HOME for caches (MONAI, Streamlit)
_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
_PRIVILEGED = {"root", "nobody"}  # root: no; nobody: shared by unrelated daemons
# A path in a unit file: no whitespace, quotes, backslashes or % (systemd's specifiers).
_PLAIN_PATH = re.compile(r"/[^\s\"'\\%;]*")

HARDENING = (
    "NoNewPrivileges=yes",
    "ProtectSystem=strict",
    "ProtectHome=read-only",
    "PrivateDevices=yes",
    "ProtectKernelTunables=yes",
    "ProtectKernelModules=yes",
    "ProtectKernelLogs=yes",
    "ProtectControlGroups=yes",
    "ProtectClock=yes",
    "ProtectHostname=yes",
    "RestrictSUIDSGID=yes",
    "RestrictRealtime=yes",
    "RestrictNamespaces=yes",
    "LockPersonality=yes",
    "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
    "CapabilityBoundingSet=",
    "AmbientCapabilities=",
    "SystemCallArchitectures=native",
    "UMask=0077",
)


@dataclass(frozen=True)
class UnitSettings:
    """What the units run: one run directory, as one user, with these ports and PACS."""

    run: Path
    user: str = "medfed"
    python: str = sys.executable
    serve_port: int = 8765
    dashboard_port: int = 8501
    dashboard_metrics_port: int | None = None  # the dashboard's --metrics-port
    dicomweb: str | None = None  # a watcher unit when given
    basic_auth_file: Path | None = None  # the watcher's PACS account (an owner-only file)
    metrics_port: int | None = None  # the watcher's --metrics-port
    allow: tuple[str, ...] = ()  # a listener unit when given: the calling AE titles
    listen_port: int = 11112
    answer_to: str | None = None
    extra_paths: tuple[Path, ...] = field(default_factory=tuple)  # more folders to write


def check_user(user: str) -> str:
    """``user`` when it is an unprivileged account name; ConfigError naming --user otherwise."""
    if user in _PRIVILEGED:
        raise ConfigError(
            f"--user {user}: the services must run as an unprivileged account of their own "
            "(e.g. 'useradd --system medfed'), not root or nobody"
        )
    if not _USER.fullmatch(user):
        raise ConfigError(
            f"--user {user!r}: not an account name (lower-case letters, digits, '_' and '-', "
            "at most 32, starting with a letter or '_')"
        )
    return user


def _path(path: Path | str, option: str) -> str:
    text = str(Path(path).expanduser().absolute())
    if not _PLAIN_PATH.fullmatch(text):
        raise ConfigError(
            f"{option} {text!r}: a path the units name must have no spaces, quotes, "
            "backslashes, ';' or '%'; move or link it to a plain path"
        )
    return text


def in_tmp(settings: UnitSettings) -> list[str]:
    """The paths the units name under /tmp or /var/tmp, which PrivateTmp=yes would hide from
    the services (the units then leave it off)."""
    paths = [settings.run, settings.python, settings.basic_auth_file, *settings.extra_paths]
    found = []
    for path in paths:
        if path is not None:
            text = str(Path(path).expanduser().absolute())
            if text.startswith(("/tmp/", "/var/tmp/")) or text in ("/tmp", "/var/tmp"):
                found.append(text)
    return found


def _escaped(line: str) -> str:
    """``line`` with systemd's specifiers (%) and variables ($) taken literally."""
    return line.replace("%", "%%").replace("$", "$$")


def _unit(description: str, command: list[str], writable: list[str], settings: UnitSettings,
          restart_s: int = 5) -> str:  # fmt: skip
    lines = [
        "[Unit]",
        f"Description={description}",
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=simple",
        f"User={settings.user}",
        f"Group={settings.user}",
        f"ExecStart={_escaped(shlex.join(command))}",
        "Restart=on-failure",
        f"RestartSec={restart_s}",
        "RestartPreventExitStatus=2",  # wrong settings: restarting would not mend them
        f"WorkingDirectory={writable[0]}",
        "StateDirectory=medfed",
        f"Environment=HOME={STATE} PYTHONUNBUFFERED=1",
        f"ReadWritePaths={' '.join(writable)}",
        f"PrivateTmp={'no' if in_tmp(settings) else 'yes'}",
        *HARDENING,
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    return "\n".join(lines)


def _metrics(port: int | None) -> list[str]:
    return [] if port is None else ["--metrics-port", str(port)]


def unit_files(settings: UnitSettings) -> dict[str, str]:
    """File name -> unit text: serve and dashboard always, the watcher with ``dicomweb``, the
    listener with ``allow``."""
    check_user(settings.user)
    run = _path(settings.run, "--run")
    python = _path(settings.python, "--python")
    writable = [run, *(_path(p, "--writable") for p in settings.extra_paths)]
    medfed = [python, "-m", "medfed"]
    name = Path(run).name
    units = {
        "medfed-serve.service": _unit(
            f"medfed routing service (run {name})",
            [*medfed, "serve", run, "--host", "127.0.0.1", "--port", str(settings.serve_port),
             "--log-format", "json"],
            writable, settings,
        ),
        "medfed-dashboard.service": _unit(
            f"medfed dashboard (run {name})",
            [*medfed, "dashboard", run, "--port", str(settings.dashboard_port),
             "--log-format", "json", *_metrics(settings.dashboard_metrics_port)],
            writable, settings,
        ),
    }  # fmt: skip
    if settings.dicomweb:
        command = [*medfed, "pacs", "watch", run, "--dicomweb", settings.dicomweb]
        command += ["--max-failures", "10"]
        if settings.basic_auth_file is not None:
            command += ["--basic-auth-file", _path(settings.basic_auth_file, "--basic-auth-file")]
        command += _metrics(settings.metrics_port)
        units["medfed-pacs-watch.service"] = _unit(
            f"medfed DICOMweb inbox (run {name})", command, writable, settings, restart_s=30
        )
    if settings.allow:
        command = [*medfed, "pacs", "listen", run, "--port", str(settings.listen_port)]
        for title in settings.allow:
            command += ["--allow", title]
        if settings.answer_to:
            command += ["--answer-to", settings.answer_to]
        units["medfed-pacs-listen.service"] = _unit(
            f"medfed DICOM listener (run {name})", command, writable, settings
        )
    return units
