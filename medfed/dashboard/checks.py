"""The dashboard's loading boundary (no Streamlit): every run file a page reads, read and checked
for the shapes the pages rely on, so a damaged file becomes one :class:`RunDirError` naming it
instead of a traceback halfway down a page.

:func:`run_damage` reads every file of a run directory and says which one is damaged (or None);
the pages leave such a run out and show the others. The ``read_*`` functions are the readers
the pages use once a run has passed.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from medfed.clinic.audit import AUDIT_FILE, AuditEntry, AuditError, AuditLog
from medfed.core.errors import MedfedError, RunDirError
from medfed.data.overview import OVERVIEW_FILE, overview_dir, read_site_overview
from medfed.runs import RunDir
from medfed.runs.schema import STATISTICS_FILE, RoundRecord, Summary
from medfed.runs.statistics import read_statistics

AUDIT_LIMIT = 5000  # the newest decisions the Routing page lists (and this module checks)


# ------------------------------------------------------------------------------- messages
FIX = "retrain the run, or restore the file from a backup"


def damaged(path: Path, exc: BaseException | str) -> RunDirError:
    """A RunDirError naming ``path`` and what to do; a MedfedError's own message is kept when
    it names the file."""
    if isinstance(exc, MedfedError) and (str(path) in str(exc) or f"{path.name}:" in str(exc)):
        return RunDirError(str(exc))
    if isinstance(exc, UnicodeDecodeError):
        reason = "not UTF-8 text"
    elif isinstance(exc, IsADirectoryError):
        reason = "a folder where a file belongs"
    elif isinstance(exc, OSError):
        reason = f"cannot be read ({exc.strerror or exc})"
    elif isinstance(exc, MedfedError | str):
        reason = str(exc)
    else:
        reason = f"{type(exc).__name__}: {exc}"
    return RunDirError(f"{path}: {reason}; the file is damaged: {FIX}")


def _guard(path: Path, read: Callable[[], Any]) -> Any:
    """``read()``, any failure turned into a RunDirError naming ``path``."""
    try:
        return read()
    except MedfedError as exc:
        raise damaged(path, exc) from exc
    except Exception as exc:  # noqa: BLE001 - the loading boundary: damaged files end here
        raise damaged(path, exc) from exc


_ESCAPED = r"\\[!-/:-@\[-`{-~]"  # a sign already escaped: kept as it is
_SIGNS = r"[\\`*_{}\[\]<>|~$]|:(?=[A-Za-z])"  # emphasis, code, links, HTML, tables, LaTeX,
# Streamlit's :emoji: and :colour[...] directives
_MARKDOWN = re.compile(f"{_ESCAPED}|{_SIGNS}")
_LINE_START = re.compile(r"^(\s*)([#+>-]|\d+(?=[.)]))")  # a heading, list or quote


def escape_markdown(text: str) -> str:
    """``text`` with every Markdown (and Streamlit emoji, colour, LaTeX) sign escaped, so it
    shows as written. A sign already escaped stays as it is, so escaping twice is harmless."""
    out = _MARKDOWN.sub(lambda m: m.group(0) if len(m.group(0)) == 2 else "\\" + m.group(0), text)
    return "\n".join(_LINE_START.sub(_line_start, line) for line in out.split("\n"))


def _line_start(match: re.Match[str]) -> str:
    space, sign = match.group(1), match.group(2)
    return f"{space}{sign}\\" if sign[0].isdigit() else f"{space}\\{sign}"


# ------------------------------------------------------------------------------- readers
def read_config(path: Path) -> dict[str, Any]:
    run = RunDir(path)
    where = run.config_path
    config = _guard(where, run.read_config)
    train = config.get("train", {})
    if not isinstance(train, dict):
        raise damaged(where, "[train] is not a table")
    rounds = train.get("rounds")
    if rounds is not None and (not isinstance(rounds, int) or isinstance(rounds, bool)):
        raise damaged(where, f"train.rounds = {rounds!r} is not a whole number")
    sites = config.get("sites", [])
    if not isinstance(sites, list) or not all(
        isinstance(s, dict) and isinstance(s.get("id"), str) for s in sites
    ):
        raise damaged(where, "[[sites]] is not a list of sites, each with its id")
    return config


def read_summary(path: Path) -> Summary:
    run = RunDir(path)
    return _guard(run.summary_path, run.read_summary)


def read_metrics(path: Path) -> list[RoundRecord]:
    run = RunDir(path)
    return _guard(run.metrics_path, run.read_metrics)


def read_events(path: Path) -> list[dict[str, Any]]:
    run = RunDir(path)
    return _guard(run.events_path, run.read_events)


def read_overview(path: Path) -> dict[str, Any] | None:
    """site_overview/overview.json checked, with every data card it names readable."""
    folder = overview_dir(path)
    where = folder / OVERVIEW_FILE
    overview = _guard(where, lambda: read_site_overview(path))
    if overview is None:
        return None
    _check_overview(overview, where)
    for info in overview["sites"].values():
        card = card_path(folder, info)
        if card is not None:
            _guard(card, lambda card=card: card.read_text(encoding="utf-8"))
    return overview


def card_path(folder: Path, info: Mapping[str, Any]) -> Path | None:
    """The site's data card, when the overview names one inside its folder and it exists."""
    relative = info.get("card")
    if not isinstance(relative, str) or not relative:
        return None
    path = (folder / relative).resolve()
    if not path.is_relative_to(folder.resolve()) or not path.exists():
        return None
    return path


