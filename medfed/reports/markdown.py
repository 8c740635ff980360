"""Markdown: tables, an experiment's result files, and the marked sections that the experiments
write into the README and the docs pages."""

from __future__ import annotations

import json
import os
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


def repository_root(path: Path) -> Path:
    """The folder of the nearest ``pyproject.toml`` above ``path``; ``path``'s own folder when
    there is none (a README on its own)."""
    folder = path.resolve().parent
    for candidate in (folder, *folder.parents):
        if (candidate / "pyproject.toml").is_file():
            return candidate
    return folder


def update_readme_section(
    path: Path, marker: str, body: str, plots: Iterable[Path], plot_dir: Path
) -> None:
    """Write ``body`` between the ``marker`` lines of the markdown file ``path`` (the README or a
    docs page), with ``plots`` copied into ``plot_dir`` first (``ValueError`` when the markers
    are missing, before anything is copied).

    ``plot_dir`` is relative to the repository root (:func:`repository_root`), as are the image
    links to it in ``body`` (``docs/bench/fundus.png``); the links are written relative to
    ``path``, so they resolve from a page in a sub-folder (``bench/fundus.png`` in
    ``docs/bench.md``) as they do from the README."""
    text = path.read_text(encoding="utf-8")
    folder = repository_root(path) / plot_dir
    if not plot_dir.is_absolute():
        linked = Path(os.path.relpath(folder, path.resolve().parent)).as_posix()
        if linked != plot_dir.as_posix():
            body = body.replace(f"]({plot_dir.as_posix()}/", f"]({linked}/")
    text = replace_marked_section(text, marker, body)
    folder.mkdir(parents=True, exist_ok=True)
    for plot in plots:
        shutil.copyfile(plot, folder / plot.name)
    path.write_text(text, encoding="utf-8")
