"""Who may write a claim's ``status.devices`` (KEP-4817): the driver of the node it is allocated on, nobody else.

The driver writes what each claim got into the claim's status (``gpuplane.driver.publish.claim_status``)
with the manifests' role: ``resourceclaims/status`` patch and ``resourceclaims/driver``
``associated-node:patch`` for ``gpu.gpuplane.dev`` only. The API server grants the associated-node verb only
to a token bound to a pod on the node the claim is allocated on. Shown here with the real driver call
(``KubeApi.write_claim_device_status``) under two drivers' node-bound tokens, on a claim an administrator
allocated on node A: A's driver writes its entry; B's driver, an entry of another driver, and the allocation
itself are refused (a Forbidden field, 422, or 403) and change nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.cluster import handle as cluster
from e2e.plane import identity
from gpuplane.driver.kube import KubeApi
from tests.rbackit import (
    driver_a_fixture,  # noqa: F401  (fixture driver_a)
    installed_fixture,  # noqa: F401  (fixture installed)
    two_nodes_fixture,  # noqa: F401  (fixture two_nodes)
)

pytestmark = pytest.mark.e2e

DRIVER = "gpu.gpuplane.dev"
G, V, NS = "resource.k8s.io", "v1", "default"
NOW = "2026-12-05T00:00:00Z"


def entry(node: str, driver: str = DRIVER) -> dict[str, Any]:
    return {
        "driver": driver,
        "pool": node,
        "device": "gpu-0",
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "Prepared", "message": "m", "lastTransitionTime": NOW}
        ],
        "data": {"kind": "gpu", "uuid": "GPU-test"},
    }


@pytest.fixture(name="allocated")
def allocated_fixture(installed: cluster.Cluster, two_nodes: tuple[str, str]) -> Iterator[dict[str, Any]]:
    """A claim an administrator allocated (device gpu-0 of node A's pool), as the scheduler would."""
    admin = client.CustomObjectsApi(installed.api)
    name = f"status-{uuid.uuid4().hex[:6]}"
    claim = admin.create_namespaced_custom_object(
        G, V, NS, "resourceclaims",
        {
            "apiVersion": f"{G}/{V}", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
        },
    )  # fmt: skip
    node_a = two_nodes[0]
    allocation = {
        "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": node_a, "device": "gpu-0"}]},
        "nodeSelector": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_a]}]}]
        },
    }
    claim = admin.patch_namespaced_custom_object_status(
        G, V, NS, "resourceclaims", name, {"status": {"allocation": allocation}}
    )
    try:
        yield claim
    finally:
        admin.delete_namespaced_custom_object(G, V, NS, "resourceclaims", name)


def test_only_the_allocated_nodes_driver_writes_its_device_status(
    installed: cluster.Cluster,
    two_nodes: tuple[str, str],
    driver_a: identity.Identity,
    allocated: dict[str, Any],
    tmp_path: Any,
) -> None:
    node_a, node_b = two_nodes
    name, uid = allocated["metadata"]["name"], allocated["metadata"]["uid"]
    driver_b = identity.driver_identity(installed, node_b, tmp_path)
    admin = client.CustomObjectsApi(installed.api)
    api_a, api_b = driver_a.api_client(), driver_b.api_client()
    try:
        mine, theirs = KubeApi(api_a), KubeApi(api_b)
        # B's driver, on a claim allocated on node A: refused, whatever entry it writes.
        for body in ([entry(node_a)], [entry(node_b)]):
            with pytest.raises(ApiException) as refused:
                theirs.write_claim_device_status(NS, name, uid, body, driver=DRIVER, node=node_b)
            # the API server's own check, reported as a Forbidden field (422): B holds no arbitrary-node verb
            assert refused.value.status == 422, refused.value.body
            assert 'requires resource=\\"resourceclaims/driver\\"' in str(refused.value.body), refused.value.body
        # A's driver: an entry of another driver is refused; the allocation is not its to change.
        with pytest.raises(ApiException) as refused:
            mine.write_claim_device_status(
                NS, name, uid, [entry(node_a, "gpu.example.com")], driver=DRIVER, node=node_a
            )
        assert refused.value.status == 422 and "gpu.example.com" in str(refused.value.body), refused.value.body
        with pytest.raises(ApiException) as refused:
            client.CustomObjectsApi(api_a).patch_namespaced_custom_object_status(
                G, V, NS, "resourceclaims", name, {"status": {"allocation": None}}
            )
        assert refused.value.status in (403, 422), refused.value.body
        assert not (admin.get_namespaced_custom_object(G, V, NS, "resourceclaims", name)["status"].get("devices"))
        # A's driver, its own entry: written, and withdrawn by applying none.
        mine.write_claim_device_status(NS, name, uid, [entry(node_a)], driver=DRIVER, node=node_a)
        got = admin.get_namespaced_custom_object(G, V, NS, "resourceclaims", name)["status"]
        assert [(d["driver"], d["pool"], d["device"], d["data"]["uuid"]) for d in got["devices"]] == [
            (DRIVER, node_a, "gpu-0", "GPU-test")
        ]
        assert got["allocation"]["devices"]["results"][0]["pool"] == node_a
        mine.write_claim_device_status(NS, name, uid, [], driver=DRIVER, node=node_a)
        got = admin.get_namespaced_custom_object(G, V, NS, "resourceclaims", name)["status"]
        assert not got.get("devices")
        # A stale uid (the claim was replaced under the same name) writes nothing and raises nothing.
        mine.write_claim_device_status(NS, name, str(uuid.uuid4()), [entry(node_a)], driver=DRIVER, node=node_a)
        assert not admin.get_namespaced_custom_object(G, V, NS, "resourceclaims", name)["status"].get("devices")
    finally:
        api_a.close()  # type: ignore[no-untyped-call]
        api_b.close()  # type: ignore[no-untyped-call]
