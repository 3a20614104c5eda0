"""Gate-and-steer on the real control plane: the admission policy gates, the controller steers, fail-open.

The MutatingAdmissionPolicy from manifests/policies gates claim pods of opted-in namespaces while
the controller's Lease is fresh; the leader writes its node choice into the pod's affinity and
lifts the gate; the real kube-scheduler then allocates. With every controller killed (SIGKILL:
the Lease keeps its holder and goes stale), new pods are gated for at most the freshness margin,
and a restarted controller releases what was gated meanwhile.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from e2e.cluster import procs
from e2e.plane import components, nodes, simnodes
from tests.e2e.conftest import GpuCluster, eventually

pytestmark = pytest.mark.e2e

NS = "e2e-steer"
PLAIN_NS = "e2e-steer-off"
GATE = "gpuplane.dev/steer"
STEERED = "gpuplane.dev/steered"
NODE_LABEL = "e2e-steer"
DOMAIN_LABEL = "gpuplane.dev/nvlink-domain"


def _namespace(name: str, steering: bool) -> dict[str, Any]:
    labels = {"gpuplane.dev/steering": "enabled"} if steering else {}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def _template(ns: str) -> dict[str, Any]:
    sel = 'device.attributes["gpu.gpuplane.dev"].migProfile == "3g.40gb"'
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "mig-3g", "namespace": ns},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": "mig.gpuplane.dev",
                                "selectors": [{"cel": {"expression": sel}}],
                            },
                        }
                    ]
                }
            }
        },
    }


def _pod(ns: str, name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "annotations": annotations or {}},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {NODE_LABEL: "on"},
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "mig-3g"}],
            "containers": [
                {"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "gpu"}]}}
            ],
        },
    }


def _gates(pod: dict[str, Any]) -> list[str]:
    return [g["name"] for g in (pod.get("spec") or {}).get("schedulingGates") or []]


@pytest.fixture(scope="module")
def steer_ns(gpu_cluster: GpuCluster) -> Any:
    """One more HGX node whose driver steers (order + stranding taint), labelled so only these pods use it."""
    gc = gpu_cluster
    assert gc.cluster.state_dir is not None
    state = gc.cluster.state_dir
    creds = components.driver_credentials(gc.cluster, components.identities_dir(state.resolve()))
    sim = simnodes.SimNodes(
        state,
        gc.cluster.kubeconfig,
        driver_credentials=creds,
        die_with_parent=True,
        driver_args=("--steer-order", "--withhold-stranding"),
        out=lambda _: None,
    )
    try:
        (node,) = sim.start([nodes.NodeGroup("hgx-h100", 1)])
        gc.cluster.kubectl("label", "node", node.name, f"{NODE_LABEL}=on", "--overwrite")

        # Steering decides from the leader's view: a pod steered before it indexed the label (or the node's
        # GPUs) found no node it may use and was released "no-room" (CI, session 39). The controller writes the
        # node's NVLink-domain label from that view; dropped after our label, it is written again only from a
        # node event that came after ours, so once it is back the leader has seen both.
        def domain_label() -> str | None:
            return gc.kubectl_json("get", "node", node.name)["metadata"].get("labels", {}).get(DOMAIN_LABEL)

        eventually(domain_label, 60, f"{node.name} labelled with its NVLink domain by the controller")
        gc.cluster.kubectl("label", "node", node.name, f"{DOMAIN_LABEL}-")
        eventually(domain_label, 60, f"{node.name}'s NVLink-domain label written again after the {NODE_LABEL} label")
        for ns, on in ((NS, True), (PLAIN_NS, False)):
            gc.cluster.apply(_namespace(ns, on))
            gc.cluster.apply(_template(ns))
        yield gc
        for ns in (NS, PLAIN_NS):
            gc.cluster.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=120s", timeout=150)
    finally:
        sim.stop()


def _claim_devices(gc: GpuCluster, ns: str) -> dict[str, tuple[str, str]]:
    out = {}
    for c in gc.kubectl_json("get", "resourceclaims", "-n", ns).get("items", []):
        owner = next((o["name"] for o in c["metadata"].get("ownerReferences") or [] if o["kind"] == "Pod"), "")
        results = ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []
        if owner and results:
            out[owner] = (results[0]["pool"], results[0]["device"])
    return out


def test_opted_in_pods_are_steered_and_packed(steer_ns: GpuCluster) -> None:
    gc = steer_ns
    for i in range(3):
        gc.cluster.apply(_pod(NS, f"s{i}"))
    pods = gc.running_pods(NS, 3, timeout=120)
    for p in pods:
        ann = (p["metadata"].get("annotations") or {}).get(STEERED)
        assert ann, f"{p['metadata']['name']} was not steered: {p['metadata'].get('annotations')}"
        node, _domain, _what = ann.split(";", 2)
        assert p["spec"]["nodeName"] == node  # the scheduler followed the preference
        pref = p["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert {
            "weight": 100,
            "preference": {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]},
        } in pref
        assert GATE not in _gates(p)
    devices = eventually(lambda: (d := _claim_devices(gc, NS)) and len(d) == 3 and d, 60, "3 allocations")
    # gpuplane never takes a 3g at slot 0 (it strands a compute slice) and packs one node first.
    assert all(dev.endswith("-3g-40gb-4") for _, dev in devices.values()), devices
    assert len({node for node, _ in devices.values()}) == 1, devices


def test_not_opted_in_and_opted_out_pods_are_never_gated(steer_ns: GpuCluster) -> None:
    gc = steer_ns
    gc.cluster.apply(_pod(PLAIN_NS, "plain"))
    gc.cluster.apply(_pod(NS, "optout", {"gpuplane.dev/steering": "off"}))
    for ns, name in ((PLAIN_NS, "plain"), (NS, "optout")):
        p = gc.pod(ns, name)
        assert GATE not in _gates(p)
        assert STEERED not in (p["metadata"].get("annotations") or {})
    gc.running_pods(PLAIN_NS, 1, timeout=120)


def _kill_controllers(gc: GpuCluster) -> None:
    assert gc.cluster.state_dir is not None
    for record in components.controller_records(gc.cluster.state_dir.resolve()).values():
        if procs.is_alive(record):
            os.kill(record.pid, signal.SIGKILL)
    eventually(
        lambda: (
            not any(procs.is_alive(r) for r in components.controller_records(gc.cluster.state_dir.resolve()).values())
        ),
        30,
        "controllers to die",
    )


def test_fail_open_when_every_controller_is_dead(steer_ns: GpuCluster) -> None:
    gc = steer_ns
    assert gc.controllers is not None
    gc.cluster.kubectl("delete", "pods", "-n", NS, "--all", "--wait=true", "--timeout=120s", timeout=150)
    _kill_controllers(gc)
    try:
        # Right after the crash the Lease still looks fresh: a pod is gated, and nobody lifts it.
        gc.cluster.apply(_pod(NS, "during"))
        assert GATE in _gates(gc.pod(NS, "during"))
        time.sleep(3)
        assert GATE in _gates(gc.pod(NS, "during"))
        # Past the 30 s margin after the last renewal the policy stops gating: the scheduler takes the pod.
        time.sleep(32)
        gc.cluster.apply(_pod(NS, "after"))
        assert GATE not in _gates(gc.pod(NS, "after"))
        eventually(lambda: gc.pod(NS, "after")["spec"].get("nodeName"), 60, "the ungated pod to be bound")
    finally:
        gc.controllers.start()
    # A controller back up decides what was gated meanwhile.
    eventually(lambda: GATE not in _gates(gc.pod(NS, "during")), 60, "the gate held during the outage to go")
    eventually(lambda: gc.pod(NS, "during")["spec"].get("nodeName"), 60, "the held pod to be bound")


def _self_gated(ns: str, name: str, blob: int) -> dict[str, Any]:
    """A tenant's pod that carries the steer gate itself, with ``blob`` bytes of its own annotations."""
    body = _pod(ns, name, {"a": "x" * blob})
    body["spec"]["schedulingGates"] = [{"name": GATE}]
    return body


