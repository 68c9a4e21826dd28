"""structlog JSON logging for the service.

One JSON object per line on stderr. At info level the pipeline logs one summary line per batch and never a
payload; record contents may appear only at debug. Call `configure_logging` once at start.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure_logging(level: str = "info", *, json: bool = True) -> None:
    """Route structlog (and stdlib logging, e.g. aiokafka's) to stderr as JSON lines at `level`."""
    numeric = _LEVELS.get(level, logging.INFO)
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
    ]
    renderer: Any = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[*processors, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=max(numeric, logging.WARNING), stream=sys.stderr, format="%(name)s %(message)s")
    # the engine's start-up progress (release shards read, GB/s, fast path and graphs) at the service's level
    logging.getLogger("engine").setLevel(numeric)


def get_logger(name: str) -> Any:
    """A lazy structlog logger with `component=name` (configuration is read on first use, not at import)."""
    return structlog.get_logger(component=name)
