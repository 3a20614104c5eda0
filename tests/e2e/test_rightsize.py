"""End to end: GpuRequests on the real control plane, through the real controller, scheduler and drivers.

The ``right-sized`` example is applied as its README says. The controller turns each GpuRequest
into a ResourceClaimTemplate; kube-controller-manager makes the pods' claims from it; the real
kube-scheduler allocates the first ``firstAvailable`` alternative that fits; the node drivers
prepare it. Checked: the template's alternatives and their order, what was allocated (an MPS
share with the need's limits in the driver's checkpoint for the soft request, the MIG profile of
the chosen alternative for the hard one), the Invalid status and Event of a need no GPU here can
meet, and that the API server refuses a compute share over 100 % at apply time.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import EXAMPLES, GpuCluster, eventually

pytestmark = pytest.mark.e2e

NS = "gpuplane-ex-right-sized"
GIB = 2**30


@pytest.fixture(scope="module")
def example(gpu_cluster: GpuCluster) -> Iterator[GpuCluster]:
    with gpu_cluster.example_applied("right-sized"):
        yield gpu_cluster


def gpu_request(gpu: GpuCluster, name: str) -> dict[str, Any]:
    return gpu.kubectl_json("get", "gpurequest", "-n", NS, name)


def ready(gpu: GpuCluster, name: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        r = gpu_request(gpu, name)
        return r if (r.get("status") or {}).get("phase") == "Ready" else None

    return eventually(probe, 60, f"GpuRequest {name} Ready")


def template_of(gpu: GpuCluster, name: str) -> dict[str, Any]:
    return gpu.kubectl_json("get", "resourceclaimtemplate", "-n", NS, name)


def claim_for_pod(gpu: GpuCluster, pod: dict[str, Any]) -> dict[str, Any]:
    (status,) = pod["status"]["resourceClaimStatuses"]
    return gpu.claim(NS, status["resourceClaimName"])


def running_pod(gpu: GpuCluster, prefix: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        for p in gpu.pods(NS):
            if p["metadata"]["name"].startswith(prefix) and p["status"].get("phase") == "Running":
                return p
        return None

    return eventually(probe, 120, f"pod {prefix}* running")


def test_soft_request_gets_an_mps_share_of_exactly_its_need(
    example: GpuCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    req = ready(example, "small-inference")
    tmpl = template_of(example, "small-inference")
    subs = tmpl["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"]
    assert subs[0]["name"] == "mps" and subs[0]["deviceClassName"] == "mps-bronze.gpu.gpuplane.dev"
    assert subs[0]["capacity"]["requests"] == {"sharePercent": "20", "memory": str(12 * GIB)}
    assert subs[-1]["name"] == "gpu" and any(s["name"].startswith("mig-") for s in subs)
    owner = tmpl["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"]) == ("GpuRequest", req["metadata"]["uid"])
    pod = running_pod(example, "inference-")
    claim = claim_for_pod(example, pod)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["request"] == "gpu/mps" and result.get("shareID")
    assert result["consumedCapacity"]["sharePercent"] == "20"
    node = example.node(pod["spec"]["nodeName"])
    record = example.checkpoint(node).claims[claim["metadata"]["uid"]]
    assert record.sharing.strategy == "MPS" and record.mps_daemon
    assert record.sharing.mps_active_thread_percentage == 20
    assert set(record.sharing.mps_pinned_limits.values()) == {12 * GIB}
    with capsys.disabled():
        print(f"\n[e2e] GpuRequest small-inference ({req['status']['need']}):")
        for line in req["status"]["alternatives"]:
            print(f"    {line}")
        print(
            f"[e2e] -> claim {claim['metadata']['name']}: {result['request']} on {result['pool']}/{result['device']}"
            f" share {result['consumedCapacity']['sharePercent']}% (shareID {result['shareID'][:8]}...),"
            f" MPS daemon {record.sharing.mps_active_thread_percentage}% threads,"
            f" pinned {sorted(record.sharing.mps_pinned_limits.values())[0] // GIB}Gi"
        )


def test_hard_request_gets_the_smallest_mig_profile(example: GpuCluster, capsys: pytest.CaptureFixture[str]) -> None:
    req = ready(example, "isolated-training")
    subs = template_of(example, "isolated-training")["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"]
    assert not any(s["name"] == "mps" for s in subs), "hard isolation must not offer an MPS share"
    assert subs[0]["name"] == "mig-h100-80gb-hbm3" and '"3g.40gb"' in subs[0]["selectors"][0]["cel"]["expression"]
    assert subs[-1]["name"] == "gpu"
    pod = running_pod(example, "training")
    claim = claim_for_pod(example, pod)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    chosen = next(s for s in subs if f"gpu/{s['name']}" == result["request"])
    device = example.slice_devices()[(result["pool"], result["device"])]
    profile = (device["attributes"].get("migProfile") or {}).get("string")
    assert chosen["name"].startswith("mig-") and f'"{profile}"' in chosen["selectors"][0]["cel"]["expression"]
    node = example.node(pod["spec"]["nodeName"])
    record = example.checkpoint(node).claims[claim["metadata"]["uid"]]
    assert [d.mig.profile_name for d in record.devices if d.mig is not None] == [profile]
    with capsys.disabled():
        print(f"\n[e2e] GpuRequest isolated-training ({req['status']['need']}):")
        for line in req["status"]["alternatives"]:
            print(f"    {line}")
        print(
            f"[e2e] -> {result['request']} on {result['pool']}/{result['device']} (MIG {profile} created by the driver)"
        )


def test_need_no_gpu_can_meet_is_invalid_with_an_event(example: GpuCluster, capsys: pytest.CaptureFixture[str]) -> None:
    def invalid() -> dict[str, Any] | None:
        r = gpu_request(example, "too-big")
        return r if (r.get("status") or {}).get("phase") == "Invalid" else None

    req = eventually(invalid, 60, "GpuRequest too-big Invalid")
    assert "500Gi is more than any GPU in the cluster has" in req["status"]["message"]
    listed = example.cluster.kubectl("get", "resourceclaimtemplates", "-n", NS, "-o", "name")
    assert "too-big" not in listed
    ev = eventually(
        lambda: [
            e
            for e in example.kubectl_json("get", "events", "-n", NS)["items"]
            if e["involvedObject"]["name"] == "too-big" and e["reason"] == "InvalidGpuRequest"
        ],
        30,
        "InvalidGpuRequest Event",
    )
    with capsys.disabled():
        print(f"\n[e2e] Event {ev[0]['type']} {ev[0]['reason']} on GpuRequest {NS}/too-big: {ev[0]['message']}")
        print(example.cluster.kubectl("get", "gpurequests", "-n", NS))


def test_compute_over_100_percent_is_refused_at_apply(example: GpuCluster) -> None:
    bad = {
        "apiVersion": "gpuplane.dev/v1alpha1",
        "kind": "GpuRequest",
        "metadata": {"name": "greedy", "namespace": NS},
        "spec": {"memory": "8Gi", "compute": 150},
    }
    bins = example.cluster.bins
    done = subprocess.run(
        [str(bins.kubectl), f"--kubeconfig={example.cluster.kubeconfig}", "apply", "-f", "-"],
        input=json.dumps(bad),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode != 0
    assert "spec.compute" in done.stderr and "less than or equal to 100" in done.stderr, done.stderr
    assert (EXAMPLES / "right-sized" / "right-sized.yaml").is_file()
