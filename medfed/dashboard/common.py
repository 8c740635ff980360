"""Streamlit glue shared by the pages: which runs to show, cached reads, errors as messages."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import streamlit as st

from medfed.dashboard import APP, RUNS_ENV
from medfed.dashboard.rundata import Run, find_runs, label_runs, run_status
from medfed.data.overview import OVERVIEW_FILE, overview_dir, read_site_overview
from medfed.errors import MedfedError
from medfed.runs import RunDir
from medfed.runs.schema import RoundRecord, Summary

SELECTED = "selected_runs"
NO_RUNS_HELP = (
    "A run directory is the folder 'medfed train --out RUN' writes (it holds config.toml). "
    "Train one, or run `make demo` and then `medfed dashboard demo_out`."
)


def roots() -> list[Path]:
    """The run directories or folders given to ``medfed dashboard`` (or after ``--``)."""
    given = os.environ.get(RUNS_ENV)
    if given:
        return [Path(p) for p in given.split(os.pathsep) if p]
    if sys.argv and Path(sys.argv[0]).resolve() == APP.resolve():
        return [Path(p) for p in sys.argv[1:]]  # streamlit run app.py -- RUN...
    return []


def all_runs() -> list[Run]:
    return label_runs(find_runs(roots()))


def sidebar(runs: list[Run]) -> None:
    """Choose the runs the pages compare."""
    st.sidebar.markdown("**medfed** clinician dashboard")
    labels = [r.label for r in runs]
    if labels:
        st.sidebar.multiselect(
            "Runs",
            labels,
            default=labels,
            key=SELECTED,
            help="The Federation and Communication pages compare these side by side.",
        )
    given = ", ".join(str(p) for p in roots()) or "none"
    st.sidebar.caption(f"Reading: {given}")


def chosen_runs() -> list[Run]:
    """The runs ticked in the sidebar; stops the page with a helpful message when none."""
    runs = all_runs()
    if not runs:
        given = ", ".join(f"`{p}`" for p in roots()) or "no folder"
        st.warning(f"No run directory found under {given}.")
        st.info(NO_RUNS_HELP)
        st.stop()
    chosen = st.session_state.get(SELECTED)
    picked = runs if chosen is None else [r for r in runs if r.label in chosen]
    if not picked:
        st.info("No run selected: tick at least one run in the sidebar.")
        st.stop()
    return picked


def pick_run(runs: list[Run], key: str, label: str = "Run") -> Run:
    """One of ``runs``, chosen with a select box (the first one by default)."""
    if len(runs) == 1:
        st.caption(f"Run: **{runs[0].label}** ({runs[0].path})")
        return runs[0]
    names = [r.label for r in runs]
    name = st.selectbox(label, names, key=key)
    return runs[names.index(name)] if name in names else runs[0]


def guarded(page: Callable[[], None]) -> None:
    """Run a page; a damaged or unreadable run directory becomes a message, not a traceback."""
    try:
        page()
    except MedfedError as exc:
        st.error(str(exc))
    except (KeyError, TypeError, ValueError) as exc:
        st.error(
            f"This page cannot read the run directory's files ({type(exc).__name__}: {exc}); "
            "they may be damaged or written by another medfed version."
        )


# ------------------------------------------------------------------------------- cached reads
def _stamp(path: Path) -> tuple[int, int]:
    """Changes whenever the file does, so cached reads refresh while a run is training."""
    try:
        stat = path.stat()
    except OSError:
        return (0, 0)
    return (stat.st_mtime_ns, stat.st_size)


@st.cache_data(show_spinner=False, max_entries=64)
def _summary(path: str, stamp: tuple[int, int]) -> Summary:
    return RunDir(path).read_summary()


@st.cache_data(show_spinner=False, max_entries=64)
def _metrics(path: str, stamp: tuple[int, int]) -> list[RoundRecord]:
    return RunDir(path).read_metrics()


@st.cache_data(show_spinner=False, max_entries=64)
def _events(path: str, stamp: tuple[int, int]) -> list[dict[str, Any]]:
    return RunDir(path).read_events()


@st.cache_data(show_spinner=False, max_entries=64)
def _config(path: str, stamp: tuple[int, int]) -> dict[str, Any]:
    return RunDir(path).read_config()


@st.cache_data(show_spinner=False, max_entries=64)
def _overview(path: str, stamp: tuple[int, int]) -> dict[str, Any] | None:
    return read_site_overview(path)


def read_summary(run: Run) -> Summary | None:
    """summary.json, or None while the run has not finished."""
    if not run.has_summary:
        return None
    return _summary(str(run.path), _stamp(run.dir.summary_path))


def read_metrics(run: Run) -> list[RoundRecord]:
    return _metrics(str(run.path), _stamp(run.dir.metrics_path))


def read_events(run: Run) -> list[dict[str, Any]]:
    return _events(str(run.path), _stamp(run.dir.events_path))


def read_config(run: Run) -> dict[str, Any] | None:
    if not run.has_config:
        return None
    return _config(str(run.path), _stamp(run.dir.config_path))


def read_overview(run: Run) -> dict[str, Any] | None:
    return _overview(str(run.path), _stamp(overview_dir(run.path) / OVERVIEW_FILE))


def status_line(run: Run) -> str:
    return run_status(run, read_config(run), read_metrics(run))


@st.cache_resource(show_spinner="Loading the trained site models ...", max_entries=4)
def _federation(path: str, stamp: tuple[int, int]) -> Any:
    from medfed.serving.bundle import TrainedFederation

    return TrainedFederation.load(path, "auto")


def load_federation(run: Run) -> Any:
    """The run's trained federation (model/), loaded once per version of model.json."""
    return _federation(str(run.path), _stamp(run.dir.model_dir / "model.json"))
