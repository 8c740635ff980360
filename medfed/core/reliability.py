"""When a figure rests on too few scans to be relied on: one threshold shared by the data
checks (a split too small to judge) and the evaluation (a figure flagged unreliable)."""

from __future__ import annotations

RELIABLE_MIN = 10
"""A figure on fewer positives or fewer negatives than this is flagged unreliable."""


def unreliable(n_pos: int, n_neg: int) -> str | None:
    """Why a figure on ``n_pos`` positives and ``n_neg`` negatives is unreliable (fewer than
    ``RELIABLE_MIN`` of either), e.g. ``fewer than 10 positives (4)``; ``None`` when it is not."""
    parts = []
    if n_pos < RELIABLE_MIN:
        parts.append(f"fewer than {RELIABLE_MIN} positives ({n_pos})")
    if n_neg < RELIABLE_MIN:
        parts.append(f"fewer than {RELIABLE_MIN} negatives ({n_neg})")
    return " and ".join(parts) or None
