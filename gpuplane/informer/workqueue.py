"""A work queue of keys for level-triggered reconcilers, in the shape of client-go's rate-limited queue.

* A key is queued at most once: adding it again while it waits only replaces its payload (the
  latest wins), so a burst of events for one object is one reconcile.
* A key is processed by at most one worker at a time: added again while in flight, it is queued once
  more after the current run ends.
* A run that raises is retried after a per-key exponential delay (``base_s``, doubling to ``max_s``);
  a success forgets the key's failures. A failure is logged with the key and what comes next.
* Workers start once ``ready`` returns (the informers synced): nothing decides on half-built indexes,
  and what the start-up listing queued is done once, on complete indexes.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import structlog

log = structlog.get_logger(__name__)

T = TypeVar("T")


class WorkQueue(Generic[T]):
    """Keys to reconcile, each with its latest payload."""

    def __init__(
        self,
        name: str,
        process: Callable[[str, T], Awaitable[None]],
        *,
        ready: Callable[[], Awaitable[None]] | None = None,
        workers: int = 1,
        base_s: float = 0.5,
        max_s: float = 60.0,
    ) -> None:
        self.name, self.process, self.ready, self.workers = name, process, ready, workers
        self.base_s, self.max_s = base_s, max_s
        self._payload: dict[str, T] = {}  # queued (or re-added while in flight) -> latest payload
        self._order: deque[str] = deque()  # keys ready to run, each once
        self._active: set[str] = set()  # in a worker now
        self._failures: dict[str, int] = {}
        self._added: dict[str, int] = {}  # key -> the number of its latest add: a retry is for that add's payload
        self._adds = 0
        self._wake = asyncio.Event()
        self.done = 0  # runs finished (successes and failures)
        self.failed = 0

    def __len__(self) -> int:
        return len(self._payload)

    def add(self, key: str, payload: T) -> None:
        """Reconcile ``key`` with ``payload`` (replacing a payload still waiting)."""
        fresh = key not in self._payload
        self._payload[key] = payload
        self._adds += 1
        self._added[key] = self._adds
        if fresh and key not in self._active:
            self._order.append(key)
            self._wake.set()

    def retry_delay(self, key: str) -> float:
        """The delay before ``key``'s next attempt after its recorded failures."""
        n = self._failures.get(key, 0)
        return float(min(self.base_s * 2.0 ** max(n - 1, 0), self.max_s))

    def _later(self, key: str, payload: T, added: int) -> None:
        if self._added.get(key) == added and key not in self._payload:  # not added since: a newer payload wins
            self.add(key, payload)

    async def _one(self, key: str) -> None:
        payload = self._payload.pop(key)
        added = self._added.get(key, 0)
        self._active.add(key)
        try:
            await self.process(key, payload)
            self._failures.pop(key, None)
        except Exception as exc:
            self.failed += 1
            self._failures[key] = self._failures.get(key, 0) + 1
            delay = self.retry_delay(key)
            log.warning("reconcile failed; retrying", queue=self.name, key=key, error=str(exc)[:300], retry_in_s=delay)
            asyncio.get_running_loop().call_later(delay, self._later, key, payload, added)
        finally:
            self.done += 1
            self._active.discard(key)
            if key not in self._payload and key not in self._failures:
                self._added.pop(key, None)  # nothing owed for it: forget the key
            if key in self._payload:  # added while in flight: once more
                self._order.append(key)
                self._wake.set()

    async def _worker(self) -> None:
        while True:
            while not self._order:
                self._wake.clear()
                await self._wake.wait()
            key = self._order.popleft()
            if key in self._payload and key not in self._active:
                await self._one(key)
            await asyncio.sleep(0)

    async def run(self) -> None:
        """The workers, forever (once ``ready``)."""
        if self.ready is not None:
            await self.ready()
        async with asyncio.TaskGroup() as group:
            for n in range(self.workers):
                group.create_task(self._worker(), name=f"{self.name} worker {n}")

    async def drain(self) -> None:
        """Until nothing is queued or in flight (tests; a worker must be running)."""
        while self._payload or self._active:
            await asyncio.sleep(0.001)