def read_audit(path: Path, limit: int = AUDIT_LIMIT) -> list[AuditEntry]:
    where = path / AUDIT_FILE
    try:
        entries = AuditLog(path).read(limit=limit)
    except AuditError as exc:  # its own words, naming the log: a newer medfed's log is not damaged
        raise RunDirError(str(exc)) from exc
    except Exception as exc:  # noqa: BLE001 - the loading boundary: damaged files end here
        raise damaged(where, exc) from exc
    for entry in entries:
        if not isinstance(entry.site_probs, dict) or not all(
            _is_number(p) for p in entry.site_probs.values()
        ):
            raise damaged(where, f"the entry for {entry.file!r} has unreadable site probabilities")
    return entries


def read_model_json(path: Path) -> dict[str, Any]:
    run = RunDir(path)
    where = run.model_json_path
    data = _guard(where, run.read_model_json)
    if not isinstance(data, dict):
        raise damaged(where, "not a JSON object")
    return data


# ------------------------------------------------------------------------------- the check
def stamps(path: Path) -> tuple[Any, ...]:
    """Changes whenever a file :func:`run_damage` reads does (size and time of each)."""
    run = RunDir(path)
    folder = overview_dir(path)
    files = [
        run.config_path,
        run.summary_path,
        run.metrics_path,
        run.events_path,
        run.predictions_path,
        path / AUDIT_FILE,
        run.model_dir,
        run.model_json_path,
        folder / OVERVIEW_FILE,
        path / STATISTICS_FILE,
    ]
    cards = folder / "cards"
    if cards.is_dir():
        files += sorted(cards.iterdir())
    return tuple(stamp(f) for f in files)


def folder_stamp(folder: Path) -> tuple[Any, ...]:
    """Changes whenever a file in ``folder`` does."""
    if not folder.is_dir():
        return (stamp(folder),)
    return tuple((f.name, *stamp(f)) for f in sorted(folder.iterdir()))


def stamp(path: Path) -> tuple[int, int]:
    """Changes whenever the file does, so cached reads refresh while a run is training."""
    try:
        stat = path.stat()
    except OSError:
        return (0, 0)
    return (stat.st_mtime_ns, stat.st_size)


def run_damage(path: Path) -> str | None:
    """Which file of the run directory ``path`` is damaged, and how; None when all read."""
    run = RunDir(path)
    checks: list[Callable[[], Any]] = [
        # a statistics-only run ('medfed deploy stats') trains nothing: it has no config.toml
        lambda: None if _statistics_only(path) else read_config(path),
        lambda: read_statistics(path),
        lambda: read_summary(path) if run.summary_path.exists() else None,
        lambda: read_metrics(path),
        lambda: read_events(path),
        lambda: _check_predictions(path),
        lambda: read_overview(path),
        lambda: read_audit(path) if (path / AUDIT_FILE).exists() else None,
        lambda: _check_model(path),
    ]
    for check in checks:
        try:
            check()
        except MedfedError as exc:
            return str(exc)
    return None


def _statistics_only(path: Path) -> bool:
    return not RunDir(path).config_path.exists() and (path / STATISTICS_FILE).is_file()


