"""Clinician review of routed scans: the review queue, reads, disagreements between readers,
prospective figures, and reads exchanged as CSV with sites that read outside the dashboard.

The loop: ``medfed route`` (or the dashboard) logs every routed scan in ``RUN/audit.sqlite``;
:meth:`Review.queue` lists them for review, abstained and low-margin scans first; a clinician
records a read (one of the run's classes, or :data:`UNGRADABLE`) with :meth:`Review.record`,
stored next to the routing record and never overwritten (a second read is a new row);
:meth:`Review.figures` turns the reads into prospective figures with their 95% CIs and n.

Which read counts (said once here, used everywhere below):

* the **reference read** of a scan, against which the model's answer is scored (sensitivity,
  specificity, agreement), is its first gradable read (the earliest by read time, then by the
  order recorded, that is not :data:`UNGRADABLE`);
* a scan is **ungradable** when it has reads and none of them is gradable;
* **between readers** (Cohen's kappa, disagreements) each reader's latest read of the scan
  counts; kappa pairs the two readers who read the scan first, over the classes and
  :data:`UNGRADABLE`.

Pure Python, sqlite3 and :mod:`medfed.metrics` (no Streamlit), for the CLI and the dashboard.
"""

from __future__ import annotations

import csv
import io
import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np

from medfed.config import class_names
from medfed.errors import MedfedError
from medfed.fileio import atomic_write
from medfed.metrics import (
    Interval,
    OperatingPoint,
    Proportion,
    operating_point,
    unreliable,
    wilson,
)
from medfed.runs.rundir import RunDir
from medfed.serving.audit import AuditEntry, AuditLog, ReadEntry

__all__ = [
    "EXPORT_COLUMNS",
    "FIGURE_COLUMNS",
    "LOW_MARGIN",
    "SYSTEM",
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
    "run_labels",
    "write_figures_csv",
]

UNGRADABLE = "ungradable"
"""The read for a scan that cannot be graded (blurred, wrong eye, cut off)."""
LOW_MARGIN = 0.2
"""A scan whose top two site probabilities are closer than this is reviewed early."""
SYSTEM = "system"
"""The scope of the figures over every site together."""
OPERATING_RULE = "site operating point (as routed)"
"""How the model's calls were made: each routed answer is already at its site's threshold."""
KAPPA_METHOD = "Cohen's kappa, asymptotic SE (statsmodels), normal 95% CI clipped to [-1, 1]"

READ_COLUMNS: tuple[str, ...] = ("scan_id", "reader", "read", "note", "time")
"""Columns an imported reads file may hold besides the context ones; scan_id, reader and read
are required."""
EXPORT_COLUMNS: tuple[str, ...] = (
    "scan_id",
    "routed_time",
    "file",
    "sha256",
    "status",
    "chosen_site",
    "prediction",
    "prediction_prob",
    "reader",
    "read",
    "note",
    "time",
)
"""Columns of an exported reads file: one row per read, and one blank row per scan not yet
read (fill in reader and read). Import reads scan_id, reader, read, note and time, checks sha256
against the log where given, and ignores the other context columns."""
REQUIRED_COLUMNS: tuple[str, ...] = ("scan_id", "reader", "read")
FIGURE_COLUMNS: tuple[str, ...] = (
    "scope",
    "figure",
    "value",
    "ci_low",
    "ci_high",
    "k",
    "n",
    "method",
    "note",
    "window_by",
    "window_start",
    "window_end",
)
"""Columns of the figures CSV: one row per scope (a site, or ``system``) and figure."""
FIGURE_NAMES: tuple[str, ...] = (
    "sensitivity",
    "specificity",
    "agreement",
    "kappa",
    "ungradable_rate",
    "abstain_rate",
)

_FIX_CSV = "Correct the file and import it again; nothing was imported."


class ReviewError(MedfedError):
    """A review action or a reads file cannot be used as given."""

    exit_code = 2


