"""The bad-input corpus, shared cases (see tests/badinput.py for the policy each row is held to;
more rows live in test_bad_inputs_*.py)."""

from __future__ import annotations

import pytest

from tests.badinput import Case, Shared, check


def _no_run(tmp, s: Shared) -> list[str]:
    (tmp / "empty").mkdir()
    return ["evaluate", tmp / "empty"]


def _summary_text(text: str):
    def make(tmp, s: Shared) -> list[str]:
        run = s.copy_run(tmp)
        (run / "summary.json").write_text(text, encoding="utf-8")
        return ["evaluate", run]

    return make


def _out(command: str, where: str):
    """``command`` with --out at ``where`` (under tmp; ``afile`` is an existing file there).
    /proc takes no new files, whoever runs the tests."""

    def make(tmp, s: Shared) -> list:
        (tmp / "afile").write_text("not a folder\n")
        out = where if where.startswith("/") else tmp / where
        if command == "train":
            sites = s.manifests()
            return ["train", "--sites", *sites, "--algorithm", "fedavg", "--out", out]
        if command == "report":
            return ["report", s.run, "--out", out]
        return [command, "--out", out, "--quick"]

    return make


CASES = [
    Case("evaluate a folder that is not a run", _no_run, 2, ("empty",)),
    Case("summary.json is not JSON", _summary_text("{"), 2, ("summary.json", "not valid JSON")),
    Case("train --out is an existing file", _out("train", "afile"), 2,
         ("--out", "afile", "existing file")),
    Case("train --out lies under a file", _out("train", "afile/run"), 2,
         ("--out", "afile", "cannot be made")),
    Case("train --out cannot be written", _out("train", "/proc/medfed-run"), 2,
         ("--out", "/proc/medfed-run", "cannot be written")),
    Case("report --out lies under a file", _out("report", "afile/report.html"), 2,
         ("--out", "afile", "existing file")),
    Case("report --out cannot be written", _out("report", "/proc/report.html"), 2,
         ("--out", "/proc", "cannot be written")),
    Case("demo --out is an existing file", _out("demo", "afile"), 2, ("--out", "existing file")),
    Case("compare --out is an existing file", _out("compare", "afile"), 2,
         ("--out", "existing file")),
    Case("bench --out is an existing file", _out("bench", "afile"), 2,
         ("--out", "existing file")),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=str)
def test_bad_input_gets_a_clear_answer(case: Case, tmp_path, shared: Shared) -> None:
    check(case, tmp_path, shared)
