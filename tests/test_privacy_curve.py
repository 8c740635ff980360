"""``medfed privacy-curve``: FedAvg and FedDRM at several privacy budgets and without DP, on a
tiny budget (the figures themselves mean nothing at this size; the mechanics are checked)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from medfed.cli import app
from medfed.experiments.privacy_curve import (
    MARKER,
    METHODS,
    PLOT_DIR,
    PrivacyBudget,
    run_label,
    run_privacy_curve,
)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = PrivacyBudget(n_per_site=24, rounds=2, local_steps=1, seeds=1, image_size=48)
README = f"# medfed\n\n<!-- {MARKER}:start -->\nold text\n<!-- {MARKER}:end -->\n"


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("privacy")
    readme = root / "README.md"
    readme.write_text(README, encoding="utf-8")
    out = root / "out"
    results = run_privacy_curve(
        out, budget=TINY, n_boot=50, epsilons=(2.0, math.inf), echo=lambda _: None, readme=readme
    )
    return out, readme, results


def test_every_method_trains_at_every_budget_and_spends_no_more(finished) -> None:
    out, _, results = finished
    assert json.loads((out / "privacy.json").read_text(encoding="utf-8")) == results
    assert results["epsilons"] == ["2", "inf"]
    for method in METHODS:
        found = results["methods"][method]
        assert list(found["runs"]) == [run_label(method, 2.0), run_label(method, math.inf)]
        private, plain = found["runs"].values()
        assert 1.9 < private["epsilon_spent_max"] <= 2.0
        assert plain["epsilon"] is None and plain["epsilon_spent_max"] is None
        summary = json.loads(
            (out / "runs" / "seed0" / f"{method}_eps2" / "summary.json").read_text()
        )
        assert summary["backbone"] == "cnn-gn" and set(summary["privacy"]) == set(summary["sites"])
        no_dp = json.loads(
            (out / "runs" / "seed0" / f"{method}_epsinf" / "summary.json").read_text()
        )
        assert "privacy" not in no_dp
        comparisons = found["comparisons"]
        assert comparisons["reference"] == run_label(method, math.inf)
        assert set(comparisons["methods"]) == {run_label(method, 2.0)}


def test_writes_the_table_the_plot_and_the_readme_section(finished) -> None:
    out, readme, results = finished
    assert (out / "privacy.png").read_bytes().startswith(PNG_MAGIC)
    assert (readme.parent / PLOT_DIR / "privacy.png").read_bytes().startswith(PNG_MAGIC)
    text = readme.read_text(encoding="utf-8")
    assert "old text" not in text and f"]({PLOT_DIR.as_posix()}/privacy.png)" in text
    for section in (text, (out / "privacy.md").read_text(encoding="utf-8")):
        assert "worst-site test AUC (95% CI)" in section
        assert "paired bootstrap" in section and "medfed privacy-curve" in section


def test_the_command_refuses_a_readme_without_the_section(tmp_path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# medfed\n", encoding="utf-8")
    result = CliRunner().invoke(
        app, ["privacy-curve", "--out", str(tmp_path / "o"), "--update-readme", str(readme)]
    )
    assert result.exit_code == 2 and "privacy" in result.output
    assert not (tmp_path / "o").exists()