# ---------------------------------------------------------------------------- time
def now() -> str:
    """The current time as the audit log writes it (ISO 8601, UTC, seconds)."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def parse_time(text: str | datetime, what: str = "time") -> datetime:
    """A time in ISO 8601 (``2026-12-01T10:30:00+00:00``, ``2026-12-01 10:30Z``, ``2026-12-01``)
    as an aware UTC datetime; a time without an offset is taken as UTC."""
    if isinstance(text, datetime):
        value = text
    else:
        try:
            value = datetime.fromisoformat(str(text).strip())
        except ValueError:
            raise ReviewError(
                f"{what} {text!r} is not a time; write it in ISO 8601, e.g. "
                "2026-12-01T10:30:00+00:00 (UTC when no offset is given)"
            ) from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def _stamp(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Window:
    """The time window of the figures: ``start`` inclusive, ``end`` exclusive (either open).

    ``by="read"`` (the default) keeps the reads made in the window, and the scans they read;
    ``by="routed"`` keeps the scans routed in the window, with all their reads. The abstain
    rate is a property of routing, so it always counts the scans *routed* in the window.
    """

    start: datetime | None = None
    end: datetime | None = None
    by: Literal["read", "routed"] = "read"

    def __post_init__(self) -> None:
        if self.by not in ("read", "routed"):
            raise ReviewError(f"window by {self.by!r}: give 'read' or 'routed'")
        for name in ("start", "end"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, parse_time(value, f"window {name}"))
        if self.start is not None and self.end is not None and self.start >= self.end:
            raise ReviewError(
                f"window start {_stamp(self.start)} is not before its end {_stamp(self.end)}; "
                "give a start earlier than the end"
            )

    def holds(self, time: str) -> bool:
        """Whether a time of the log (a read's or a scan's routing) falls in the window."""
        t = parse_time(time)
        return (self.start is None or t >= self.start) and (self.end is None or t < self.end)

    def describe(self) -> str:
        start = _stamp(self.start) if self.start else "the first record"
        end = _stamp(self.end) if self.end else "now"
        return f"by {self.by} time, from {start} to {end}"


# ---------------------------------------------------------------------------- labels
@dataclass(frozen=True)
class Labels:
    """The run's classes by index (as its routed answers name them), and every spelling a read
    may use for each (a manifest may map several names to one class)."""

    classes: tuple[str, ...]
    spellings: Mapping[str, str] = field(default_factory=dict)  # casefolded -> canonical

    @property
    def binary(self) -> bool:
        return len(self.classes) == 2

    @property
    def positive(self) -> str | None:
        """The positive class of a two-class task (class index 1), else ``None``."""
        return self.classes[1] if self.binary else None

    def choices(self) -> list[str]:
        """What a reader may answer: every class, then :data:`UNGRADABLE`."""
        return [*self.classes, UNGRADABLE]

    def canonical(self, text: str) -> str | None:
        """The class (or :data:`UNGRADABLE`) ``text`` names, ignoring case and spaces."""
        key = str(text).strip().casefold()
        if key == UNGRADABLE:
            return UNGRADABLE
        return self.spellings.get(key)


def run_labels(run_dir: str | Path) -> Labels:
    """The run's label classes, from its config.toml (the first site's labels, as routing
    names its answers)."""
    run = RunDir(run_dir).require()
    sites = run.read_config().get("sites")
    labels = sites[0].get("labels") if isinstance(sites, list) and sites else None
    if not isinstance(labels, Mapping) or not labels:
        raise ReviewError(
            f"{run.config_path}: names no site labels ([[sites]] with a [labels] table), so "
            "reads cannot be checked; review a run directory written by 'medfed train'"
        )
    names = class_names({str(k): int(v) for k, v in labels.items()})
    classes = tuple(names[i] for i in sorted(names))
    spellings = {c.casefold(): c for c in classes}
    spellings |= {str(k).casefold(): names[int(v)] for k, v in labels.items()}
    if UNGRADABLE in spellings:
        raise ReviewError(
            f"{run.config_path}: a class is called {UNGRADABLE!r}, which is the review's own "
            "answer for a scan that cannot be graded; rename the class in the site manifests"
        )
    return Labels(classes, spellings)


# ---------------------------------------------------------------------------- queue
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


def _priority(entry: AuditEntry, gap: float | None, low_margin: float) -> str:
    if entry.status == "abstained":
        return "abstained"
    if gap is not None and gap < low_margin:
        return "low margin"
    return "routine"


# ---------------------------------------------------------------------------- figures
@dataclass(frozen=True)
class Kappa:
    """Cohen's kappa between two readers over ``n`` scans, with its interval. ``value`` is
    ``None`` when kappa is undefined, ``interval`` when it has no standard error (the readers
    agreed on every scan, one reader gave one answer on every scan, or they disagreed on every
    scan in a pattern that leaves it at 0); ``reason`` says why."""

    value: float | None
    interval: Interval | None
    n: int
    reason: str | None = None


def cohens_kappa(first: Sequence[str], second: Sequence[str], categories: Sequence[str]) -> Kappa:
    """Cohen's kappa of two readers' reads of the same scans (statsmodels ``cohens_kappa`` on
    their contingency table over ``categories``), with a normal 95% CI from its asymptotic
    standard error, clipped to [-1, 1]."""
    from statsmodels.stats.inter_rater import cohens_kappa as sm_kappa

    n = len(first)
    if n != len(second):
        raise ValueError(f"cohens_kappa: {n} first reads but {len(second)} second reads")
    if n == 0:
        return Kappa(None, None, 0, "no scan has reads by two readers")
    index = {c: i for i, c in enumerate(categories)}
    table = np.zeros((len(categories), len(categories)))
    for a, b in zip(first, second, strict=True):
        table[index[a], index[b]] += 1
    expected = float((table.sum(axis=1) @ table.sum(axis=0)) / n**2)
    if expected >= 1.0:
        why = f"both readers gave one and the same answer on all {n} scan(s): kappa undefined"
        return Kappa(None, None, n, why)
    with warnings.catch_warnings():  # its test of kappa = 0 divides by 0 on tiny tables
        warnings.simplefilter("ignore", RuntimeWarning)
        result = sm_kappa(table)
    value, se = float(result.kappa), float(result.std_kappa)
    if not math.isfinite(value):
        return Kappa(None, None, n, "kappa is not finite on these reads")
    if not (math.isfinite(se) and se > _SE_ROUNDING):
        why = f"no standard error on {n} scan(s) ({_why_no_se(first, second)}): no CI"
        return Kappa(value, None, n, why)
    z = 1.959963984540054
    low, high = max(-1.0, value - z * se), min(1.0, value + z * se)
    return Kappa(value, Interval(value, min(low, value), max(high, value), KAPPA_METHOD), n)


_SE_ROUNDING = 1e-7
"""statsmodels' asymptotic SE of kappa is the spread of the scans' terms in its variance; where
every scan's term is the same it is 0, up to ~1e-8 of round-off (NaN when the round-off makes
the variance negative). A true SE is far larger on any number of scans a log holds, so below
this it is taken as 0."""


def _why_no_se(first: Sequence[str], second: Sequence[str]) -> str:
    """Why kappa's asymptotic standard error is 0 on these reads, in words."""
    if all(a == b for a, b in zip(first, second, strict=True)):
        return "the readers agreed on every scan"
    for which, reads in (("first", first), ("second", second)):
        if len(set(reads)) == 1:
            return f"every scan's {which} read was {reads[0]!r}, so kappa is 0 with no spread"
    if not any(a == b for a, b in zip(first, second, strict=True)):
        return "the readers disagreed on every scan, in a pattern that leaves the spread at 0"
    return "every scan weighs the same in its asymptotic variance"


