"""The controller's first listing of a resource, paced by its handlers: at most ``bound`` listed objects wait.

kopf lists a resource in pages (``settings.watching.chunk_size``) and hands every listed object to a
per-object worker queue, then fetches the next page at once: nothing waits for the workers. On a
fleet that means every ResourceSlice body is decoded and alive at the same moment (76 HGX/GB200
nodes: 308 slices, about 81 MB of Python objects; 1,000 nodes: about 1 GB), and the process keeps
that peak as resident memory afterwards (CPython rarely returns fragmented arenas). Measured with
tracemalloc on the fleet benchmark: gpuplane's own indexes held under 1 MB of it.

:class:`ListPacer` gives the listing back-pressure: :mod:`gpuplane.controller.kopf_decoding` asks
:meth:`ListPacer.before_page` before each page of a paced resource and reports the page's items
with :meth:`ListPacer.listed`; one unconditional index handler per resource calls
:meth:`ListPacer.seen` for every object it is handed (listed or watched). The next page is fetched
once at most ``bound`` listed objects are still waiting, or after ``max_wait_s`` in any case: the
pacer can slow a listing, never stop it (a handler that raises or is skipped cannot wedge the
controller).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable
from urllib.parse import urlsplit

PACED = ("resourceslices", "resourceclaims", "pods", "nodes")  # each has one unconditional index handler


class ListPacer:
    """Counts listed objects not yet handed to a handler, per resource plural (thread-safe)."""

    def __init__(self, bound: int, max_wait_s: float = 10.0, paced: Iterable[str] = PACED) -> None:
        if bound < 1:
            raise ValueError(f"bound must be at least 1, not {bound}")
        self.bound = bound
        self.max_wait_s = max_wait_s
        self.paced = frozenset(paced)
        self._waiting: dict[str, int] = {}
        self._lock = threading.Lock()
        self.pages_held = 0  # pages that waited for the handlers (for tests and metrics)
        self.pages_timed_out = 0  # pages fetched after max_wait_s although objects were still waiting

    @staticmethod
    def plural_of(url: str) -> str | None:
        """The resource plural of a list URL (one with ``limit=``: kopf's paged listing), else None."""
        parts = urlsplit(url)
        if "limit=" not in parts.query:
            return None
        segments = [s for s in parts.path.split("/") if s]
        return segments[-1] if segments else None

    def waiting(self, plural: str) -> int:
        """Listed objects of ``plural`` not yet seen by its handler."""
        with self._lock:
            return self._waiting.get(plural, 0)

    def listed(self, plural: str, count: int) -> None:
        """A page of ``count`` objects of ``plural`` was decoded and goes to kopf's queues."""
        if plural in self.paced and count > 0:
            with self._lock:
                self._waiting[plural] = self._waiting.get(plural, 0) + count

    def seen(self, plural: str) -> None:
        """A handler of ``plural`` was handed one object (a watched one counts too; never below zero)."""
        with self._lock:
            left = self._waiting.get(plural, 0)
            if left > 0:
                self._waiting[plural] = left - 1

    async def before_page(self, plural: str, poll_s: float = 0.02) -> None:
        """Wait until at most ``bound`` listed objects of ``plural`` are waiting, or ``max_wait_s`` passed."""
        if plural not in self.paced or self.waiting(plural) <= self.bound:
            return
        self.pages_held += 1
        deadline = time.monotonic() + self.max_wait_s
        while self.waiting(plural) > self.bound:
            if time.monotonic() >= deadline:
                self.pages_timed_out += 1
                return
            await asyncio.sleep(poll_s)
