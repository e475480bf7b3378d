"""structlog, configured once: JSON lines when stderr is not a terminal (journald),
readable lines on a terminal. Logs go to stderr; stdout is for command output."""

from __future__ import annotations

import logging
import sys

import structlog


def configure(quiet: bool = False) -> None:
    """``quiet``: warnings and errors only (a one-shot answer, as ``numad -w``)."""
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer()
        if sys.stderr.isatty()
        else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING if quiet else 0),
    )