@dataclass(frozen=True)
class ScopeFigures:
    """Prospective figures of one scope: a site (the scans routed to it) or :data:`SYSTEM`.

    ``operating``: the model's answers (already at each site's operating point) against the
    reference reads of answered scans, as :func:`medfed.metrics.operating_point` counts them
    (sensitivity and specificity with Wilson CIs); ``None`` for more than two classes.
    ``agreement``: answered scans whose model answer equals the reference read.
    ``ungradable``: read scans without a gradable read. ``abstain``: scans routed in the window
    that the router abstained on (system only). ``kappa``: between two readers.
    """

    scope: str
    operating: OperatingPoint | None
    agreement: Proportion
    kappa: Kappa
    ungradable: Proportion
    abstain: Proportion | None
    note: str | None = None

    def rates(self) -> dict[str, Proportion | Kappa | None]:
        """Every figure by its name in :data:`FIGURE_NAMES`."""
        op = self.operating
        return {
            "sensitivity": op.sensitivity if op else None,
            "specificity": op.specificity if op else None,
            "agreement": self.agreement,
            "kappa": self.kappa,
            "ungradable_rate": self.ungradable,
            "abstain_rate": self.abstain,
        }


@dataclass(frozen=True)
class Prospective:
    """The prospective figures over a window: one :class:`ScopeFigures` per site, then the
    system; ``n_reads`` reads of ``n_scans`` scans fell in the window."""

    window: Window
    labels: Labels
    scopes: list[ScopeFigures]
    n_reads: int
    n_scans: int

    def scope(self, name: str) -> ScopeFigures:
        """The figures of site ``name``, or of :data:`SYSTEM` (KeyError for an unknown one)."""
        for s in self.scopes:
            if s.scope == name:
                return s
        raise KeyError(f"no figures for {name!r}; scopes: {[s.scope for s in self.scopes]}")

    def rows(self) -> list[dict[str, Any]]:
        """One plain row per scope and figure (:data:`FIGURE_COLUMNS`), for tables and CSV."""
        rows = []
        for s in self.scopes:
            for name, rate in s.rates().items():
                rows.append(_row(s, name, rate, self.window))
        return rows


