"""Why a claim stays unallocated: one pass over the claim index every few seconds. Does I/O.

This was a kopf timer on ResourceClaims. kopf keeps the last body of *every* object of a resource
that has a timer or daemon (its ``live_fresh_body``, for the timer's kwargs), whether or not the
timer's filter ever matches it: with 10,000 claims on a fleet, 10,000 full claim bodies held for
the timers of the few that are pending. A loop of the controller's own over the claim index (the
slim form, :func:`gpuplane.controller.indexed.claim`) holds nothing more, and skips an allocated
claim with one dict lookup. A pass that fails is logged and the next one runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from gpuplane.controller import indexed, periodic

Explain = Callable[[Mapping[str, Any], float], Awaitable[None]]


def pending(claim_idx: Mapping[Any, Iterable[Mapping[str, Any]]]) -> list[Mapping[str, Any]]:
    """The indexed claims without an allocation."""
    return [c for c in indexed.single(claim_idx).values() if not (c.get("status") or {}).get("allocation")]


async def explain_pass(claim_idx: Mapping[Any, Iterable[Mapping[str, Any]]], explain: Explain) -> int:
    """Explain every pending claim (yielding to the loop between claims); returns how many were looked at."""
    todo = pending(claim_idx)
    for claim in todo:
        await explain(claim, time.time())
        await asyncio.sleep(0)
    return len(todo)


async def run(
    claim_idx: Mapping[Any, Iterable[Mapping[str, Any]]],
    explain: Explain,
    leading: Callable[[], bool],
    interval_s: float,
) -> None:
    """Forever: wait, then one pass if ``leading()`` (never before kopf's start-up barrier opened)."""
    await periodic.every(interval_s, leading, lambda: explain_pass(claim_idx, explain), "unallocated-claim")
