"""The core install (no extras) trains and routes: Flower, the dashboard's Streamlit and Plotly,
PEFT and matplotlib are only needed by the front ends that name them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# Top-level packages of the optional extras (flower, dashboard, lora, bench).
EXTRAS_ONLY = ("flwr", "streamlit", "plotly", "peft", "matplotlib")

# Runs in a fresh interpreter: the test process itself may already hold these modules.
SCRIPT = r"""
import importlib.abc
import json
import sys
from pathlib import Path

BLOCKED = set(sys.argv[2].split(","))
attempts = []


class Uninstalled(importlib.abc.MetaPathFinder):
    # Acts as if the extras were never installed, and notes who asked for them.

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] not in BLOCKED:
            return None
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename.startswith("<frozen"):
            frame = frame.f_back
        asker = frame.f_globals.get("__name__", "?") if frame is not None else "?"
        attempts.append([name, asker])
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)


sys.meta_path.insert(0, Uninstalled())

from typer.testing import CliRunner

from medfed.cli import app
from medfed.data.synth import synthesize

out = Path(sys.argv[1])
runner = CliRunner()
manifests = synthesize(out / "data", modality="fundus", n_per_site=12, seed=0, image_size=48)
train = ["train", "--sites", *map(str, manifests), "--algorithm", "feddrm", "--rounds", "1"]
train += ["--local-steps", "2", "--batch-size", "8", "--device", "cpu", "--no-progress"]
train += ["--out", str(out / "run"), "--cache-dir", str(out / "cache")]
trained = runner.invoke(app, train)
scan = sorted((out / "data" / "ACRIMA").glob("*.jpg"))[0]
routed = runner.invoke(app, ["route", str(out / "run"), str(scan), "--json"])
loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
# The front ends of a missing extra say what to install instead of failing on an import.
dashboard = runner.invoke(app, ["dashboard", str(out / "run"), "--port", "8599"])
deploy = ["deploy", "app", str(out / "app"), "--site", "acrima", "--run-dir", str(out / "r")]
deployed = runner.invoke(app, deploy)
report = {"attempts": attempts, "loaded": loaded}
steps = (("train", trained), ("route", routed), ("dashboard", dashboard), ("deploy", deployed))
for key, result in steps:
    report[key] = {"exit_code": result.exit_code, "output": result.output}
    if result.exc_info and not isinstance(result.exception, SystemExit):
        import traceback

        report[key]["error"] = "".join(traceback.format_exception(*result.exc_info))
print("REPORT " + json.dumps(report))
"""


def test_core_install_trains_and_routes_without_the_extras(tmp_path: Path) -> None:
    env = os.environ | {"OMP_NUM_THREADS": "1", "MEDFED_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path), ",".join(EXTRAS_ONLY)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-5000:]
    report = json.loads(lines[-1].removeprefix("REPORT "))

    for step in ("train", "route"):
        result = report[step]
        assert result["exit_code"] == 0, f"{step}:\n{result['output']}\n{result.get('error', '')}"
    out = report["route"]["output"]
    (row,) = json.loads(out[out.index("[") :])
    assert row["status"] in {"routed", "abstained"}, row
    assert set(row["site_probs"]) == {"acrima", "rimone", "refuge"}

    for step, extra in (("dashboard", "dashboard"), ("deploy", "flower")):
        result = report[step]
        assert result["exit_code"] == 2 and "error" not in result, result
        assert f"pip install 'medfed[{extra}]'" in result["output"], result["output"]

    # Only the extras check (medfed.core.errors.require_extra) may look for them.
    asked_by_medfed = [
        (name, asker)
        for name, asker in report["attempts"]
        if asker.startswith("medfed") and asker != "medfed.core.errors"
    ]
    assert not asked_by_medfed, f"medfed imported optional packages: {asked_by_medfed}"
    assert report["loaded"] == []
