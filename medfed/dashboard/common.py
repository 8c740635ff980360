"""Streamlit glue shared by the pages: which runs to show, cached reads, errors as messages.

Every file a page reads is checked here first (:func:`damage`): a run directory holding a
damaged file is named in one warning and left out, so the other runs still show.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import streamlit as st

from medfed.clinic.audit import AUDIT_FILE
from medfed.core.errors import MedfedError
from medfed.dashboard import APP, RUNS_ENV, checks
from medfed.dashboard.rundata import Run, find_runs, label_runs, run_status
from medfed.data.overview import OVERVIEW_FILE, overview_dir
from medfed.runs.schema import RoundRecord, Summary

SELECTED = "selected_runs"
NO_RUNS_HELP = (
    "A run directory is the folder 'medfed train --out RUN' writes (it holds config.toml). "
    "Train one, or run `make demo` and then `medfed dashboard demo_out`."
)


def heading(title: str, caption: str) -> None:
    """A page's title and the one line under it that says what the page shows."""
    st.title(title)
    st.caption(caption)


def roots() -> list[Path]:
    """The run directories or folders given to ``medfed dashboard`` (or after ``--``)."""
    given = os.environ.get(RUNS_ENV)
    if given:
        return [Path(p) for p in given.split(os.pathsep) if p]
    if sys.argv and Path(sys.argv[0]).resolve() == APP.resolve():
        return [Path(p) for p in sys.argv[1:]]  # streamlit run app.py -- RUN...
    return []


LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def exposed() -> str | None:
    """Why the pages must not be served (the server listens beyond this machine), or None.

    Streamlit takes ``server.address`` from its command line, STREAMLIT_SERVER_ADDRESS and
    .streamlit/config.toml; unset, it listens on every interface."""
    address = st.get_option("server.address")
    if address and (address in LOOPBACK or str(address).startswith("127.")):
        return None
    where = f"on {address}" if address else "on every network interface"
    return (
        f"This dashboard shows patient-level results and is listening {where} "
        "(server.address). Start it with `medfed dashboard RUN`, which listens on this machine "
        "only, or add `--server.address 127.0.0.1` to `streamlit run`."
    )


def all_runs() -> list[Run]:
    return label_runs(find_runs(roots()))


def sidebar(runs: list[Run]) -> None:
    """Choose the runs the pages compare (damaged runs are left out)."""
    st.sidebar.markdown("**medfed** clinician dashboard")
    runs = [r for r in runs if damage(r) is None]
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
    st.sidebar.caption(f"Reading: {escape(given)}")


def damage(run: Run) -> str | None:
    """Why ``run`` cannot be shown (its damaged file named), or None when every file it holds
    reads cleanly; checked again whenever one of its files changes."""
    return _damage(str(run.path), checks.stamps(run.path))


@st.cache_data(show_spinner=False, max_entries=256)
def _damage(path: str, stamps: tuple[Any, ...]) -> str | None:
    return checks.run_damage(Path(path))


def escape(text: str) -> str:
    """``text`` shown as it is in Streamlit markdown (paths hold underscores)."""
    return checks.escape_markdown(text)


def left_out(runs: list[Run]) -> list[Run]:
    """The runs that read cleanly; one warning per damaged run, naming its file."""
    good = []
    for run in runs:
        problem = damage(run)
        if problem is None:
            good.append(run)
        else:
            st.warning(f"Run **{escape(run.label)}** is left out: {escape(problem)}")
    return good


def chosen_runs() -> list[Run]:
    """The runs ticked in the sidebar; stops the page with a helpful message when none."""
    found = all_runs()
    if not found:
        given = ", ".join(f"`{p}`" for p in roots()) or "no folder"
        st.warning(f"No run directory found under {given}.")
        st.info(NO_RUNS_HELP)
        st.stop()
    runs = left_out(found)
    if not runs:
        st.info(
            "Every run directory here holds a damaged file (named above): retrain those runs, "
            "or restore the files from a backup."
        )
        st.stop()
    chosen = st.session_state.get(SELECTED)
    picked = runs if chosen is None else [r for r in runs if r.label in chosen]
    if not picked:
        st.info("No run selected: tick at least one run in the sidebar.")
        st.stop()
    return picked


def pick_run(runs: list[Run], key: str, label: str = "Run", default: Run | None = None) -> Run:
    """One of ``runs``, chosen with a select box (``default``, else the first one, at first)."""
    if len(runs) == 1:
        st.caption(f"Run: **{runs[0].label}** ({runs[0].path})")
        return runs[0]
    names = [r.label for r in runs]
    first = runs.index(default) if default in runs else 0
    name = st.selectbox(label, names, index=first, key=key)
    return runs[names.index(name)] if name in names else runs[0]


