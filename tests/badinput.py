"""The bad-input corpus: one row per bad input, each run through the real CLI in-process.

A :class:`Case` builds its bad input under a temporary folder (from a copy of the shared
synthetic sites or of the shared trained run, never the originals) and returns the command line
to run. Every case must end with the expected exit code, name what is wrong (the words must
appear in the output), and never show a Python traceback. Test modules hold the rows
(``CASES``) and parametrize :func:`check` over them; the fixtures here are built once per
session.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from medfed.cli import app

N_PER_SITE = 24


@dataclass(frozen=True)
class Shared:
    """What cases start from: synthetic fundus sites and a run trained on them (read-only)."""

    data: Path  # medfed synth output: sites/*.toml and the image folders
    run: Path  # a finished feddrm run over those sites

    def manifests(self) -> list[Path]:
        return sorted((self.data / "sites").glob("*.toml"))

    def copy_data(self, tmp: Path) -> Path:
        """A private copy of the sites, manifests rewritten to point into it."""
        out = tmp / "data"
        shutil.copytree(self.data, out)
        for manifest in (out / "sites").glob("*.toml"):
            text = manifest.read_text(encoding="utf-8")
            manifest.write_text(text.replace(str(self.data), str(out)), encoding="utf-8")
        return out

    def copy_run(self, tmp: Path) -> Path:
        out = tmp / "run"
        shutil.copytree(self.run, out)
        return out


@dataclass(frozen=True)
class Case:
    """One bad input: how to build it and run a command on it, and the answer it must get."""

    name: str
    make: Callable[[Path, Shared], list[str]]  # (tmp folder, shared inputs) -> argv
    exit_code: int
    words: tuple[str, ...]  # each must appear in the output (case-insensitive)
    env: tuple[tuple[str, str], ...] = ()  # environment variables the command runs with

    def __str__(self) -> str:
        return self.name


def check(case: Case, tmp_path: Path, shared: Shared) -> None:
    """Run ``case`` and hold it to the policy: clear words, the right exit code, no traceback."""
    argv = case.make(tmp_path, shared)
    result = CliRunner().invoke(app, [str(a) for a in argv], env=dict(case.env) or None)
    output = result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"{case.name}: uncaught {result.exception!r}\n{output}")
    assert "Traceback" not in output, f"{case.name}: a traceback was shown\n{output}"
    assert result.exit_code == case.exit_code, f"{case.name}: exit {result.exit_code}\n{output}"
    missing = [w for w in case.words if w.lower() not in output.lower()]
    assert not missing, f"{case.name}: the answer lacks {missing}\n{output}"


@pytest.fixture(scope="session")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Shared:
    base = tmp_path_factory.mktemp("badinput")
    runner = CliRunner()
    data = base / "data"
    made = runner.invoke(
        app, ["synth", "--out", str(data), "--modality", "fundus", "--n-per-site", str(N_PER_SITE)]
    )
    assert made.exit_code == 0, made.output
    run = base / "run"
    manifests = [str(p) for p in sorted((data / "sites").glob("*.toml"))]
    argv = ["train", "--sites", *manifests, "--algorithm", "feddrm", "--rounds", "2"]
    argv += ["--local-steps", "1", "--device", "cpu", "--out", str(run), "--no-progress"]
    trained = runner.invoke(app, argv)
    assert trained.exit_code == 0, trained.output
    return Shared(data=data, run=run)
