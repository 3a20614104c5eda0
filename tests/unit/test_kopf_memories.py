"""kopf's per-object memories with gpuplane.controller.kopf_memories: a fleet object's is forgotten once idle.

The wrapper runs around a stand-in for kopf's ``process_resource_event`` that recalls the object's memory
in kopf's own ``ResourceMemories`` (as kopf does first) and optionally leaves state in it.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from kopf._core.actions import progression
from kopf._core.reactor import inventory, processing

from gpuplane.controller import kopf_memories, runtime

Leave = Callable[[inventory.ResourceMemory], None]


@pytest.fixture
def process() -> Iterator[Callable[..., Any]]:
    kept = processing.process_resource_event
    leave: list[Leave] = []

    async def stand_in(**kw: Any) -> None:
        memory = await kw["memories"].recall(kw["raw_event"]["object"], memobase=kw.get("memobase"))
        for fn in leave:
            fn(memory)

    processing.process_resource_event = stand_in  # type: ignore[assignment]
    try:
        kopf_memories.install()
        wrapped = processing.process_resource_event

        async def run(plural: str, memories: Any, uid: str, then: Leave | None = None) -> None:
            leave[:] = [then] if then else []
            event = {"type": "MODIFIED", "object": {"metadata": {"uid": uid, "name": uid}}}
            await wrapped(memories=memories, resource=SimpleNamespace(plural=plural), raw_event=event)

        yield run
    finally:
        processing.process_resource_event = kept


def test_fleet_objects_leave_no_memory_other_resources_keep_theirs(process: Callable[..., Any]) -> None:
    async def run() -> None:
        memories = inventory.ResourceMemories()
        for plural, i in itertools.product(("pods", "resourceclaims", "resourceslices", "nodes"), range(50)):
            await process(plural, memories, f"{plural}-{i}")
        assert memories._items == {}  # 200 events of fleet objects: nothing kept
        await process("gpugangs", memories, "gang-0")  # a resource with timers keeps kopf's memory
        assert list(memories._items) == ["gang-0"]

    asyncio.run(run())


def test_a_memory_that_holds_state_is_kept_until_an_event_finds_it_idle(process: Callable[..., Any]) -> None:
    def failing_index(memory: inventory.ResourceMemory) -> None:  # kopf keeps retry state for an index handler
        memory.indexing_memory.indexing_state = progression.State.from_scratch()

    def throttled(memory: inventory.ResourceMemory) -> None:
        memory.error_throttler.active_until = 1e12

    async def run() -> None:
        memories = inventory.ResourceMemories()
        await process("resourceclaims", memories, "c1", failing_index)
        await process("pods", memories, "p1", throttled)
        assert set(memories._items) == {"c1", "p1"}
        kept = memories._items["c1"]
        await process("resourceclaims", memories, "c1")  # the same memory, still holding its state
        assert "c1" in memories._items and memories._items["c1"] is kept

        def recovered(memory: inventory.ResourceMemory) -> None:
            memory.indexing_memory.indexing_state = None

        await process("resourceclaims", memories, "c1", recovered)
        assert "c1" not in memories._items and "p1" in memories._items

    asyncio.run(run())


def test_the_runtime_memo_is_its_own_copy() -> None:
    rt = runtime.Runtime.__new__(runtime.Runtime)
    rt.shared = runtime.Shared()
    assert copy.copy(rt) is rt


def test_a_fresh_kopf_memory_is_idle() -> None:
    async def run() -> None:
        assert kopf_memories.idle(inventory.ResourceMemory())

    asyncio.run(run())