def _row(s: ScopeFigures, name: str, rate: Any, window: Window) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(FIGURE_COLUMNS)
    row |= {"scope": s.scope, "figure": name, "window_by": window.by}
    row["window_start"] = _stamp(window.start) if window.start else None
    row["window_end"] = _stamp(window.end) if window.end else None
    if isinstance(rate, Kappa):
        iv = rate.interval
        row |= {"value": rate.value, "n": rate.n, "note": rate.reason}
        if iv is not None:
            row |= {"ci_low": iv.low, "ci_high": iv.high, "method": iv.method}
        return row
    if rate is None:
        why = "only for two-class tasks" if name in ("sensitivity", "specificity") else None
        why = why or "abstentions have no site; see the system row"
        return row | {"n": 0, "note": why}
    iv = rate.interval
    row |= {"k": rate.k, "n": rate.n, "value": rate.value}
    if iv is not None:
        row |= {"ci_low": iv.low, "ci_high": iv.high, "method": iv.method}
    else:
        row["note"] = "no scans"
    if name in ("sensitivity", "specificity") and s.operating is not None and rate.n:
        op = s.operating
        row["note"] = unreliable(op.tp + op.fn, op.tn + op.fp)
    return row


@dataclass(frozen=True)
class Disagreement:
    """A scan whose readers' latest reads differ: ``reads`` maps each reader to that read."""

    scan_id: int
    file: str
    chosen_site: str | None
    prediction: str | None
    reads: dict[str, str]


@dataclass(frozen=True)
class ImportResult:
    """What an import did: ``added`` reads written, ``skipped`` rows (blank worksheet rows, and
    reads already in the log exactly as given)."""

    added: int
    skipped: int


