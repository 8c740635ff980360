"""The prospective figures of a clinician review: which read counts, the figures' time window,
the run's classes, Cohen's kappa between readers, and the figures per site and for the system.

Which read counts (said once here, used everywhere in the review):

* a reader's **current read** of a scan is the last one they recorded (an amended read replaces
  the read it amends; the history stays in the log);
* the **reference read** of a scan, against which the model's answer is scored (sensitivity,
  specificity, agreement), is its first gradable current read (the earliest by read time, then
  by the order recorded, that is not :data:`UNGRADABLE`);
* a scan is **ungradable** when it has reads and none of them is gradable;
* **between readers** (Cohen's kappa, disagreements) each reader's current read counts; kappa
  pairs the two readers who read the scan first, over the classes and :data:`UNGRADABLE`, and
  is given only from :data:`MIN_DOUBLE_READS` double-read scans on.

Pure Python and :mod:`medfed.metrics` (no Streamlit), for the CLI and the dashboard.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np

from medfed.clinic.audit import AuditEntry, ReadEntry
from medfed.config import class_names
from medfed.core.errors import MedfedError
from medfed.metrics import (
    Interval,
    OperatingPoint,
    Proportion,
    operating_point,
    unreliable,
    wilson,
)
from medfed.runs.rundir import RunDir

UNGRADABLE = "ungradable"
"""The read for a scan that cannot be graded (blurred, wrong eye, cut off)."""
SYSTEM = "system"
"""The scope of the figures over every site together."""
OPERATING_RULE = "site operating point (as routed)"
"""How the model's calls were made: each routed answer is already at its site's threshold."""
KAPPA_METHOD = "Cohen's kappa, asymptotic SE (statsmodels), normal 95% CI clipped to [-1, 1]"
MIN_DOUBLE_READS = 5
"""Fewest scans read by two readers that kappa is given on: below it, agreement between readers
rests on too few scans to be a figure (one double read gives kappa 0 or 1 by chance)."""

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
    "reads_blinded",
)
"""Columns of the figures CSV: one row per scope (a site, or ``system``) and figure;
``reads_blinded``: how many of the scope's counted reads were made before the reader saw the
model's answer (``k of n``)."""
FIGURE_NAMES: tuple[str, ...] = (
    "sensitivity",
    "specificity",
    "agreement",
    "kappa",
    "ungradable_rate",
    "abstain_rate",
)


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


def stamp(value: datetime) -> str:
    """A time as the audit log writes it (ISO 8601, UTC, seconds)."""
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
                f"window start {stamp(self.start)} is not before its end {stamp(self.end)}; "
                "give a start earlier than the end"
            )

    def holds(self, time: str) -> bool:
        """Whether a time of the log (a read's or a scan's routing) falls in the window."""
        t = parse_time(time)
        return (self.start is None or t >= self.start) and (self.end is None or t < self.end)

    def describe(self) -> str:
        start = stamp(self.start) if self.start else "the first record"
        end = stamp(self.end) if self.end else "now"
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
    ``n_blinded`` of the ``n_reads`` counted reads were made before the reader saw the model's
    answer.
    """

    scope: str
    operating: OperatingPoint | None
    agreement: Proportion
    kappa: Kappa
    ungradable: Proportion
    abstain: Proportion | None
    note: str | None = None
    n_reads: int = 0
    n_blinded: int = 0

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
    n_blinded: int = 0

    def blinding(self) -> str:
        """Whether the counted reads were blinded to the model's answer, in words."""
        return blinding_words(self.n_blinded, self.n_reads)

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
                rows.append(figure_row(s, name, rate, self.window))
        return rows


def figure_row(s: ScopeFigures, name: str, rate: Any, window: Window) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(FIGURE_COLUMNS)
    row |= {"scope": s.scope, "figure": name, "window_by": window.by}
    row["reads_blinded"] = f"{s.n_blinded} of {s.n_reads}"
    row["window_start"] = stamp(window.start) if window.start else None
    row["window_end"] = stamp(window.end) if window.end else None
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


def blinding_words(blinded: int, reads: int) -> str:
    """``all 6 reads blinded to the model's answer``, ``2 of 6 reads blinded ...``."""
    if reads == 0:
        return "no reads"
    if blinded == reads:
        return f"all {reads} read(s) blinded to the model's answer"
    if blinded == 0:
        return f"none of the {reads} read(s) blinded: made after seeing the model's answer"
    return (
        f"{blinded} of {reads} read(s) blinded to the model's answer; the other "
        f"{reads - blinded} made after seeing it"
    )


