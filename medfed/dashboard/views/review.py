"""Review: clinicians read the scans the federation routed, record what they see, and follow the
prospective figures their reads give (sensitivity, specificity, agreement, kappa).

Reads go to the run's audit log (audit.sqlite), next to the routing decisions, through
``medfed.clinic.review``, as ``medfed review`` reads them. Nothing read from the log is cached:
each run of the page reads it again, so a read recorded in one browser session shows in every
other one at its next rerun, and nothing shown is older than the last write.
"""

from __future__ import annotations

import math
import os
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import streamlit as st

from medfed.clinic.kept import kept_scan
from medfed.clinic.pacs.instances import ids_from_name, run_visits, with_pacs_ids
from medfed.clinic.review import (
    MIN_DOUBLE_READS,
    Disagreement,
    Labels,
    QueueItem,
    Review,
    Window,
    write_figures_csv,
)
from medfed.core.errors import MedfedError
from medfed.dashboard import checks, clinical, common, reviewdata, rundata, thumbnails
from medfed.dashboard.rundata import Run
from medfed.reports import fmt
from medfed.routing.scans import read_scan

PAGE_SIZE = 10  # scans shown with their picture and read form at once
THUMBNAIL = 160  # pixels, as on the Routing page
RECORDED = "review_recorded"  # session state: what the last read recorded, shown after the rerun
MINE, NOBODY, EVERY = "not read by you", "not read by anyone", "every routed scan"
BY = {"read": "reads made in these days", "routed": "scans routed in these days"}
NOT_RELIED_ON = "Not to be relied on"
HYPOTHETICAL = f"{NOT_RELIED_ON}: what the models would have answered (no site fits this scan)"
HIDDEN = "The model's answer is hidden until you record your read"


