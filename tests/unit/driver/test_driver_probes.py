"""gpuplane.driver.probes: /healthz turns unhealthy when a driver loop hangs; /readyz waits for its checks."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter

from gpuplane.driver import probes
from gpuplane.httpauth.settings import ServingSettings


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def get(port: int, path: str) -> tuple[int, dict[str, object] | str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            body = resp.read().decode()
            status = resp.status
    except urllib.error.HTTPError as err:
        body, status = err.read().decode(), err.code
    try:
        return status, json.loads(body)
    except json.JSONDecodeError:
        return status, body


class TestProbes:
    def test_live_while_every_loop_beats(self) -> None:
        clock = Clock()
        p = probes.Probes(stale_after_s=30, clock=clock)
        p.watch(["main", "health"])
        clock.now += 29
        p.beat("main")
        p.beat("health")
        clock.now += 29
        assert p.liveness().ok

    def test_a_stale_loop_is_named(self) -> None:
        clock = Clock()
        p = probes.Probes(stale_after_s=30, clock=clock)
        p.watch(["main", "health"])
        clock.now += 31
        p.beat("health")
        result = p.liveness()
        assert not result.ok
        assert "stuck" in result.detail["main"]
        assert "stuck" not in result.detail["health"]

    def test_ready_needs_every_check_and_liveness(self) -> None:
        clock = Clock()
        registered = threading.Event()
        p = probes.Probes(stale_after_s=30, clock=clock, ready_checks={"registered": registered.is_set})
        p.watch(["main"])
        assert not p.readiness().ok
        assert p.readiness().detail["registered"] == "not yet"
        registered.set()
        assert p.readiness().ok
        clock.now += 31
        assert not p.readiness().ok  # a hung loop is not ready either

    def test_a_failing_check_is_not_ready(self) -> None:
        def broken() -> bool:
            raise OSError("socket gone")

        p = probes.Probes(stale_after_s=30, ready_checks={"x": broken})
        result = p.readiness()
        assert not result.ok
        assert "socket gone" in result.detail["x"]

    def test_stale_after_must_be_positive(self) -> None:
        with pytest.raises(ValueError, match="positive"):
            probes.Probes(stale_after_s=0)


class TestServer:
    def test_a_hung_loop_turns_healthz_and_readyz_to_503(self) -> None:
        """A real thread beats, then blocks forever: the HTTP server (its own thread) answers 503."""
        registry = CollectorRegistry()
        Counter("gpuplane_test_total", "a metric", registry=registry).inc()
        p = probes.Probes(stale_after_s=0.5, ready_checks={"registered": lambda: True})
        hang = threading.Event()
        release = threading.Event()

        def loop() -> None:
            while not release.is_set():
                p.beat("main-loop")
                if hang.is_set():
                    release.wait()  # stuck in a call that never returns
                time.sleep(0.02)

        p.watch(["main-loop"])
        worker = threading.Thread(target=loop, daemon=True)
        worker.start()
        # loopback plain HTTP (--metrics-auth=none): tests/unit/httpauth/test_metrics_auth.py covers the token gate
        (server,) = probes.serve("127.0.0.1:0", registry, p, serving=ServingSettings(auth="none"))
        try:
            status, body = get(server.port, "/healthz")
            assert status == 200, body
            assert get(server.port, "/readyz")[0] == 200
            hang.set()
            time.sleep(0.8)
            status, body = get(server.port, "/healthz")
            assert status == 503
            assert isinstance(body, dict) and "stuck" in str(body["main-loop"])
            assert get(server.port, "/readyz")[0] == 503
            # metrics still answer (from the same server): that is why they are no liveness signal
            status, text = get(server.port, "/metrics")
            assert status == 200 and "gpuplane_test_total 1.0" in str(text)
        finally:
            release.set()
            worker.join(2)
            server.stop()