# ---------------------------------------------------------------------------- which read counts
def by_scan(reads: Iterable[ReadEntry]) -> dict[int, list[ReadEntry]]:
    """Reads grouped by the scan they read, each in the order recorded."""
    out: dict[int, list[ReadEntry]] = {}
    for r in reads:
        out.setdefault(r.routed_id, []).append(r)
    return out


def current(reads: Iterable[ReadEntry]) -> list[ReadEntry]:
    """Each reader's current read of each scan (the last one recorded), in the order recorded."""
    last: dict[tuple[int, str], ReadEntry] = {}
    for r in sorted(reads, key=lambda r: r.id or 0):
        last[(r.routed_id, r.reader)] = r
    return sorted(last.values(), key=lambda r: r.id or 0)


def in_order(reads: Iterable[ReadEntry]) -> list[ReadEntry]:
    """Reads by read time, then in the order recorded."""
    return sorted(reads, key=lambda r: (parse_time(r.time), r.id or 0))


def reference(reads: Iterable[ReadEntry]) -> str | None:
    """The scan's first gradable read, or ``None`` when every read says ungradable."""
    return next((r.read for r in in_order(reads) if r.read != UNGRADABLE), None)


def latest_by_reader(reads: Iterable[ReadEntry]) -> dict[str, str]:
    """Each reader's current read of one scan, by reader name."""
    return {r.reader: r.read for r in sorted(current(reads), key=lambda r: r.reader)}


def first_two_readers(reads: Iterable[ReadEntry]) -> tuple[str, str] | None:
    """The current reads of the two readers who read the scan first, or ``None``."""
    order: list[str] = []
    for r in in_order(reads):
        if r.reader not in order:
            order.append(r.reader)
    if len(order) < 2:
        return None
    latest = latest_by_reader(reads)
    return latest[order[0]], latest[order[1]]


def scope_figures(
    scope: str,
    scans: Mapping[int, AuditEntry],
    reads: Mapping[int, list[ReadEntry]],
    labels: Labels,
) -> ScopeFigures:
    """The figures of one site (the scans routed to it) or of :data:`SYSTEM`, from each scan's
    current reads (``reads``: by scan); the abstain rate is left to the caller."""
    ids = [i for i in reads if scope == SYSTEM or scans[i].chosen_site == scope]
    refs = {i: reference(reads[i]) for i in ids}
    graded = [i for i in ids if refs[i] is not None]
    answered = [i for i in graded if scans[i].status == "routed" and scans[i].prediction]
    agree = sum(scans[i].prediction == refs[i] for i in answered)
    operating = None
    if labels.binary:
        positive = labels.positive
        y = [int(refs[i] == positive) for i in answered]
        called = [float(scans[i].prediction == positive) for i in answered]
        operating = operating_point(
            np.array(y, dtype=np.int64), np.array(called), 0.5, OPERATING_RULE
        )
    pairs = [p for p in (first_two_readers(reads[i]) for i in ids) if p is not None]
    if 0 < len(pairs) < MIN_DOUBLE_READS:
        why = f"too few double reads (n={len(pairs)}): kappa needs at least {MIN_DOUBLE_READS}"
        kappa = Kappa(None, None, len(pairs), why)
    else:
        kappa = cohens_kappa([a for a, _ in pairs], [b for _, b in pairs], labels.choices())
    counted = [r for i in ids for r in reads[i]]
    return ScopeFigures(
        scope=scope,
        operating=operating,
        agreement=wilson(agree, len(answered)),
        kappa=kappa,
        ungradable=wilson(len(ids) - len(graded), len(ids)),
        abstain=None,
        n_reads=len(counted),
        n_blinded=sum(bool(r.blinded) for r in counted),
    )


def with_abstain(s: ScopeFigures, rate: Proportion) -> ScopeFigures:
    """``s`` with its abstain rate."""
    return ScopeFigures(
        s.scope, s.operating, s.agreement, s.kappa, s.ungradable, rate, s.note, s.n_reads,
        s.n_blinded,
    )  # fmt: skip
