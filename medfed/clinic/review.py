"""Clinician review of routed scans: the review queue, blinded reads, disagreements between
readers, prospective figures, and reads exchanged as CSV with sites that read outside the
dashboard.

The loop: ``medfed route`` (or the dashboard) logs every routed scan in ``RUN/audit.sqlite``;
:meth:`Review.queue` lists them for review, abstained and low-margin scans first; a clinician
records a read (one of the run's classes, or :data:`UNGRADABLE`) with :meth:`Review.record`,
before seeing the model's answer (:meth:`Review.reveal` records when it was shown); a changed
read is a new row that amends the reader's earlier one, never an overwrite;
:meth:`Review.figures` turns the current reads into prospective figures with their 95% CIs and
n, and says whether the reads were blinded. Which read counts is said once, in
:mod:`medfed.clinic.review_figures`; the CSV worksheet lives in
:mod:`medfed.clinic.review_sheets`.

Pure Python, sqlite3 and :mod:`medfed.metrics` (no Streamlit), for the CLI and the dashboard.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from medfed.clinic.audit import AuditEntry, AuditLog, ReadEntry
from medfed.clinic.review_figures import (
    FIGURE_COLUMNS,
    FIGURE_NAMES,
    MIN_DOUBLE_READS,
    OPERATING_RULE,
    SYSTEM,
    UNGRADABLE,
    Kappa,
    Labels,
    Prospective,
    ReviewError,
    ScopeFigures,
    Window,
    by_scan,
    cohens_kappa,
    current,
    latest_by_reader,
    now,
    parse_time,
    run_labels,
    scope_figures,
    stamp,
    with_abstain,
)
from medfed.clinic.review_sheets import (
    ANSWER_COLUMNS,
    EXPORT_COLUMNS,
    FIX_CSV,
    UNBLINDED_COLUMNS,
    ImportResult,
    export_row,
    read_csv,
    restored,
    write_csv,
    write_figures_csv,
)
from medfed.core.errors import MedfedError
from medfed.metrics import wilson
from medfed.runs.rundir import RunDir

__all__ = [
    "EXPORT_COLUMNS",
    "FIGURE_COLUMNS",
    "FIGURE_NAMES",
    "LOW_MARGIN",
    "MIN_DOUBLE_READS",
    "OPERATING_RULE",
    "SYSTEM",
    "UNBLINDED_COLUMNS",
    "UNGRADABLE",
    "Disagreement",
    "ImportResult",
    "Kappa",
    "Labels",
    "Prospective",
    "QueueItem",
    "Review",
    "ReviewError",
    "ScopeFigures",
    "Window",
    "cohens_kappa",
    "margin",
    "now",
    "parse_time",
    "prospective_rows",
    "queue_text",
    "run_labels",
    "run_low_margin",
    "run_low_margin_note",
    "write_figures_csv",
]

LOW_MARGIN = 0.2
"""A scan whose top two site probabilities are closer than this is reviewed early, for a run
whose model was published without a low-margin line fitted on validation (model.json
``routing.low_margin``, see :mod:`medfed.routing.posterior`)."""


def _published_routing(run_dir: str | Path) -> dict[str, Any]:
    """model.json's ``routing`` (empty for a run without a model, or an older one)."""
    path = RunDir(run_dir).model_json_path
    if not path.is_file():
        return {}
    try:
        routing = RunDir(run_dir).read_model_json().get("routing")
    except MedfedError:
        return {}
    return routing if isinstance(routing, dict) else {}


def run_low_margin(run_dir: str | Path) -> float:
    """The run's low-margin line: the one fitted on the sites' validation scans and published
    with the model, else :data:`LOW_MARGIN` (an older model, a run without one)."""
    value = _published_routing(run_dir).get("low_margin")
    ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 1
    return float(value) if ok else LOW_MARGIN


