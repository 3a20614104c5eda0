"""A tenant cannot preempt another tenant's gang with a number it writes, nor past its PodDisruptionBudget
(issue 32, defect 1), on the session's cluster (the controller as deployed, with its RBAC).

Tenant B runs a gang that fills the GB200 clique, with a PodDisruptionBudget of its size. Tenant A asks for
the clique: first with ``spec.priority: 1000000`` and no PriorityClass (before the fix this preempted B with
plain deletes), then with pods of a higher PriorityClass (its preemption is refused by B's budget: A's status
says why, B keeps running with the same pods). Once B's budget is gone, A preempts B through the Eviction API.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any, cast

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.cluster import flags
from tests.e2e.conftest import GpuCluster, eventually
from tests.hostilekit import apply_text, events_of, pod_body

pytestmark = pytest.mark.e2e

GB200 = 'device.attributes["gpu.gpuplane.dev"].productName == "NVIDIA GB200"'
HIGH = flags.ENTITLED_PRIORITY_CLASSES[0]  # granted per namespace by a ResourceQuota scoped to it


@pytest.fixture
def tenants(gpu_cluster: GpuCluster) -> Iterator[tuple[str, str]]:
    """Two tenant namespaces, a PriorityClass above the default, granted to tenant A only (deleted at the end)."""
    core = gpu_cluster.cluster.core
    suffix = uuid.uuid4().hex[:6]
    names_ = (f"tenant-a-{suffix}", f"tenant-b-{suffix}")
    for name in names_:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        eventually(lambda n=name: core.list_namespaced_service_account(n).items, 60, "service account")  # type: ignore[misc]
    pc = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": HIGH},
        "value": 100000,
        "preemptionPolicy": "PreemptLowerPriority",
        "description": "e2e: a gang priority an administrator grants",
    }
    apply_text(gpu_cluster, json.dumps(pc))
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": HIGH, "namespace": names_[0]},
        "spec": {
            "hard": {"pods": "4"},
            "scopeSelector": {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": [HIGH]}]},
        },
    }
    apply_text(gpu_cluster, json.dumps(quota))
    try:
        yield names_
    finally:
        for name in names_:
            gpu_cluster.cluster.kubectl("delete", "namespace", name, "--wait=true", "--timeout=120s", timeout=150)
        gpu_cluster.cluster.kubectl("delete", "priorityclass", HIGH, "--ignore-not-found")


def make_gang(gc: GpuCluster, ns: str, name: str, *, spec_priority: int | None = None, pc: str = "") -> None:
    spec: dict[str, Any] = {"members": 2, "gpusPerMember": 4, "tensorParallelSize": 8, "selectors": [GB200]}
    if spec_priority is not None:
        spec["priority"] = spec_priority
    items: list[dict[str, Any]] = [
        {
            "apiVersion": "gpuplane.dev/v1alpha1",
            "kind": "GpuGang",
            "metadata": {"name": name, "namespace": ns},
            "spec": spec,
        }
    ]
    for i in range(2):
        pod = pod_body(ns, f"{name}-pod-{i}", f"{name}-{i}")
        pod["metadata"]["labels"] = {"gpuplane.dev/gang": name}
        pod["spec"]["schedulingGates"] = [{"name": "gpuplane.dev/gang"}]
        if pc:
            pod["spec"]["priorityClassName"] = pc
        items.append(pod)
    apply_text(gc, json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))


def status_of(gc: GpuCluster, ns: str, name: str) -> dict[str, Any]:
    return dict(gc.kubectl_json("get", "gpugang", "-n", ns, name).get("status") or {})


def pod_uids(gc: GpuCluster, ns: str, gang: str) -> dict[str, str]:
    pods = gc.kubectl_json("get", "pods", "-n", ns, "-l", f"gpuplane.dev/gang={gang}")["items"]
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods if not p["metadata"].get("deletionTimestamp")}


def assert_b_untouched(gc: GpuCluster, ns: str, uids: dict[str, str]) -> None:
    assert status_of(gc, ns, "train").get("phase") == "Running", status_of(gc, ns, "train")
    assert pod_uids(gc, ns, "train") == uids
    assert not [e for e in events_of(gc, ns, "train") if e["reason"] == "Preempted"]


def test_a_priority_class_is_granted_per_namespace(gpu_cluster: GpuCluster, tenants: tuple[str, str]) -> None:
    """The e2e API server limits gpuplane's example PriorityClasses (AdmissionConfiguration, ResourceQuota
    limitedResources): tenant B, without a quota scoped to it, cannot make a pod of it; tenant A can."""
    ns_a, ns_b = tenants
    core = gpu_cluster.cluster.core
    pod = pod_body(ns_b, "wants-high", "none")
    pod["spec"]["priorityClassName"] = HIGH
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod(ns_b, cast(Any, pod), dry_run="All")
    # kube-apiserver answers this refusal with code 500 (the quota plugin returns a plain error), not 403.
    assert refused.value.status in (403, 500), refused.value.body
    assert "insufficient quota to match these scopes" in str(refused.value.body)
    why = json.loads(refused.value.body or "{}").get("message")
    print(f"\n[e2e] tenant B, pod of PriorityClass {HIGH}: {refused.value.status} {why}")
    pod["metadata"]["namespace"] = ns_a
    core.create_namespaced_pod(ns_a, cast(Any, pod), dry_run="All")  # entitled: admitted


def test_a_tenant_cannot_preempt_another_by_spec_priority_or_past_its_budget(
    gpu_cluster: GpuCluster, tenants: tuple[str, str]
) -> None:
    gc = gpu_cluster
    ns_a, ns_b = tenants
    # Tenant B: a gang filling the GB200 clique, Running, with a budget that allows no disruption.
    make_gang(gc, ns_b, "train")
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "train", "namespace": ns_b},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"gpuplane.dev/gang": "train"}}},
    }
    apply_text(gc, json.dumps(pdb))
    eventually(lambda: status_of(gc, ns_b, "train").get("phase") == "Running", 180, "tenant B's gang Running")
    uids = pod_uids(gc, ns_b, "train")
    assert len(uids) == 2

    # 1. Tenant A's self-declared spec.priority: no preemption; A is told the number is ignored.
    make_gang(gc, ns_a, "grab", spec_priority=1_000_000)
    eventually(lambda: status_of(gc, ns_a, "grab").get("reason"), 90, "tenant A's gang decided")
    time.sleep(8)  # several queue passes (the controller resyncs gangs every few seconds)
    assert_b_untouched(gc, ns_b, uids)  # before issue 32: Preempted, its pods deleted past the budget
    st = status_of(gc, ns_a, "grab")
    assert st.get("phase") == "Queued" and not st.get("nominatedVictims"), st
    assert st.get("effectivePriority", 0) < 100, st
    ignored = [e for e in events_of(gc, ns_a, "grab") if e["reason"] == "SpecPriorityIgnored"]
    assert ignored and "spec.priority 1000000 is ignored" in ignored[0]["message"], ignored
    print(f"\n[e2e] spec.priority 1000000: {st['reason']}: {st['message']}")
    gc.cluster.kubectl("delete", "gpugang,pods", "-n", ns_a, "--all", "--wait=true", "--timeout=60s", timeout=90)

    # 2. Tenant A's pods carry a higher PriorityClass: the preemption is refused by B's budget, whole.
    make_gang(gc, ns_a, "grab2", pc=HIGH)
    refused = eventually(
        lambda: (s := status_of(gc, ns_a, "grab2")).get("reason") == "PreemptionRefused" and s, 90, "refusal"
    )
    msg = refused["message"]
    assert msg.startswith(f"preemption of gang {ns_b}/train refused: "), msg
    assert "disruption budget" in msg and msg.endswith("; waiting"), msg
    assert not refused.get("nominatedVictims"), refused
    assert [e for e in events_of(gc, ns_a, "grab2") if e["reason"] == "PreemptionRefused"]
    time.sleep(6)
    assert_b_untouched(gc, ns_b, uids)
    print(f"[e2e] PriorityClass {HIGH} vs a PodDisruptionBudget: {msg}")

    # 3. Without the budget the entitled gang preempts B, through the Eviction API.
    gc.cluster.kubectl("delete", "pdb", "-n", ns_b, "train")
    eventually(lambda: status_of(gc, ns_a, "grab2").get("phase") == "Running", 180, "tenant A's gang Running")
    st_b = status_of(gc, ns_b, "train")
    assert st_b.get("phase") == "Preempted" and st_b["message"] == f"preempted by higher-priority gang {ns_a}/grab2"
    eventually(lambda: not pod_uids(gc, ns_b, "train"), 60, "tenant B's pods evicted")
    print(f"[e2e] budget gone: {ns_b}/train {st_b['phase']}: {st_b['message']}")