def count(n: int, noun: str) -> str:
    """``1 scan``, ``2 scans``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


# ------------------------------------------------------------------------------- the reader
def reader_name() -> str | None:
    """Who is reading: the name the sign-in proxy sends (its header), else the name typed
    here; None (recording off) while unknown or when the header cannot be trusted."""
    try:
        header = rundata.reviewer_header(os.environ)
        name = rundata.reviewer_from_headers(st.context.headers, header)
    except MedfedError as exc:
        st.error(common.escape(str(exc)) + " Reads cannot be recorded until this is fixed.")
        return None
    if name is not None:
        st.markdown(
            f"Reading as **{common.escape(name)}** (signed in: the name comes from the "
            f"{common.escape(str(header))} header)."
        )
        return name
    typed = st.text_input(
        "Your name (recorded with every read)",
        key="reviewer",
        help="Recorded with each read you make. Behind a sign-in proxy the name comes from its "
        f"header ({rundata.REVIEWER_HEADER_ENV}) and this box does not show.",
    )
    return typed.strip() or None


# ------------------------------------------------------------------------------- pictures
def routed_picture(run_dir: Path, file: str, sha256: str) -> tuple[np.ndarray | None, str]:
    """The picture of a routed scan, from the copy the run keeps of an upload or else its file
    on this machine, and its caption; None and why when neither is here or holds the bytes
    that were routed."""
    kept = kept_scan(run_dir, sha256)
    path = kept if kept is not None else Path(file).expanduser()
    try:
        present = (kept is not None or bool(file)) and path.exists()
    except OSError:
        present = False
    if not present:
        return None, (
            "No picture: the file is not on this machine (moved since it was routed, or an "
            "upload routed before uploads were kept with the run)."
        )
    stamp = checks.folder_stamp(path) if path.is_dir() else checks.stamp(path)
    return _picture(str(path), sha256, stamp)


@st.cache_data(show_spinner=False, max_entries=128)
def _picture(path: str, sha256: str, stamp: tuple[Any, ...]) -> tuple[np.ndarray | None, str]:
    from medfed.data.cache import content_hash  # imports torch: only when there is a file

    try:
        scan = read_scan(path)
        digest = content_hash(scan.files)
    except (MedfedError, OSError, ValueError) as exc:
        return None, f"No picture: {exc}"
    if digest != sha256:
        return None, (
            "No picture: the file has changed since it was routed (its SHA-256 differs), so it "
            "is not the scan the model saw."
        )
    picture = thumbnails.picture(scan.decoded, window=thumbnails.dicom_window(scan.files))
    return picture, "the scan" if picture.ndim == 3 else "the scan (middle slice)"


# ------------------------------------------------------------------------------- the queue
def priority_words(item: QueueItem) -> str:
    if item.priority == "abstained":
        return "abstained: no site's model fits it"
    if item.priority == "low margin":
        return f"low margin: its top two site probabilities are {fmt(item.margin, 2)} apart"
    return "routine"


def queue_section(review: Review, labels: Labels, reader: str | None) -> None:
    st.subheader("Queue")
    show = st.radio("Show", [MINE, NOBODY, EVERY], horizontal=True, key="review_show")
    # Fixed slots: a hint that comes and goes must not shift the scan cards below it, or a
    # rerun briefly shows each card twice (the old one stale until the script ends).
    hint, recorded = st.empty(), st.empty()
    if show == MINE and reader is None:
        hint.caption("Give your name above to see the scans you have not read yet.")
    items = review.queue(reader=reader if show == MINE else None, include_read=show == EVERY)
    if RECORDED in st.session_state:
        recorded.success(st.session_state.pop(RECORDED))
    if not items:
        st.info(f"No scan left to read ({show}).")
        return
    tiers = {p: sum(i.priority == p for i in items) for p in ("abstained", "low margin", "routine")}
    st.caption(
        f"{count(len(items), 'scan')} ({show}): {tiers['abstained']} abstained, "
        f"{tiers['low margin']} low margin (top two site probabilities less than "
        f"{review.low_margin:.2f} apart; {review.low_margin_note}), {tiers['routine']} "
        "routine; abstained and low-margin scans first, then oldest first."
    )
    st.dataframe(
        with_pacs_ids(reviewdata.queue_frame(items), review.path),
        hide_index=True,
        width="stretch",
        column_config={
            "top-2 margin": st.column_config.NumberColumn("top-2 margin", format="%.2f"),
        },
    )
    pages = math.ceil(len(items) / PAGE_SIZE)
    page = 1
    if pages > 1:
        page = st.selectbox(
            "Scans to read", range(1, pages + 1), key="review_page", format_func=page_words(items)
        )
    disagreements = {d.scan_id: d for d in review.disagreements()}
    for item in items[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]:
        scan_card(review, item, labels, reader, disagreements.get(item.scan_id))


def page_words(items: list[QueueItem]) -> Any:
    def words(page: int) -> str:
        last = min(page * PAGE_SIZE, len(items))
        return f"{(page - 1) * PAGE_SIZE + 1}-{last} of {len(items)}"

    return words


def scan_card(
    review: Review,
    item: QueueItem,
    labels: Labels,
    reader: str | None,
    disagreement: Disagreement | None,
) -> None:
    with st.container(border=True):
        st.markdown(f"**Scan {item.scan_id}**: {common.escape(item.file)}")
        ids = ids_from_name(item.file)
        if ids is not None:
            visit = run_visits(review.path).get(ids.key)
            shown = f"{visit.label()}; " if visit is not None and visit.label() else ""
            st.caption(f"From the PACS: {shown}study {ids.study}, series {ids.series}.")
        st.caption(f"Routed {item.time} (UTC); {priority_words(item)}.")
        picture_column, answer_column, read_column = st.columns([1, 2, 2])
        with picture_column:
            picture, caption = routed_picture(review.path, item.file, item.sha256)
            if picture is not None:
                st.image(picture, width=THUMBNAIL, caption=caption)
            else:
                st.caption(common.escape(caption))
        with answer_column:
            if answer_shown(review, item, reader):
                answer(item)
            else:
                hidden_answer(review, item, reader)
        with read_column:
            reads_so_far(item, reader, disagreement)
            read_form(review, item, labels, reader)


def answer_shown(review: Review, item: QueueItem, reader: str | None) -> bool:
    """Whether ``reader`` may see the model's answer: once they have read the scan (the answer
    is then recorded as seen) or asked to see it first."""
    if reader is None:
        return False
    if reader in item.readers():
        review.reveal(item.scan_id, reader)  # once: a later read of it is no longer blinded
        return True
    return review.revealed(item.scan_id, reader)


def hidden_answer(review: Review, item: QueueItem, reader: str | None) -> None:
    """The model's answer kept back until the read is recorded, so that the read is the
    reader's own (blinded); a reader may ask for it first, and their read is then recorded as
    not blinded."""
    st.info(
        f"{HIDDEN}: it shows once your read is recorded, so that your read is your own "
        "(blinded to the model)."
    )
    if reader is None:
        return
    if st.button(
        "Show the model's answer before reading",
        key=f"reveal_{item.scan_id}",
        help="Your read of this scan is then recorded as made after seeing the model's answer.",
    ):
        try:
            review.reveal(item.scan_id, reader)
        except MedfedError as exc:
            st.error(common.escape(str(exc)))
            return
        st.rerun()


def answer_words(item: QueueItem) -> str:
    """The model's answer in one sentence, for the note after a read."""
    if item.status == "abstained":
        return "The federation abstained on this scan (no site fits it): it gave no answer."
    return (
        f"The model's answer: {item.prediction or 'n/a'} (probability "
        f"{fmt(item.prediction_prob, 2)}) at site {item.chosen_site}."
    )


