"""Text from a cluster or a chart, made safe to print on a terminal (SPEC S2). Pure.

A Tenant's condition message carries what a chart's ``fail`` said, a values key name or an
Event's message: anyone who writes a chart, a Tenant or an Event chooses those bytes. Printed
raw, an ESC or OSC sequence in them can move the cursor, rewrite what the administrator sees,
retitle the window or plant a link. Every string the CLI prints that did not come from
krypton itself goes through :func:`escape`: C0 controls, DEL, C1 controls and the Unicode
format characters that reorder or hide text are shown as ``\\xNN`` / ``\\uNNNN`` instead.
"""

from __future__ import annotations

import re

# C0 (but TAB and LF, which the caller may keep), DEL, C1, and the bidirectional and line
# separator characters that make a terminal show something other than what is there.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029"
                     "\u202a-\u202e\u2066-\u2069]")
_UNSAFE_LINE = re.compile("[\t\n]|" + _UNSAFE.pattern)


def _shown(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape(text: str) -> str:
    """`text` on one line: every control character (TAB and LF too) escaped."""
    return _UNSAFE_LINE.sub(_shown, text)


def escape_lines(text: str) -> str:
    """`text` keeping its line breaks and tabs, every other control character escaped: for
    multi-line output such as a diff."""
    return _UNSAFE.sub(_shown, text)


def short(text: str, limit: int = 80) -> str:
    """`text` as a message quotes it: repr'd, and cut to `limit` characters (a field of a
    Tenant may be a megabyte long; its message and every log line of it must not be)."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"
