"""End to end: time-slicing tiers on one GPU: the interval follows the highest tier, tiers mix only by consent.

On the session's simulated HGX node (the real driver, the simulator's NVML-faithful state as the
one hardware boundary), with the real scheduler allocating shares of whole GPUs:

* GPU 2: a ``timeslice-gold`` claim runs and the GPU is set to ``Short``; a ``timeslice-bronze``
  claim pinned to the same GPU is allocated by the scheduler (DRA's capacity cannot say "not with
  another tier") and refused by the driver at prepare: a ``FailedPrepareDynamicResources`` Event
  on its pod names both tiers and the class setting that would allow it; the pod stays Pending,
  nothing of it is in the checkpoint and the GPU keeps ``Short``.
* GPU 3: a gold class that consents (``timeSlicing.shareWithLowerTiers: true``, a DeviceClass this
  test makes) and a bronze claim share the GPU, both Running, the GPU at gold's ``Short``; when
  the gold pod goes the GPU falls back to bronze's ``Long``, and to ``Default`` when the last one
  goes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from gpuplane.driver.hw.sim import gpu_uuid
from tests.e2e.conftest import GpuCluster, eventually

pytestmark = pytest.mark.e2e

NS = "timeslice-tiers"
MINOR = 'device.attributes["gpu.gpuplane.dev"].minor'
SHARED_GOLD = "timeslice-gold-shared.gpu.gpuplane.dev"


def claim(name: str, class_name: str, minor: int) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": class_name,
                            "selectors": [{"cel": {"expression": f"{MINOR} == {minor}"}}],
                            "capacity": {"requests": {"sharePercent": "50"}},
                        },
                    }
                ]
            }
        },
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


def consenting_gold(cluster: GpuCluster) -> dict[str, Any]:
    """The shipped gold class under another name, with shareWithLowerTiers: true."""
    cls = cluster.kubectl_json("get", "deviceclass", "timeslice-gold.gpu.gpuplane.dev")
    sharing = cls["spec"]["config"][0]["opaque"]["parameters"]["sharing"]
    assert sharing["timeSlicing"] == {"interval": "Short"}, sharing
    sharing["timeSlicing"]["shareWithLowerTiers"] = True
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": SHARED_GOLD},
        "spec": cls["spec"],
    }


@pytest.fixture(scope="module")
def placed(gpu_cluster: GpuCluster) -> Iterator[tuple[GpuCluster, str]]:
    node = gpu_cluster.of_profile("hgx-h100")[0].name
    items: list[dict[str, Any]] = [
        # Granted gold by its administrator: tiers are entitlements (issue 32).
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": NS, "labels": {"gpuplane.dev/max-tier": "gold"}},
        },
        consenting_gold(gpu_cluster),
        claim("gold", "timeslice-gold.gpu.gpuplane.dev", 2),
        pod("gold", node),
        claim("gold-shared", SHARED_GOLD, 3),
        pod("gold-shared", node),
        claim("bronze-with-shared", "timeslice-bronze.gpu.gpuplane.dev", 3),
        pod("bronze-with-shared", node),
    ]
    gpu_cluster.cluster.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    try:
        yield gpu_cluster, node
    finally:
        gpu_cluster.cluster.kubectl("delete", "namespace", NS, "--wait=true", "--timeout=120s", timeout=150)
        gpu_cluster.cluster.kubectl("delete", "deviceclass", SHARED_GOLD, "--ignore-not-found", check=False)


def interval(gpu: GpuCluster, node: str, minor: int) -> str:
    return str(gpu.sim_state(gpu.node(node))["gpus"][gpu_uuid(node, minor)]["timeslice"])


def running(gpu: GpuCluster, name: str) -> bool:
    return gpu.pod(NS, name)["status"].get("phase") == "Running"


def all_running(gpu: GpuCluster, names: list[str], timeout: float) -> None:
    """Wait for the pods to run; on timeout, fail with each pod's conditions, its claim's allocation and the Events."""
    try:
        eventually(lambda: all(running(gpu, n) for n in names), timeout, " and ".join(names) + " running")
    except AssertionError as timed_out:
        lines = [str(timed_out)]
        for name in names:
            status = gpu.pod(NS, name)["status"]
            conditions = [f"{c['type']}={c['status']} {c.get('message', '')}" for c in status.get("conditions", [])]
            allocation = gpu.claim(NS, name).get("status", {}).get("allocation")
            lines.append(f"pod {name}: phase {status.get('phase')}; {conditions}; claim allocation {allocation}")
        for e in gpu.kubectl_json("get", "events", "-n", NS)["items"]:
            lines.append(f"event {e['involvedObject']['name']} {e['reason']}: {e['message']}")
        raise AssertionError("\n".join(lines)) from None


def test_a_lower_tier_is_refused_on_a_gold_sliced_gpu(
    placed: tuple[GpuCluster, str], capsys: pytest.CaptureFixture[str]
) -> None:
    gpu, node = placed
    all_running(gpu, ["gold"], 120)
    assert interval(gpu, node, 2) == "Short"
    gpu.cluster.apply(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "List",
                "items": [claim("bronze", "timeslice-bronze.gpu.gpuplane.dev", 2), pod("bronze", node)],
            }
        )
    )

    def refused() -> dict[str, Any] | None:
        items = gpu.kubectl_json("get", "events", "-n", NS)["items"]
        return next(
            (
                e
                for e in items
                if e["involvedObject"]["name"] == "bronze" and e["reason"] == "FailedPrepareDynamicResources"
            ),
            None,
        )

    event = eventually(refused, 90, "FailedPrepareDynamicResources Event on the bronze pod")
    message = event["message"]
    assert "of tier gold (interval Short); this claim is tier bronze (interval Long)" in message, message
    assert "timeSlicing.shareWithLowerTiers" in message, message
    assert not running(gpu, "bronze")
    uid = gpu.claim(NS, "bronze")["metadata"]["uid"]
    assert uid not in gpu.checkpoint(gpu.node(node)).claims, "a refused claim left a record"
    assert interval(gpu, node, 2) == "Short", "the refusal changed the GPU's time-slice"
    assert running(gpu, "gold")
    with capsys.disabled():
        print(f"\n[e2e] gpu-2 time-slice with gold alone: {interval(gpu, node, 2)}")
        print(f"[e2e] Event {event['type']} {event['reason']} on Pod {NS}/bronze: {message}")


def test_a_consenting_gold_class_shares_and_the_gpu_follows_the_highest_tier(
    placed: tuple[GpuCluster, str], capsys: pytest.CaptureFixture[str]
) -> None:
    gpu, node = placed
    all_running(gpu, ["gold-shared", "bronze-with-shared"], 120)
    seen = [("gold (consenting) + bronze", interval(gpu, node, 3))]
    assert seen[-1][1] == "Short"
    gpu.cluster.kubectl("delete", "pod", "-n", NS, "gold-shared", "--wait=true", timeout=90)
    eventually(lambda: interval(gpu, node, 3) == "Long", 60, "gpu-3 back to bronze's Long once gold left")
    seen.append(("bronze alone", interval(gpu, node, 3)))
    assert running(gpu, "bronze-with-shared")
    gpu.cluster.kubectl("delete", "pod", "-n", NS, "bronze-with-shared", "--wait=true", timeout=90)
    eventually(lambda: interval(gpu, node, 3) == "Default", 60, "gpu-3 back to Default once the last claim left")
    seen.append(("none", interval(gpu, node, 3)))
    with capsys.disabled():
        print(f"\n[e2e] gpu-3 time-slice on {node}: " + "; ".join(f"{who}: {value}" for who, value in seen))
