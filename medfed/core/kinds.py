"""What a recorded figure may hold, declared once on the field that holds it.

A run file's figures are declared with :func:`rate`, :func:`count`, :func:`amount` and the
others below: each puts the figure's :class:`Kind` (a rate between 0 and 1, a count, an amount
of bytes or seconds, ...) in the field's metadata, where the run schema's one reader checks
every value read against it. A leaf: the metrics declare their figures here too, without
depending on the run schema.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field
from functools import partial
from typing import Any


def is_number(value: Any) -> bool:
    """An int or a float, not a bool (JSON's true is no figure)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class Kind:
    """What a figure of a run file may hold: every number read from one is checked against its
    kind (a rate between 0 and 1, a count, an amount of bytes or seconds, ...), so a NaN, an
    infinity, a negative count or an AUC of 7.5 is refused by name instead of printed."""

    expected: str
    whole: bool = False
    low: float | None = None
    high: float | None = None
    finite: bool = True

    def accepts(self, value: Any) -> bool:
        if not is_number(value) or (self.whole and not isinstance(value, int)):
            return False
        if self.finite and not math.isfinite(value):
            return False
        if self.low is not None and not value >= self.low:
            return False
        return self.high is None or value <= self.high


FIGURE = Kind("a finite number")
"""Any finite number (a threshold, a seed-free statistic)."""
RAW = Kind("a number", finite=False)
"""Any number, NaN included (a training loss as recorded)."""
RATE = Kind("a number from 0 to 1", low=0.0, high=1.0)
"""A probability, AUC, accuracy or other rate."""
AMOUNT = Kind("a finite number, 0 or more", low=0.0)
"""Bytes, seconds, milliseconds, a standard deviation."""
WHOLE = Kind("a whole number", whole=True)
"""A round number, a seed."""
COUNT = Kind("a whole number, 0 or more", whole=True, low=0)
"""Scans, sites, rounds, passes."""


def part(
    default: Any = MISSING,
    *,
    kind: Kind | None = None,
    missing: Any = MISSING,
    omit_none: bool = False,
    flatten: bool = False,
    prefix: str = "",
    after: dict[str, str] | None = None,
    expected: str | None = None,
    rest: bool = False,
    **options: Any,
) -> Any:
    """A field of a record, as the run schema reads and writes it.

    ``kind``: what each number in it may hold. ``missing``: the value read when a file lacks
    the key (by default the field's default; with neither, the key is required).
    ``omit_none``: not written while None. ``flatten``: a nested record written as its own keys
    (each led by ``prefix``), ``after`` moving some of them after another key. ``expected``:
    the words for a malformed list or object as a whole. ``rest``: every key the record does
    not declare (each a number). ``options`` go to :func:`dataclasses.field`.
    """
    metadata = {
        "kind": kind,
        "missing": missing,
        "omit_none": omit_none,
        "flatten": flatten,
        "prefix": prefix,
        "after": after or {},
        "expected": expected,
        "rest": rest,
    }
    return field(default=default, metadata=metadata, **options)


# A field of each kind: ``rate()``, ``count(0)``, ``amount(None, hash=False)``; the default
# and options as :func:`part` takes them.
figure = partial(part, kind=FIGURE)  # any finite number
raw = partial(part, kind=RAW)  # any number, NaN and infinities included (a loss as recorded)
rate = partial(part, kind=RATE)  # a rate, probability or accuracy: from 0 to 1
auc = partial(part, kind=RATE)  # an area under the ROC curve: from 0 to 1
amount = partial(part, kind=AMOUNT)  # bytes, seconds, a spread: finite, 0 or more
whole = partial(part, kind=WHOLE)  # a whole number of either sign (a seed)
count = partial(part, kind=COUNT)  # a count of scans, sites, rounds: a whole number, 0 or more