def run_low_margin_note(run_dir: str | Path) -> str:
    """How the run's line was set, to show beside it: what it flagged on validation with the
    interval of their routing accuracy, or that it is the fixed default."""
    from medfed.routing.bundle import RoutingFit

    routing = _published_routing(run_dir)
    if "low_margin" not in routing:
        return "the fixed default: the model was published without a fitted line"
    try:
        fit = RoutingFit.from_dict(routing)
    except (KeyError, TypeError, ValueError):
        return "the fixed default: the model's routing fit cannot be read"
    return fit.band_text() or "fitted on validation"


def margin(site_probs: Mapping[str, float]) -> float | None:
    """The gap between the two highest site probabilities (``None`` with fewer than 2 sites)."""
    values = sorted((float(p) for p in site_probs.values() if math.isfinite(p)), reverse=True)
    return values[0] - values[1] if len(values) >= 2 else None


@dataclass(frozen=True)
class QueueItem:
    """One routed scan to review: its routing record, why it is where it is in the queue
    (``priority``: ``abstained``, ``low margin`` or ``routine``), and its reads so far."""

    scan_id: int
    entry: AuditEntry
    margin: float | None
    priority: str
    reads: tuple[ReadEntry, ...] = ()

    time = property(lambda self: self.entry.time)
    file = property(lambda self: self.entry.file)
    sha256 = property(lambda self: self.entry.sha256)
    status = property(lambda self: self.entry.status)
    chosen_site = property(lambda self: self.entry.chosen_site)
    site_probs = property(lambda self: self.entry.site_probs)
    prediction = property(lambda self: self.entry.prediction)
    prediction_prob = property(lambda self: self.entry.prediction_prob)

    def readers(self) -> list[str]:
        return sorted({r.reader for r in self.reads})

    def to_dict(self) -> dict[str, Any]:
        """Plain values: the routing record, ``scan_id``, ``margin``, ``priority``, ``n_reads``."""
        out = self.entry.to_dict()
        return {
            "scan_id": self.scan_id,
            **out,
            "margin": self.margin,
            "priority": self.priority,
            "n_reads": len(self.reads),
        }


_TIERS = {"abstained": 0, "low margin": 1, "routine": 2}


def priority_of(entry: AuditEntry, gap: float | None, low_margin: float) -> str:
    if entry.status == "abstained":
        return "abstained"
    if gap is not None and gap < low_margin:
        return "low margin"
    return "routine"


@dataclass(frozen=True)
class Disagreement:
    """A scan whose readers' latest reads differ: ``reads`` maps each reader to that read."""

    scan_id: int
    file: str
    chosen_site: str | None
    prediction: str | None
    reads: dict[str, str]


def _same(row: ReadEntry, logged: ReadEntry, timed: bool) -> bool:
    """Whether a worksheet row says what a logged read says (its time only when it gives one)."""
    return (row.read, row.note or None) == (logged.read, logged.note or None) and (
        not timed or parse_time(row.time) == parse_time(logged.time)
    )


