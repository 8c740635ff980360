"""Progress bars for long steps: one place decides whether they show.

Bars go to stderr, only when stderr is a terminal, and never when ``MEDFED_NO_PROGRESS`` is set
to anything but ``""``/``0``; a command's ``--no-progress`` turns them off too. Output written for
a file or a pipe therefore stays free of bar characters.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from tqdm import tqdm

T = TypeVar("T")

ENV = "MEDFED_NO_PROGRESS"


def wanted(requested: bool = True) -> bool:
    """Whether bars should show: requested, stderr is a terminal, and not turned off by ENV."""
    if not requested or os.environ.get(ENV, "").strip() not in ("", "0"):
        return False
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


def bar(
    items: Iterable[T], desc: str, *, show: bool = True, total: int | None = None, **kw: Any
) -> Iterator[T]:
    """``items`` with a bar named ``desc`` when :func:`wanted` (``show`` is the caller's wish)."""
    return iter(tqdm(items, desc=desc, total=total, disable=not wanted(show), leave=False, **kw))


def counter(desc: str, total: int, *, show: bool = True, **kw: Any) -> tqdm:
    """A manual bar (``update``/``set_postfix``/``close``) for loops that are not iterables."""
    return tqdm(total=total, desc=desc, disable=not wanted(show), leave=False, **kw)


def _line_to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def lines_instead(requested: bool = True) -> Callable[[str], None] | None:
    """Where a bar was asked for but stderr is a log file or a pipe: a printer of one line per
    step (a round, or every few) to stderr, so a long step is not silent; None where the bar
    shows, or progress is off (``requested`` false, or ENV set)."""
    if not requested or os.environ.get(ENV, "").strip() not in ("", "0") or wanted():
        return None
    return _line_to_stderr