def answer(item: QueueItem) -> None:
    """What the federation answered: the site and its prediction at the site's operating
    point; for an abstained scan no answer, and the models' outputs folded away and marked as
    not to be relied on."""
    if item.status == "abstained":
        st.warning(f"abstain: {common.escape(item.entry.reason or 'no site fits')}")
        if not item.site_probs:
            return
        with st.expander(HYPOTHETICAL, expanded=False):
            site_probabilities(item)
        return
    cols = st.columns(2)
    cols[0].metric("Chosen site", item.chosen_site or "")
    cols[1].metric(
        "Prediction",
        item.prediction or "n/a",
        f"probability {fmt(item.prediction_prob, 2)}",
        delta_color="off",
        delta_arrow="off",
    )
    if item.entry.reason:  # how the site's operating threshold decided it
        st.caption(common.escape(item.entry.reason))
    site_probabilities(item)


def site_probabilities(item: QueueItem) -> None:
    if item.site_probs:
        probs = rundata.probabilities_frame(item.site_probs, item.chosen_site)
        st.dataframe(
            probs.set_index("site")[["probability"]].T,
            width="stretch",
            column_config={s: st.column_config.NumberColumn(s, format="%.2f") for s in probs.site},
        )


def reads_so_far(item: QueueItem, reader: str | None, disagreement: Disagreement | None) -> None:
    """The scan's reads, once ``reader`` has read it; until then other readers' reads stay
    hidden, so that each read is independent (kappa between readers assumes it)."""
    if reader is None or reader not in item.readers():
        if item.reads:
            st.caption(
                f"{count(len(item.reads), 'read')} by others, hidden until you record yours, "
                "so that your read is independent."
            )
        return
    if disagreement is not None:
        st.warning(f"Readers disagree: {common.escape(reviewdata.read_list(disagreement.reads))}")
    for r in item.reads:
        note = f" ({r.note})" if r.note else ""
        st.caption(common.escape(f"Read {r.time}: {r.read} by {r.reader}{note}"))


def read_form(review: Review, item: QueueItem, labels: Labels, reader: str | None) -> None:
    with st.form(key=f"read_form_{item.scan_id}", clear_on_submit=True, border=False):
        read = st.radio(
            "Your read", labels.choices(), index=None, horizontal=True, key=f"read_{item.scan_id}"
        )
        note = st.text_input("Note (optional)", key=f"note_{item.scan_id}")
        submitted = st.form_submit_button("Record read", key=f"record_{item.scan_id}")
    if not submitted:
        return
    if reader is None:
        st.warning("Give your name above first: every read is recorded with its reader.")
        return
    if read is None:
        st.warning("Choose a read first (a class, or ungradable).")
        return
    try:
        written = review.record(item.scan_id, reader, read, note or None)
        review.reveal(item.scan_id, reader)  # the answer is shown now, after the read
    except MedfedError as exc:
        st.error(common.escape(str(exc)))
        return
    how = "blinded to the model's answer" if written.blinded else "after seeing the model's answer"
    st.session_state[RECORDED] = common.escape(
        f"Recorded: scan {written.routed_id} read as {written.read} by {written.reader} "
        f"({written.time}, {how}). {answer_words(item)}"
    )
    st.rerun()  # the queue, reads and figures are read again, with this read in them


# ------------------------------------------------------------------------------- the rest
def answers_seen(review: Review, reader: str | None) -> set[int]:
    """The scans whose model answer ``reader`` may see in the tables: those they have read or
    asked to see (none for a reader not yet named)."""
    if reader is None:
        return set()
    read = {r.routed_id for r in review.reads() if r.reader == reader}
    return read | {v.routed_id for v in review.log.reveals() if v.reader == reader}


