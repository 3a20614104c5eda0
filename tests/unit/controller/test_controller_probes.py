"""gpuplane.controller.probes on kopf's own health endpoint: healthy while the loop turns, not when it hangs.

The endpoint is the one ``kopf.operator(liveness_endpoint=...)`` serves (what the controller's
``kopf.run`` starts), through kopf's public API only: the operator runs on a real event loop in a
thread with the controller's probe registered, logged in (``@kopf.on.login``) to a small API server
of the test's own that serves an empty discovery, and is asked over HTTP the way kubelet asks.
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
from aiohttp import web

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


async def discovery_server() -> tuple[web.AppRunner, str]:
    """An API server with nothing in it: the discovery kopf asks for at start, and no resources."""

    async def api(_: web.Request) -> web.Response:
        return web.json_response({"kind": "APIVersions", "versions": ["v1"]})

    async def core(_: web.Request) -> web.Response:
        return web.json_response({"kind": "APIResourceList", "groupVersion": "v1", "resources": []})

    async def groups(_: web.Request) -> web.Response:
        return web.json_response({"kind": "APIGroupList", "groups": []})

    app = web.Application()
    app.router.add_get("/api", api)
    app.router.add_get("/api/v1", core)
    app.router.add_get("/apis", groups)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def endpoint(elector: leader.Elector | None) -> Iterator[tuple[str, asyncio.AbstractEventLoop]]:
    registry = kopf.OperatorRegistry()
    probes.add_probes(registry, elector)
    server: list[str] = []

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=server[0])

    settings = kopf.OperatorSettings()
    settings.posting.enabled = False
    url = f"http://127.0.0.1:{free_port()}/healthz"
    loop = asyncio.new_event_loop()
    stop: list[asyncio.Future[None]] = []

    async def main() -> None:
        runner, base = await discovery_server()
        server.append(base)
        stop.append(loop.create_future())
        try:
            await kopf.operator(
                registry=registry,
                settings=settings,
                standalone=True,
                clusterwide=True,
                liveness_endpoint=url,
                stop_flag=stop[0],
            )
        finally:
            await runner.cleanup()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # until the endpoint answers (any status)
        try:
            ask(url, timeout=0.5)
            break
        except (TimeoutError, urllib.error.URLError, ConnectionError):
            time.sleep(0.05)
    try:
        yield url, loop
    finally:

        def finish() -> None:
            if not stop[0].done():
                stop[0].set_result(None)

        loop.call_soon_threadsafe(finish)
        thread.join(10)
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
