"""kopf's start-up barrier without one parked worker per object of the fleet-sized resources.

kopf (1.45) gives every watched object a worker task; after the object's index handlers ran, the
worker awaits ``operator_indexed.wait_for(True)`` (every object of every resource indexed) before
it runs the object's other handlers. At start-up, and whenever the watches re-list, every object
therefore holds a parked worker: its task, coroutines, queue and event, and its body, about 33 kB
each (the controller's memory report on a 1,000-node KWOK fleet: 5,874 tasks and 29,260 deques
alive for 4,600 slices and 1,000 nodes, 285 MB at the peak; a restart with 10,000 claims and their
pods would park about 27,000).

:func:`install` wraps kopf's ``process_resource_event`` so that, for the resources named (the
ones a fleet has thousands of: pods, ResourceClaims, ResourceSlices, Nodes), an event that arrives
before the barrier is open runs its index handlers and then its other handlers at once, and the
worker moves on (it exits after kopf's idle timeout) instead of parking. Those handlers ask
:func:`indexed` first and, while it is False, *defer*: they record what they would have done
(which node to label, which claim to check) and return; :mod:`gpuplane.controller.startup` does
all of it once, after :func:`wait_indexed`, on complete indexes. Resources not named (GpuGangs,
GpuRequests, Jobs, classes, templates: few objects) keep kopf's barrier as it is.
``tests/unit/test_kopf_barrier.py`` checks the barrier still opens only when every object was
indexed, that bypassed workers do not wait, and the deferral.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from kopf._core.reactor import processing

FLEET_PLURALS = frozenset({"pods", "resourceclaims", "resourceslices", "nodes"})
_MARK = "_gpuplane_barrier_bypass"


class _Barrier:
    """What the wrapper has seen of kopf's barrier (one per process, like kopf's operator)."""

    def __init__(self) -> None:
        self.active = False  # install() was called: this process runs kopf with the bypass
        self.toggles: Any = None  # kopf's operator_indexed ToggleSet, once an event carried it
        self.passed = False  # the barrier was seen open (or an event came without one)


_STATE = _Barrier()


def indexed() -> bool:
    """Whether handlers may act now: True unless a start-up barrier is known and still closed."""
    b = _STATE
    if not b.active or b.passed or b.toggles is None:
        return True
    if b.toggles.is_on():
        b.passed = True
    return b.passed


def opened() -> bool:
    """Whether the start-up barrier was seen open (False until an event showed it; True without install())."""
    b = _STATE
    if not b.active:
        return True
    if not b.passed and b.toggles is not None and b.toggles.is_on():
        b.passed = True
    return b.passed


async def wait_indexed(poll_s: float = 0.2) -> None:
    """Until the start-up barrier is open: every object of every watched resource indexed."""
    while not opened():
        await asyncio.sleep(poll_s)


def reset() -> None:
    """Forget what was seen and the install (tests; a process runs one operator)."""
    _STATE.active = False
    _STATE.toggles = None
    _STATE.passed = False


def install(plurals: Iterable[str] = FLEET_PLURALS) -> None:
    """Wrap kopf's event processor (idempotent; before ``kopf.spawn_tasks``, which binds it)."""
    _STATE.active = True
    if getattr(processing.process_resource_event, _MARK, False):
        return
    original = processing.process_resource_event
    bypassed = frozenset(plurals)

    async def process_resource_event(**kw: Any) -> Any:
        toggles = kw.get("operator_indexed")
        own = kw.get("resource_indexed")
        if toggles is None:
            _STATE.passed = True  # kopf passes none once its barrier was open when the worker started
            return await original(**kw)
        _STATE.toggles = toggles
        if toggles.is_on() or kw["resource"].plural not in bypassed:
            return await original(**kw)
        try:  # index, then the handlers at once (they defer until indexed()), no wait
            return await original(**{**kw, "operator_indexed": None, "resource_indexed": None})
        finally:
            if own is not None:
                await toggles.drop_toggle(own)  # this object is indexed: what kopf does before its wait

    setattr(process_resource_event, _MARK, True)
    processing.process_resource_event = process_resource_event  # type: ignore[assignment]
