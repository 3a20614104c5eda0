"""Real nodes join the cluster: real kubelet v1.36 and containerd 2.x, pods run in real containers.

The Node objects are kubelet's own (created, kept Ready, reporting its version
and the runtime's); a busybox pod runs in a real container on the node's
bridge, in the node's own cgroup; ``kubectl logs`` and ``kubectl exec`` reach it
through kube-apiserver, the kubelet and containerd's streaming server. The
node's driver is registered by the real kubelet's plugin watcher (health stream
opened) and its ResourceSlices are published.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator

import pytest

from e2e.cluster import releases
from e2e.cluster.realnode import images
from e2e.plane.realnode import plan
from tests.e2e.conftest import eventually
from tests.e2e.realfixtures import RealCluster

pytestmark = pytest.mark.e2e

NAMESPACE = "gpuplane-realnode-basics"


@pytest.fixture(scope="module")
def basics(real_cluster: RealCluster) -> Iterator[RealCluster]:
    real_cluster.kubectl("create", "namespace", NAMESPACE)
    try:
        yield real_cluster
    finally:
        real_cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=true", "--timeout=120s", timeout=150)


@pytest.mark.smoke
def test_nodes_are_kubelets_own_with_real_versions(basics: RealCluster) -> None:
    table = basics.kubectl("get", "nodes", "-o", "wide", "-l", f"{plan.REAL_NODE_LABEL}=true")
    print(table)
    rows = {line.split()[0]: line.split() for line in table.splitlines()[1:]}
    assert sorted(rows) == sorted(n.name for n in basics.nodes)
    for node in basics.nodes:
        row = rows[node.name]
        assert row[1] == "Ready", row
        assert re.fullmatch(rf"v{re.escape(releases.RUNNING.minor)}\.\d+", row[4]), row
        assert row[5] == node.node_ip, row
        assert re.fullmatch(r"containerd://2\.\d+\.\d+", row[-1]), row
        obj = basics.kubectl_json("get", "node", node.name)
        # kubelet's own status, not a stand-in's: its daemon endpoint port and the runtime it talks to.
        assert obj["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] == node.kubelet_port
        assert obj["status"]["nodeInfo"]["kubeletVersion"].startswith(f"v{releases.RUNNING.minor}.")
        assert obj["metadata"]["labels"][plan.PROFILE_LABEL] == node.profile


def test_busybox_pod_runs_in_a_real_container(basics: RealCluster) -> None:
    node = basics.of_profile("hgx-h100")[0]
    basics.gpu.cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "hello", "namespace": NAMESPACE},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node.name},
                "containers": [
                    {
                        "name": "hello",
                        "image": images.BUSYBOX_IMAGE,
                        "command": ["sh", "-c", "echo hello from $(hostname); sleep 3600"],
                    }
                ],
                "terminationGracePeriodSeconds": 1,
            },
        }
    )

    def running() -> dict[str, object] | None:
        pod = basics.kubectl_json("get", "pod", "-n", NAMESPACE, "hello")
        return pod if pod.get("status", {}).get("phase") == "Running" else None

    pod = eventually(running, 90, "the busybox pod to run")
    status = pod["status"]
    assert isinstance(status, dict)
    assert status["containerStatuses"][0]["containerID"].startswith("containerd://")
    assert status["containerStatuses"][0]["imageID"].startswith("sha256:") or "@sha256:" in str(
        status["containerStatuses"][0]["imageID"]
    )
    assert ipaddress.ip_address(status["podIP"]) in node.ip_network
    assert status["hostIP"] == node.node_ip
    logs = basics.kubectl("logs", "-n", NAMESPACE, "hello")
    assert "hello from hello" in logs
    cgroup = basics.exec(NAMESPACE, "hello", "cat", "/proc/1/cgroup")
    assert f":{node.cgroup_root}/kubepods/" in cgroup, cgroup
    assert basics.exec(NAMESPACE, "hello", "sh", "-c", "echo $((6 * 7))").strip() == "42"


@pytest.mark.smoke
def test_drivers_registered_by_the_real_kubelet(basics: RealCluster) -> None:
    for node in basics.nodes:
        log = basics.real.log(f"kubelet-{node.name}").read_text(errors="replace")
        assert 'driverName="gpu.gpuplane.dev"' in log and "connected=true" in log
        assert "Successfully started WatchResources health stream" in log
        slices = basics.kubectl_json("get", "resourceslices", "--field-selector", f"spec.nodeName={node.name}")
        assert slices["items"], f"{node.name}: no ResourceSlices"
        assert all(s["spec"]["driver"] == "gpu.gpuplane.dev" for s in slices["items"])
