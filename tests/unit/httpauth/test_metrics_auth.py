"""Issue 32, defect 8: /metrics wants a bearer token allowed to ``get /metrics``; the server bounds its connections.

- the token gate (gpuplane.httpauth.review.Gate): 401 without or with a rejected token, 403 without the right,
  200 with it; reviews cached by token digest for a while (injected clock), at most N of them; an API failure
  answers 503 and is not cached;
- the server (gpuplane.httpauth.server): HTTPS with a self-signed certificate made at start; a client that
  sends half a request (or never finishes its TLS handshake) is cut off at the injected deadline and its slot
  freed; with a cap of N, connection N+1 is closed at once;
- the driver's and the controller's servers: metrics refused to a tenant's token, served to the reader's;
  the probes answer kubelet without a token and name no tenant; unauthenticated plain HTTP only on loopback.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cryptography import x509
from prometheus_client import CollectorRegistry, Counter, make_wsgi_app

from gpuplane.controller import config as controller_config
from gpuplane.controller import metrics as controller_metrics
from gpuplane.driver import config as driver_config
from gpuplane.driver import probes
from gpuplane.httpauth import review, server, settings, tls

READER = "system:serviceaccount:monitoring:prometheus"
TENANT = "system:serviceaccount:tenant-a:default"


class FakeReviewer:
    """The API server's answers: tokens to users, and who may get /metrics. Counts the questions."""

    def __init__(self) -> None:
        self.users = {"reader-token": READER, "tenant-token": TENANT}
        self.allowed = {READER}
        self.authentications = 0
        self.authorizations = 0
        self.fail = False

    def authenticate(self, token: str) -> review.Identity | None:
        self.authentications += 1
        if self.fail:
            raise review.ReviewFailed("TokenReview failed: ConnectionRefusedError")
        user = self.users.get(token)
        return review.Identity(user, groups=("system:serviceaccounts",)) if user else None

    def authorize(self, who: review.Identity, verb: str, path: str) -> bool:
        self.authorizations += 1
        return verb == "get" and path == "/metrics" and who.username in self.allowed


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def eventually(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


class TestGate:
    def test_no_token_a_rejected_token_a_tenant_and_the_reader(self) -> None:
        gate = review.Gate(FakeReviewer())
        assert gate.check(None, "get", "/metrics").status == 401
        assert gate.check("Basic dXNlcjpwdw==", "get", "/metrics").status == 401
        assert gate.check("Bearer ", "get", "/metrics").status == 401
        assert gate.check("Bearer made-up", "get", "/metrics").status == 401
        tenant = gate.check("Bearer tenant-token", "get", "/metrics")
        assert (tenant.status, tenant.user) == (403, TENANT)
        reader = gate.check("bearer reader-token", "get", "/metrics")
        assert (reader.status, reader.user) == (200, READER)

    def test_reviews_are_cached_by_digest_until_their_ttl(self) -> None:
        api, clock = FakeReviewer(), Clock()
        gate = review.Gate(api, ttl_s=10, clock=clock)
        for _ in range(5):
            assert gate.check("Bearer reader-token", "get", "/metrics").allowed
            assert gate.check("Bearer made-up", "get", "/metrics").status == 401
        assert api.authentications == 2  # one review per token, not one per scrape
        api.allowed.clear()  # the ClusterRoleBinding was removed
        clock.now += 9.9
        assert gate.check("Bearer reader-token", "get", "/metrics").allowed
        clock.now += 0.2
        assert gate.check("Bearer reader-token", "get", "/metrics").status == 403  # re-asked after the TTL

    def test_the_cache_is_bounded_least_recently_used_first(self) -> None:
        api = FakeReviewer()
        gate = review.Gate(api, ttl_s=60, entries=3)
        for i in range(100):
            gate.check(f"Bearer flood-{i}", "get", "/metrics")
        assert len(gate) == 3
        gate.check("Bearer reader-token", "get", "/metrics")
        assert len(gate) == 3
        before = api.authentications
        gate.check("Bearer reader-token", "get", "/metrics")
        assert api.authentications == before  # the newest entry stayed

    def test_an_api_failure_answers_503_and_is_not_cached(self) -> None:
        api = FakeReviewer()
        gate = review.Gate(api)
        api.fail = True
        assert gate.check("Bearer reader-token", "get", "/metrics").status == 503
        api.fail = False
        assert gate.check("Bearer reader-token", "get", "/metrics").allowed

    def test_an_oversized_token_is_refused_without_asking(self) -> None:
        api = FakeReviewer()
        gate = review.Gate(api)
        assert gate.check("Bearer " + "x" * (review.MAX_TOKEN_BYTES + 1), "get", "/metrics").status == 401
        assert api.authentications == 0


def insecure() -> ssl.SSLContext:
    """A scraper's TLS settings as Prometheus's insecure_skip_verify (authentication is the bearer token)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def request(port: int, path: str, token: str | None = None, *, tls: bool = True) -> tuple[int, str, dict[str, str]]:
    conn: http.client.HTTPConnection
    if tls:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=insecure())
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        resp = conn.getresponse()
        return resp.status, resp.read().decode(), dict(resp.getheaders())
    finally:
        conn.close()


def registry_with_a_claim() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("gpuplane_test_claims", "a metric naming a tenant", ["namespace"], registry=registry).labels(
        "tenant-b"
    ).inc()
    return registry


def secure(**limits: float) -> settings.ServingSettings:
    return settings.ServingSettings(auth="kubernetes", **limits)


@pytest.fixture
def metrics_server() -> Iterator[server.Server]:
    api = FakeReviewer()
    s = server.serve_metrics(
        "127.0.0.1:0", make_wsgi_app(registry_with_a_claim()), secure(), reviewer=lambda: api, common_name="t"
    )
    yield s
    s.stop()


class TestAuthenticatedMetrics:
    def test_metrics_want_a_token_with_the_right(self, metrics_server: server.Server) -> None:
        assert metrics_server.tls
        status, body, headers = request(metrics_server.port, "/metrics")
        assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
        assert "tenant-b" not in body
        status, body, _ = request(metrics_server.port, "/metrics", "made-up")
        assert status == 401 and "tenant-b" not in body
        status, body, _ = request(metrics_server.port, "/metrics", "tenant-token")
        assert status == 403 and "tenant-b" not in body
        status, body, _ = request(metrics_server.port, "/metrics", "reader-token")
        assert status == 200 and 'gpuplane_test_claims_total{namespace="tenant-b"} 1.0' in body
        assert request(metrics_server.port, "/other", "reader-token")[0] == 404

    def test_plain_http_gets_no_metrics(self, metrics_server: server.Server) -> None:
        with pytest.raises((http.client.HTTPException, OSError)):
            request(metrics_server.port, "/metrics", "reader-token", tls=False)


def half_request(port: int, tls: bool = False) -> socket.socket:
    """A client that sends part of a request line and headers, then nothing (slowloris)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    if not tls:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    return sock


def closed_by_server(sock: socket.socket) -> bool:
    """The server closed the connection (EOF or reset) without answering; a client timeout raises."""
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True


def ok(environ: object, start_response: Callable[..., object]) -> list[bytes]:
    del environ
    start_response("200 OK", [("Content-Length", "2")])
    return [b"ok"]


class TestBoundedServer:
    def test_a_half_request_is_cut_off_at_the_deadline_and_its_slot_freed(self) -> None:
        s = server.serve(
            "127.0.0.1:0", server.probe_app({"/healthz": ok}), limits=server.Limits(1, request_timeout_s=0.2)
        )
        try:
            slow = half_request(s.port)
            assert closed_by_server(slow)  # before the fix: recv times out (10 s), the thread held for ever
            slow.close()
            assert s.counters.cut_off == 1
            eventually(lambda: s.counters.in_flight == 0, "the slot to be freed")
            assert request(s.port, "/healthz", tls=False)[:2] == (200, "ok")  # the only slot is free again
        finally:
            s.stop()

    def test_a_tls_client_that_never_handshakes_is_cut_off(self) -> None:
        api = FakeReviewer()
        cfg = secure(max_connections=1, request_timeout_s=0.2)
        s = server.serve_metrics(
            "127.0.0.1:0", make_wsgi_app(CollectorRegistry()), cfg, reviewer=lambda: api, common_name="t"
        )
        try:
            silent = half_request(s.port, tls=True)
            assert closed_by_server(silent)
            silent.close()
            eventually(lambda: s.counters.in_flight == 0, "the slot to be freed")
            assert request(s.port, "/metrics", "reader-token")[0] == 200  # the accept loop never blocked
        finally:
            s.stop()

    def test_connection_n_plus_1_is_refused_at_a_cap_of_n(self) -> None:
        n = 3
        s = server.serve(
            "127.0.0.1:0", server.probe_app({"/healthz": ok}), limits=server.Limits(n, request_timeout_s=60)
        )
        held = [half_request(s.port) for _ in range(n)]
        try:
            eventually(lambda: s.counters.in_flight == n, f"{n} connections served")
            extra = half_request(s.port)
            assert closed_by_server(extra)  # before the fix: a thread per connection, without bound
            extra.close()
            assert s.counters.refused == 1
            held[0].sendall(b"\r\n")  # one held client finishes its request: answered, its slot freed
            assert b"200 OK" in held[0].recv(1024)
            eventually(lambda: s.counters.in_flight == n - 1, "the slot to be freed")
            assert request(s.port, "/healthz", tls=False)[0] == 200
        finally:
            for sock in held:
                sock.close()
            s.stop()


class TestDriverServer:
    def test_probes_on_their_own_port_without_a_token_metrics_behind_one(self) -> None:
        p = probes.Probes(stale_after_s=30, ready_checks={"slices-published": lambda: True})
        p.watch(["main-loop"])
        api = FakeReviewer()
        health, metrics = probes.serve(
            "127.0.0.1:0",
            registry_with_a_claim(),
            p,
            serving=secure(),
            reviewer=lambda: api,
            health_address="127.0.0.1:0",
        )
        try:
            assert not health.tls and metrics.tls
            status, body, _ = request(health.port, "/healthz", tls=False)
            assert status == 200 and "main-loop" in body and "tenant" not in body
            assert request(health.port, "/readyz", tls=False)[0] == 200
            assert request(health.port, "/metrics", tls=False)[0] == 404  # never on the open port
            assert request(metrics.port, "/metrics")[0] == 401
            assert request(metrics.port, "/metrics", "tenant-token")[0] == 403
            status, body, _ = request(metrics.port, "/metrics", "reader-token")
            assert status == 200 and "tenant-b" in body
        finally:
            health.stop()
            metrics.stop()

    def test_the_flags_default_to_authenticated_and_refuse_open_metrics_off_loopback(self) -> None:
        cfg = driver_config.parse_args(["--node-name=n1", "--metrics-address=10.0.0.5:9400"])
        assert cfg.metrics_serving.auth == "kubernetes"
        local = driver_config.parse_args(["--node-name=n1", "--metrics-address=127.0.0.1:9400", "--metrics-auth=none"])
        assert local.metrics_serving.auth == "none"
        with pytest.raises(SystemExit):
            driver_config.parse_args(["--node-name=n1", "--metrics-address=10.0.0.5:9400", "--metrics-auth=none"])
        with pytest.raises(SystemExit):
            driver_config.parse_args(["--node-name=n1", "--metrics-address=:9400", "--metrics-tls-cert-file=/c"])


class TestControllerServer:
    def test_controller_metrics_are_refused_to_a_tenant(self) -> None:
        m = controller_metrics.ControllerMetrics()
        m.decisions.labels("place").inc()
        api = FakeReviewer()
        s = m.serve(0, "127.0.0.1", serving=secure(), reviewer=lambda: api)
        try:
            assert request(s.port, "/metrics")[0] == 401
            assert request(s.port, "/metrics", "tenant-token")[0] == 403
            status, body, _ = request(s.port, "/metrics", "reader-token")
            assert status == 200 and 'gpuplane_gang_decisions_total{outcome="place"} 1.0' in body
        finally:
            s.stop()

    def test_open_metrics_only_on_loopback(self) -> None:
        base = ["--identity=c1", "--metrics-port=9401"]
        assert controller_config.parse_args(base, {}).metrics_serving.auth == "kubernetes"
        env = {"GPUPLANE_METRICS_AUTH": "none"}
        assert controller_config.parse_args(base, env).metrics_serving.auth == "none"
        with pytest.raises(SystemExit):
            controller_config.parse_args([*base, "--metrics-host=0.0.0.0"], env)
        with pytest.raises(SystemExit):
            controller_config.parse_args([*base, "--metrics-host=10.1.2.3", "--metrics-auth=none"], {})


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "[::1]", "localhost", "127.0.0.53"])
def test_loopback_hosts(host: str) -> None:
    assert settings.is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "", "::", "10.0.0.5", "$(POD_IP)", "example.com"])
