"""``medfed real-study``: the pilot-study table and the outside-photo rates on real photos,
written to OUT/real-study.json and .md, and into docs/real-data.md's marked sections."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from medfed.experiments.realdata import StudyPlan, load_encoded, run_study
from medfed.experiments.realdata_outside import leave_one_out, outside_markdown
from medfed.experiments.realdata_report import measure, study_markdown
from medfed.reports.markdown import replace_marked_section

MARKERS = ("real-study", "real-outside")


def run_real_study(
    plan: StudyPlan,
    out: Path,
    *,
    echo: Callable[[str], Any] = print,
    readme: Path | None = None,
    outside: bool = True,
    reuse: bool = False,
) -> dict[str, Any]:
    """Train, measure and write; returns the results (what OUT/real-study.json holds)."""
    out.mkdir(parents=True, exist_ok=True)
    cache = out / "cache"
    runs = run_study(plan, out, cache, reuse=reuse)
    results = measure(runs, plan)
    sections = {MARKERS[0]: study_markdown(results, plan, runs)}
    _write(out, results, sections)
    if outside:
        _, encoded, _ = load_encoded(plan, cache)
        results["outside"] = leave_one_out(plan, encoded, out, cache)
        sections[MARKERS[1]] = outside_markdown(results["outside"])
    text = _write(out, results, sections)
    echo(text)
    echo(f"wrote {out / 'real-study.json'} and {out / 'real-study.md'}")
    if readme is not None:
        page = readme.read_text(encoding="utf-8")
        for marker, body in sections.items():
            page = replace_marked_section(page, marker, body)
        readme.write_text(page, encoding="utf-8")
        echo(f"updated the {', '.join(sections)} sections of {readme}")
    return results


def _write(out: Path, results: dict[str, Any], sections: dict[str, str]) -> str:
    """OUT/real-study.json and .md as far as the study has come."""
    (out / "real-study.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    text = "\n\n".join(sections.values())
    (out / "real-study.md").write_text(text + "\n", encoding="utf-8")
    return text
