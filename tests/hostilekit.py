"""What the hostile-input e2e modules share: a namespace of their own, claim and pod bodies, Events, apply of text."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from e2e.plane.imex_gangs import pod_body
from tests.e2e.conftest import GpuCluster, eventually

__all__ = ["apply_text", "claim_body", "events_of", "ns_fixture", "pod_body"]


@pytest.fixture(scope="module", name="ns")
def ns_fixture(gpu_cluster: GpuCluster) -> Iterator[str]:
    """A namespace of its own for the module (deleted at its end)."""
    name = f"hostile-{uuid.uuid4().hex[:6]}"
    gpu_cluster.cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    eventually(lambda: gpu_cluster.cluster.core.list_namespaced_service_account(name).items, 60, "service account")
    yield name
    gpu_cluster.cluster.kubectl("delete", "namespace", name, "--wait=true", "--timeout=120s", timeout=150)


def apply_text(gc: GpuCluster, text: str) -> None:
    """``kubectl apply -f -`` of a JSON text (built as text: no Python json can hold 1,500 levels)."""
    gc.cluster.kubectl("apply", "-f", "-", input_text=text)


PLACEHOLDER = "@@parameters@@"


def claim_body(ns: str, name: str, parameters: Any, *, device_class: str = "gpu.gpuplane.dev") -> dict[str, Any]:
    """A one-GPU claim with one opaque config of this driver."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}],
                "config": [{"opaque": {"driver": "gpu.gpuplane.dev", "parameters": parameters}}],
            }
        },
    }


def events_of(gc: GpuCluster, ns: str, name: str) -> list[dict[str, Any]]:
    items = gc.kubectl_json("get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name}")["items"]
    return list(items)
