"""Keeping credentials out of every log line, Event, condition and metric (SPEC D4).

Two nets, both applied wherever text leaves the process: the credentials krypton has
loaded (tokens, passwords of engaged clusters) are registered here and replaced wherever
they appear, and patterns catch what was never registered (``Authorization`` headers,
``Bearer``/``Basic`` values, PEM blocks and their base64 form). Exceptions from libraries
can quote request headers; nothing that reaches a user goes around :func:`scrub`.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import MutableMapping
from typing import Any

MASK = "[REDACTED]"
MIN_LENGTH = 6  # shorter strings are too likely to be ordinary words

_lock = threading.Lock()
_known: set[str] = set()
_known_pattern: re.Pattern[str] | None = None

_PATTERNS = [
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{4,}"), rf"\1 {MASK}"),
    (re.compile(r"(?i)(authorization['\"]?\s*[:=]\s*['\"]?)[^'\"\s,}]+(\s+[^'\"\s,}]+)?"),
     rf"\1{MASK}"),
    (re.compile(r"-----BEGIN [A-Z0-9 ]+-----.*?(-----END [A-Z0-9 ]+-----|$)", re.S), MASK),
    (re.compile(r"LS0tLS1CRUdJT[A-Za-z0-9+/=]*"), MASK),  # base64 of "-----BEGIN"
]


def register(*secrets: str | None) -> None:
    """Remember credentials so that :func:`scrub` masks them wherever they appear."""
    global _known_pattern
    fresh = {s for s in secrets if isinstance(s, str) and len(s) >= MIN_LENGTH} - _known
    if not fresh:
        return
    with _lock:
        _known.update(fresh)
        ordered = sorted(_known, key=len, reverse=True)
        _known_pattern = re.compile("|".join(re.escape(s) for s in ordered))
        _scrub_cached.cache_clear()  # answers given before may hold the new credential


def scrub(text: str) -> str:
    """`text` with registered credentials and credential-shaped substrings masked. The
    same short strings (names, reasons, log fields) come back all the time: their answer
    is remembered until a new credential is registered."""
    if len(text) > CACHED_LENGTH:
        return _scrub(text)
    return _scrub_cached(text)


CACHED_LENGTH = 256


def _scrub(text: str) -> str:
    pattern = _known_pattern
    if pattern is not None:
        text = pattern.sub(MASK, text)
    for regex, replacement in _PATTERNS:
        text = regex.sub(replacement, text)
    return text


_scrub_cached = functools.lru_cache(maxsize=4096)(_scrub)


def scrub_value(value: Any) -> Any:
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        return {k: scrub_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub_value(v) for v in value]
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    return scrub(str(value))


def structlog_processor(_logger: Any, _name: str,
                        event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Scrub every field of a log event (after exceptions were rendered to text)."""
    return {k: scrub_value(v) for k, v in event.items()}


def describe(exc: BaseException, limit: int = 300) -> str:
    """``Type: message`` of an exception, scrubbed and bounded, for Events and conditions.
    A group of exceptions (a task group's) is described by the first one it holds, not
    as "unhandled errors in a TaskGroup"."""
    more = 0
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        more += len(exc.exceptions) - 1
        exc = exc.exceptions[0]
    if more:
        return f"{describe(exc, limit)} (and {more} more)"
    text = scrub(str(exc)).replace("\n", " ")
    if len(text) > limit:
        text = text[:limit] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
