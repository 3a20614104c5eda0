"""Behaviour 5: device health reaches pod status through the real kubelet (KEP-4680) and clears on recovery.

A busybox pod holds a whole GPU on the real ``hgx-h100`` node. A fatal Xid (48,
double-bit ECC) injected into the simulator makes the driver taint the device in
its ResourceSlice and report it UNHEALTHY on the dra-health stream kubelet
opened at registration; kubelet writes it into the pod's
``status.containerStatuses[].allocatedResourcesStatus`` (gate
``ResourceHealthStatus``, beta and on in 1.36, set explicitly on kubelet and
kube-apiserver), resource id = the device's CDI id, with the driver's message.
Unchanged health keeps reading Healthy past kubelet's 30 s trust (the driver
resends it). After the simulator's recovery signal the taint goes (3 s quiet
time in this session) and kubelet reports the device Healthy again.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from e2e.cluster.realnode import images
from tests.e2e.conftest import eventually
from tests.e2e.realfixtures import RealCluster

pytestmark = pytest.mark.e2e

NAMESPACE = "gpuplane-realnode-health"
KUBELET_TRUST_S = 30  # DefaultHealthTimeout, kubelet 1.36 pkg/kubelet/cm/dra/healthinfo.go
XID_TAINT = {"key": "gpu.gpuplane.dev/xid", "value": "xid-48", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def health(only_real_nodes: RealCluster) -> Iterator[RealCluster]:
    real = only_real_nodes
    (node,) = real.of_profile("hgx-h100")
    manifest = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "gpu", "namespace": NAMESPACE},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpuplane.dev"}}]}},
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "trainer", "namespace": NAMESPACE},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node.name},
                "terminationGracePeriodSeconds": 1,
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu"}],
                "containers": [
                    {
                        "name": "train",
                        "image": images.BUSYBOX_IMAGE,
                        "command": ["sh", "-c", "sleep 3600"],
                        "resources": {"claims": [{"name": "gpu"}]},
                    }
                ],
            },
        },
    ]
    real.gpu.cluster.apply("\n---\n".join(json.dumps(m) for m in manifest))
    try:
        yield real
    finally:
        real.kubectl("delete", "namespace", NAMESPACE, "--wait=true", "--timeout=120s", timeout=150)
        real.wait_clean()


def resource_health(real: RealCluster) -> list[dict[str, Any]]:
    pod = real.kubectl_json("get", "pod", "-n", NAMESPACE, "trainer")
    (status,) = pod["status"].get("containerStatuses") or [{}]
    return list(status.get("allocatedResourcesStatus") or [])


def device_taints(real: RealCluster, pool: str, device: str) -> list[dict[str, Any]]:
    for item in real.kubectl_json("get", "resourceslices", "--field-selector", f"spec.nodeName={pool}")["items"]:
        for found in item["spec"].get("devices") or []:
            if found["name"] == device:
                return [{k: t[k] for k in ("key", "value", "effect")} for t in found.get("taints") or []]
    return []


def test_fatal_xid_reaches_pod_status_and_the_device_taint_then_both_clear(health: RealCluster) -> None:
    real = health
    (node,) = real.of_profile("hgx-h100")
    eventually(
        lambda: real.kubectl_json("get", "pod", "-n", NAMESPACE, "trainer")["status"].get("phase") == "Running",
        120,
        "the pod Running",
    )
    claim = real.gpu.claim(NAMESPACE, "gpu")
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    record = real.checkpoint(node).claims[claim["metadata"]["uid"]]
    (device,) = record.devices
    resource_id = device.cdi_ids[0]

    def reported(health_value: str) -> list[dict[str, Any]] | None:
        statuses = resource_health(real)
        entries = [r for s in statuses if s["name"] == "claim:gpu" for r in s["resources"]]
        return entries if entries and all(r["health"] == health_value for r in entries) else None

    healthy = eventually(lambda: reported("Healthy"), 60, "kubelet to report the device Healthy")
    assert [r["resourceID"] for r in healthy] == [resource_id]
    # kubelet trusts a report for 30 s (no health_check_timeout_seconds given): past that, health that
    # nothing changed must still read Healthy, not Unknown (the driver resends it every 10 s).
    time.sleep(KUBELET_TRUST_S + 5)
    still = resource_health(real)
    assert [r["health"] for s in still if s["name"] == "claim:gpu" for r in s["resources"]] == ["Healthy"], still

    subprocess.run(
        node.sim_cli("inject-xid", "--uuid", device.gpu_uuid, "--xid", "48"), check=True, capture_output=True
    )
    began = time.monotonic()
    unhealthy = eventually(lambda: reported("Unhealthy"), 60, "allocatedResourcesStatus Unhealthy")
    to_pod = time.monotonic() - began
    assert [r["resourceID"] for r in unhealthy] == [resource_id]
    assert "xid-48" in (unhealthy[0].get("message") or ""), unhealthy
    eventually(lambda: XID_TAINT in device_taints(real, result["pool"], result["device"]), 30, "the device taint")
    print(f"\nXid 48 -> pod status Unhealthy after {to_pod:.1f}s: {unhealthy}")

    subprocess.run(
        node.sim_cli("inject-event", "--uuid", device.gpu_uuid, "--kind", "cleared"), check=True, capture_output=True
    )
    began = time.monotonic()
    eventually(lambda: not device_taints(real, result["pool"], result["device"]), 60, "the taint cleared")
    eventually(lambda: reported("Healthy"), 60, "allocatedResourcesStatus Healthy again")
    recovered = time.monotonic() - began
    assert recovered >= 2.5, "cleared before the quiet time"
    print(f"recovery signal -> taint gone and pod status Healthy after {recovered:.1f}s")
    pod = real.kubectl_json("get", "pod", "-n", NAMESPACE, "trainer")
    assert pod["status"]["phase"] == "Running" and pod["status"]["containerStatuses"][0]["restartCount"] == 0
