"""The controller's writes over HTTP: :class:`gpuplane.informer.blocking.BlockingClient` against a server
standing in for the API server (its answers, errors with causes, no answer at all) and ``Resource`` paths."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from gpuplane.informer.blocking import BlockingClient
from gpuplane.informer.client import MERGE, UNREACHABLE, ApiError, Endpoint, Resource

CAUSE = "The disruption budget b-pdb needs 4 healthy pods"
PDB = {
    "kind": "Status",
    "code": 429,
    "reason": "TooManyRequests",
    "message": "Cannot evict pod as it would violate the pod's disruption budget.",
    "details": {
        "causes": [{"reason": "DisruptionBudget", "message": "The disruption budget b-pdb needs 4 healthy pods"}]
    },
}


class _Handler(BaseHTTPRequestHandler):
    seen: list[tuple[str, str, str, str, Any]] = []  # method, path, content type, authorization, body

    def _answer(self, status: int, value: Any) -> None:
        data = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self) -> Any:
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length)) if length else None
        auth = self.headers.get("Authorization", "")
        self.seen.append((self.command, self.path, self.headers.get("Content-Type", ""), auth, body))
        return body

    def do_GET(self) -> None:
        self._record()
        if self.path.startswith("/api/v1/namespaces/ns/pods/gone"):
            self._answer(404, {"kind": "Status", "code": 404, "reason": "NotFound", "message": 'pods "gone" not found'})
        else:
            self._answer(200, {"metadata": {"name": "p"}})

    def do_POST(self) -> None:
        body = self._record()
        if self.path.endswith("/eviction"):
            self._answer(429, PDB)
        else:
            self._answer(201, body)

    def do_PATCH(self) -> None:
        self._record()
        self._answer(200, {"deep": [[[[]]]]})

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture(name="blocking")
def blocking_fixture() -> Iterator[BlockingClient]:
    _Handler.seen.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    tokens = iter(["Bearer one", "Bearer two", "Bearer three"])
    c = BlockingClient(Endpoint(f"http://127.0.0.1:{server.server_address[1]}", False, lambda: next(tokens)))
    try:
        yield c
    finally:
        c.close()
        server.shutdown()
        server.server_close()


def test_requests_carry_the_body_content_type_and_the_token_of_the_moment(blocking: BlockingClient) -> None:
    pods = Resource("", "v1", "pods")
    assert blocking.request("GET", pods.path("ns", "p")) == {"metadata": {"name": "p"}}
    patch = {"metadata": {"labels": {"a": "b"}}}
    assert blocking.request("PATCH", pods.path("ns", "p"), body=patch, content_type=MERGE, answer="none") is None
    created = blocking.request("POST", pods.path("ns"), params={"dryRun": "All"}, body={"metadata": {"name": "x"}})
    assert created == {"metadata": {"name": "x"}}
    assert [(m, p, a) for m, p, _, a, _ in _Handler.seen] == [
        ("GET", "/api/v1/namespaces/ns/pods/p", "Bearer one"),
        ("PATCH", "/api/v1/namespaces/ns/pods/p", "Bearer two"),  # a rotated token is used at once
        ("POST", "/api/v1/namespaces/ns/pods?dryRun=All", "Bearer three"),
    ]
    assert _Handler.seen[1][2] == MERGE and _Handler.seen[1][4] == patch


def test_an_error_is_an_api_error_with_the_status_and_its_causes(blocking: BlockingClient) -> None:
    with pytest.raises(ApiError) as refused:
        blocking.request("POST", "/api/v1/namespaces/ns/pods/p/eviction", body={"kind": "Eviction"})
    assert (refused.value.status, refused.value.reason) == (429, "TooManyRequests")
    assert refused.value.said == (
        "Cannot evict pod as it would violate the pod's disruption budget. "
        "(The disruption budget b-pdb needs 4 healthy pods)"
    )
    with pytest.raises(ApiError) as gone:
        blocking.request("GET", "/api/v1/namespaces/ns/pods/gone")
    assert gone.value.status == 404 and gone.value.said == 'pods "gone" not found'


def test_no_answer_is_an_api_error_too_and_a_call_from_the_clients_own_loop_refuses() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once closed
    c = BlockingClient(Endpoint(f"http://127.0.0.1:{port}", False, lambda: None))
    try:
        with pytest.raises(ApiError) as unreachable:
            c.request("GET", "/api/v1/nodes")
        assert unreachable.value.status == UNREACHABLE and "GET /api/v1/nodes" in unreachable.value.message

        async def inside() -> Any:
            return c.request("GET", "/api/v1/nodes")

        loop = c._running()
        with pytest.raises(RuntimeError, match="its own loop"):
            asyncio.run_coroutine_threadsafe(inside(), loop).result(5)
    finally:
        c.close()


def test_resource_paths_for_the_core_group_named_groups_namespaces_and_subresources() -> None:
    pods, rules = Resource("", "v1", "pods"), Resource("resource.k8s.io", "v1", "devicetaintrules")
    assert pods.path() == "/api/v1/pods"
    assert pods.path("ns", "p", "eviction") == "/api/v1/namespaces/ns/pods/p/eviction"
    assert rules.path(None, "r") == "/apis/resource.k8s.io/v1/devicetaintrules/r"
    assert pods.path("ns", "a/b?c") == "/api/v1/namespaces/ns/pods/a%2Fb%3Fc"  # never a different path
    for bad in ("", ".", ".."):
        with pytest.raises(ValueError, match="not a name"):
            pods.path("ns", bad)