def disagreements_section(review: Review, reader: str | None) -> None:
    st.subheader("Disagreements")
    found = review.disagreements()
    if not found:
        st.caption("No scan whose readers disagree (each reader's latest read counts).")
        return
    st.caption(
        f"{count(len(found), 'scan')} whose readers disagree (each reader's latest read counts)."
    )
    shown = answers_seen(review, reader)
    st.dataframe(reviewdata.disagreements_frame(found, shown), hide_index=True, width="stretch")


def window_from(start: date | None, until: date | None, by: str) -> Window:
    """The figures' window: from the start of ``start`` to the end of ``until`` (UTC days)."""
    begin = datetime.combine(start, time.min, UTC) if start else None
    end = datetime.combine(until, time.min, UTC) + timedelta(days=1) if until else None
    return Window(begin, end, by)  # type: ignore[arg-type]


def figures_section(review: Review, run: Run) -> None:
    st.subheader("Prospective figures")
    cols = st.columns(3)
    start = cols[0].date_input("From (UTC day)", value=None, key="review_from")
    until = cols[1].date_input("Until (UTC day, included)", value=None, key="review_until")
    by = cols[2].radio("Count", list(BY), format_func=BY.get, key="review_by")
    try:
        window = window_from(start, until, by)
    except MedfedError as exc:
        st.error(common.escape(str(exc)))
        return
    figures = review.figures(window)
    st.caption(
        f"{count(figures.n_reads, 'read')} of {count(figures.n_scans, 'scan')}, "
        f"{window.describe()}. Each figure "
        "with its 95% CI and counts (k/n). Sensitivity, specificity and agreement score the "
        "federation's answer (at the chosen site's operating point) against each answered "
        "scan's first gradable read; kappa compares the current reads of a scan's first two "
        f"readers (from {MIN_DOUBLE_READS} double-read scans on); a scan is ungradable when "
        "every read says so; the abstain rate counts the scans routed in the window. Reads: "
        f"{figures.blinding()}."
    )
    st.table(clinical.prospective_table(figures))
    left, right = st.columns(2)
    left.download_button(
        "Download the figures (CSV)",
        lambda: reviewdata.review_csv(lambda path: write_figures_csv(figures, path)),
        file_name=f"{run.path.name}_prospective_figures.csv",
        mime="text/csv",
        key="figures_csv",
    )
    right.download_button(
        "Download the reads (CSV)",
        lambda: reviewdata.review_csv(review.export_reads),
        file_name=f"{run.path.name}_reads.csv",
        mime="text/csv",
        key="reads_csv",
        help="Each reader's current read, then a blank row per scan nobody has read, without "
        "the model's answer, as 'medfed review RUN --export' writes it (a site can fill it in "
        "and import it; importing it twice adds nothing).",
    )


def reads_section(review: Review, reader: str | None) -> None:
    st.subheader("Reads")
    reads = review.reads()
    if not reads:
        st.caption("No read recorded yet.")
        return
    st.caption(
        f"{count(len(reads), 'read')}, newest first; a read is never overwritten: a changed "
        "read is a new row that amends it. A scan's model answer shows once you have read it."
    )
    st.dataframe(
        reviewdata.reads_frame(reads, review.scans(), answers_seen(review, reader)),
        hide_index=True,
        width="stretch",
    )


def main() -> None:
    common.heading(
        "Review",
        "Read the scans the federation routed and record what you see: one of the run's classes, "
        "or ungradable, before the model's answer is shown. Reads are kept in the run's audit "
        "log (audit.sqlite) next to the routing decisions; a read is never overwritten: a "
        "changed read is a new row that amends it. They give the prospective figures below.",
    )
    runs = common.chosen_runs()
    run = common.pick_run(
        runs, key="review_run", default=common.routing_run(runs, audit_first=True)
    )
    review = Review(run.path)
    if not review.scans():
        where = run.path / "audit.sqlite"
        if run.has_model:
            st.info(
                common.escape(
                    f"No scan has been routed with {run.label} yet ({where}): route scans on "
                    "the Routing page or with 'medfed route'; they are listed here to be read."
                )
            )
        else:
            st.info(
                common.escape(f"{run.label} has no trained model yet, so nothing to read: ")
                + common.status_line(run)
            )
        return
    labels = review.labels
    reader = reader_name()
    queue_section(review, labels, reader)
    disagreements_section(review, reader)
    figures_section(review, run)
    reads_section(review, reader)


common.guarded(main)
