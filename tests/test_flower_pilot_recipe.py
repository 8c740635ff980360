"""The loopback pilot of docs/deployment.md works as written: the script between its markers,
run as it stands (only its folder and ports set through the variables it reads), trains the
federation on Flower, prints a line per round while it runs, and writes a run directory that
medfed evaluate reads; every process it started is gone afterwards."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from medfed.flower.loopback import free_port

pytestmark = pytest.mark.flower

DOCS = Path(__file__).resolve().parents[1] / "docs" / "deployment.md"
BIN = Path(sys.executable).parent


def recipe() -> str:
    text = DOCS.read_text(encoding="utf-8")
    block = re.search(
        r"<!-- loopback-pilot:start -->\n```bash\n(.*?)```\n<!-- loopback-pilot:end -->",
        text,
        re.S,
    )
    assert block, "docs/deployment.md has no loopback pilot between its markers"
    return block.group(1)


def test_the_loopback_pilot_recipe_runs_as_written(tmp_path: Path) -> None:
    script = tmp_path / "pilot.sh"
    script.write_text(recipe(), encoding="utf-8")
    env = os.environ | {
        "WORK": str(tmp_path / "pilot"),
        "LINK_PORT": str(free_port()),
        "NODE_PORT": str(free_port()),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.Popen(
        ["bash", str(script)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=540)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the script and all it started: one session
        out, _ = proc.communicate()
    logs = "".join(
        f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
        for p in sorted((tmp_path / "pilot").glob("*.log"))
    )
    assert proc.returncode == 0, f"the recipe failed:\n{out[-4000:]}\n{logs}"
    for round_ in (1, 2):  # round progress in the stream, as it goes
        assert re.search(rf"medfed: fedavg round {round_}/2", out), out[-4000:]
    assert "AUC" in out  # medfed evaluate read the run it wrote
    assert (tmp_path / "pilot" / "run" / "summary.json").is_file()
    # nothing the recipe started is left running: its trap stopped the SuperLink and the
    # SuperNodes, and their SuperExecs follow their parents out
    work = str(tmp_path / "pilot")
    deadline = time.monotonic() + 30
    while (left := _started_by(work)) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left running after the recipe: {left}"


def _started_by(work: str) -> list[int]:
    """The processes still running with the recipe's WORK in their environment."""
    import psutil

    found = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if p.environ().get("WORK") == work:
                found.append(p.pid)
    return found
