"""The quick demo, whole, equals its pinned figures (tests/fixtures/quick_demo.json) at the
threads CI uses: a restructure that changes no behaviour leaves every figure, file and message
of it as it was. tests/pinned_demo.py says how to re-pin after a change meant to move them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from medfed.experiments.demo import run_demo
from tests.pinned_demo import FIXTURE, differences, machine, pin, shape_differences, snapshot

pytestmark = pytest.mark.slow


def test_the_quick_demo_equals_its_pinned_figures(tmp_path: Path) -> None:
    pinned = json.loads(FIXTURE.read_text(encoding="utf-8"))

    run_demo(tmp_path / "demo", quick=True, echo=lambda _line: None)

    found = snapshot(tmp_path / "demo")
    if os.environ.get("MEDFED_REPIN") == "1":
        pin(found)
        pytest.skip(f"re-pinned the quick demo in {FIXTURE}")
    pinned_on = pinned.pop("machine", None)
    if pinned_on == machine():
        problems = differences(found, pinned)
        assert not problems, "the quick demo moved:\n" + "\n".join(problems[:20])
    else:  # other kernels, other sums: the shape is held, the figures are not compared
        print(f"pinned on a {pinned_on} CPU, run on a {machine()} one: its shape compared")
        problems = shape_differences(found, pinned)
        assert not problems, "the quick demo changed shape:\n" + "\n".join(problems[:20])
