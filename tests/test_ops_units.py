"""``medfed ops units``: systemd units for serve, the PACS inboxes and the dashboard, each as an
unprivileged user, restarting on failure, writing only where it must, sandboxed; checked by
``systemd-analyze verify`` where it is installed."""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from medfed.cli import app
from medfed.ops.units import UnitSettings, unit_files

runner = CliRunner()


def _run(tmp: Path) -> Path:
    run = tmp / "runs" / "feddrm"
    run.mkdir(parents=True)
    (run / "config.toml").write_text("[train]\n", encoding="utf-8")
    return run


def _service(text: str) -> dict[str, list[str]]:
    """The [Service] section's keys -> their values (a key may repeat)."""
    out: dict[str, list[str]] = {}
    section = ""
    for line in text.splitlines():
        if line.startswith("["):
            section = line
        elif "=" in line and section == "[Service]":
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def test_every_service_gets_a_sandboxed_unprivileged_restarting_unit(tmp_path) -> None:
    run = _run(tmp_path)
    out = tmp_path / "units"
    argv = ["ops", "units", "--run", str(run), "--out", str(out), "--user", "medfed"]
    argv += ["--dicomweb", "https://pacs.example.org/dicom-web", "--metrics-port", "9101"]
    argv += ["--allow", "FUNDUSCAM1", "--answer-to", "ORTHANC@pacs.example.org:4242"]

    result = runner.invoke(app, argv)

    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in out.glob("*.service"))
    assert names == [
        "medfed-dashboard.service", "medfed-pacs-listen.service", "medfed-pacs-watch.service",
        "medfed-serve.service",
    ]  # fmt: skip
    for name in names:
        text = (out / name).read_text()
        configparser.ConfigParser(strict=False, interpolation=None).read_string(text)
        service = _service(text)
        assert service["User"] == ["medfed"] and service["Restart"] == ["on-failure"]
        assert service["ReadWritePaths"] == [str(run)]
        assert service["NoNewPrivileges"] == ["yes"] and service["ProtectSystem"] == ["strict"]
        assert service["UMask"] == ["0077"]
        assert service["CapabilityBoundingSet"] == [""]
        assert service["PrivateTmp"] == ["no"]  # the run is under /tmp here (and it says so)
        assert shlex.split(service["ExecStart"][0])[1:3] == ["-m", "medfed"]
    watch = shlex.split(_service((out / "medfed-pacs-watch.service").read_text())["ExecStart"][0])
    assert watch[3:5] == ["pacs", "watch"] and "--metrics-port" in watch
    serve = shlex.split(_service((out / "medfed-serve.service").read_text())["ExecStart"][0])
    assert serve[serve.index("--host") + 1] == "127.0.0.1" and "json" in serve
    assert "PrivateTmp off" in result.output


def test_a_run_outside_tmp_gets_a_private_tmp_and_percent_is_taken_literally() -> None:
    settings = UnitSettings(run=Path("/srv/medfed/runs/feddrm"), python="/usr/bin/python3",
                            dicomweb="https://pacs.example.org/dicom%2Dweb")  # fmt: skip
    units = unit_files(settings)
    assert _service(units["medfed-serve.service"])["PrivateTmp"] == ["yes"]
    assert "dicom%%2Dweb" in units["medfed-pacs-watch.service"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verifies_the_units(tmp_path) -> None:
    run = _run(tmp_path)
    out = tmp_path / "units"
    argv = ["ops", "units", "--run", str(run), "--out", str(out), "--user", "medfed"]
    argv += ["--dicomweb", "http://127.0.0.1:8042/dicom-web", "--allow", "CAM"]
    assert runner.invoke(app, argv).exit_code == 0

    files = sorted(str(p) for p in out.glob("*.service"))
    checked = subprocess.run(
        ["systemd-analyze", "verify", *files], capture_output=True, text=True, timeout=60
    )

    assert len(files) == 4
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "medfed-" not in checked.stderr, checked.stderr  # no warning about our units
