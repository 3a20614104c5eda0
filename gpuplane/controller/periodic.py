"""A background loop of the leader: one pass every interval, once kopf's start-up barrier opened. Does I/O.

Started by kopf startup handlers as asyncio tasks (kopf timers need an object to hang on). A pass
that fails is logged and the next one runs; a lost leadership ends a pass at its next write.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from gpuplane.controller import kopf_barrier, kube

log = structlog.get_logger(__name__)


async def every(
    interval_s: float, leading: Callable[[], bool], one_pass: Callable[[], Awaitable[object]], what: str
) -> None:
    """Forever: wait ``interval_s``, then ``one_pass()`` if ``leading()`` (never before the barrier opened)."""
    await kopf_barrier.wait_indexed()
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
