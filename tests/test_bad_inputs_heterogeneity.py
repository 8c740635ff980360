"""The bad-input corpus, heterogeneity cases: ``medfed sites heterogeneity`` on federations it
cannot report on, and the glaucoma federation's shift knobs (see tests/badinput.py)."""

from __future__ import annotations

import pytest

from tests.badinput import Case, Shared, check, shared  # noqa: F401 - the session fixture


def _report(*extra: str, keep: tuple[str, ...] | None = None, run: bool = False):
    """``sites heterogeneity`` on a copy of the shared sites, keeping only the manifests
    ``keep`` (all when None), with the shared run when ``run``."""

    def make(tmp, s: Shared) -> list[str]:
        data = s.copy_data(tmp)
        for manifest in (data / "sites").glob("*.toml"):
            if keep is not None and manifest.stem not in keep:
                manifest.unlink()
        argv = ["sites", "heterogeneity", "--sites-dir", data, "--cache-dir", tmp / "cache"]
        return argv + (["--run", s.run] if run else []) + list(extra)

    return make


def _without_glaucoma(tmp, s: Shared) -> list[str]:
    data = s.copy_data(tmp)
    for image in (data / "ACRIMA").glob("*_g_*"):
        image.unlink()
    return ["sites", "heterogeneity", "--sites-dir", data, "--cache-dir", tmp / "cache"]


def _empty_dir(tmp, s: Shared) -> list[str]:
    (tmp / "empty").mkdir()
    return ["sites", "heterogeneity", "--sites-dir", tmp / "empty"]


def _sweep(text: str):
    def make(tmp, s: Shared) -> list[str]:
        (tmp / "sweep.json").write_text(text, encoding="utf-8")
        return _report("--sweep", str(tmp / "sweep.json"))(tmp, s)

    return make


def _synth(*extra: str):
    def make(tmp, s: Shared) -> list[str]:
        return ["synth", "--out", tmp / "f", "--modality", "fundus", *extra]

    return make


# fmt: off
CASES = [
    Case("a federation of one site", _report(keep=("acrima",)), 2,
         ("1 site(s) given", "at least two")),
    Case("a site with no scans of a class", _without_glaucoma, 0,
         ("site acrima has no scans of class(es) glaucoma",)),
    Case("a folder without manifests", _empty_dir, 2, ("no site manifests",)),
    Case("neither sites nor a run", lambda tmp, s: ["sites", "heterogeneity"], 2,
         ("--sites-dir", "--run")),
    Case("a run of other sites", _report(keep=("acrima", "refuge"), run=True), 2,
         ("rimone", "not among the sites given")),
    Case("a sweep file that is no sweep", _sweep('{"a": 1}'), 2,
         ("sweep.json", "not a scenario sweep")),
    Case("a sweep file that is not JSON", _sweep("{"), 2, ("sweep.json", "not a readable JSON")),
    Case("a sweep file nested too deeply", _sweep("[" * 100000 + "]" * 100000), 2,
         ("sweep.json", "nested too deeply")),
    Case("a sweep whose differences have no verdict",
         _sweep('{"format": 2, "scenarios": [{"covariate": "mid", "concept": false, '
                '"informative": true, "ranking": ["feddrm"], "differences": {"local": 0.1}}]}'),
         2, ("sweep.json", "scenarios[0]['differences']", "'verdict'")),
    Case("a sweep written before the informativeness gate",
         _sweep('{"format": 1, "scenarios": []}'), 2,
         ("sweep.json", "format 1", "--reuse-runs")),
    Case("an informative sweep level without a ranking",
         _sweep('{"format": 2, "scenarios": [{"covariate": "mid", "concept": false, '
                '"informative": true, "ranking": []}]}'), 2,
         ("sweep.json", "scenarios[0]", "not empty where informative")),
    Case("glaucoma sites with grades per site", _synth("--classes-per-site", "2"), 2,
         ("--classes-per-site", "--task dr only")),
    Case("glaucoma covariate shift not a level", _synth("--covariate-shift", "extreme"), 2,
         ("covariate shift 'extreme'", "low", "high")),
    Case("glaucoma federation of two sites", _synth("--n-sites", "2"), 2,
         ("n_sites", "from 3 to 32")),
]
# fmt: on


@pytest.mark.parametrize("case", CASES, ids=str)
def test_bad_heterogeneity_input_gets_a_clear_answer(case: Case, tmp_path, shared: Shared) -> None:  # noqa: F811
    check(case, tmp_path, shared)