def routing_run(runs: list[Run], *, audit_first: bool = False) -> Run | None:
    """The run a user trained to route with: one whose summary has a routing accuracy (it routes
    by a client head, as FedDRM does), whose audit log holds routed scans, or a FedDRM run; the
    audit log comes first with ``audit_first`` (the Review page reads it). None without runs."""

    def rank(run: Run) -> tuple[bool, ...]:
        try:
            summary = read_summary(run)
        except (MedfedError, OSError, ValueError):
            summary = None
        routes = summary is not None and getattr(summary, "routing_accuracy", None) is not None
        audited = (run.path / AUDIT_FILE).is_file()
        feddrm = summary is not None and str(getattr(summary, "algorithm", "")) == "feddrm"
        return (audited, routes, feddrm) if audit_first else (routes, audited, feddrm)

    return max(runs, key=rank, default=None)  # (max keeps the first of equal ones)


def guarded(page: Callable[[], None]) -> None:
    """Run a page; a damaged or unreadable run directory becomes a message, not a traceback.

    The checks in :func:`left_out` catch damaged files before a page reads them; this is the
    last line for anything they do not foresee."""
    try:
        page()
    except MedfedError as exc:
        st.error(escape(str(exc)))
    except Exception as exc:  # noqa: BLE001 - a page must never show a traceback
        st.error(
            escape(
                f"This page cannot read the run directory's files ({type(exc).__name__}: "
                f"{exc}); they may be damaged or written by another medfed version."
            )
        )


# ------------------------------------------------------------------------------- cached reads


@st.cache_data(show_spinner=False, max_entries=64)
def _summary(path: str, stamp: tuple[int, int], order: tuple[str, ...]) -> Summary:
    return checks.in_order(checks.read_summary(Path(path)), order)


@st.cache_data(show_spinner=False, max_entries=64)
def _metrics(path: str, stamp: tuple[int, int]) -> list[RoundRecord]:
    return checks.read_metrics(Path(path))


@st.cache_data(show_spinner=False, max_entries=64)
def _events(path: str, stamp: tuple[int, int]) -> list[dict[str, Any]]:
    return checks.read_events(Path(path))


@st.cache_data(show_spinner=False, max_entries=64)
def _config(path: str, stamp: tuple[int, int]) -> dict[str, Any]:
    return checks.read_config(Path(path))


@st.cache_data(show_spinner=False, max_entries=64)
def _overview(path: str, stamp: tuple[int, int], order: tuple[str, ...]) -> dict[str, Any] | None:
    return checks.overview_in_order(checks.read_overview(Path(path)), order)


def site_order(run: Run) -> tuple[str, ...]:
    """The run's sites in the order its configuration lists them (its manifests' order)."""
    return checks.site_order(read_config(run))


def read_summary(run: Run) -> Summary | None:
    """summary.json (sites in manifest order), or None while the run has not finished."""
    if not run.has_summary:
        return None
    return _summary(str(run.path), checks.stamp(run.dir.summary_path), site_order(run))


def read_metrics(run: Run) -> list[RoundRecord]:
    return _metrics(str(run.path), checks.stamp(run.dir.metrics_path))


def read_events(run: Run) -> list[dict[str, Any]]:
    return _events(str(run.path), checks.stamp(run.dir.events_path))


def read_config(run: Run) -> dict[str, Any] | None:
    if not run.has_config:
        return None
    return _config(str(run.path), checks.stamp(run.dir.config_path))


def read_overview(run: Run) -> dict[str, Any] | None:
    stamp = checks.stamp(overview_dir(run.path) / OVERVIEW_FILE)
    return _overview(str(run.path), stamp, site_order(run))


def status_line(run: Run) -> str:
    return run_status(run, read_config(run), read_metrics(run))


def runs_holding(runs: list[Run], read: Callable[[Run], Any]) -> dict[str, Any]:
    """``read(run)`` by run label, for the runs where it holds something (not None, not
    empty); each other run's status line is shown instead."""
    found = {}
    for run in runs:
        got = read(run)
        if got:
            found[run.label] = got
        else:
            st.info(f"**{run.label}**: {status_line(run)}")
    return found


def chosen_runs_holding(
    read: Callable[[Run], Any], nothing: str
) -> tuple[list[Run], dict[str, Any]]:
    """The runs ticked in the sidebar and :func:`runs_holding`'s ``read`` of them; stops the
    page with the warning ``nothing`` when no run holds anything."""
    runs = chosen_runs()
    found = runs_holding(runs, read)
    if not found:
        st.warning(nothing)
        st.stop()
    return runs, found


@st.cache_resource(show_spinner="Loading the trained site models ...", max_entries=4)
def _federation(path: str, stamp: tuple[int, int]) -> Any:
    from medfed.routing.bundle import TrainedFederation

    return TrainedFederation.load(path, "auto")


def load_federation(run: Run) -> Any:
    """The run's trained federation (model/), loaded once per version of model.json; a
    RunDirError naming the model folder when it cannot be loaded."""
    model = run.dir.model_dir
    try:
        return _federation(str(run.path), checks.folder_stamp(model))
    except MedfedError:
        raise
    except Exception as exc:  # noqa: BLE001 - damaged weights: a message, not a traceback
        raise checks.damaged(model, exc) from exc