# ---------------------------------------------------------------------------- the review
class Review:
    """The review of one run: its queue, reads and prospective figures (``RUN/audit.sqlite``)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir)
        self.log = AuditLog(self.path)
        self._labels: Labels | None = None
        self._low_margin: float | None = None
        self._low_margin_note: str | None = None

    @property
    def low_margin(self) -> float:
        """Top-2 margins below this are reviewed early (:func:`run_low_margin`, read once)."""
        if self._low_margin is None:
            self._low_margin = run_low_margin(self.path)
        return self._low_margin

    @property
    def low_margin_note(self) -> str:
        """How the line was set (:func:`run_low_margin_note`, read once)."""
        if self._low_margin_note is None:
            self._low_margin_note = run_low_margin_note(self.path)
        return self._low_margin_note

    @property
    def labels(self) -> Labels:
        """The run's classes (read once from config.toml)."""
        if self._labels is None:
            self._labels = run_labels(self.path)
        return self._labels

    # ------------------------------------------------------------------ queue and reads
    def scans(self) -> dict[int, AuditEntry]:
        """Every reviewable scan (routed or abstained; errors had no answer) by its scan id."""
        scans = {i: e for i, e in self.log.records() if e.status in ("routed", "abstained")}
        for scan_id, e in scans.items():
            try:
                parse_time(e.time)
            except ReviewError:
                raise ReviewError(
                    f"{self.log.path}: scan {scan_id} was logged with the time {e.time!r}, which "
                    "is not a time: the log is damaged; restore it from a backup"
                ) from None
        return scans

    def queue(
        self,
        *,
        reader: str | None = None,
        include_read: bool = False,
        low_margin: float | None = None,
    ) -> list[QueueItem]:
        """Scans to review: abstained first, then low margin (top two site probabilities closer
        than ``low_margin``, by default the run's :attr:`low_margin`), then the rest; oldest
        first within each.

        By default only scans nobody has read; with ``reader``, the scans that reader has not
        read (a second reader sees scans the first one read); ``include_read`` keeps all.
        """
        reads_of = by_scan(self.log.reads())
        low_margin = self.low_margin if low_margin is None else low_margin
        items = []
        for scan_id, entry in self.scans().items():
            reads = tuple(reads_of.get(scan_id, ()))
            if not include_read:
                if reader is None and reads:
                    continue
                if reader is not None and any(r.reader == reader.strip() for r in reads):
                    continue
            gap = margin(entry.site_probs)
            tier = priority_of(entry, gap, low_margin)
            items.append(QueueItem(scan_id, entry, gap, tier, reads))
        items.sort(key=lambda it: (_TIERS[it.priority], parse_time(it.time), it.scan_id))
        return items

    def item(self, scan_id: int) -> QueueItem:
        """One scan of the log with its reads (ReviewError when no reviewable scan has the id)."""
        entry = self.scans().get(int(scan_id))
        if entry is None:
            raise ReviewError(
                f"{self.log.path}: no routed scan has id {scan_id}; pick a scan from "
                "'medfed review RUN --export' or the dashboard's Review page"
            )
        gap = margin(entry.site_probs)
        reads = tuple(self.log.reads(int(scan_id)))
        priority = priority_of(entry, gap, self.low_margin)
        return QueueItem(int(scan_id), entry, gap, priority, reads)

    def revealed(self, scan_id: int, reader: str) -> bool:
        """Whether ``reader`` has been shown the model's answer for scan ``scan_id``."""
        who = (reader or "").strip()
        return any(r.reader == who for r in self.log.reveals(int(scan_id)))

    def reveal(self, scan_id: int, reader: str) -> None:
        """Record that ``reader`` is shown the model's answer for scan ``scan_id`` (once): their
        reads of it from now on are not blinded."""
        who = (reader or "").strip()
        if not who:
            raise ReviewError("the reader's name is empty; give the name of who reads the scan")
        self.item(scan_id)
        if not self.revealed(scan_id, who):
            self.log.add_reveal(int(scan_id), who, now())

    def record(
        self,
        scan_id: int,
        reader: str,
        read: str,
        note: str | None = None,
        *,
        time: str | datetime | None = None,
        source: str = "dashboard",
    ) -> ReadEntry:
        """Record one read of scan ``scan_id`` by ``reader``: a new row, which amends the
        reader's earlier read of the scan when there is one. ``read``: a class of the run or
        :data:`UNGRADABLE` (any case); ``time``: when it was read (default now). The read is
        blinded unless the reader was shown the model's answer first (:meth:`reveal`)."""
        item = self.item(scan_id)
        row = self._checked(scan_id, item.entry, reader, read, note, time, source)
        mine = [r for r in item.reads if r.reader == row.reader]
        blinded = not self.revealed(scan_id, row.reader)
        row = replace(row, amends=mine[-1].id if mine else None, blinded=blinded)
        return self.log.add_reads([row])[0]

    def _checked(
        self,
        scan_id: int,
        entry: AuditEntry,
        reader: str,
        read: str,
        note: str | None,
        time: str | datetime | None,
        source: str,
    ) -> ReadEntry:
        """A read to write, checked: reader given, read known, time neither before the scan was
        routed nor in the future."""
        who = (reader or "").strip()
        if not who:
            raise ReviewError("the reader's name is empty; give the name of who read the scan")
        label = self.labels.canonical(read or "")
        if label is None:
            raise ReviewError(
                f"read {read!r} is not a class of this run; give one of "
                f"{', '.join(self.labels.choices())}"
            )
        recorded = now()
        when = parse_time(time, "read time") if time not in (None, "") else parse_time(recorded)
        if when < parse_time(entry.time):
            raise ReviewError(
                f"read time {stamp(when)} is before scan {scan_id} was routed "
                f"({entry.time}); give the time the scan was read"
            )
        if when > parse_time(recorded):
            raise ReviewError(
                f"read time {stamp(when)} is in the future (now {recorded}); give the time "
                "the scan was read"
            )
        text = (note or "").strip() or None
        return ReadEntry(scan_id, who, label, text, stamp(when), recorded, source)

    def reads(self, scan_id: int | None = None) -> list[ReadEntry]:
        """Every read (of one scan when ``scan_id`` is given), in the order recorded."""
        return self.log.reads(scan_id)

    def disagreements(self, window: Window | None = None) -> list[Disagreement]:
        """Scans whose readers disagree (each reader's current read in ``window`` counts)."""
        scans, reads = self._in_window(window or Window())
        out = []
        for scan_id, rows in sorted(reads.items()):
            latest = latest_by_reader(rows)
            if len(set(latest.values())) > 1:
                e = scans[scan_id]
                out.append(Disagreement(scan_id, e.file, e.chosen_site, e.prediction, latest))
        return out

    # ------------------------------------------------------------------ figures
    def figures(self, window: Window | None = None) -> Prospective:
        """Prospective figures per site (scans routed to it) and for the system, over
        ``window`` (see :class:`Window`; :mod:`medfed.clinic.review_figures` says which read
        counts)."""
        window = window or Window()
        labels = self.labels
        scans, reads = self._in_window(window)
        sites = self._sites(scans)
        scopes = [scope_figures(site, scans, reads, labels) for site in sites]
        system = scope_figures(SYSTEM, scans, reads, labels)
        # abstaining is decided when a scan is routed: counted by routing time, whatever ``by``
        routed = [e for e in scans.values() if window.holds(e.time)]
        abstained = sum(e.status == "abstained" for e in routed)
        scopes.append(with_abstain(system, wilson(abstained, len(routed))))
        return Prospective(
            window, labels, scopes, system.n_reads, len(reads), n_blinded=system.n_blinded
        )

    def _sites(self, scans: Mapping[int, AuditEntry]) -> list[str]:
        try:
            sites = RunDir(self.path).read_config().get("sites") or []
            known = [str(s["id"]) for s in sites if isinstance(s, Mapping) and "id" in s]
        except MedfedError:
            known = []
        seen = sorted({e.chosen_site for e in scans.values() if e.chosen_site} - set(known))
        return known + seen

    def _in_window(
        self, window: Window
    ) -> tuple[dict[int, AuditEntry], dict[int, list[ReadEntry]]]:
        """Every reviewable scan, and the current reads that count in ``window`` by scan."""
        scans = self.scans()
        reads = [r for r in current(self.log.reads()) if r.routed_id in scans]
        choices = self.labels.choices()
        for r in reads:
            if r.read not in choices:
                raise ReviewError(
                    f"{self.log.path}: read {r.id} (scan {r.routed_id}, {r.reader}) says "
                    f"{r.read!r}, not one of this run's answers ({', '.join(choices)}): the log "
                    "belongs to another run or was edited; restore the run's own audit.sqlite"
                )
        if window.by == "read":
            reads = [r for r in reads if window.holds(r.time)]
        else:
            reads = [r for r in reads if window.holds(scans[r.routed_id].time)]
        return scans, by_scan(reads)

    # ------------------------------------------------------------------ CSV
    def export_reads(self, path: str | Path, *, unblinded: bool = False) -> int:
        """Write a reads file: every reader's current read, then one blank row per scan nobody
        has read yet, in queue order, for a site to fill in; returns the rows written. The
        model's answer is left out (:data:`EXPORT_COLUMNS`) unless ``unblinded``
        (:data:`UNBLINDED_COLUMNS`)."""
        scans = self.scans()
        rows = []
        for r in current(self.log.reads()):
            e = scans.get(r.routed_id)
            if e is not None:
                read = {"read_id": r.id, "reader": r.reader, "read": r.read}
                read |= {"note": r.note or "", "time": r.time}
                rows.append(export_row(r.routed_id, e, read, unblinded=unblinded))
        for item in self.queue():
            rows.append(export_row(item.scan_id, item.entry, {}, unblinded=unblinded))
        write_csv(Path(path), UNBLINDED_COLUMNS if unblinded else EXPORT_COLUMNS, rows)
        return len(rows)

    def import_reads(self, path: str | Path, *, source: str = "import") -> ImportResult:
        """Add the reads of a reads file, each line checked on its own; returns what each line
        did (:class:`ImportResult`). A file that is no reads CSV is refused whole (ReviewError).

        A read is identified by its read_id, when the line gives one, else by its scan and
        reader: a line the log already holds as given (the same read and note, and time where
        the line gives one; an earlier version of the read counts too) is unchanged, so
        importing a file twice adds nothing; a changed read is written as an amendment of the
        reader's current read. Blank rows are skipped; a line without a time is read now. A bad
        line is refused (its line number and why), and the other lines are still imported.
        """
        path = Path(path)
        header, rows = read_csv(path)
        blinded = not any(c in header for c in ANSWER_COLUMNS)
        scans = self.scans()
        logged = self.log.reads()
        ids = {r.id: r for r in logged}
        chains: dict[tuple[int, str], list[ReadEntry]] = {}
        for r in logged:
            chains.setdefault((r.routed_id, r.reader), []).append(r)
        shown = {(v.routed_id, v.reader) for v in self.log.reveals()}
        lines: dict[tuple[int, str], int] = {}
        counts = {"new": 0, "unchanged": 0, "amended": 0, "blank": 0}
        refused: list[tuple[int, str]] = []
        new: list[ReadEntry] = []
        for line, raw in rows:
            cells = {c: restored(raw.get(c) or "").strip() for c in header}
            if not any(cells.get(c) for c in ("reader", "read", "note")):
                counts["blank"] += 1
                continue
            try:
                read = self._row_read(cells, scans, source)
                key = (read.routed_id, read.reader)
                base = self._named_read(cells.get("read_id", ""), ids, key)
                if key in lines:
                    raise ReviewError(
                        f"another read of scan {key[0]} by {key[1]} than on line {lines[key]}; "
                        "keep one line per scan and reader"
                    )
            except ReviewError as exc:
                refused.append((line, f"{path}, line {line}: {exc}. {FIX_CSV}"))
                continue
            lines[key] = line
            chain = chains.get(key, [])
            # a line matching the read it names or any later version of it changes nothing
            versions = [v for v in chain if base is None or (v.id or 0) >= (base.id or 0)]
            if any(_same(read, v, bool(cells.get("time"))) for v in versions):
                counts["unchanged"] += 1
                continue
            counts["amended" if chain else "new"] += 1
            amends = chain[-1].id if chain else None
            new.append(replace(read, amends=amends, blinded=blinded and key not in shown))
        if new:
            self.log.add_reads(new)
        return ImportResult(**counts, refused=tuple(refused))

    def _named_read(
        self, text: str, ids: Mapping[int | None, ReadEntry], key: tuple[int, str]
    ) -> ReadEntry | None:
        """The logged read a line's read_id names (None when it names none); ReviewError when
        it is no read of this log, or another scan's or reader's read."""
        if not text:
            return None
        try:
            found = ids.get(int(text))
        except ValueError:
            found = None
        if found is None:
            raise ReviewError(
                f"read_id {text!r} is no read of {self.log.path}; leave read_id empty for a "
                "read that is not in this run's log"
            )
        if (found.routed_id, found.reader) != key:
            raise ReviewError(
                f"read_id {text} is {found.reader}'s read of scan {found.routed_id}, not "
                f"{key[1]}'s read of scan {key[0]}; keep read_id as exported"
            )
        return found

    def _row_read(
        self, cells: Mapping[str, str], scans: Mapping[int, AuditEntry], source: str
    ) -> ReadEntry:
        """A worksheet line's read, checked (ReviewError saying what is wrong with it)."""
        text = cells.get("scan_id", "")
        try:
            scan_id = int(text)
        except ValueError:
            raise ReviewError(
                f"scan_id {text!r} is not a number; give the scan's id as exported "
                "(its row in the audit log)"
            ) from None
        entry = scans.get(scan_id)
        if entry is None:
            raise ReviewError(
                f"unknown scan_id {scan_id}: no routed scan of {self.path} has it; "
                "check that the file was exported from this run"
            )
        digest = cells.get("sha256", "")
        if digest and digest != entry.sha256:
            raise ReviewError(
                f"scan {scan_id}'s sha256 {digest[:12]}... is not the logged one "
                f"({entry.sha256[:12]}...): the row is about another file; check that the file "
                "was exported from this run"
            )
        return self._checked(
            scan_id,
            entry,
            cells.get("reader", ""),
            cells.get("read", ""),
            cells.get("note") or None,
            cells.get("time") or None,
            source,
        )


