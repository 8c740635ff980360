"""The bad-input corpus, data and manifest cases (see tests/badinput.py for the policy)."""

from __future__ import annotations

import pytest

from tests.badinput import Case, Shared, check


def _manifest_edit(old: str, new: str):
    """`sites check` on one site whose manifest has ``old`` replaced by ``new``."""

    def make(tmp, s: Shared) -> list[str]:
        data = s.copy_data(tmp)
        manifest = sorted((data / "sites").glob("*.toml"))[0]
        text = manifest.read_text(encoding="utf-8")
        assert old in text, text
        manifest.write_text(text.replace(old, new, 1), encoding="utf-8")
        return ["sites", "check", manifest, "--cache-dir", tmp / "cache"]

    return make


def _manifest_append(section: str, line: str):
    def make(tmp, s: Shared) -> list[str]:
        data = s.copy_data(tmp)
        manifest = sorted((data / "sites").glob("*.toml"))[0]
        text = manifest.read_text(encoding="utf-8")
        manifest.write_text(text.replace(f"[{section}]\n", f"[{section}]\n{line}\n", 1))
        return ["sites", "check", manifest, "--cache-dir", tmp / "cache"]

    return make


CASES = [
    Case("roi_crop is a string", _manifest_append("preprocess", 'roi_crop = "no"'), 2,
         ("roi_crop", "true or false")),
    Case("normalize is a string", _manifest_append("preprocess", 'normalize = "yes"'), 2,
         ("normalize", "true or false")),
    Case("use_layout_split is a number", _manifest_append("split", "use_layout_split = 1"), 2,
         ("use_layout_split", "true or false")),
    Case("split seed is text", _manifest_edit("seed = 0", 'seed = "abc"'), 2,
         ("seed", "an integer")),
    Case("image_size is fractional", _manifest_edit("image_size = 64", "image_size = 64.5"), 2,
         ("image_size", "an integer")),
    Case("roi_threshold is text", _manifest_append("preprocess", 'roi_threshold = "x"'), 2,
         ("roi_threshold", "a number")),
    Case("val_fraction is a bool", _manifest_append("split", "val_fraction = true"), 2,
         ("val_fraction", "a number")),
    Case("labels share one index", _manifest_edit("glaucoma = 1", "glaucoma = 0"), 2,
         ("[labels]", "same index")),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=str)
def test_bad_data_input_gets_a_clear_answer(case: Case, tmp_path, shared: Shared) -> None:
    check(case, tmp_path, shared)
