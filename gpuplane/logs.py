"""structlog configuration, done once at program start by each binary's main().

JSON lines when stderr is not a terminal (in a pod), a console renderer on a
terminal. Standard-library loggers (grpc, kopf, kubernetes, urllib3) are routed
through the same processors, and per-request context (claim uid, gang) is bound
with ``structlog.contextvars``.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

LogFormat = Literal["auto", "json", "console"]


def configure(level: str = "INFO", fmt: LogFormat = "auto") -> None:
    """Configure structlog and the stdlib root logger. Call once, from main()."""
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # kopf.objects says "Handler ... succeeded" at INFO for every event and timer tick of every object
    # (21,000 lines for a controller's start on a 1,000-node fleet); its warnings and errors still show.
    for noisy in ("urllib3", "kubernetes.client.rest", "asyncio", "kopf.objects"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
