"""Deleting a GpuGang releases it and tells its pods (issue 18, defect 7, second item), on the session's cluster.

Before, deleting a gang mid-placement left its member pods Pending for ever ("cannot allocate
all claims": the garbage collector deleted the claims the gang owned), and deleting a Running
gang left its pods running on terminating claims. Now the controller, on the gang's deletion,
puts a Warning Event ``GangDeleted`` on each live member pod, deletes the pods (a Job's
members: suspends the Job) and the claims it made, so nothing waits for a gang that is gone and
its GPUs are free for the next one.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.e2e.conftest import GpuCluster, eventually
from tests.hostilekit import (
    apply_text,
    events_of,
    ns_fixture,  # noqa: F401  (fixture ns)
    pod_body,
)

pytestmark = pytest.mark.e2e


def gang_objects(ns: str, name: str, members: int, *, node_selector: dict[str, str] | None = None) -> str:
    gang = {
        "apiVersion": "gpuplane.dev/v1alpha1",
        "kind": "GpuGang",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"members": members, "gpusPerMember": 1},
    }
    items: list[dict[str, Any]] = [gang]
    for i in range(members):
        pod = pod_body(ns, f"{name}-pod-{i}", f"{name}-{i}")
        pod["metadata"]["labels"] = {"gpuplane.dev/gang": name}
        pod["spec"]["schedulingGates"] = [{"name": "gpuplane.dev/gang"}]
        if node_selector:
            pod["spec"]["nodeSelector"] = node_selector
        items.append(pod)
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items})


def gang_phase(gc: GpuCluster, ns: str, name: str) -> str:
    body = gc.kubectl_json("get", "gpugang", "-n", ns, name)
    return str((body.get("status") or {}).get("phase", ""))


def assert_told_and_gone(gc: GpuCluster, ns: str, name: str, members: int, was: str) -> float:
    """Delete the gang; every member pod gets GangDeleted and goes, and so do the gang's claims. Seconds taken."""
    began = time.monotonic()
    gc.cluster.kubectl("delete", "gpugang", "-n", ns, name, "--wait=true", "--timeout=60s", timeout=90)
    pods = [f"{name}-pod-{i}" for i in range(members)]

    left: list[str] = []

    def gone() -> bool:
        listed = gc.kubectl_json("get", "pods", "-n", ns)["items"]
        claims = gc.kubectl_json("get", "resourceclaims", "-n", ns)["items"]
        left[:] = [
            f"pod {p['metadata']['name']} {p['status'].get('phase')}"
            + (" (deleting)" if p["metadata"].get("deletionTimestamp") else "")
            for p in listed
            if p["metadata"]["name"] in pods
        ] + [
            f"claim {c['metadata']['name']}" + (" (deleting)" if c["metadata"].get("deletionTimestamp") else "")
            for c in claims
            if c["metadata"]["name"].startswith(f"{name}-")
        ]
        return not left

    try:
        eventually(gone, 120, f"gang {name}'s pods and claims gone after its deletion")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; left: {', '.join(left)}") from None
    took = time.monotonic() - began
    for pod in pods:
        told = [e for e in events_of(gc, ns, pod) if e["reason"] == "GangDeleted"]
        assert told, f"no GangDeleted Event on {pod}: {[e['reason'] for e in events_of(gc, ns, pod)]}"
        event = told[0]
        assert event["type"] == "Warning" and event["source"]["component"] == "gpuplane-controller", event
        assert f"GpuGang {ns}/{name} was deleted while {was}" in event["message"], event["message"]
        assert "this pod is deleted" in event["message"]
    print(f"\n[e2e] gang {name} deleted while {was}: {members} pods told and gone in {took:.1f}s")
    print(f"[e2e] Event GangDeleted on {pods[0]}: {told[0]['message']}")
    return took


def test_deleting_a_gang_mid_placement_releases_its_pending_members(gpu_cluster: GpuCluster, ns: str) -> None:
    """Placed, gates lifted, the pods unbindable (a nodeSelector no node has): Pending until the gang goes."""
    gc = gpu_cluster
    apply_text(gc, gang_objects(ns, "mid", 2, node_selector={"gpuplane-test/nowhere": "true"}))

    # Placed stays while the members are unbound (until --bind-timeout, 600 s): a phase that holds still.
    eventually(lambda: gang_phase(gc, ns, "mid") == "Placed", 120, "gang mid Placed (gates lifted, members unbound)")
    assert all(gc.pod(ns, f"mid-pod-{i}")["status"].get("phase") == "Pending" for i in range(2))
    assert_told_and_gone(gc, ns, "mid", 2, "Placed")


def test_deleting_a_running_gang_stops_its_pods_and_frees_its_gpus(gpu_cluster: GpuCluster, ns: str) -> None:
    gc = gpu_cluster
    apply_text(gc, gang_objects(ns, "run", 2))

    def running() -> bool:
        return all(gc.pod(ns, f"run-pod-{i}")["status"].get("phase") == "Running" for i in range(2))

    eventually(running, 180, "gang run's members Running")
    eventually(lambda: gang_phase(gc, ns, "run") == "Running", 60, "gang run Running")
    assert_told_and_gone(gc, ns, "run", 2, "Running")
    apply_text(gc, gang_objects(ns, "next", 2))  # the released GPUs take the next gang
    eventually(
        lambda: all(gc.pod(ns, f"next-pod-{i}")["status"].get("phase") == "Running" for i in range(2)),
        180,
        "the next gang's members Running",
    )
    gc.cluster.kubectl("delete", "gpugang", "-n", ns, "next", "--wait=true", "--timeout=60s", timeout=90)
