"""A gang placed where the scheduler will not follow is released after the bind timeout, then placed again.

Two simulated ``hgx-h100`` nodes and two controller replicas (``running_plane``, as ``python -m e2e
up``), the controller's bind timeout 20 s (``GPUPLANE_BIND_TIMEOUT``) instead of 600. A
DeviceTaintRule (resource.k8s.io/v1; v1beta2 on 1.36) taints every gpuplane device ``NoSchedule``: the
controller's placement does not look at device taints (neither a rule's nor the slices' own), so
it places a 2 x 4-GPU gang and lifts its gates, and the real kube-scheduler, which applies the
rule, can bind none of the members. (Should placement learn to honour taints, this test needs
another disagreement between the two.) Once the timeout passes the controller releases the placement like a
preemption: phase ``Preempted``, a Warning Event ``BindTimeout`` on the gang saying how many
members were bound, member pods and claims deleted. With the rule gone and the pods recreated (what
their owner would do) the gang queues again and runs.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.cluster import handle as cluster
from e2e.cluster import releases
from tests.e2e.conftest import GpuCluster, eventually, running_plane

pytestmark = pytest.mark.e2e

GROUP, VERSION, PLURAL = "gpuplane.dev", "v1alpha1", "gpugangs"
RULES = ("resource.k8s.io", releases.RUNNING.device_taint_rule_api.split("/")[1], "devicetaintrules")
BIND_TIMEOUT_S = 20
CONTROLLER_ENV = {"GPUPLANE_BIND_TIMEOUT": str(BIND_TIMEOUT_S)}


@pytest.fixture(scope="module")
def plane(control_plane: cluster.Cluster) -> Iterator[GpuCluster]:
    saved = {k: os.environ.get(k) for k in CONTROLLER_ENV}
    os.environ.update(CONTROLLER_ENV)  # the controller replicas inherit it
    try:
        with running_plane(control_plane, "hgx-h100:2") as gpu:
            yield gpu
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _member_pod(gang: str, index: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{gang}-{index}", "labels": {"gpuplane.dev/gang": gang}},
        "spec": {
            "automountServiceAccountToken": False,
            "schedulingGates": [{"name": "gpuplane.dev/gang"}],
            "resourceClaims": [{"name": "gpus", "resourceClaimName": f"{gang}-{index}"}],
            "containers": [
                {"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "gpus"}]}}
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }


def _status(gpu: GpuCluster, ns: str, name: str) -> dict[str, Any]:
    obj = gpu.cluster.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    return dict(obj.get("status") or {})


def _events(gpu: GpuCluster, ns: str, name: str, reason: str) -> list[str]:
    items = gpu.cluster.core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
    return [e.message or "" for e in items if e.reason == reason]


def _claims(gpu: GpuCluster, ns: str) -> list[str]:
    listed = gpu.cluster.custom.list_namespaced_custom_object("resource.k8s.io", "v1", ns, "resourceclaims")
    return [c["metadata"]["name"] for c in listed["items"] if not c["metadata"].get("deletionTimestamp")]


def test_unbindable_placement_is_released_after_the_bind_timeout_then_placed_again(plane: GpuCluster) -> None:
    gpu, core, custom = plane, plane.cluster.core, plane.cluster.custom
    ns, gang, rule = f"bindto-{uuid.uuid4().hex[:6]}", "tp8", f"bindto-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    eventually(lambda: core.list_namespaced_service_account(ns).items, what="default SA")
    taint_rule = {
        "apiVersion": f"{RULES[0]}/{RULES[1]}",
        "kind": "DeviceTaintRule",
        "metadata": {"name": rule},
        "spec": {
            "deviceSelector": {"driver": "gpu.gpuplane.dev"},
            "taint": {"key": "example.com/maintenance", "value": "e2e", "effect": "NoSchedule"},
        },
    }
    custom.create_cluster_custom_object(*RULES, taint_rule)
    try:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GpuGang", "metadata": {"name": gang}}
        custom.create_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, {**body, "spec": {"members": 2, "gpusPerMember": 4}}
        )
        for i in range(2):
            core.create_namespaced_pod(ns, _member_pod(gang, i))
        placed = eventually(
            lambda: (s := _status(gpu, ns, gang)).get("phase") == "Placed" and s, 90, "the gang to be placed"
        )
        print(f"\n[bind-timeout] placed despite the rule: {placed.get('message')}")
        released = eventually(
            lambda: (s := _status(gpu, ns, gang)).get("phase") == "Preempted" and s,
            BIND_TIMEOUT_S + 60,
            "the placement to be released after the bind timeout",
        )
        (said,) = eventually(lambda: _events(gpu, ns, gang, "BindTimeout"), 30, "the BindTimeout Event")
        print(f"[bind-timeout] {released.get('reason')}: {said}")
        assert released.get("reason") == "BindTimeout" and "0 of 2 members bound" in said
        eventually(lambda: not gpu.pods(ns) and not _claims(gpu, ns), 60, "member pods and claims to be deleted")
    finally:
        try:
            custom.delete_cluster_custom_object(*RULES, rule)
        except ApiException as exc:
            if exc.status != 404:
                raise
    for i in range(2):  # what the pods' owner does: recreate them (gated); the gang queues again
        core.create_namespaced_pod(ns, _member_pod(gang, i))
    running = eventually(
        lambda: (s := _status(gpu, ns, gang)).get("phase") == "Running" and s, 120, "the gang to run again"
    )
    print(f"[bind-timeout] after the rule was removed: {running.get('message')}")
    gpu.cluster.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=120s", timeout=150)
