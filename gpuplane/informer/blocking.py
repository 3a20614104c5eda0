"""The controller's client for code that runs in threads: the same :class:`~gpuplane.informer.client.Client`
on an event loop of its own, each request a blocking call.

Why a loop of its own rather than the operator's: the writes are made by ordered, fenced apply sequences
that run in worker threads (``asyncio.to_thread``) and are plain synchronous code, tested with synchronous
fakes; and the leader's Lease is renewed by its own thread, which must keep renewing (and release the
Lease on the way out) while the operator's loop is busy, stuck or gone. One class of client, one error
type (:class:`~gpuplane.informer.client.ApiError`), one bounded decoder for every answer; two connection
pools (the informers' long watches do not queue the writes).

A call from the loop's own thread would wait for itself: it raises ``RuntimeError`` instead.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Any

from gpuplane.informer.client import JSON, REQUEST_TIMEOUT_S, UNREACHABLE, Answer, ApiError, Client, Endpoint

GRACE_S = 5.0  # beyond the request's own timeout, before the caller stops waiting for the loop


class BlockingClient:
    """Blocking requests, made on a daemon thread's event loop started at the first request."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._client = Client(endpoint)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _running(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="gpuplane kube client", daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = JSON,
        answer: Answer = "object",
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> Any:
        """:meth:`Client.request`, waited for; raises its :class:`ApiError` (status 0 also when the loop did not
        answer within the request's timeout and :data:`GRACE_S`)."""
        loop = self._running()
        if threading.current_thread() is self._thread:
            raise RuntimeError("BlockingClient.request was called on its own loop's thread: it would wait forever")
        work = self._client.request(
            method, path, params=params, body=body, content_type=content_type, answer=answer, timeout_s=timeout_s
        )
        future = asyncio.run_coroutine_threadsafe(work, loop)
        try:
            return future.result(timeout_s + GRACE_S)
        except TimeoutError as exc:
            future.cancel()
            raise ApiError(UNREACHABLE, "Unreachable", f"{method} {path}: no answer in time") from exc

    def close(self) -> None:
        """Close the HTTP session and stop the loop (a later request starts them again)."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._client.close(), loop).result(GRACE_S)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(GRACE_S)
            if not thread.is_alive():
                loop.close()
