"""kopf's ToggleSet(all) barrier with gpuplane.controller.kopf_indexing: same answers, no wake-up per object.

Counts how often the waiters of an all-set are woken while N objects are added and then indexed (their
toggles dropped): kopf as released wakes every waiter on every add and drop (O(N^2)); patched, the
waiters wake once, when the last off toggle goes, and still all pass. An any-set (kopf's
operator_paused) keeps kopf's behaviour.
"""

from __future__ import annotations

import asyncio
import importlib
from typing import Any

import pytest
from kopf._cogs.aiokits import aiotoggles

from gpuplane.controller import kopf_indexing

N = 60


async def _barrier() -> tuple[int, int]:
    """(predicate checks made by the waiters, waiters that passed) for N objects."""
    ts = aiotoggles.ToggleSet(all)
    resource = await ts.make_toggle(name="resource listed")  # off until the listing is done
    checks = 0
    original = ts.is_on

    def counted() -> bool:
        nonlocal checks
        checks += 1
        return original()

    ts.is_on = counted  # type: ignore[method-assign]
    toggles = [await ts.make_toggle(name=f"o{i}") for i in range(N)]
    passed = 0

    async def waiter() -> None:
        nonlocal passed
        await ts.wait_for(True)
        passed += 1

    tasks = [asyncio.create_task(waiter()) for _ in range(N)]
    await asyncio.sleep(0)
    for t in toggles:
        await ts.drop_toggle(t)
        await asyncio.sleep(0)
    assert passed == 0  # the resource is not listed yet: nobody may go
    await resource.turn_to(True)
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    return checks, passed


@pytest.fixture
def released_kopf() -> Any:
    importlib.reload(aiotoggles)
    yield
    importlib.reload(aiotoggles)


def test_kopf_as_released_wakes_every_waiter_per_object(released_kopf: Any) -> None:
    checks, passed = asyncio.run(_barrier())
    assert passed == N and checks > N * N // 2


def test_patched_the_waiters_wake_when_the_set_turns_on(released_kopf: Any) -> None:
    kopf_indexing.install()
    kopf_indexing.install()  # idempotent
    checks, passed = asyncio.run(_barrier())
    assert passed == N and checks < 4 * N


def test_an_any_set_keeps_kopfs_behaviour(released_kopf: Any) -> None:
    kopf_indexing.install()

    async def run() -> bool:
        paused = aiotoggles.ToggleSet(any)
        t = await paused.make_toggle(name="peer")
        woke = asyncio.create_task(paused.wait_for(True))
        await asyncio.sleep(0)
        await t.turn_to(True)
        await asyncio.wait_for(woke, 2)
        gone = asyncio.create_task(paused.wait_for(False))
        await asyncio.sleep(0)
        await paused.drop_toggle(t)  # no toggle on: the any-set is off, its False-waiter must wake
        await asyncio.wait_for(gone, 2)
        return paused.is_off()

    assert asyncio.run(run())
