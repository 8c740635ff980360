"""Training: the runs' curves overlaid (one line per run), the weights each run started from,
then one run's per-round curves per site (loss, AUC), with dropouts and resumes marked."""

from __future__ import annotations

import streamlit as st

from medfed.core.errors import RunDirError
from medfed.dashboard import charts, common, rundata
from medfed.runs.schema import DROPPED, NOT_SAMPLED

DEFAULT_CURVES = ("train_loss", "val_auc")


def compared(runs: list[rundata.Run]) -> None:
    """Several runs on one chart per curve: each run's mean over its sites, round by round."""
    frames = {}
    for run in runs:
        records = common.read_metrics(run)
        if records:
            frames[run.label] = rundata.metrics_frame(records, common.site_order(run))
    if len(frames) < 2:
        return
    st.subheader("Runs compared")
    curves = list(dict.fromkeys(c for f in frames.values() for c in rundata.available_curves(f)))
    chosen = pick_curves("Curves to compare", curves, key="compare_curves")
    for curve in chosen:
        overlay = rundata.runs_frame(frames, curve)
        if overlay.empty:
            continue
        title = rundata.CURVES[curve]
        st.plotly_chart(charts.runs_overlay(overlay, curve, title), key=f"compare_{curve}")
    st.caption(
        "One line per run: the mean over the sites that trained in each round (dropped and "
        "unsampled sites left out). The run below shows each site on its own."
    )
    st.divider()


def starting(runs: list[rundata.Run]) -> None:
    """What each run started from: seeded random weights, or the pretrained weights of its
    config.toml's [init] table (one row per run when several, each run's details below)."""
    st.subheader("Starting weights")
    weights = {run.label: read_init(run) for run in runs}
    for label, got in weights.items():
        if isinstance(got, RunDirError):
            st.warning(
                f"Run **{common.escape(label)}**: its starting weights cannot be shown: "
                f"{common.escape(str(got))}"
            )
    if len(runs) == 1:
        only = weights[runs[0].label]
        if not isinstance(only, RunDirError):
            weights_details(only, nested=False)
    else:
        st.dataframe(rundata.starting_weights_table(weights))
        for label, got in weights.items():
            if not isinstance(got, RunDirError):
                with st.expander(f"{common.escape(label)}: starting weights"):
                    weights_details(got, nested=True)
    st.divider()


def read_init(run: rundata.Run) -> rundata.StartingWeights | None | RunDirError:
    """The run's [init] table; the error naming config.toml when the table is damaged."""
    try:
        return rundata.starting_weights(common.read_config(run), run.dir.config_path)
    except RunDirError as exc:
        return exc


def weights_details(weights: rundata.StartingWeights | None, *, nested: bool) -> None:
    """One run's starting weights: where they came from, what was loaded, skipped, left random."""
    if weights is None:
        st.markdown(rundata.RANDOM_INIT)
        return
    esc = common.escape
    how = ", ".join(
        f"{name} {esc(value)}"
        for name, value in (("kind", weights.kind), ("format", weights.format))
        if value
    )
    if weights.strict is not None:
        how += f"{', ' if how else ''}strict: {'yes' if weights.strict else 'no'}"
    adapters = "n/a" if weights.adapters is None else str(weights.adapters)
    came = weights.weights_normalization or "none recorded"
    lines = [
        f"**Source:** {esc(weights.source)}" + (f" ({how})" if how else ""),
        f"**File read:** {esc(weights.file or 'n/a')}",
        f"**Tensors hash (SHA-256, start):** {esc(weights.short_sha256 or 'n/a')}",
        f"**Keys:** {len(weights.loaded)} loaded, {len(weights.skipped)} skipped, "
        f"{len(weights.random)} left random (seeded); {adapters} LoRA adapter tensors "
        "(always start fresh)",
        f"**Input normalization:** {esc(weights.normalization or 'n/a')} (the weights came "
        f"with: {esc(came)})",
    ]
    st.markdown("  \n".join(lines))
    note = weights.normalization_note()
    if note:
        st.info(note)
    if weights.skipped:
        st.caption("Keys of the weights that were not loaded, and why:")
        st.dataframe(rundata.skipped_frame(weights), hide_index=True)
    else:
        st.caption("No key of the weights was skipped.")
    # Expanders may not nest: inside a run's expander the key lists sit in tabs directly.
    with st.container() if nested else st.expander("Loaded and left-random keys"):
        loaded, random = st.tabs(
            [f"Loaded ({len(weights.loaded)})", f"Left random ({len(weights.random)})"]
        )
        with loaded:
            st.dataframe({"loaded key": list(weights.loaded)}, hide_index=True)
        with random:
            st.dataframe({"key left random": list(weights.random)}, hide_index=True)


def pick_curves(label: str, curves: list[str], *, key: str) -> list[str]:
    """A multiselect of ``curves``, the default ones chosen (else the first)."""
    return st.multiselect(
        label,
        curves,
        default=[c for c in DEFAULT_CURVES if c in curves] or curves[:1],
        format_func=lambda c: rundata.CURVES[c],
        key=key,
    )


def main() -> None:
    common.heading(
        "Training", "How each site's model moved round by round, as metrics.jsonl recorded it."
    )
    runs = common.chosen_runs()
    compared(runs)
    starting(runs)
    run = common.pick_run(runs, key="training_run")
    st.caption(common.status_line(run))
    records = common.read_metrics(run)
    if not records:
        st.info(
            f"Nothing to plot yet: {run.dir.metrics_path} holds no round. Curves appear after "
            "the first round finishes."
        )
        return
    events = common.read_events(run)
    frame = rundata.metrics_frame(records, common.site_order(run))
    curves = rundata.available_curves(frame)
    chosen = pick_curves("Curves", curves, key="training_curves")
    resumed_after = rundata.resumes(events)
    skipped = rundata.skipped_rounds(events)
    for curve in chosen:
        dropped = rundata.dropouts(frame, curve)
        title = rundata.CURVES[curve]
        fig = charts.round_curves(frame, curve, title, dropped, resumed_after, skipped)
        st.plotly_chart(fig, key=f"curve_{curve}")

    dropped = frame[frame["status"] == DROPPED]
    st.subheader("Dropouts and resumes")
    if dropped.empty:
        st.write("No site dropped out.")
    else:
        st.write(f"{len(dropped)} dropout(s), marked with a red cross on the curves:")
        st.table(dropped[["round", "site", "reason"]].reset_index(drop=True))
    if resumed_after:
        rounds = ", ".join(str(r) for r in resumed_after)
        st.write(f"Resumed {len(resumed_after)} time(s), after round {rounds} (dashed lines).")
    else:
        st.write("The run was never resumed.")
    if skipped:
        st.write(f"Rounds not aggregated (too few usable updates): {skipped}.")
    not_sampled = int((frame["status"] == NOT_SAMPLED).sum())
    if not_sampled:
        st.caption(f"{not_sampled} site-round(s) were not sampled (gaps in the curves).")
    with st.expander("All run events"):
        st.table(rundata.events_frame(events))


common.guarded(main)