# ---------------------------------------------------------------------------- the review
class Review:
    """The review of one run: its queue, reads and prospective figures (``RUN/audit.sqlite``)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir)
        self.log = AuditLog(self.path)
        self._labels: Labels | None = None

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
        low_margin: float = LOW_MARGIN,
    ) -> list[QueueItem]:
        """Scans to review: abstained first, then low margin (top two site probabilities closer
        than ``low_margin``), then the rest; oldest first within each.

        By default only scans nobody has read; with ``reader``, the scans that reader has not
        read (a second reader sees scans the first one read); ``include_read`` keeps all.
        """
        by_scan = _by_scan(self.log.reads())
        items = []
        for scan_id, entry in self.scans().items():
            reads = tuple(by_scan.get(scan_id, ()))
            if not include_read:
                if reader is None and reads:
                    continue
                if reader is not None and any(r.reader == reader.strip() for r in reads):
                    continue
            gap = margin(entry.site_probs)
            items.append(QueueItem(scan_id, entry, gap, _priority(entry, gap, low_margin), reads))
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
        return QueueItem(int(scan_id), entry, gap, _priority(entry, gap, LOW_MARGIN), reads)

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
        """Record one read of scan ``scan_id`` by ``reader`` (a new row, even when the reader
        read the scan before). ``read``: a class of the run or :data:`UNGRADABLE` (any case);
        ``time``: when it was read (default now)."""
        entry = self.item(scan_id).entry
        row = self._checked(scan_id, entry, reader, read, note, time, source)
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
                f"read time {_stamp(when)} is before scan {scan_id} was routed "
                f"({entry.time}); give the time the scan was read"
            )
        if when > parse_time(recorded):
            raise ReviewError(
                f"read time {_stamp(when)} is in the future (now {recorded}); give the time "
                "the scan was read"
            )
        text = (note or "").strip() or None
        return ReadEntry(scan_id, who, label, text, _stamp(when), recorded, source)

    def reads(self, scan_id: int | None = None) -> list[ReadEntry]:
        """Every read (of one scan when ``scan_id`` is given), in the order recorded."""
        return self.log.reads(scan_id)

    def disagreements(self, window: Window | None = None) -> list[Disagreement]:
        """Scans whose readers disagree (each reader's latest read in ``window`` counts)."""
        scans, reads = self._in_window(window or Window())
        out = []
        for scan_id, rows in sorted(reads.items()):
            latest = _latest_by_reader(rows)
            if len(set(latest.values())) > 1:
                e = scans[scan_id]
                out.append(Disagreement(scan_id, e.file, e.chosen_site, e.prediction, latest))
        return out

    # ------------------------------------------------------------------ figures
    def figures(self, window: Window | None = None) -> Prospective:
        """Prospective figures per site (scans routed to it) and for the system, over
        ``window`` (see :class:`Window`; the module docstring says which read counts)."""
        window = window or Window()
        labels = self.labels
        scans, reads = self._in_window(window)
        sites = self._sites(scans)
        scopes = [self._scope(site, scans, reads, labels) for site in sites]
        system = self._scope(SYSTEM, scans, reads, labels)
        # abstaining is decided when a scan is routed: counted by routing time, whatever ``by``
        routed = [e for e in scans.values() if window.holds(e.time)]
        abstained = sum(e.status == "abstained" for e in routed)
        scopes.append(_replace_abstain(system, wilson(abstained, len(routed))))
        n_reads = sum(len(r) for r in reads.values())
        return Prospective(window, labels, scopes, n_reads, len(reads))

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
        """Every reviewable scan, and the reads that count in ``window`` by scan."""
        scans = self.scans()
        reads = [r for r in self.log.reads() if r.routed_id in scans]
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
        return scans, _by_scan(reads)

    def _scope(
        self,
        scope: str,
        scans: Mapping[int, AuditEntry],
        reads: Mapping[int, list[ReadEntry]],
        labels: Labels,
    ) -> ScopeFigures:
        ids = [i for i in reads if scope == SYSTEM or scans[i].chosen_site == scope]
        reference = {i: _reference(reads[i]) for i in ids}
        graded = [i for i in ids if reference[i] is not None]
        answered = [i for i in graded if scans[i].status == "routed" and scans[i].prediction]
        agree = sum(scans[i].prediction == reference[i] for i in answered)
        operating = None
        if labels.binary:
            positive = labels.positive
            y = [int(reference[i] == positive) for i in answered]
            called = [float(scans[i].prediction == positive) for i in answered]
            operating = operating_point(
                np.array(y, dtype=np.int64), np.array(called), 0.5, OPERATING_RULE
            )
        pairs = [p for p in (_first_two_readers(reads[i]) for i in ids) if p is not None]
        kappa = cohens_kappa([a for a, _ in pairs], [b for _, b in pairs], labels.choices())
        return ScopeFigures(
            scope=scope,
            operating=operating,
            agreement=wilson(agree, len(answered)),
            kappa=kappa,
            ungradable=wilson(len(ids) - len(graded), len(ids)),
            abstain=None,
        )

    # ------------------------------------------------------------------ CSV
    def export_reads(self, path: str | Path) -> int:
        """Write a reads file (:data:`EXPORT_COLUMNS`): every read, then one blank row per scan
        nobody has read yet, in queue order, for a site to fill in; returns the rows written."""
        scans = self.scans()
        rows = []
        for r in self.log.reads():
            e = scans.get(r.routed_id)
            if e is not None:
                rows.append(_export_row(r.routed_id, e, r.reader, r.read, r.note or "", r.time))
        for item in self.queue():
            rows.append(_export_row(item.scan_id, item.entry, "", "", "", ""))
        _write_csv(Path(path), EXPORT_COLUMNS, rows)
        return len(rows)

    def import_reads(self, path: str | Path, *, source: str = "import") -> ImportResult:
        """Check every row of a reads file, then write its reads in one transaction; any bad row
        refuses the whole file (ReviewError naming the file, the CSV line and what to do).

        Blank rows (no reader, read nor note) are skipped, and so are rows already in the log
        exactly as given (same scan, reader, read, note and time): importing a file twice adds
        nothing. A row without a time is read now.
        """
        path = Path(path)
        header, rows = _read_csv(path)
        scans = self.scans()
        existing = {_key(r) for r in self.log.reads()}
        seen: dict[tuple[Any, ...], int] = {}
        new: list[ReadEntry] = []
        skipped = 0
        for line, raw in rows:
            where = f"{path}, line {line}"
            cells = {c: (raw.get(c) or "").strip() for c in header}
            if not any(cells.get(c) for c in ("reader", "read", "note")):
                skipped += 1
                continue
            read = self._row_read(cells, scans, where, source)
            key = _key(read)
            if key in seen:
                raise ReviewError(
                    f"{where}: the same read as line {seen[key]} (scan {read.routed_id}, "
                    f"{read.reader}, {read.read}); delete one of them. {_FIX_CSV}"
                )
            seen[key] = line
            if cells.get("time") and key in existing:
                skipped += 1
                continue
            new.append(read)
        if new:
            self.log.add_reads(new)
        return ImportResult(len(new), skipped)

    def _row_read(
        self, cells: Mapping[str, str], scans: Mapping[int, AuditEntry], where: str, source: str
    ) -> ReadEntry:
        text = cells.get("scan_id", "")
        try:
            scan_id = int(text)
        except ValueError:
            raise ReviewError(
                f"{where}: scan_id {text!r} is not a number; give the scan's id as exported "
                f"(its row in the audit log). {_FIX_CSV}"
            ) from None
        entry = scans.get(scan_id)
        if entry is None:
            raise ReviewError(
                f"{where}: unknown scan_id {scan_id}: no routed scan of {self.path} has it; "
                f"check that the file was exported from this run. {_FIX_CSV}"
            )
        digest = cells.get("sha256", "")
        if digest and digest != entry.sha256:
            raise ReviewError(
                f"{where}: scan {scan_id}'s sha256 {digest[:12]}... is not the logged one "
                f"({entry.sha256[:12]}...): the row is about another file; check that the file "
                f"was exported from this run. {_FIX_CSV}"
            )
        try:
            return self._checked(
                scan_id,
                entry,
                cells.get("reader", ""),
                cells.get("read", ""),
                cells.get("note") or None,
                cells.get("time") or None,
                source,
            )
        except ReviewError as exc:
            raise ReviewError(f"{where}: {exc}. {_FIX_CSV}") from None


def prospective_rows(run_dir: str | Path, window: Window | None = None) -> list[dict[str, Any]]:
    """The figures' rows (:meth:`Prospective.rows`) of a run whose scans have reads; ``[]``
    for a run without an audit log or without reads (what reports show only when present)."""
    log = AuditLog(run_dir)
    if not log.path.is_file() or not log.reads():
        return []
    return Review(run_dir).figures(window).rows()


def _replace_abstain(s: ScopeFigures, rate: Proportion) -> ScopeFigures:
    return ScopeFigures(s.scope, s.operating, s.agreement, s.kappa, s.ungradable, rate, s.note)


def _by_scan(reads: Iterable[ReadEntry]) -> dict[int, list[ReadEntry]]:
    out: dict[int, list[ReadEntry]] = {}
    for r in reads:
        out.setdefault(r.routed_id, []).append(r)
    return out


def _in_order(reads: Iterable[ReadEntry]) -> list[ReadEntry]:
    """Reads by read time, then in the order recorded."""
    return sorted(reads, key=lambda r: (parse_time(r.time), r.id or 0))


def _reference(reads: Iterable[ReadEntry]) -> str | None:
    """The scan's first gradable read, or ``None`` when every read says ungradable."""
    return next((r.read for r in _in_order(reads) if r.read != UNGRADABLE), None)


def _latest_by_reader(reads: Iterable[ReadEntry]) -> dict[str, str]:
    latest: dict[str, str] = {}
    for r in _in_order(reads):
        latest[r.reader] = r.read
    return dict(sorted(latest.items()))


def _first_two_readers(reads: Iterable[ReadEntry]) -> tuple[str, str] | None:
    """The latest reads of the two readers who read the scan first, or ``None``."""
    order: list[str] = []
    for r in _in_order(reads):
        if r.reader not in order:
            order.append(r.reader)
    if len(order) < 2:
        return None
    latest = _latest_by_reader(reads)
    return latest[order[0]], latest[order[1]]


def _key(r: ReadEntry) -> tuple[Any, ...]:
    return (r.routed_id, r.reader, r.read, r.note or "", r.time)


def _export_row(
    scan_id: int, e: AuditEntry, reader: str, read: str, note: str, time: str
) -> dict[str, Any]:
    prob = e.to_dict()["prediction_prob"]
    return {
        "scan_id": scan_id,
        "routed_time": e.time,
        "file": e.file,
        "sha256": e.sha256,
        "status": e.status,
        "chosen_site": e.chosen_site or "",
        "prediction": e.prediction or "",
        "prediction_prob": "" if prob is None else f"{prob:.4f}",
        "reader": reader,
        "read": read,
        "note": note,
        "time": time,
    }


# ---------------------------------------------------------------------------- CSV files
def _write_csv(path: Path, columns: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> None:
    if path.is_dir():
        raise ReviewError(f"{path} is a folder; give the CSV file to write")
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: "" if row.get(c) is None else row[c] for c in columns})
    atomic_write(path, buffer.getvalue())


