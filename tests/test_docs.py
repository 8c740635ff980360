"""The documentation's shape: a short README that links every page in docs/, relative links that
lead to files, and each section that a command writes in the page that command is told to write."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"

README_MAX_LINES = 400

# Marker -> the page that holds it (``--update-readme PAGE`` writes it there).
MARKER_PAGES: dict[str, str] = {
    "demo-table": "README.md",
    "demo-ct-table": "docs/ct.md",
    "compare-table": "docs/training.md",
    "transfer": "docs/training.md",
    "deploy-bench": "docs/deployment.md",
    "privacy": "docs/privacy.md",
    "bench-table": "docs/benchmarks.md",
    "bench-ct-table": "docs/benchmarks.md",
    "serve-load": "docs/pacs.md",
    "throughput": "docs/benchmarks.md",
    **{
        f"scenario-{a}": "docs/scenarios.md"
        for a in ("covariate", "lambda", "label", "concept", "clients")
    },
}

# [text](target) and ![alt](target); the target ends at a space (a title) or the parenthesis.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md")), *sorted((ROOT / "dashboard").glob("*.md"))]


def _relative_links(page: Path) -> list[str]:
    """The page's links to files of the repository (no web addresses, no in-page anchors), with
    their anchors dropped; code blocks are left out."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    targets = [m.group(1) for m in LINK.finditer(text)]
    return [
        t.split("#", 1)[0]
        for t in targets
        if not re.match(r"^[a-zA-Z][a-zA-Z+.-]*:", t) and not t.startswith("#")
    ]


def test_readme_is_short_enough_for_a_newcomer():
    lines = README.read_text(encoding="utf-8").splitlines()

    assert len(lines) < README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_readme_links_every_docs_page():
    linked = {(ROOT / t).resolve() for t in _relative_links(README)}

    missing = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]

    assert not missing, f"README.md does not link docs/{', docs/'.join(missing)}"


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file(page: Path):
    broken = [t for t in _relative_links(page) if not (page.parent / t).exists()]

    assert not broken, f"{page.relative_to(ROOT)}: links to missing files: {broken}"


@pytest.mark.parametrize("marker", sorted(MARKER_PAGES))
def test_each_written_section_sits_once_in_its_page(marker: str):
    start, end = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"
    counts = {}
    for page in _pages():
        text = page.read_text(encoding="utf-8")
        counts[page.relative_to(ROOT).as_posix()] = (text.count(start), text.count(end))

    home = MARKER_PAGES[marker]
    assert counts[home] == (1, 1), f"{home}: {marker} start/end markers found {counts[home]}"
    elsewhere = {p: c for p, c in counts.items() if p != home and c != (0, 0)}
    assert not elsewhere, f"{marker} markers also in {elsewhere}"
    text = (ROOT / home).read_text(encoding="utf-8")
    assert text.index(start) < text.index(end)


def test_the_top_level_dashboard_folder_is_not_packaged():
    setuptools = pytest.importorskip("setuptools")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]

    packages = setuptools.find_packages(where=str(ROOT), include=include)

    assert "medfed.dashboard" in packages
    assert not [p for p in packages if not p.startswith("medfed")], packages


def test_the_top_level_dashboard_serves_as_medfed_dashboard_does():
    from medfed.dashboard.launch import streamlit_command

    config = tomllib.loads((ROOT / "dashboard" / ".streamlit" / "config.toml").read_text())
    flags = dict(
        arg.removeprefix("--").split("=", 1) for arg in streamlit_command(8501) if "=" in arg
    )

    for flag, value in flags.items():
        section, key = flag.split(".", 1)
        assert str(config[section][key]).lower() == value.lower(), flag
    assert (ROOT / "dashboard" / "app.py").is_file()
    assert not (ROOT / "dashboard" / "__init__.py").exists()