def prospective_rows(run_dir: str | Path, window: Window | None = None) -> list[dict[str, Any]]:
    """The figures' rows (:meth:`Prospective.rows`) of a run whose scans have reads; ``[]``
    for a run without an audit log or without reads (what reports show only when present)."""
    log = AuditLog(run_dir)
    if not log.path.is_file() or not log.reads():
        return []
    return Review(run_dir).figures(window).rows()


def disagreement_rows(run_dir: str | Path) -> list[dict[str, Any]]:
    """The scans of a run whose readers' latest reads differ, as dicts
    (:class:`Disagreement`'s fields); ``[]`` for a run without an audit log or reads."""
    log = AuditLog(run_dir)
    if not log.path.is_file() or not log.reads():
        return []
    return [asdict(d) for d in Review(run_dir).disagreements()]


QUEUE_SHOWN = 20
"""Scans the CLI lists from the head of the queue."""


def queue_text(review: Review, reader: str | None = None) -> str:
    """The review queue as the dashboard's Review page lists it (scans nobody has read, or
    that ``reader`` has not), without the model's answer: reads are blinded to it."""
    items = review.queue(reader=reader)
    whom = f"not read by {reader}" if reader else "not read by anyone"
    if not items:
        return f"queue: no scan left to read ({whom})"
    tiers = {p: sum(i.priority == p for i in items) for p in _TIERS}
    lines = [
        f"queue: {len(items)} scan(s) {whom}: {tiers['abstained']} abstained, "
        f"{tiers['low margin']} low margin (top two site probabilities less than "
        f"{review.low_margin:.2f} apart; {review.low_margin_note}), {tiers['routine']} "
        "routine; abstained and low-margin first, then oldest first"
    ]
    from medfed.clinic.pacs.instances import ids_from_name, run_visits

    visits = run_visits(review.path)
    for it in items[:QUEUE_SHOWN]:
        gap = "" if it.margin is None else f", top-2 margin {it.margin:.2f}"
        site = it.chosen_site or "abstain"
        ids = ids_from_name(it.file)
        visit = visits.get(ids.key) if ids else None
        shown = f"{visit.label()} ({it.file})" if visit and visit.label() else it.file
        lines.append(
            f"  scan {it.scan_id} [{it.priority}] routed {it.time} to {site}{gap}: {shown}"
        )
    if len(items) > QUEUE_SHOWN:
        lines.append(f"  ... and {len(items) - QUEUE_SHOWN} more (--export lists every one)")
    return "\n".join(lines)
