"""The demo's account of how each of gpuplane's programs runs (``e2e.plane.realnode.demo_real.component_lines``)."""

from __future__ import annotations

from typing import Any

from e2e.plane.realnode import demo_real


def _pod(
    name: str, generate: str, node: str, image: str, *, phase: str = "Running", ready: bool = True
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "generateName": generate},
        "spec": {"nodeName": node, "containers": [{"image": image}]},
        "status": {"phase": phase, "containerStatuses": [{"ready": ready}]},
    }


PODS = [
    _pod("gpuplane-driver-x7k2p", "gpuplane-driver-", "hgx-h100-real-0", "localhost/gpuplane-driver:0.1.0-abc"),
    _pod("gpuplane-driver-identity-hgx-h100-0", "", "hgx-h100-0", "registry.k8s.io/pause:3.10"),
    _pod(
        "gpuplane-controller-5d9c-a",
        "gpuplane-controller-5d9c-",
        "hgx-h100-real-0",
        "localhost/gpuplane-controller:0.1.0-d",
    ),
    _pod(
        "gpuplane-controller-5d9c-b",
        "gpuplane-controller-5d9c-",
        "hgx-h100-real-0",
        "localhost/gpuplane-controller:0.1.0-d",
        ready=False,
    ),
]


def test_real_nodes_run_pods_and_simulated_nodes_host_processes() -> None:
    lines = demo_real.component_lines(
        PODS, ["hgx-h100-real-0"], ["hgx-h100-0", "gb200-nvl72-0"], leader="gpuplane-controller-5d9c-a", as_pods=True
    )
    assert lines[0] == (
        "  hgx-h100-real-0 (real node, kubelet + containerd): driver = pod gpuplane-driver-x7k2p of DaemonSet "
        "gpuplane-driver, image localhost/gpuplane-driver:0.1.0-abc, Running"
    )
    assert lines[1].startswith("  hgx-h100-0, gb200-nvl72-0 (simulated, no container runtime): driver = host process")
    assert lines[2].endswith("gpuplane-controller:0.1.0-d, Running, leader")
    assert "on hgx-h100-real-0" in lines[2]
    assert lines[3].endswith("Running, not ready, standby")
    assert len(lines) == 4


def test_a_real_node_without_its_driver_pod_says_where_to_look() -> None:
    lines = demo_real.component_lines(PODS[1:], ["hgx-h100-real-0"], [], leader="", as_pods=True)
    assert "no driver pod (see `kubectl describe daemonset -n gpuplane-system gpuplane-driver`)" in lines[0]


def test_without_real_nodes_the_controllers_are_host_processes() -> None:
    lines = demo_real.component_lines(PODS[1:2], [], ["hgx-h100-0"], leader="gpuplane-controller-0", as_pods=False)
    assert lines[-1] == (
        "  controller = host processes controller-<i> (no real node to run pods on); leader gpuplane-controller-0"
    )
    assert not any("pod gpuplane-controller" in line for line in lines)
