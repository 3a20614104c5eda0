"""The controller's C-allocator settings: the arena cap, and the trim loop's timing."""

from __future__ import annotations

import asyncio
import ctypes

import pytest

from gpuplane.controller import heap, memdump


def test_an_arena_cap_from_the_environment_is_left_alone() -> None:
    assert heap.configure({"MALLOC_ARENA_MAX": "4"}) is False


def test_the_cap_is_set_on_glibc() -> None:
    if heap._glibc() is None:
        pytest.skip("not glibc 2.33+")
    assert heap.configure({}) is True


def test_a_trim_gives_freed_heap_pages_back() -> None:
    if heap._glibc() is None:
        pytest.skip("not glibc 2.33+")
    lib = ctypes.CDLL(None)
    lib.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD: glibc must not trim by itself during the test
    try:
        blocks = [bytes(20000) for _ in range(4000)]  # 80 MB from malloc, above pymalloc's limit
        del blocks[::2]  # half freed, in holes only a trim gives back
        before = memdump._status_kb("VmRSS")
        assert heap.trim() is True
        after = memdump._status_kb("VmRSS")
        del blocks
    finally:
        lib.mallopt(-1, 128 * 1024)  # glibc's default threshold
    assert before - after >= 20_000  # kB: the freed holes went back


def test_the_trim_loop_waits_for_the_start_up_barrier_then_trims_on_its_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events: list[str] = []
    monkeypatch.setattr(heap, "trim", lambda: events.append("trim") or True)

    async def ready() -> None:
        events.append("ready")

    async def sleep(seconds: float) -> None:
        events.append(f"sleep {seconds:g}")
        if events.count("trim") >= 3:
            raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(heap.trim_loop(ready, first_s=30, every_s=300, sleep=sleep))
    assert events == ["ready", "sleep 30", "trim", "sleep 300", "trim", "sleep 300", "trim", "sleep 300"]
