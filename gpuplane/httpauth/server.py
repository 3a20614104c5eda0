"""The HTTP(S) server of /metrics and the probes: bounded connections, each with a deadline.

One thread per connection, as before, but:

- at most ``max_connections`` at once: a connection beyond the cap is closed as soon
  as it is accepted (counted in ``refused``), so a flood cannot grow the threads
  without bound;
- each connection has one deadline for its whole life (the TLS handshake, the
  request line and headers, the answer): one reaper thread per server shuts the
  socket down when it passes (counted in ``cut_off``), so a client that sends half
  a request, or reads the answer a byte a minute, frees its slot after
  ``request_timeout_s``; every socket operation also times out after it. Threads:
  at most ``max_connections`` + 2 (the accepting loop, the reaper);
- the TLS handshake runs on the connection's thread, never on the accepting one.

:func:`metrics_app` puts the :class:`~gpuplane.httpauth.review.Gate` in front of
the metrics: the open paths (kubelet's probes) answer anyone, ``/metrics`` wants a
bearer token with the right to ``get /metrics``, every other path is 404.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

import structlog

from gpuplane.httpauth import review, settings, tls

log = structlog.get_logger(__name__)

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

METRICS_PATH = "/metrics"


@dataclasses.dataclass(frozen=True)
class Limits:
    """How many connections at once, and how long each may live."""

    max_connections: int = 32
    request_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.max_connections < 1 or self.request_timeout_s <= 0:
            raise ValueError("max_connections must be at least 1 and request_timeout_s positive")


class Counters:
    """Connections refused at the cap, cut off at their deadline, being served now (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.refused = 0
        self.cut_off = 0
        self.in_flight = 0

    def enter(self) -> None:
        with self._lock:
            self.in_flight += 1

    def leave(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def refuse(self) -> None:
        with self._lock:
            self.refused += 1

    def cut(self) -> None:
        with self._lock:
            self.cut_off += 1


class _Reaper:
    """One thread that shuts each connection's socket down when its deadline passes."""

    def __init__(self, on_cut: Callable[[], None], clock: Callable[[], float] = time.monotonic) -> None:
        self._cond = threading.Condition()
        self._deadlines: dict[int, tuple[float, socket.socket]] = {}
        self._keys = itertools.count()
        self._stopped = False
        self._on_cut = on_cut
        self._clock = clock
        self._thread = threading.Thread(target=self._run, name="http-deadlines", daemon=True)
        self._thread.start()

    def watch(self, sock: socket.socket, timeout_s: float) -> int:
        """Shut ``sock`` down ``timeout_s`` from now unless :meth:`forget` comes first."""
        key = next(self._keys)
        with self._cond:
            self._deadlines[key] = (self._clock() + timeout_s, sock)
            self._cond.notify()
        return key

    def forget(self, key: int) -> None:
        """The connection ended in time (call before closing its socket)."""
        with self._cond:
            self._deadlines.pop(key, None)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join(5.0)

    def _run(self) -> None:
        with self._cond:
            while not self._stopped:
                now = self._clock()
                for key in [k for k, (due, _) in self._deadlines.items() if due <= now]:
                    _, sock = self._deadlines.pop(key)
                    self._on_cut()
                    # The base method: no TLS state touched (the connection's thread may be inside it).
                    with contextlib.suppress(OSError):
                        socket.socket.shutdown(sock, socket.SHUT_RDWR)
                soonest = min((due for due, _ in self._deadlines.values()), default=now + 60.0)
                self._cond.wait(max(soonest - now, 0.005))


class _BoundedServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    # socketserver's listen backlog is 5: a burst of scrapes and probes would see SYNs dropped and
    # retried a second later; connections beyond the cap are accepted and closed instead.
    request_queue_size = 128
    limits = Limits()
    counters: Counters
    slots: threading.BoundedSemaphore
    reaper: _Reaper

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.counters.refuse()
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            self.shutdown_request(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        watched = self.reaper.watch(request, self.limits.request_timeout_s)
        self.counters.enter()
        try:
            request.settimeout(self.limits.request_timeout_s)
            if isinstance(request, ssl.SSLSocket):
                request.do_handshake()
            self.finish_request(request, client_address)
        except Exception as exc:  # a client gone, cut off, or speaking garbage: its problem, not the server's
            log.debug("connection ended", client=str(client_address[0]), error=exc.__class__.__name__)
        finally:
            self.reaper.forget(watched)
            self.shutdown_request(request)
            self.counters.leave()
            self.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("request failed", client=str(client_address[0]))


class _BoundedServer6(_BoundedServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        del format, args


@dataclasses.dataclass
class Server:
    """The running server (``port`` is the bound port; ``counters`` its refusals and cut-offs)."""

    httpd: _BoundedServer
    thread: threading.Thread
    tls: bool

    @property
    def port(self) -> int:
        return int(self.httpd.server_port)

    @property
    def counters(self) -> Counters:
        return self.httpd.counters

    def stop(self) -> None:
        """Stop answering and close the socket."""
        self.httpd.shutdown()
        self.httpd.server_close()
        self.httpd.reaper.stop()
        self.thread.join(5.0)


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` (``"[::1]:9400"``, ``":9400"``) as (host, port); no host: 127.0.0.1."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address {address!r} is not host:port")
    return (host.strip("[]") or "127.0.0.1"), int(port)


def serve(
    address: str, app: WSGIApp, *, limits: Limits, context: ssl.SSLContext | None = None, name: str = "http"
) -> Server:
    """Serve ``app`` on ``"host:port"`` (port 0 picks one) in a background thread, TLS with ``context``."""
    host, port = split_address(address)
    server_class = _BoundedServer6 if ":" in host else _BoundedServer
    httpd = server_class((host, port), _QuietHandler)
    httpd.set_app(app)
    httpd.limits = limits
    httpd.counters = Counters()
    httpd.slots = threading.BoundedSemaphore(limits.max_connections)
    httpd.reaper = _Reaper(httpd.counters.cut)
    if context is not None:
        httpd.socket = context.wrap_socket(httpd.socket, server_side=True, do_handshake_on_connect=False)
    thread = threading.Thread(target=httpd.serve_forever, name=name, daemon=True)
    thread.start()
    return Server(httpd, thread, context is not None)


def _answer(start_response: Callable[..., Any], status: str, body: bytes, headers: Mapping[str, str]) -> list[bytes]:
    start_response(
        status,
        [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body))), *headers.items()],
    )
    return [body]


_REASONS = {401: "401 Unauthorized", 403: "403 Forbidden", 503: "503 Service Unavailable"}


def metrics_app(metrics: WSGIApp, gate: review.Gate | None, open_paths: Mapping[str, WSGIApp] | None = None) -> WSGIApp:
    """``open_paths`` for anyone, ``/metrics`` behind ``gate`` (None: no authentication), else 404."""
    opened = dict(open_paths or {})

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path in opened:
            return opened[path](environ, start_response)
        if path != METRICS_PATH:
            return _answer(start_response, "404 Not Found", b"not found\n", {})
        if gate is not None:
            verdict = gate.check(environ.get("HTTP_AUTHORIZATION"), "get", METRICS_PATH)
            if not verdict.allowed:
                if verdict.status == 503:
                    log.warning("metrics scrape refused: the token could not be reviewed", reason=verdict.reason)
                body = {401: b"Unauthorized\n", 403: f"Forbidden: {verdict.reason}\n".encode()}.get(
                    verdict.status, b"the token could not be reviewed; try again\n"
                )
                return _answer(start_response, _REASONS[verdict.status], body, review.verdict_headers(verdict))
        return metrics(environ, start_response)

    return app


def serve_metrics(
    address: str,
    metrics: WSGIApp,
    cfg: settings.ServingSettings,
    *,
    reviewer: Callable[[], review.Reviewer],
    open_paths: Mapping[str, WSGIApp] | None = None,
    common_name: str,
    name: str = "metrics",
) -> Server:
    """Serve ``metrics`` as ``cfg`` says: HTTPS behind the token gate, or (auth none, loopback) plain HTTP."""
    host, _ = split_address(address)
    cfg.check_bind(host)
    limits = Limits(cfg.max_connections, cfg.request_timeout_s)
    if not cfg.authenticated:
        return serve(address, metrics_app(metrics, None, open_paths), limits=limits, name=name)
    gate = review.Gate(reviewer(), ttl_s=cfg.cache_ttl_s, entries=cfg.cache_entries)
    context = tls.server_context(
        cfg.tls_cert_file, cfg.tls_key_file, common_name=common_name, hosts=[host, "localhost", "127.0.0.1"]
    )
    return serve(address, metrics_app(metrics, gate, open_paths), limits=limits, context=context, name=name)


def probe_app(open_paths: Mapping[str, WSGIApp]) -> WSGIApp:
    """Only ``open_paths`` (kubelet's probes), without authentication; every other path is 404."""
    opened = dict(open_paths)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        handler = opened.get(environ.get("PATH_INFO", ""))
        if handler is None:
            return _answer(start_response, "404 Not Found", b"not found\n", {})
        return handler(environ, start_response)

    return app
