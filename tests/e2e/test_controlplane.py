"""The proof that DRA works on the harness's control plane with no driver at all.

The test plays the driver's part by publishing ResourceSlices itself, and the
kubelet's part with ``NodeHeartbeat``. The real kube-scheduler must then bind
pods to the node and write each claim's allocation from the slice's devices,
never allocate one device twice, leave a pod Pending with a FailedScheduling
event when devices run out, and, for partitionable devices (counters in their
own slice, the 1.35+ layout), never allocate two devices whose counters overlap.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any, TypeVar

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.cluster import handle as cluster
from e2e.cluster import releases
from e2e.plane import nodes
from tests.e2e.conftest import claim, eventually, pod

pytestmark = pytest.mark.e2e

DRIVER = "gpu.gpuplane.dev"
GROUP, VERSION = "resource.k8s.io", "v1"
CLAIMS_UNSATISFIABLE = "cannot allocate all claims"
T = TypeVar("T")


# Builders ---------------------------------------------------------------------


def device_class(name: str, device_type: str) -> dict[str, Any]:
    expression = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "{device_type}"'
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def resource_slice(name: str, node: str, pool_slices: int = 1, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": pool_slices},
            **spec,
        },
    }


# Cluster access ------------------------------------------------------------------


class Dra:
    """resource.k8s.io/v1 and pods in one namespace, as plain dicts."""

    def __init__(self, handle: cluster.Cluster, namespace: str) -> None:
        self.ns = namespace
        self.core = handle.core
        self.custom = handle.custom

    def create_cluster_object(self, plural: str, body: dict[str, Any]) -> dict[str, Any]:
        created: dict[str, Any] = self.custom.create_cluster_custom_object(GROUP, VERSION, plural, body)
        return created

    def create_claim(self, body: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, "resourceclaims", body)

    def get_claim(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.ns, "resourceclaims", name
        )
        return found

    def claim_gone(self, name: str) -> bool:
        try:
            self.get_claim(name)
        except ApiException as err:
            if err.status == 404:
                return True
            raise
        return False

    def allocated_devices(self, name: str) -> list[tuple[str, str]] | None:
        allocation = self.get_claim(name).get("status", {}).get("allocation")
        if not allocation:
            return None
        return [(r["pool"], r["device"]) for r in allocation["devices"]["results"]]

    def create_pod(self, body: dict[str, Any]) -> None:
        self.core.create_namespaced_pod(self.ns, body)

    def node_of(self, name: str) -> str | None:
        spec = self.core.read_namespaced_pod(name, self.ns).spec
        return spec.node_name if spec else None

    def delete_pod_now(self, name: str) -> None:
        self.core.delete_namespaced_pod(name, self.ns, grace_period_seconds=0)

    def scheduling_failures(self, pod_name: str) -> list[str]:
        events = self.core.list_namespaced_event(self.ns, field_selector=f"involvedObject.name={pod_name}")
        return [e.message or "" for e in events.items if e.reason == "FailedScheduling"]

    def run(self, pod_name: str, claim_body: dict[str, Any]) -> None:
        self.create_claim(claim_body)
        self.create_pod(pod(pod_name, claim_body["metadata"]["name"]))


@pytest.fixture
def namespace(control_plane: cluster.Cluster) -> Iterator[str]:
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    core = control_plane.core
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    # The ServiceAccount admission plugin rejects pods until the namespace's default SA exists.
    eventually(lambda: core.list_namespaced_service_account(name).items, what=f"default SA in {name}")
    yield name
    core.delete_namespace(name)


def start_node(handle: cluster.Cluster, name: str) -> nodes.NodeHeartbeat:
    heartbeat = nodes.NodeHeartbeat(name, handle.api, delete_on_stop=True)
    heartbeat.start()
    try:
        heartbeat.wait_schedulable()
    except BaseException:
        heartbeat.stop()
        raise
    return heartbeat


# Tests ----------------------------------------------------------------------------


@pytest.mark.smoke
def test_harness_answers_kubectl_and_serves_the_apis_we_need(control_plane: cluster.Cluster) -> None:
    versions = control_plane.kubectl("api-versions").split()
    release = releases.RUNNING
    for wanted in ("resource.k8s.io/v1", release.device_taint_rule_api, release.workload_api):
        assert wanted in versions
    resources = control_plane.kubectl("api-resources", "--api-group=resource.k8s.io", "-o", "name").split()
    assert "devicetaintrules.resource.k8s.io" in resources
    assert "resourceslices.resource.k8s.io" in resources


def test_scheduler_allocates_devices_from_a_slice_without_a_driver(
    control_plane: cluster.Cluster, namespace: str
) -> None:
    dra = Dra(control_plane, namespace)
    dra.create_cluster_object("deviceclasses", device_class("gpuplane-gpu", "gpu"))
    heartbeat = start_node(control_plane, "n1")
    try:
        gpus = [{"name": f"gpu-{i}", "attributes": {f"{DRIVER}/type": {"string": "gpu"}}} for i in range(2)]
        dra.create_cluster_object("resourceslices", resource_slice("n1-gpus", "n1", devices=gpus))

        allocated: list[tuple[str, str]] = []
        for index in (1, 2):
            dra.run(f"pod-{index}", claim(f"claim-{index}", "gpuplane-gpu"))
            assert eventually(lambda i=index: dra.node_of(f"pod-{i}"), what=f"pod-{index} bound") == "n1"
            devices = eventually(lambda i=index: dra.allocated_devices(f"claim-{i}"), what="allocation")
            assert len(devices) == 1
            allocated += devices
            status = dra.get_claim(f"claim-{index}")["status"]
            assert status["allocation"]["devices"]["results"][0]["driver"] == DRIVER
            assert [r["name"] for r in status["reservedFor"]] == [f"pod-{index}"]
        assert sorted(allocated) == [("n1", "gpu-0"), ("n1", "gpu-1")]

        dra.run("pod-3", claim("claim-3", "gpuplane-gpu"))
        messages = eventually(lambda: dra.scheduling_failures("pod-3"), what="FailedScheduling for pod-3")
        # The DynamicResources plugin's verdict: "0/1 nodes are available: 1 cannot allocate all claims."
        assert any(CLAIMS_UNSATISFIABLE in m for m in messages), messages
        assert dra.node_of("pod-3") is None
        assert dra.allocated_devices("claim-3") is None
        assert heartbeat.last_error is None
    finally:
        heartbeat.stop()
        control_plane.kubectl("delete", "resourceslice", "n1-gpus", "--ignore-not-found")
        control_plane.kubectl("delete", "deviceclass", "gpuplane-gpu", "--ignore-not-found")


def test_partitionable_devices_never_allocate_overlapping_partitions(
    control_plane: cluster.Cluster, namespace: str
) -> None:
    dra = Dra(control_plane, namespace)
    dra.create_cluster_object("deviceclasses", device_class("gpuplane-partition", "partition"))
    heartbeat = start_node(control_plane, "n2")

    def partition(name: str, profile: str, memory: str) -> dict[str, Any]:
        return {
            "name": name,
            "attributes": {
                f"{DRIVER}/type": {"string": "partition"},
                f"{DRIVER}/profile": {"string": profile},
            },
            "consumesCounters": [{"counterSet": "gpu-0", "counters": {"memory": {"value": memory}}}],
        }

    def profile(name: str) -> str:
        return f'device.attributes["{DRIVER}"].profile == "{name}"'

    try:
        counters = [{"name": "gpu-0", "counters": {"memory": {"value": "80Gi"}}}]
        dra.create_cluster_object(
            "resourceslices", resource_slice("n2-counters", "n2", pool_slices=2, sharedCounters=counters)
        )
        parts = [partition("gpu-0-full", "full", "80Gi"), partition("gpu-0-half-a", "half", "40Gi"),
                 partition("gpu-0-half-b", "half", "40Gi")]  # fmt: skip
        dra.create_cluster_object("resourceslices", resource_slice("n2-devices", "n2", pool_slices=2, devices=parts))

        # The whole GPU first: afterwards no half fits.
        dra.run("full", claim("full", "gpuplane-partition", profile("full")))
        assert eventually(lambda: dra.allocated_devices("full"), what="full allocated") == [("n2", "gpu-0-full")]
        dra.run("half-1", claim("half-1", "gpuplane-partition", profile("half")))
        messages = eventually(lambda: dra.scheduling_failures("half-1"), what="FailedScheduling for half-1")
        assert any(CLAIMS_UNSATISFIABLE in m for m in messages), messages
        assert dra.allocated_devices("half-1") is None

        # Free the whole GPU: both halves now fit, one each, and then the whole GPU does not.
        dra.delete_pod_now("full")
        control_plane.kubectl("delete", "resourceclaim", "full", "-n", namespace, "--wait=false")
        eventually(lambda: dra.claim_gone("full"), what="claim full deallocated and deleted")
        first = eventually(lambda: dra.allocated_devices("half-1"), what="half-1 allocated")
        dra.run("half-2", claim("half-2", "gpuplane-partition", profile("half")))
        second = eventually(lambda: dra.allocated_devices("half-2"), what="half-2 allocated")
        assert sorted(first + second) == [("n2", "gpu-0-half-a"), ("n2", "gpu-0-half-b")]
        assert dra.node_of("half-1") == dra.node_of("half-2") == "n2"

        dra.run("full-2", claim("full-2", "gpuplane-partition", profile("full")))
        messages = eventually(lambda: dra.scheduling_failures("full-2"), what="FailedScheduling for full-2")
        assert any(CLAIMS_UNSATISFIABLE in m for m in messages), messages
        assert dra.allocated_devices("full-2") is None
    finally:
        heartbeat.stop()
        for name in ("n2-devices", "n2-counters"):
            control_plane.kubectl("delete", "resourceslice", name, "--ignore-not-found")
        control_plane.kubectl("delete", "deviceclass", "gpuplane-partition", "--ignore-not-found")


def test_node_heartbeat_keeps_lease_and_ready_condition_fresh(control_plane: cluster.Cluster) -> None:
    coordination = client.CoordinationV1Api(control_plane.api)
    with nodes.NodeHeartbeat("n-beat", control_plane.api, interval=0.5, delete_on_stop=True) as heartbeat:
        first = coordination.read_namespaced_lease("n-beat", nodes.LEASE_NAMESPACE).spec.renew_time
        eventually(lambda: heartbeat.beats >= 3, timeout=20, what="three heartbeats")
        lease = coordination.read_namespaced_lease("n-beat", nodes.LEASE_NAMESPACE)
        assert lease.spec.holder_identity == "n-beat"
        assert lease.spec.renew_time > first
        assert lease.metadata.owner_references[0].kind == "Node"
        node = control_plane.core.read_node("n-beat")
        ready = [c for c in node.status.conditions if c.type == "Ready"]
        assert ready and ready[0].status == "True"
        assert node.status.allocatable["pods"] == "110"
        assert heartbeat.last_error is None
    beats = heartbeat.beats
    time.sleep(1.2)
    assert heartbeat.beats == beats  # the thread really stopped
    eventually(lambda: not control_plane.core.list_node(field_selector="metadata.name=n-beat").items,
               what="node deleted on stop")  # fmt: skip
