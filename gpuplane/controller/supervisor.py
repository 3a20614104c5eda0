"""Run the kopf operator in a thread under a supervisor that owns signals, health and the way out.

kopf answers ``/healthz`` and SIGTERM on its own event loop, so when that loop
stalls or its operator dies half-way, nothing answers either while the Lease
thread keeps renewing: a replica that holds the Lease and does nothing
(issue 18: a restarted leader kept the Lease, ignored SIGTERM, answered no
probe). Here the main thread keeps what must work even then:

* the operator (any coroutine; production: kopf's root tasks with a stop flag)
  runs in its own thread and event loop, with a heartbeat task beating every
  ``beat_s``; it calls ``failed(reason)`` the moment a part of it ends that
  should run forever (kopf's orchestrator after a watcher failed): kopf then
  spends seconds to minutes retrying requests on a closed session before it
  returns, with no health endpoint and no SIGTERM handler (issue 18's wedge);
* ``/healthz`` is served from a thread of its own: 200 while the operator thread
  lives and its loop beat within ``unhealthy_after_s``; otherwise 503 with the
  reason;
* a reported failure, the operator thread ending on its own, or its loop not
  beating for ``stall_exit_s`` ends the process with exit code 1 after
  releasing the Lease, so the standby takes over at once and the pod restarts;
* SIGTERM/SIGINT set the operator's stop flag, wait up to ``stop_grace_s`` for
  it, release the Lease and exit 0 (1 when the operator did not stop in time);
  a second signal exits at once.

The process ends with ``os._exit`` once the Lease is released and the logs are
flushed: a thread stuck in a blocking call (an executor job, a hung socket)
cannot keep it alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

import structlog

log = structlog.get_logger(__name__)

Operator = Callable[[threading.Event, Callable[[str], None]], Coroutine[Any, Any, None]]  # (stop flag, failed)

EXIT_OK = 0
EXIT_FAILED = 1


@dataclass(frozen=True)
class Timing:
    """How fast the supervisor notices and acts (seconds)."""

    beat_s: float = 1.0
    unhealthy_after_s: float = 10.0
    stall_exit_s: float = 30.0
    stop_grace_s: float = 20.0
    poll_s: float = 0.25


def parse_endpoint(spec: str) -> tuple[str, int, str]:
    """``http://host:port/path`` or ``host:port`` (IPv6 with or without brackets) -> (host, port, path)."""
    if "://" in spec:
        parts = urlsplit(spec)
        if parts.port is None:
            raise ValueError(f"health endpoint {spec!r} has no port")
        return parts.hostname or "127.0.0.1", parts.port, parts.path or "/healthz"
    host, _, port = spec.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port), "/healthz"


