"""structlog configuration (SPEC O2): JSON or console lines, one level for everything."""

from __future__ import annotations

import logging
import sys

import structlog

from krypton.decisions.trust import redact


def configure(fmt: str = "", level: str = "info") -> None:
    """Console output on a TTY unless `fmt` says otherwise; JSON elsewhere. Records of the
    standard library's loggers (the libraries krypton uses) and Python's warnings are
    rendered by the same processors, so that a JSON log holds nothing but JSON lines."""
    fmt = fmt or ("console" if sys.stderr.isatty() else "json")
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if fmt == "console" else structlog.processors.JSONRenderer()
    )
    numeric = getattr(logging, level.upper())
    stamped: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_logger_name, *stamped],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, redact.structlog_processor, renderer]))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
    logging.captureWarnings(True)
    structlog.configure(
        processors=[
            *stamped,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            redact.structlog_processor,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
