"""End to end: MPS client priority per tier, in each claim's daemon and in its containers' CDI spec.

On the session's simulated HGX node (real driver, the MPS stand-in as the control binary), gold,
silver and bronze MPS claims, a gold claim that lowers its own priority, and a bronze claim that
tries to raise it. Checked for each prepared claim: the daemon's default client priority (the
stand-in's record: ``set_default_client_priority`` read back, ``CUDA_MPS_CLIENT_PRIORITY`` in the
daemon's environment) and ``CUDA_MPS_CLIENT_PRIORITY`` in the CDI spec the kubelet stand-in hands
the container runtime. The raise is refused before the claim reaches a node (the controller's
claim check, an Event on the claim) and its pod never runs.

This checks the CDI spec, not a running container: the e2e nodes have no container runtime. The
in-container check belongs to a node with a real kubelet and containerd (not on main yet).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuplane.driver.prepare import cdi
from tests.e2e.conftest import GpuCluster, eventually

pytestmark = pytest.mark.e2e

NS = "tier-priority"
MINOR = 'device.attributes["gpu.gpuplane.dev"].minor'


def claim(name: str, tier: str, share: int, minor: int, priority: str | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {
        "requests": [
            {
                "name": "gpu",
                "exactly": {
                    "deviceClassName": f"mps-{tier}.gpu.gpuplane.dev",
                    "selectors": [{"cel": {"expression": f"{MINOR} == {minor}"}}],
                    "capacity": {"requests": {"sharePercent": str(share)}},
                },
            }
        ]
    }
    if priority is not None:
        devices["config"] = [
            {
                "opaque": {
                    "driver": "gpu.gpuplane.dev",
                    "parameters": {
                        "apiVersion": "gpu.gpuplane.dev/v1alpha1",
                        "kind": "GpuConfig",
                        "sharing": {"strategy": "MPS", "mps": {"clientPriority": priority}},
                    },
                }
            }
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": devices},
    }


def pod(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            "containers": [
                {"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "gpu"}]}}
            ],
        },
    }


CASES = {  # name -> (tier, share, minor, claim's own priority, expected CUDA_MPS_CLIENT_PRIORITY)
    "gold": ("gold", 60, 6, None, 0),
    "bronze": ("bronze", 20, 6, None, 1),
    "silver": ("silver", 40, 7, None, 0),
    "gold-lowered": ("gold", 60, 7, "BelowNormal", 1),
}


@pytest.fixture(scope="module")
def workloads(gpu_cluster: GpuCluster) -> Iterator[tuple[GpuCluster, str]]:
    node = gpu_cluster.of_profile("hgx-h100")[-1].name
    granted = {"gpuplane.dev/max-tier": "gold"}  # tiers are entitlements (issue 32)
    items: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS, "labels": granted}}
    ]
    for name, (tier, share, minor, priority, _) in CASES.items():
        items += [claim(name, tier, share, minor, priority), pod(name, node)]
    items += [claim("bronze-raised", "bronze", 20, 5, "Normal"), pod("bronze-raised", node)]
    gpu_cluster.cluster.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    try:
        yield gpu_cluster, node
    finally:
        gpu_cluster.cluster.kubectl("delete", "namespace", NS, "--wait=true", "--timeout=120s", timeout=150)


def test_each_tier_daemon_and_cdi_spec_carry_its_priority(
    workloads: tuple[GpuCluster, str], capsys: pytest.CaptureFixture[str]
) -> None:
    gpu, node_name = workloads
    node = gpu.node(node_name)
    for name in CASES:
        eventually(lambda n=name: gpu.pod(NS, n)["status"].get("phase") == "Running", 120, f"pod {name} running")  # type: ignore[misc]
    lines = []
    for name, (tier, _, minor, priority, want) in CASES.items():
        c = gpu.claim(NS, name)
        uid = c["metadata"]["uid"]
        record = gpu.checkpoint(node).claims[uid]
        assert record.sharing.mps_client_priority == want, name
        standin: dict[str, Any] = json.loads((Path(node.mps_root) / uid / "log" / "standin-record.json").read_text())
        assert standin["defaults"]["client_priority"] == want, name
        assert standin["env"]["CUDA_MPS_CLIENT_PRIORITY"] == str(want), name
        told = [x["command"] for x in standin["commands"]]
        assert f"set_default_client_priority {want}" in told and "get_default_client_priority" in told, name
        spec = json.loads(cdi.spec_path(node.cdi_root, uid).read_text())
        env = spec["containerEdits"]["env"]
        assert f"CUDA_MPS_CLIENT_PRIORITY={want}" in env, (name, env)
        default, daemon_env = standin["defaults"]["client_priority"], standin["env"]["CUDA_MPS_CLIENT_PRIORITY"]
        lines.append(
            f"{name:<13} tier {tier:<7} gpu-{minor} own={priority or '-':<12} daemon default {default}"
            f" (daemon env {daemon_env}), CDI env CUDA_MPS_CLIENT_PRIORITY={want}"
        )
    with capsys.disabled():
        print(f"\n[e2e] MPS client priority per claim on {node_name}:")
        for line in lines:
            print(f"    {line}")


def test_a_claim_cannot_raise_its_priority_above_its_tier(
    workloads: tuple[GpuCluster, str], capsys: pytest.CaptureFixture[str]
) -> None:
    gpu, node_name = workloads

    def refused() -> list[dict[str, Any]]:
        items = gpu.kubectl_json("get", "events", "-n", NS)["items"]
        return [
            e for e in items if e["involvedObject"]["name"] == "bronze-raised" and e["reason"] == "InvalidDeviceConfig"
        ]

    (event, *_) = eventually(refused, 60, "InvalidDeviceConfig Event on bronze-raised")
    assert "mps.clientPriority Normal is above the device class's BelowNormal" in event["message"]
    uid = gpu.claim(NS, "bronze-raised")["metadata"]["uid"]
    assert gpu.pod(NS, "bronze-raised")["status"].get("phase") != "Running"
    assert uid not in gpu.checkpoint(gpu.node(node_name)).claims
    with capsys.disabled():
        print(
            f"\n[e2e] Event {event['type']} {event['reason']} on ResourceClaim {NS}/bronze-raised: {event['message']}"
        )