class Supervisor:
    """One controller process: the operator thread, the health endpoint, signals and the exit code."""

    def __init__(
        self,
        operator: Operator,
        *,
        release: Callable[[], None],
        health: str | None,
        timing: Timing = Timing(),
        is_leader: Callable[[], bool] = lambda: False,
    ) -> None:
        self.operator = operator
        self.release = release
        self.health_spec = health
        self.timing = timing
        self.is_leader = is_leader
        self.stop_flag = threading.Event()  # kopf's stop flag (kopf accepts a threading.Event)
        self._signalled = threading.Event()
        self._signals = 0
        self._beat = time.monotonic()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._failed: str | None = None
        self._server: http.server.ThreadingHTTPServer | None = None
        self.health_port: int | None = None

    # --- the operator thread ---------------------------------------------------------------------
    async def _beating(self) -> None:
        while True:
            self._beat = time.monotonic()
            await asyncio.sleep(self.timing.beat_s)

    async def _operate(self) -> None:
        beater = asyncio.create_task(self._beating(), name="gpuplane heartbeat")
        try:
            await self.operator(self.stop_flag, self.report_failure)
        finally:
            beater.cancel()

    def report_failure(self, reason: str) -> None:
        """The operator is failing (thread-safe; the supervisor exits 1 at its next poll)."""
        if self._failed is None:
            self._failed = reason

    def _run_operator(self) -> None:
        try:
            asyncio.run(self._operate())
        except BaseException as exc:  # recorded for the supervisor; the thread ends either way
            self._error = exc

    def loop_age(self) -> float:
        """Seconds since the operator's event loop last beat."""
        return time.monotonic() - self._beat

    # --- health ----------------------------------------------------------------------------------
    def problem(self) -> str | None:
        """Why this replica is unhealthy now (None: healthy)."""
        if self._failed is not None:
            return f"the operator failed: {self._failed}"
        if self._thread is not None and not self._thread.is_alive():
            return f"the operator stopped: {self._error!r}" if self._error else "the operator stopped"
        age = self.loop_age()
        if age > self.timing.unhealthy_after_s:
            return f"the operator's event loop has not run for {age:.1f}s"
        if self.stop_flag.is_set():
            return "stopping"
        return None

    def start_health(self) -> None:
        """Serve the health endpoint in a thread (idempotent; :meth:`run` calls it)."""
        if not self.health_spec or self._server is not None:
            return
        host, port, path = parse_endpoint(self.health_spec)
        sup = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != path:
                    self.send_error(404)
                    return
                problem = sup.problem()
                body = json.dumps(
                    {
                        "healthy": problem is None,
                        "problem": problem,
                        "loopAgeSeconds": round(sup.loop_age(), 3),
                        "leader": sup.is_leader(),
                    }
                ).encode()
                self.send_response(200 if problem is None else 503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return  # probes every few seconds: not worth a log line each

        server = http.server.ThreadingHTTPServer((host, port), Handler)
        server.daemon_threads = True
        self._server = server
        self.health_port = int(server.server_address[1])
        threading.Thread(target=server.serve_forever, name="healthz", daemon=True).start()
        log.info("serving health", address=f"{host}:{self.health_port}", path=path)

    # --- signals and the main loop ---------------------------------------------------------------
    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._signals += 1
        if self._signals > 1:
            self._exit(EXIT_FAILED, f"second {signal.Signals(signum).name}: exiting at once", release=False)
        self._signalled.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT go to the supervisor (main thread only)."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def run(self) -> int:
        """Start everything, watch it, and return the exit code (the caller ends the process with it)."""
        self._beat = time.monotonic()
        self.start_health()
        self._thread = threading.Thread(target=self._run_operator, name="kopf-operator", daemon=True)
        self._thread.start()
        t = self.timing
        while not self._signalled.wait(t.poll_s):
            if self._failed is not None:
                log.error("the operator failed; releasing the Lease and exiting", reason=self._failed)
                self.stop_flag.set()
                return self._finish(EXIT_FAILED)
            if not self._thread.is_alive():
                log.error("the operator stopped on its own; releasing the Lease and exiting", error=repr(self._error))
                return self._finish(EXIT_FAILED)
            age = self.loop_age()
            if age > t.stall_exit_s:
                log.error("the operator's event loop is stalled; releasing the Lease and exiting", stalled_s=age)
                self.stop_flag.set()
                return self._finish(EXIT_FAILED)
        log.info("stop requested; stopping the operator", grace_s=t.stop_grace_s)
        self.stop_flag.set()
        self._thread.join(t.stop_grace_s)
        if self._thread.is_alive():
            log.error("the operator did not stop in time; exiting anyway", grace_s=t.stop_grace_s)
            return self._finish(EXIT_FAILED)
        return self._finish(EXIT_OK)

    def _finish(self, code: int) -> int:
        try:
            self.release()
        except Exception:  # the standby then waits out the lease duration
            log.exception("releasing the Lease failed")
        if self._server is not None:
            self._server.shutdown()
        return code

    def _exit(self, code: int, why: str, *, release: bool) -> None:
        log.error(why)
        if release:
            with contextlib.suppress(Exception):
                self.release()
        exit_now(code)


def exit_now(code: int) -> None:
    """Flush the logs and end the process, whatever other threads are doing."""
    with contextlib.suppress(Exception):
        logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