def test_self_gated_pods_cannot_starve_steering(steer_ns: GpuCluster) -> None:
    """Issue 32, defect 2: a tenant's own gated pods (outside the opted-in namespaces, and inside with
    annotations so close to the 256 KiB limit that no write can add to them) never hold back another
    pod's steering; the controller leaves the ones outside alone."""
    gc = steer_ns
    outside = [_self_gated(PLAIN_NS, f"hog-{i:02d}", 250_000) for i in range(70)]
    inside = [_self_gated(NS, f"full-{i:02d}", 262_144 - 1 - 40) for i in range(8)]
    for body in [*outside, *inside]:  # created, not applied: kubectl apply would copy the blob again
        gc.cluster.core.create_namespaced_pod(body["metadata"]["namespace"], body)
    try:
        started = time.monotonic()
        gc.cluster.apply(_pod(NS, "victim"))

        def running() -> dict[str, Any] | None:
            got = gc.pod(NS, "victim")
            return got if (got.get("status") or {}).get("phase") == "Running" else None

        victim = eventually(running, 90, "the victim pod running")
        waited = time.monotonic() - started
        assert (victim["metadata"].get("annotations") or {}).get(STEERED), "the victim was not steered"
        assert waited < 30, f"the victim waited {waited:.0f} s behind the tenant's gated pods"
        # Outside the opted-in namespaces the controller touched nothing: the gates are the tenant's.
        for p in gc.kubectl_json("get", "pods", "-n", PLAIN_NS)["items"]:
            if p["metadata"]["name"].startswith("hog-"):
                assert GATE in _gates(p) and STEERED not in (p["metadata"].get("annotations") or {})
    finally:
        for ns, names in (
            (PLAIN_NS, [b["metadata"]["name"] for b in outside]),
            (NS, [*(b["metadata"]["name"] for b in inside), "victim"]),
        ):
            gc.cluster.kubectl("delete", "pod", "-n", ns, "--wait=false", "--ignore-not-found", *names, timeout=120)
