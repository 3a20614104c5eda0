"""A claim nested 3,000 levels deep, read by the driver and written by the controller over HTTP (issue 18, defect 1).

An HTTP server stands in for the API server and answers GET, list and PATCH of
ResourceClaims with the deep claim between two ordinary ones, exactly as the API
server would (it accepts such claims). The production clients are used as they
run: :class:`gpuplane.driver.kube.KubeApi` (prepare's ``get_claim``, the checkpoint
rebuild's ``list_claims``) and :class:`gpuplane.controller.kube.KubeWriter` over the
controller's :class:`~gpuplane.informer.blocking.BlockingClient` (the annotation the
controller writes on every invalid claim, and its direct reads). Before issue 18 each of
these raised ``RecursionError`` in the kubernetes client's ``json.loads``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client

from gpuplane.controller import kube
from gpuplane.controller.kube import KubeWriter
from gpuplane.driver.kube import KubeApi
from gpuplane.informer.blocking import BlockingClient
from gpuplane.informer.client import Endpoint
from tests.hostile import claim_text, wrap

REJECTED = "gpuplane.dev/rejected"  # boundedjson.REJECTED, spelled out: the marker users see
DEEP = claim_text(3000, "deep", "ns")
LISTING = wrap(
    '{"kind":"ResourceClaimList","apiVersion":"resource.k8s.io/v1","metadata":{"resourceVersion":"7"},"items":[',
    ",".join(claim_text(levels, name, "ns") for levels, name in ((5, "a"), (3000, "deep"), (5, "c"))),
    "]}",
)


class _Handler(BaseHTTPRequestHandler):
    patches: list[tuple[str, str, bytes]] = []  # (path, content type, body) of every PATCH received

    def _answer(self, text: str) -> None:
        data = text.encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._answer(LISTING if self.path.split("?")[0].endswith("/resourceclaims") else DEEP)

    def do_PATCH(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.patches.append((self.path, self.headers.get("Content-Type", ""), body))
        self._answer(DEEP)  # the API server answers a patch with the whole object

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture(name="api")
def api_fixture() -> Iterator[client.ApiClient]:
    _Handler.patches.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{server.server_address[1]}"
    api = client.ApiClient(cfg)
    try:
        yield api
    finally:
        api.close()
        server.shutdown()
        server.server_close()


def test_the_driver_reads_the_deep_claim_as_a_rejected_stub(api: client.ApiClient) -> None:
    claim = KubeApi(api).get_claim("ns", "deep")
    assert claim["metadata"]["name"] == "deep" and claim["metadata"]["uid"] == "u-deep"
    reason = str(claim.get(REJECTED))
    assert "deeper than 64 levels" in reason and "spec.devices.config[0].opaque.parameters" in reason, claim


def test_the_checkpoint_rebuild_lists_past_the_deep_claim(api: client.ApiClient) -> None:
    items = KubeApi(api).list_claims()
    assert [i["metadata"]["name"] for i in items] == ["a", "deep", "c"]
    assert [REJECTED in i for i in items] == [False, True, False]
    assert items[0]["spec"]["devices"]["config"][0]["opaque"]["driver"] == "gpu.gpuplane.dev"


@pytest.fixture(name="writer")
def writer_fixture(api: client.ApiClient) -> Iterator[KubeWriter]:
    blocking = BlockingClient(Endpoint(api.configuration.host, ssl=False, authorization=lambda: "Bearer t"))
    try:
        yield KubeWriter(blocking)
    finally:
        blocking.close()


def test_the_controller_annotates_the_deep_claim(writer: KubeWriter) -> None:
    writer.annotate_claim("ns", "deep", {"gpuplane.dev/config-error": "nested too deeply"})
    ((path, content_type, body),) = _Handler.patches
    assert path.split("?")[0] == "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/deep"
    assert "merge-patch" in content_type
    assert json.loads(body) == {"metadata": {"annotations": {"gpuplane.dev/config-error": "nested too deeply"}}}


def test_the_controller_reads_the_deep_claim_quarantined_and_lists_past_it(writer: KubeWriter) -> None:
    one = writer.get(kube.CLAIMS, "ns", "deep")
    assert one is not None and one["metadata"]["name"] == "deep" and REJECTED in one
    items = writer.list_objects(kube.CLAIMS, "ns")
    assert [i["metadata"]["name"] for i in items] == ["a", "deep", "c"]
    assert [REJECTED in i for i in items] == [False, True, False]