def _check_predictions(path: Path) -> None:
    run = RunDir(path)
    if run.predictions_path.exists():
        _guard(run.predictions_path, run.read_predictions)


def _check_model(path: Path) -> None:
    run = RunDir(path)
    model = run.model_dir
    if not model.exists():
        return
    if not model.is_dir():
        raise damaged(model, "not a folder (the trained model is a folder of files)")
    if run.model_json_path.exists():
        read_model_json(path)
    elif run.summary_path.exists():
        raise RunDirError(
            f"{run.model_json_path}: missing, though the run finished; the model folder is "
            "incomplete: retrain the run or restore its model folder"
        )


def _check_overview(overview: dict[str, Any], where: Path) -> None:
    """The shapes the Sites page reads; RunDirError naming ``where`` for the first that is off."""

    def fail(what: str) -> RunDirError:
        return damaged(where, what)

    for site, info in overview["sites"].items():
        if not isinstance(info, dict):
            raise fail(f"site {site!r} is not a table")
        counts = info.get("counts", {})
        if not isinstance(counts, dict) or not all(
            isinstance(per, dict) and all(_is_count(n) for n in per.values())
            for per in counts.values()
        ):
            raise fail(f"site {site!r}: 'counts' is not a table of counts per split and class")
        ratio = info.get("class_ratio", {})
        if not isinstance(ratio, dict) or not all(_is_number(v) for v in ratio.values()):
            raise fail(f"site {site!r}: 'class_ratio' is not a table of shares")
        if "card" in info and not isinstance(info["card"], str):
            raise fail(f"site {site!r}: 'card' is not a file name")
        samples = info.get("samples", [])
        if not isinstance(samples, list) or not all(isinstance(s, dict) for s in samples):
            raise fail(f"site {site!r}: 'samples' is not a list")
    distances = overview.get("distances")
    if distances:
        sites, matrix = (
            (distances.get("sites"), distances.get("matrix"))
            if isinstance(distances, dict)
            else (None, None)
        )
        if not (
            isinstance(sites, list)
            and isinstance(matrix, list)
            and len(matrix) == len(sites)
            and all(isinstance(r, list) and len(r) == len(sites) for r in matrix)
            and all(_is_number(v) for r in matrix for v in r)
        ):
            raise fail("'distances' is not a square matrix over its sites")
    points = overview.get("embedding")
    if points:
        keys = ("x", "y", "site", "label")
        if not isinstance(points, dict) or not all(isinstance(points.get(k), list) for k in keys):
            raise fail("'embedding' lacks its x, y, site and label lists")
        if len({len(points[k]) for k in keys}) != 1:
            raise fail("'embedding' lists of different lengths")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# ------------------------------------------------------------------------------- site order
def site_order(config: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The sites in the order the run's configuration lists them (its manifests' order)."""
    sites = (config or {}).get("sites") or []
    return tuple(s["id"] for s in sites if isinstance(s, dict) and isinstance(s.get("id"), str))


def ordered(mapping: Mapping[str, Any], order: Sequence[str]) -> dict[str, Any]:
    """``mapping`` with the keys in ``order`` first (in that order), then the others."""
    first = {k: mapping[k] for k in order if k in mapping}
    return first | {k: v for k, v in mapping.items() if k not in first}


def in_order(summary: Summary, order: Sequence[str]) -> Summary:
    """``summary`` with its per-site tables in manifest order."""
    if not order:
        return summary
    return dataclasses.replace(
        summary,
        sites=ordered(summary.sites, order),
        priors=ordered(summary.priors, order),
        bytes_per_round_by_site=ordered(summary.bytes_per_round_by_site, order),
        cross_site=(
            {m: ordered(row, order) for m, row in ordered(summary.cross_site, order).items()}
            if summary.cross_site
            else summary.cross_site
        ),
    )


def overview_in_order(
    overview: dict[str, Any] | None, order: Sequence[str]
) -> dict[str, Any] | None:
    """The site overview with its sites and distance matrix in manifest order."""
    if overview is None or not order:
        return overview
    out = dict(overview, sites=ordered(overview["sites"], order))
    distances = overview.get("distances")
    if distances:
        names = list(distances["sites"])
        keep = list(ordered(dict.fromkeys(names), order))
        index = [names.index(s) for s in keep]
        matrix = [[distances["matrix"][i][j] for j in index] for i in index]
        out["distances"] = dict(distances, sites=keep, matrix=matrix)
    return out
