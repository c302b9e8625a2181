"""structlog configuration (SPEC O2): JSON or console lines, one level for everything."""

from __future__ import annotations

import logging
import sys

import structlog

from krypton.decisions import redact


def configure(fmt: str = "", level: str = "info") -> None:
    """Console output on a TTY unless `fmt` says otherwise; JSON elsewhere."""
    fmt = fmt or ("console" if sys.stderr.isatty() else "json")
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if fmt == "console" else structlog.processors.JSONRenderer()
    )
    numeric = getattr(logging, level.upper())
    logging.basicConfig(level=numeric, stream=sys.stderr, format="%(message)s")
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            redact.structlog_processor,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
