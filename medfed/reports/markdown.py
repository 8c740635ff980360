"""Markdown: tables, an experiment's result files, and the marked sections that the experiments
write into the README and the docs pages."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from medfed.reports.text import fmt


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in header]] + [[fmt(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def line(row: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"

    sep = "| " + " | ".join("-" * w for w in widths) + " |"
    return "\n".join([line(cells[0]), sep, *(line(r) for r in cells[1:])])


def replace_marked_section(text: str, marker: str, body: str) -> str:
    """Replace what stands between ``<!-- marker:start -->`` and ``<!-- marker:end -->``."""
    start, end = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"
    if start not in text or end not in text:
        raise ValueError(f"markers {start} ... {end} not found")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body.rstrip()}\n{end}{tail}"


def write_results(out: Path, stem: str, results: Mapping[str, Any], markdown: str) -> str:
    """``OUT/STEM.json`` and ``OUT/STEM.md`` of an experiment; returns how to name them."""
    (out / f"{stem}.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    (out / f"{stem}.md").write_text(markdown + "\n", encoding="utf-8")
    return f"{out / f'{stem}.json'}, {out / f'{stem}.md'}"


def update_readme_section(
    path: Path, marker: str, body: str, plots: Iterable[Path], plot_dir: Path
) -> None:
    """Write ``body`` between the ``marker`` lines of the markdown file ``path`` (the README or a
    docs page), with ``plots`` copied into ``plot_dir`` first (``ValueError`` when the markers
    are missing, before anything is copied).

    ``plot_dir`` is relative to ``path``'s folder, as the image links in ``body`` are
    (``bench/fundus.png`` in ``docs/benchmarks.md`` is ``docs/bench/fundus.png``), so the links
    resolve from the page wherever it lies."""
    text = replace_marked_section(path.read_text(encoding="utf-8"), marker, body)
    folder = path.parent / plot_dir
    folder.mkdir(parents=True, exist_ok=True)
    for plot in plots:
        shutil.copyfile(plot, folder / plot.name)
    path.write_text(text, encoding="utf-8")
