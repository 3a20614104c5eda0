"""gpuplane.controller.probes on kopf's own health endpoint: healthy while the loop turns, not when it hangs.

The endpoint is kopf's ``health_reporter`` (what ``kopf.run(liveness_endpoint=...)``
starts), run on a real event loop in a thread with the controller's probe registered,
and asked over HTTP the way kubelet asks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import kopf
import pytest
from kopf._cogs.structs import ephemera
from kopf._core.engines import indexing, probing

from gpuplane.controller import leader, probes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Store:
    """A Lease store that never answers (the election thread's step hangs) when told to."""

    def __init__(self) -> None:
        self.hang = threading.Event()
        self.release = threading.Event()
        self.record: leader.LeaseRecord | None = None

    def get(self) -> leader.LeaseRecord | None:
        if self.hang.is_set():
            self.release.wait()
        return self.record

    def create(self, record: leader.LeaseRecord) -> leader.LeaseRecord:
        self.record = record
        return record

    def update(self, record: leader.LeaseRecord) -> leader.LeaseRecord:
        self.record = record
        return record


@contextlib.contextmanager
def endpoint(elector: leader.Elector | None) -> Iterator[tuple[str, asyncio.AbstractEventLoop]]:
    registry = kopf.OperatorRegistry()
    probes.add_probes(registry, elector)
    url = f"http://127.0.0.1:{free_port()}/healthz"
    loop = asyncio.new_event_loop()
    ready = asyncio.Event()
    task: list[asyncio.Task[None]] = []

    async def main() -> None:
        task.append(
            asyncio.create_task(
                probing.health_reporter(
                    url,
                    memo=ephemera.Memo(),
                    indices=indexing.OperatorIndexers().indices,
                    registry=registry,
                    settings=kopf.OperatorSettings(),
                    ready_flag=ready,
                )
            )
        )
        with contextlib.suppress(asyncio.CancelledError):
            await task[0]

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not ready.is_set() and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield url, loop
    finally:
        loop.call_soon_threadsafe(task[0].cancel)
        thread.join(5)
        loop.close()


def ask(url: str, timeout: float = 2.0) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def elector(store: Store, timing: leader.Timing) -> leader.Elector:
    return leader.Elector("replica-a", store, timing)


class TestControllerProbes:
    def test_healthy_with_a_working_elector(self) -> None:
        e = elector(Store(), leader.Timing(1.5, 1.0, 0.1))
        e.start()
        try:
            time.sleep(0.3)
            with endpoint(e) as (url, _loop):
                status, body = ask(url)
            assert status == 200
            assert body[probes.PROBE_ID]["leader"] is True
        finally:
            e.stop(release=False)

    def test_a_hung_event_loop_gives_no_answer(self) -> None:
        with endpoint(None) as (url, loop):
            assert ask(url)[0] == 200
            loop.call_soon_threadsafe(time.sleep, 3.0)  # a handler that blocks the loop
            time.sleep(0.1)
            with pytest.raises((TimeoutError, urllib.error.URLError)):
                ask(url, timeout=1.0)  # kubelet's probe would time out the same way
            time.sleep(3.0)
            assert ask(url)[0] == 200  # the loop turns again

    def test_a_stalled_elector_fails_the_probe(self) -> None:
        store = Store()
        timing = leader.Timing(0.3, 0.2, 0.05)
        e = elector(store, timing)
        e.start()
        try:
            time.sleep(0.2)
            store.hang.set()  # the next step never returns
            time.sleep(2 * timing.lease_duration_s + timing.retry_period_s + 0.5)
            assert "not finished a step" in (e.stalled() or "")
            with endpoint(e) as (url, _loop):
                status, body = ask(url)
            assert status == 500, body
        finally:
            store.release.set()
            e.stop(release=False)

    def test_an_elector_that_never_started_is_not_stalled(self) -> None:
        assert elector(Store(), leader.Timing()).stalled() is None
