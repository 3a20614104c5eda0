"""Liveness and readiness of the node driver, served beside /metrics for kubelet's probes.

The driver's work happens in loops on threads: the main loop (publish,
rediscover, cleanup; it wakes at least once a second) and the health watcher
(Xid/ECC events, every poll interval). Each loop calls :meth:`Probes.beat` once
per pass. ``/healthz`` answers 200 while every watched loop has beaten within
``stale_after_s`` and 503 naming the loop that stopped, so a loop stuck in a
call that never returns (a hung API request, a deadlock) turns the container
unhealthy and kubelet restarts it; /metrics alone, served by its own thread,
would keep answering. ``/readyz`` answers 200 only when the driver is live and
every readiness check holds (the node's ResourceSlices published, kubelet's
registration of the plugin), so a rolling update waits for the new pod to be
registered before it moves on. One HTTP server (:func:`serve`, a thread per
request) answers all three paths; any other path is the Prometheus exposition,
as before.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

LIVENESS_PATH = "/healthz"
READINESS_PATH = "/readyz"


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """One probe's answer: healthy or not, and why, per loop or check."""

    ok: bool
    detail: Mapping[str, str]

    def body(self) -> bytes:
        """The JSON body of the HTTP answer."""
        return json.dumps({"ok": self.ok, **self.detail}, sort_keys=True).encode()


class Probes:
    """Heartbeats of the driver's loops and its readiness checks."""

    def __init__(
        self,
        *,
        stale_after_s: float,
        ready_checks: Mapping[str, Callable[[], bool]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if stale_after_s <= 0:
            raise ValueError("stale_after_s must be positive")
        self.stale_after_s = stale_after_s
        self._clock = clock
        self._lock = threading.Lock()
        self._beats: dict[str, float] = {}
        self._checks: dict[str, Callable[[], bool]] = dict(ready_checks or {})

    def watch(self, loops: Iterable[str]) -> None:
        """Start expecting beats from ``loops`` (each counts as having just beaten)."""
        now = self._clock()
        with self._lock:
            for loop in loops:
                self._beats[loop] = now

    def beat(self, loop: str) -> None:
        """``loop`` completed a pass."""
        now = self._clock()
        with self._lock:
            self._beats[loop] = now

    def add_check(self, name: str, check: Callable[[], bool]) -> None:
        """Readiness also requires ``check()`` to be true."""
        with self._lock:
            self._checks[name] = check

    def liveness(self) -> ProbeResult:
        """Live while every watched loop beat within ``stale_after_s``."""
        now = self._clock()
        with self._lock:
            beats = dict(self._beats)
        detail: dict[str, str] = {}
        ok = True
        for loop, last in sorted(beats.items()):
            age = now - last
            if age > self.stale_after_s:
                ok = False
                detail[loop] = f"no pass for {age:.1f}s (limit {self.stale_after_s:.0f}s): the loop is stuck"
            else:
                detail[loop] = f"last pass {age:.1f}s ago"
        return ProbeResult(ok, detail)

    def readiness(self) -> ProbeResult:
        """Ready while live and every readiness check holds."""
        live = self.liveness()
        with self._lock:
            checks = dict(self._checks)
        detail = dict(live.detail)
        ok = live.ok
        for name, check in sorted(checks.items()):
            try:
                passed = bool(check())
            except Exception as exc:
                passed = False
                detail[name] = f"check failed: {exc}"
            else:
                detail[name] = "yes" if passed else "not yet"
            ok = ok and passed
        return ProbeResult(ok, detail)


def wsgi_app(registry: CollectorRegistry, probes: Probes) -> Callable[..., Iterable[bytes]]:
    """A WSGI app: /healthz and /readyz from ``probes``, everything else the metrics of ``registry``."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path in (LIVENESS_PATH, READINESS_PATH):
            result = probes.liveness() if path == LIVENESS_PATH else probes.readiness()
            body = result.body()
            status = "200 OK" if result.ok else "503 Service Unavailable"
            start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        answer: Iterable[bytes] = metrics(environ, start_response)
        return answer

    return app


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        del format, args


@dataclasses.dataclass
class Server:
    """The running HTTP server (``port`` is the bound port)."""

    httpd: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.httpd.server_port)

    def stop(self) -> None:
        """Stop answering and close the socket."""
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5.0)


def serve(address: str, registry: CollectorRegistry, probes: Probes) -> Server:
    """Serve /metrics, /healthz and /readyz on ``"host:port"`` (port 0 picks one) in a background thread."""
    host, _, port = address.rpartition(":")
    httpd = make_server(
        host or "0.0.0.0",
        int(port),
        wsgi_app(registry, probes),
        server_class=_ThreadingServer,
        handler_class=_QuietHandler,
    )
    thread = threading.Thread(target=httpd.serve_forever, name="http-probes", daemon=True)
    thread.start()
    return Server(httpd, thread)
