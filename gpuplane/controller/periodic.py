"""A background loop of the leader: one pass every interval. Does I/O.

Started by kopf startup handlers as asyncio tasks once the informers synced (``runtime.after_sync``). A pass
that fails is logged and the next one runs; a lost leadership ends a pass at its next write.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from gpuplane.controller import kube

log = structlog.get_logger(__name__)


async def every(
    interval_s: float, leading: Callable[[], bool], one_pass: Callable[[], Awaitable[object]], what: str
) -> None:
    """Forever: wait ``interval_s``, then ``one_pass()`` if ``leading()``."""
    while True:
        await asyncio.sleep(interval_s)
        if not leading():
            continue
        try:
            await one_pass()
        except kube.NotLeader:
            continue
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(f"{what} pass failed; the next one runs in a moment")
