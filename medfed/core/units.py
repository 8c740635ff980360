"""Human formatting shared by every command, report and page: one unit family for bytes."""

from __future__ import annotations

# Decimal (SI) units everywhere: B, kB, MB, GB, as network and storage figures are quoted.
BYTE_UNITS = (("GB", 1e9), ("MB", 1e6), ("kB", 1e3))


def human_bytes(n: float | None, digits: int = 2) -> str:
    """``1234567`` -> ``1.23 MB``; ``None`` -> ``n/a``."""
    if n is None:
        return "n/a"
    for unit, size in BYTE_UNITS:
        if abs(n) >= size:
            return f"{n / size:.{digits}f} {unit}"
    return f"{n:.0f} B"