def test_not_loopback_hosts(host: str) -> None:
    assert not settings.is_loopback(host)


def test_a_slow_reviewer_does_not_stop_other_scrapes() -> None:
    """Reviews run on the connection's thread: one stuck review does not hold the accept loop."""
    api = FakeReviewer()
    stuck = threading.Event()
    original = api.authenticate

    def slow(token: str) -> review.Identity | None:
        if token == "slow-token":
            stuck.wait(10)
        return original(token)

    api.authenticate = slow  # type: ignore[method-assign]
    s = server.serve_metrics(
        "127.0.0.1:0", make_wsgi_app(CollectorRegistry()), secure(), reviewer=lambda: api, common_name="t"
    )
    try:
        waiting = threading.Thread(target=lambda: request(s.port, "/metrics", "slow-token"), daemon=True)
        waiting.start()
        eventually(lambda: s.counters.in_flight == 1, "the slow scrape to be in flight")
        assert request(s.port, "/metrics", "reader-token")[0] == 200
    finally:
        stuck.set()
        waiting.join(5)
        s.stop()


def test_a_mounted_certificate_is_served_and_verifies(tmp_path: Path) -> None:
    """--metrics-tls-cert-file/--metrics-tls-key-file: the scraper can verify the server with the CA it was given."""
    cert, key = tls.self_signed("gpuplane-driver", ["127.0.0.1"])
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    cfg = settings.ServingSettings(tls_cert_file=str(tmp_path / "tls.crt"), tls_key_file=str(tmp_path / "tls.key"))
    api = FakeReviewer()
    s = server.serve_metrics(
        "127.0.0.1:0", make_wsgi_app(CollectorRegistry()), cfg, reviewer=lambda: api, common_name="t"
    )
    try:
        verify = ssl.create_default_context(cadata=cert.decode())  # hostname checked against the SAN 127.0.0.1
        conn = http.client.HTTPSConnection("127.0.0.1", s.port, timeout=5, context=verify)
        conn.request("GET", "/metrics", headers={"Authorization": "Bearer reader-token"})
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        s.stop()


def test_the_self_signed_certificate_names_the_bind_address() -> None:
    cert = x509.load_pem_x509_certificate(tls.self_signed("gpuplane-controller", ["10.1.2.3", "localhost"])[0])
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("10.1.2.3") in names.get_values_for_type(x509.IPAddress)
    assert "localhost" in names.get_values_for_type(x509.DNSName)
