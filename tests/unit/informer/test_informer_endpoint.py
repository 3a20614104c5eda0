"""gpuplane.informer.client.Endpoint from the ``kubernetes`` client's configuration (what main() builds it from)."""

from __future__ import annotations

import ssl

from gpuplane.informer.client import Endpoint


def test_the_endpoint_comes_from_the_kubernetes_clients_configuration() -> None:
    """Host, TLS verification and the bearer token (asked for at each request, so a rotated one is used)."""
    from kubernetes import client as kube_client

    c = kube_client.Configuration()
    c.host = "https://10.0.0.1:6443/"
    c.verify_ssl = False
    c.api_key = {"authorization": "Bearer first"}
    endpoint = Endpoint.of(c)
    assert endpoint.host == "https://10.0.0.1:6443" and endpoint.ssl is False
    assert endpoint.authorization() == "Bearer first"
    c.api_key = {"authorization": "Bearer rotated"}
    assert endpoint.authorization() == "Bearer rotated"
    c.api_key = {}
    assert endpoint.authorization() is None
    c.verify_ssl = True
    assert isinstance(Endpoint.of(c).ssl, ssl.SSLContext)  # the system's CAs when none is named
