"""``nvidia.com/gpu`` served through DRA (KEP-5004), and a fleet half on the device plugin, half on gpuplane.

The DeviceClass ``nvidia-gpu.gpuplane.dev`` maps the extended resource
``nvidia.com/gpu`` to whole gpuplane GPUs. The tests check what the real
kube-scheduler does with unchanged device-plugin pods: it makes the special
claim (named in the pod's ``status.extendedResourceClaimStatus``), allocates
gpuplane GPUs, the node driver prepares them; and on a node whose allocatable
still lists ``nvidia.com/gpu`` (``e2e.plane.legacynode``, what the device plugin
makes kubelet report) it counts the request against that number instead.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from e2e.plane import legacynode, report
from gpuplane.controller.claim.checks import EXTENDED_RESOURCE_CLAIM_ANNOTATION
from tests.e2e.conftest import GpuCluster, eventually
from tests.e2e.test_scenarios import assert_prepared, attr, results

pytestmark = pytest.mark.e2e

EXAMPLE = "nvidia-gpu-limits"
EXAMPLE_NS = "gpuplane-ex-nvidia-gpu-limits"
CLASS = "nvidia-gpu.gpuplane.dev"


def special_claim(gpu: GpuCluster, pod: dict[str, Any]) -> dict[str, Any]:
    """The scheduler's claim for the pod's extended resources (asserts it is recorded and allocated)."""
    status = pod["status"].get("extendedResourceClaimStatus")
    assert status, f"pod {pod['metadata']['name']} has no extendedResourceClaimStatus"
    claim = gpu.claim(pod["metadata"]["namespace"], status["resourceClaimName"])
    assert claim["metadata"]["annotations"][EXTENDED_RESOURCE_CLAIM_ANNOTATION] == "true"
    assert claim["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
    assert [r["exactly"]["deviceClassName"] for r in claim["spec"]["devices"]["requests"]] == [CLASS]
    return claim


@pytest.fixture
def example(gpu_cluster: GpuCluster) -> Iterator[str]:
    with gpu_cluster.example_applied(EXAMPLE, clean_within=30) as name:
        yield name


def test_unchanged_nvidia_gpu_pods_run_on_gpuplane_gpus(gpu_cluster: GpuCluster, example: str) -> None:
    pods = {p["metadata"]["name"]: p for p in gpu_cluster.running_pods(EXAMPLE_NS, 2)}
    (inference,) = [p for name, p in pods.items() if name.startswith("inference-")]
    # Unchanged: no resourceClaims in the pod, the limit as written.
    assert "resourceClaims" not in inference["spec"]
    assert inference["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    devices = gpu_cluster.slice_devices()
    for pod, want in ((inference, 1), (pods["two-gpus"], 2)):
        claim = special_claim(gpu_cluster, pod)
        got = results(claim)
        node = gpu_cluster.node(pod["spec"]["nodeName"])
        assert len(got) == want
        assert {r["driver"] for r in got} == {"gpu.gpuplane.dev"} and {r["pool"] for r in got} == {node.name}
        assert all(attr(devices[(r["pool"], r["device"])], "type") == "gpu" for r in got)
        mapping = pod["status"]["extendedResourceClaimStatus"]["requestMappings"]
        assert mapping == [
            {
                "containerName": pod["spec"]["containers"][0]["name"],
                "resourceName": "nvidia.com/gpu",
                "requestName": got[0]["request"],
            }
        ]
        assert_prepared(gpu_cluster, node, claim)
        if want == 2:  # both from the node's one NVLink domain
            domains = {attr(devices[(r["pool"], r["device"])], "nvlinkDomain") for r in got}
            assert len(domains) == 1, domains
    print(
        "\n".join(
            f"{p['metadata']['name']}: node {p['spec']['nodeName']}, claim "
            f"{p['status']['extendedResourceClaimStatus']['resourceClaimName']}: "
            + ", ".join(r["device"] for r in results(special_claim(gpu_cluster, p)))
            for p in pods.values()
        )
    )


def _pod(name: str, namespace: str, nodes: list[str], *, claim: bool) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": "registry.k8s.io/pause:3.10"}
    spec: dict[str, Any] = {
        "containers": [container],
        "terminationGracePeriodSeconds": 0,
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}]}
                    ]
                }
            }
        },
    }
    if claim:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
        container["resources"] = {"claims": [{"name": "gpu"}]}
    else:
        container["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


@pytest.fixture
def device_plugin_node(gpu_cluster: GpuCluster) -> Iterator[legacynode.LegacyNode]:
    node = legacynode.LegacyNode(gpu_cluster.cluster, "device-plugin-0", gpus=2, die_with_parent=True)
    node.start()
    try:
        yield node
    finally:
        node.stop()


def test_mixed_fleet_device_plugin_and_gpuplane_nodes(
    gpu_cluster: GpuCluster, device_plugin_node: legacynode.LegacyNode
) -> None:
    """Legacy pods land on either kind of node, DRA pods only on gpuplane, nothing is allocated twice."""
    ns = "mixed-fleet"
    dp = device_plugin_node.name
    hgx0, hgx1 = (n.name for n in gpu_cluster.of_profile("hgx-h100"))
    handle = gpu_cluster.cluster
    handle.kubectl("create", "namespace", ns)
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu", "namespace": ns},
        "spec": {
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpuplane.dev"}}]}}
        },
    }
    # 11 legacy pods for 2 device-plugin GPUs + 8 gpuplane GPUs; 3 DRA pods that may use the device-plugin node
    # or hgx-1 (their claims can only be allocated on hgx-1, the device-plugin node publishes no devices).
    objects = [template]
    objects += [_pod(f"legacy-{i}", ns, [dp, hgx0], claim=False) for i in range(11)]
    objects += [_pod(f"dra-{i}", ns, [dp, hgx1], claim=True) for i in range(3)]
    try:
        handle.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(objects))

        def settled() -> list[dict[str, Any]] | None:
            pods = gpu_cluster.pods(ns)
            running = [p for p in pods if p["status"].get("phase") == "Running"]
            return pods if len(running) == 13 else None

        pods = eventually(settled, 120, "13 of the 14 pods running")
        time.sleep(3)  # the 14th stays Pending: give the scheduler a chance to (wrongly) place it
        pods = gpu_cluster.pods(ns)
        where = {p["metadata"]["name"]: p["spec"].get("nodeName") or "" for p in pods}
        per_node = Counter(where[n] for n in where if n.startswith("legacy-"))
        assert per_node[dp] == 2, per_node  # the device plugin's count is enforced by the scheduler
        assert per_node[hgx0] == 8, per_node
        assert per_node[""] == 1, per_node  # the 11th: no GPU left anywhere it may go
        pending = [p for p in pods if not p["spec"].get("nodeName")]
        (unplaced,) = pending
        message = " ".join(c.get("message", "") for c in unplaced["status"].get("conditions") or [])
        assert "nvidia.com/gpu" in message or "cannot allocate" in message, message
        assert {where[f"dra-{i}"] for i in range(3)} == {hgx1}
        # Nothing allocated twice: every device of every claim is unique; legacy pods on the DP node have no claim.
        allocated: list[tuple[str, str]] = []
        for pod in pods:
            if not pod["spec"].get("nodeName"):
                continue
            names = report.pod_claim_names(pod)
            if pod["spec"]["nodeName"] == dp:
                assert names == [] and "extendedResourceClaimStatus" not in pod["status"]
                continue
            for name in names:
                allocated += [(r["pool"], r["device"]) for r in results(gpu_cluster.claim(ns, name))]
        assert len(allocated) == 11 and len(set(allocated)) == 11, allocated
        print(f"legacy pods per node: {dict(per_node)}; DRA pods on {hgx1}; devices allocated once each: 11")
    finally:
        handle.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=120s", timeout=150)
        eventually(gpu_cluster.nodes_are_clean, 30, "nodes to be clean after the mixed fleet")


def test_device_plugin_node_publishes_nothing_to_dra(
    gpu_cluster: GpuCluster, device_plugin_node: legacynode.LegacyNode
) -> None:
    node = gpu_cluster.kubectl_json("get", "node", device_plugin_node.name)
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "2"
    pools = {s["spec"]["pool"]["name"] for s in gpu_cluster.kubectl_json("get", "resourceslices")["items"]}
    assert device_plugin_node.name not in pools
    labels = node["metadata"].get("labels") or {}
    assert labels.get(legacynode.POOL_LABEL) == "device-plugin"
    assert json.dumps(labels).find("nvlink-domain") < 0
