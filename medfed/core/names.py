"""How file names (and messages that hold them) are shown: valid UTF-8 on one line.

A file name may hold bytes that are not UTF-8 (Python carries them as surrogates, which fail
when printed or written) and control characters such as a newline (which would start a line
of its own in a report). Both become backslash escapes, e.g. ``scan\\xff.png``, ``a\\nb.jpg``.
"""

from __future__ import annotations

# C0 and C1 control characters and DEL, escaped; the common ones as \n, \r, \t.
_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))}
_ESCAPES |= {ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"}


def printable(text: str) -> str:
    """``text`` as valid UTF-8 without control characters: bytes of a file name that are not
    UTF-8 and control characters become backslash escapes, instead of failing (or faking a
    line of output) later."""
    utf8 = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return utf8.translate(_ESCAPES)
