"""gpuplane.informer.workqueue: keys deduplicated, one run per key at a time, failures retried, a ready gate."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import pytest

from gpuplane.informer.workqueue import WorkQueue


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def spy_retries(queue: WorkQueue[str], hold: bool = False) -> list[tuple[str, str]]:
    """The (key, payload) of each retry timer that fired: observed instead of its moment guessed, and with
    ``hold`` not passed on to the queue (the test fires it with ``WorkQueue._later`` when it chooses)."""
    fired: list[tuple[str, str]] = []
    later = queue._later

    def spy(key: str, payload: str, added: int) -> None:
        fired.append((key, payload))
        held.append(added)
        if not hold:
            later(key, payload, added)

    held: list[int] = []
    queue._later = spy  # type: ignore[method-assign]
    queue.held = held  # type: ignore[attr-defined]  # the add each fired retry belongs to (for hold=True)
    return fired


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.001)

    await asyncio.wait_for(poll(), timeout)


def test_adds_before_the_workers_start_are_one_run_with_the_last_payload() -> None:
    """Adding a key three times before the workers start processes it once, with the last payload."""

    async def body() -> None:
        calls: list[tuple[str, int]] = []

        async def process(key: str, payload: int) -> None:
            calls.append((key, payload))

        queue: WorkQueue[int] = WorkQueue("t", process)
        for payload in (1, 2, 3):
            queue.add("a", payload)
        queue.add("b", 9)
        assert len(queue) == 2
        task = asyncio.create_task(queue.run())
        await asyncio.wait_for(queue.drain(), 10)
        await stop(task)
        assert calls == [("a", 3), ("b", 9)] and queue.done == 2 and queue.failed == 0

    asyncio.run(body())


def test_readded_while_in_flight_runs_once_more_after() -> None:
    """A key added (twice) while its run is in flight runs exactly once more, afterwards, with the last payload."""

    async def body() -> None:
        calls: list[int] = []
        started, release = asyncio.Event(), asyncio.Event()

        async def process(key: str, payload: int) -> None:
            calls.append(payload)
            if payload == 1:
                started.set()
                await release.wait()

        queue: WorkQueue[int] = WorkQueue("t", process, workers=2)
        queue.add("a", 1)
        task = asyncio.create_task(queue.run())
        await asyncio.wait_for(started.wait(), 10)
        queue.add("a", 2)
        queue.add("a", 3)
        for _ in range(10):
            await asyncio.sleep(0)
        assert calls == [1]  # the idle second worker did not take it
        release.set()
        await asyncio.wait_for(queue.drain(), 10)
        await stop(task)
        assert calls == [1, 3] and queue.done == 2

    asyncio.run(body())


def test_one_key_never_runs_twice_at_once() -> None:
    """With four workers and keys re-added constantly, a key never runs twice at once and ends on its last payload."""

    async def body() -> None:
        active: set[str] = set()
        overlaps: list[str] = []
        last: dict[str, int] = {}
        peak = [0]

        async def process(key: str, payload: int) -> None:
            if key in active:
                overlaps.append(key)  # not asserted here: the queue would catch it as a failure
            active.add(key)
            peak[0] = max(peak[0], len(active))
            for _ in range(3):
                await asyncio.sleep(0)
            active.discard(key)
            last[key] = payload

        queue: WorkQueue[int] = WorkQueue("t", process, workers=4)
        task = asyncio.create_task(queue.run())
        for n in range(60):
            queue.add(f"k{n % 3}", n)
            await asyncio.sleep(0)
        await asyncio.wait_for(queue.drain(), 10)
        await stop(task)
        assert overlaps == [] and queue.failed == 0
        assert last == {"k0": 57, "k1": 58, "k2": 59}
        assert peak[0] > 1  # the workers did run distinct keys side by side

    asyncio.run(body())


def test_failures_are_retried_with_the_payload_and_doubling_delay() -> None:
    """A failing run is retried with its payload; the delay doubles from base_s to max_s; success forgets it."""

    async def body() -> None:
        payloads: list[str] = []
        delays: list[float] = []

        async def process(key: str, payload: str) -> None:
            payloads.append(payload)
            delays.append(queue.retry_delay(key))  # the delay the failures so far give
            if len(payloads) <= 4:
                raise RuntimeError("not yet")

        queue: WorkQueue[str] = WorkQueue("t", process, base_s=0.001, max_s=0.004)
        queue.add("a", "p")
        task = asyncio.create_task(queue.run())
        await until(lambda: queue.done == 5)
        await asyncio.wait_for(queue.drain(), 10)
        await stop(task)
        assert payloads == ["p"] * 5 and queue.failed == 4
        assert delays == pytest.approx([0.001, 0.001, 0.002, 0.004, 0.004])
        assert queue.retry_delay("a") == pytest.approx(0.001)  # the success forgot the failures

    asyncio.run(body())


def test_newer_payload_queued_before_the_retry_fires_wins() -> None:
    """A newer payload still queued when the retry timer fires is what runs; the failed payload is not re-run."""

    async def body() -> None:
        calls: list[str] = []
        failed, release = asyncio.Event(), asyncio.Event()

        async def process(key: str, payload: str) -> None:
            calls.append(payload)
            if payload == "old":
                failed.set()
                raise RuntimeError("boom")
            if payload == "blocker":
                await release.wait()

        queue: WorkQueue[str] = WorkQueue("t", process, base_s=0.001)
        fired = spy_retries(queue)
        queue.add("a", "old")
        task = asyncio.create_task(queue.run())
        await asyncio.wait_for(failed.wait(), 10)
        queue.add("z", "blocker")  # the only worker is busy while the retry timer fires
        queue.add("a", "new")
        await until(lambda: fired == [("a", "old")])
        release.set()
        await asyncio.wait_for(queue.drain(), 10)
        await stop(task)
        assert calls == ["old", "blocker", "new"]

    asyncio.run(body())


def test_newer_payload_that_already_ran_is_not_followed_by_the_stale_retry() -> None:
    """A newer payload added during the retry delay runs at once; the failed older payload does not run after it
    (found by this test: the retry re-added the stale payload; each retry now belongs to the add it retries)."""

    async def body() -> None:
        calls: list[str] = []

        async def process(key: str, payload: str) -> None:
            calls.append(payload)
            if payload == "old":
                raise RuntimeError("boom")

        queue: WorkQueue[str] = WorkQueue("t", process, base_s=0.001)
        fired = spy_retries(queue, hold=True)
        queue.add("a", "old")
        task = asyncio.create_task(queue.run())
        await until(lambda: queue.failed == 1)
        queue.add("a", "new")
        await until(lambda: calls[-1:] == ["new"] and not queue._active)
        await until(lambda: fired == [("a", "old")])
        WorkQueue._later(queue, *fired[0], queue.held[0])  # type: ignore[attr-defined]  # the timer, after "new" ran
        await asyncio.wait_for(queue.drain(), 10)
        await stop(task)
        assert calls == ["old", "new"]

    asyncio.run(body())


def test_nothing_runs_until_ready_returns() -> None:
    """Workers start only once ``ready`` returns; what was queued before is then processed."""

    async def body() -> None:
        calls: list[tuple[str, int]] = []
        entered, gate = asyncio.Event(), asyncio.Event()

        async def process(key: str, payload: int) -> None:
            calls.append((key, payload))

        async def ready() -> None:
            entered.set()
            await gate.wait()

        queue: WorkQueue[int] = WorkQueue("t", process, ready=ready, workers=2)
        queue.add("a", 1)
        task = asyncio.create_task(queue.run())
        await asyncio.wait_for(entered.wait(), 10)
        for _ in range(20):
            await asyncio.sleep(0)
        queue.add("b", 2)
        assert calls == [] and len(queue) == 2
        gate.set()
        await asyncio.wait_for(queue.drain(), 10)
        await stop(task)
        assert sorted(calls) == [("a", 1), ("b", 2)]

    asyncio.run(body())
