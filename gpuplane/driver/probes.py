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
registered before it moves on.

:func:`serve` starts the servers (gpuplane.httpauth: a capped number of
connections, each with a deadline). ``/metrics`` names tenants' claims and
namespaces, so it wants a bearer token allowed to ``get /metrics`` (TokenReview
and SubjectAccessReview, over HTTPS) unless ``--metrics-auth=none`` serves it in
plain HTTP on loopback for development. The probes say only which driver loops
and checks pass, nothing about tenants: they answer without a token, on a port of
their own (``--health-address``, the DaemonSet's setting) or beside /metrics.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, make_wsgi_app

from gpuplane.httpauth import review, server, settings
from gpuplane.httpauth.server import Server, WSGIApp

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


def probe_paths(probes: Probes) -> dict[str, WSGIApp]:
    """/healthz and /readyz of ``probes`` as WSGI apps (kubelet's probes: no authentication, no tenant names)."""

    def answer(result: ProbeResult, start_response: Callable[..., Any]) -> Iterable[bytes]:
        body = result.body()
        status = "200 OK" if result.ok else "503 Service Unavailable"
        start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    def live(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        del environ
        return answer(probes.liveness(), start_response)

    def ready(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        del environ
        return answer(probes.readiness(), start_response)

    return {LIVENESS_PATH: live, READINESS_PATH: ready}


def serve(
    address: str,
    registry: CollectorRegistry,
    probes: Probes,
    *,
    serving: settings.ServingSettings,
    reviewer: Callable[[], review.Reviewer] | None = None,
    health_address: str = "",
) -> list[Server]:
    """Serve /metrics on ``address`` as ``serving`` says, and the probes (first server returned).

    With ``health_address`` the probes get a plain-HTTP server of their own there (the DaemonSet's
    setting: kubelet probes it without a token, the metrics port needs one); without it they are
    open paths of the metrics server. ``reviewer`` makes the TokenReview/SubjectAccessReview client
    (needed unless ``serving.auth`` is none).
    """

    def no_reviewer() -> review.Reviewer:
        raise ValueError("--metrics-auth=kubernetes needs the API client for its token reviews")

    paths = probe_paths(probes)
    limits = server.Limits(serving.max_connections, serving.request_timeout_s)
    started: list[Server] = []
    try:
        if health_address:
            started.append(server.serve(health_address, server.probe_app(paths), limits=limits, name="http-probes"))
        started.append(
            server.serve_metrics(
                address,
                make_wsgi_app(registry),
                serving,
                reviewer=reviewer or no_reviewer,
                open_paths=None if health_address else paths,
                common_name="gpuplane-driver",
                name="http-metrics",
            )
        )
    except BaseException:
        for s in started:
            s.stop()
        raise
    return started
