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


CASES = [
    Case("evaluate a folder that is not a run", _no_run, 2, ("empty",)),
    Case("summary.json is not JSON", _summary_text("{"), 2, ("summary.json", "not valid JSON")),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_bad_input_gets_a_clear_answer(case: Case, tmp_path, shared: Shared) -> None:
    check(case, tmp_path, shared)
