"""structlog configured for one JSON line per event on stderr.

stdout stays free for command output (keys create --json, the MCP server's
protocol frames). Nothing here ever logs a key, a secret or a body.
"""

from __future__ import annotations

import logging
import sys

import structlog


def configure(level: str = "info") -> None:
    logging.basicConfig(stream=sys.stderr, format="%(message)s", level=level.upper())
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


def get_logger(name: str):
    return structlog.get_logger(name)