def write_figures_csv(figures: Prospective, path: str | Path) -> int:
    """Write the figures (:data:`FIGURE_COLUMNS`, one row per scope and figure); returns the
    rows written."""
    rows = figures.rows()
    _write_csv(Path(path), FIGURE_COLUMNS, rows)
    return len(rows)


def _read_csv(path: Path) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    """The header and the rows (with their line numbers) of a reads file, its columns checked."""
    if path.is_dir():
        raise ReviewError(f"{path} is a folder; give the reads CSV file to import")
    if not path.is_file():
        raise ReviewError(f"{path}: no such file; give the reads CSV to import")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ReviewError(f"{path}: not UTF-8 text ({exc}); save the file as UTF-8 CSV") from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        header = [str(h).strip() for h in (reader.fieldnames or [])]
        reader.fieldnames = header
        rows = [(reader.line_num, row) for row in reader]
    except csv.Error as exc:
        raise ReviewError(
            f"{path}, line {reader.line_num}: not valid CSV ({exc}). {_FIX_CSV}"
        ) from None
    if not header:
        raise ReviewError(
            f"{path}: empty file; give a CSV with the columns {', '.join(REQUIRED_COLUMNS)} "
            "(and optionally note, time), e.g. from 'medfed review RUN --export'"
        )
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise ReviewError(
            f"{path}, line 1: missing column(s) {', '.join(missing)}; the header must name "
            f"{', '.join(REQUIRED_COLUMNS)} (and optionally note, time). {_FIX_CSV}"
        )
    unknown = [c for c in header if c not in EXPORT_COLUMNS]
    repeated = sorted({c for c in header if header.count(c) > 1})
    if unknown or repeated:
        what = f"unknown column(s) {', '.join(map(repr, unknown))}" if unknown else ""
        what += ("; " if what else "") + (
            f"repeated column(s) {', '.join(repeated)}" if repeated else ""
        )
        raise ReviewError(
            f"{path}, line 1: {what}; accepted columns: {', '.join(EXPORT_COLUMNS)}. {_FIX_CSV}"
        )
    for line, row in rows:
        if None in row:  # more cells than the header names
            raise ReviewError(
                f"{path}, line {line}: more cells than the header has columns; quote cells "
                f'that hold commas ("a, b"). {_FIX_CSV}'
            )
    return header, rows
