"""End to end: health taints and the real scheduler, the dra-health stream, MPS telemetry, the noisy-neighbour Event.

One simulated ``hgx-h100`` node (a real ``gpuplane-driver`` on the simulator plus the kubelet
stand-in, from ``e2e.plane.simnodes``) against the real control plane. The driver runs with short
timings through its environment: taints clear 3 s after recovery, telemetry every second, a
noisy neighbour must persist 3 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client

from e2e.cluster import handle as cluster
from e2e.plane import nodes, simnodes
from gpuplane.driver.hw.sim import gpu_uuid
from gpuplane.driver.plugin.kubelet_client import KubeletPluginClient
from gpuplane.driver.sharing.mps import MpsControl
from tests.e2e.conftest import claim, eventually, pod

pytestmark = pytest.mark.e2e

GROUP, VERSION, DRIVER = "resource.k8s.io", "v1", "gpu.gpuplane.dev"
REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")

DRIVER_ENV = {
    "GPUPLANE_TAINT_CLEAR_AFTER": "3",
    "GPUPLANE_HEALTH_POLL_INTERVAL": "0.5",
    "GPUPLANE_TELEMETRY_INTERVAL": "1",
    "GPUPLANE_NOISY_SUSTAIN": "3",
    "GPUPLANE_REPUBLISH_INTERVAL": "5",
    # Every GPU's MIG placements, whatever the controller's MIG offer (docs/mig-offer.md): the tests taint a
    # GPU and check its MIG devices, on GPUs the offer would not name.
    "GPUPLANE_MIG_PLACEMENTS": "all",
}


def attr(name: str) -> str:
    return f'device.attributes["{DRIVER}"].{name}'


class Node:
    """What the tests do to the one simulated node and its cluster."""

    def __init__(self, handle: cluster.Cluster, sim: simnodes.SimNode, ns: str) -> None:
        self.handle = handle
        self.sim = sim
        self.ns = ns
        self.custom = handle.custom
        self.core = handle.core

    def uuid(self, minor: int) -> str:
        return gpu_uuid(self.sim.name, minor)

    def sim_cli(self, *args: str) -> Any:
        done = subprocess.run(self.sim.sim_cli(*args), capture_output=True, text=True, check=True, cwd=REPO)
        return json.loads(done.stdout)

    def devices(self) -> dict[str, dict[str, Any]]:
        """Devices of the newest complete pool generation (the publisher rewrites slices one by one)."""
        deadline = time.monotonic() + 10
        while True:
            listed = self.custom.list_cluster_custom_object(
                GROUP, VERSION, "resourceslices", field_selector=f"spec.nodeName={self.sim.name}"
            )
            items = listed["items"]
            newest = max(s["spec"]["pool"]["generation"] for s in items)
            current = [s for s in items if s["spec"]["pool"]["generation"] == newest]
            if len(current) == current[0]["spec"]["pool"]["resourceSliceCount"] or time.monotonic() > deadline:
                return {d["name"]: d for s in current for d in s["spec"].get("devices") or []}
            time.sleep(0.1)

    def taints(self, device: str) -> list[dict[str, Any]]:
        return list(self.devices()[device].get("taints") or [])

    def run(self, name: str, body: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, "resourceclaims", body)
        self.core.create_namespaced_pod(self.ns, pod(name, body["metadata"]["name"]))

    def claim_obj(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.ns, "resourceclaims", name
        )
        return found

    def allocated(self, name: str) -> list[str] | None:
        alloc = (self.claim_obj(name).get("status") or {}).get("allocation")
        return None if not alloc else [r["device"] for r in alloc["devices"]["results"]]

    def running(self, name: str) -> bool:
        return self.core.read_namespaced_pod(name, self.ns).status.phase == "Running"

    def events(self, name: str, reason: str) -> list[Any]:
        items = self.core.list_namespaced_event(self.ns, field_selector=f"involvedObject.name={name}").items
        return [e for e in items if e.reason == reason]

    def scrape(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.sim.metrics_port}/metrics", timeout=5) as resp:
            text: str = resp.read().decode()
        return text


@pytest.fixture(scope="module")
def gpu_node(control_plane: cluster.Cluster) -> Iterator[tuple[cluster.Cluster, simnodes.SimNode]]:
    assert control_plane.state_dir is not None
    saved = {k: os.environ.get(k) for k in DRIVER_ENV}
    os.environ.update(DRIVER_ENV)  # the driver processes inherit it
    sims = simnodes.SimNodes(control_plane.state_dir, control_plane.kubeconfig, die_with_parent=True)
    try:
        (node,) = sims.start([nodes.NodeGroup("hgx-h100", 1)])
        control_plane.kubectl("apply", "-f", str(REPO / "manifests" / "deviceclasses"))
        yield control_plane, node
    finally:
        sims.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def node(gpu_node: tuple[cluster.Cluster, simnodes.SimNode]) -> Iterator[Node]:
    handle, sim = gpu_node
    name = f"health-{uuid.uuid4().hex[:6]}"
    core = handle.core
    # A gold claim shares a GPU with a bronze one: the namespace is granted gold (tiers are entitlements).
    labels = {"gpuplane.dev/max-tier": "gold"}
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels)))
    eventually(lambda: core.list_namespaced_service_account(name).items, what=f"default SA in {name}")
    yield Node(handle, sim, name)
    core.delete_namespace(name)


def test_fatal_xid_taints_scheduler_avoids_then_clears_and_allocates_again(node: Node) -> None:
    u0 = node.uuid(0)
    node.sim_cli("inject-xid", "--uuid", u0, "--xid", "48")
    t0 = time.monotonic()
    want = {"key": "gpu.gpuplane.dev/xid", "value": "xid-48", "effect": "NoSchedule"}
    eventually(lambda: any(_same(t, want) for t in node.taints("gpu-0")), 30, "xid taint on gpu-0")
    print(f"\n[e2e] Xid 48 injected on gpu-0; taint in the ResourceSlice after {time.monotonic() - t0:.1f}s")
    devices = node.devices()
    mig0 = [n for n in devices if n.startswith("gpu-0-mig-")]
    assert mig0 and all(any(_same(t, want) for t in devices[n].get("taints", [])) for n in mig0)
    assert not any(devices[n].get("taints") for n in devices if n != "gpu-0" and not n.startswith("gpu-0-"))
    # the kubelet health stream reports every device of gpu-0 unhealthy
    health = KubeletPluginClient(str(node.sim.plugin_dir / "dra.sock"))
    try:
        stream = health.watch_health(timeout=10)
        views = {v.device_name: v for v in next(stream)}
        stream.close()
    finally:
        health.close()
    assert views["gpu-0"].healthy is False and "xid-48" in views["gpu-0"].message
    assert all(views[n].healthy is False for n in mig0) and views["gpu-1"].healthy is True

    # the real scheduler: a claim that only gpu-0 can satisfy stays pending; another lands elsewhere
    node.run("pinned", claim("pinned", "gpu.gpuplane.dev", f"{attr('minor')} == 0"))
    node.run("other", claim("other", "gpu.gpuplane.dev", f"{attr('minor')} <= 1"))
    other = eventually(lambda: node.allocated("other"), 60, "allocation of 'other'")
    assert other == ["gpu-1"]
    eventually(lambda: node.events("pinned", "FailedScheduling"), 60, "FailedScheduling for 'pinned'")
    assert node.allocated("pinned") is None
    print(f"[e2e] while tainted: 'other' -> {other}, 'pinned' (minor == 0) unallocated, FailedScheduling")

    # recovery: the taint goes 3 s after the cleared signal, and the pending claim lands on gpu-0
    node.sim_cli("inject-event", "--uuid", u0, "--kind", "cleared")
    t1 = time.monotonic()
    eventually(lambda: not node.taints("gpu-0"), 30, "taint cleared from gpu-0")
    cleared_after = time.monotonic() - t1
    assert cleared_after >= 2.5
    assert eventually(lambda: node.allocated("pinned"), 90, "allocation of 'pinned' after recovery") == ["gpu-0"]
    eventually(lambda: node.running("pinned"), 60, "'pinned' running")
    print(f"[e2e] cleared signal -> taint removed after {cleared_after:.1f}s; 'pinned' allocated gpu-0 and Running")


def test_gpu_fallen_off_the_bus_is_tainted_and_recovers_after_reset(node: Node) -> None:
    u5 = node.uuid(5)
    node.sim_cli("inject-xid", "--uuid", u5, "--xid", "79")  # the simulator marks the GPU lost
    want = {"key": "gpu.gpuplane.dev/unhealthy", "value": "fallen-off-bus", "effect": "NoSchedule"}
    eventually(lambda: any(_same(t, want) for t in node.taints("gpu-5")), 30, "unhealthy taint on gpu-5")
    time.sleep(5)  # silence alone never clears it: the probe keeps seeing GPU_IS_LOST
    assert any(_same(t, want) for t in node.taints("gpu-5"))
    node.sim_cli("reset-gpu", "--uuid", u5)  # the GPU answers again: recovery evidence
    t0 = time.monotonic()
    eventually(lambda: not node.taints("gpu-5"), 30, "unhealthy taint cleared after the reset")
    print(f"\n[e2e] Xid 79 on gpu-5: tainted while lost; cleared {time.monotonic() - t0:.1f}s after the GPU reset")


def test_mig_device_of_a_tainted_gpu_is_not_allocated(node: Node) -> None:
    u1 = node.uuid(1)
    node.sim_cli("inject-event", "--uuid", u1, "--kind", "ecc-dbe")
    want = {"key": "gpu.gpuplane.dev/ecc", "value": "double-bit", "effect": "NoSchedule"}
    eventually(lambda: any(_same(t, want) for t in node.taints("gpu-1-mig-1g-10gb-0")), 30, "ecc taint on gpu-1 MIG")
    on_tainted = f'{attr("parentMinor")} == 1 && {attr("migProfile")} == "1g.10gb"'
    on_healthy = f'{attr("parentMinor")} == 2 && {attr("migProfile")} == "1g.10gb"'
    node.run("mig-tainted", claim("mig-tainted", "mig.gpuplane.dev", on_tainted))
    node.run("mig-healthy", claim("mig-healthy", "mig.gpuplane.dev", on_healthy))
    healthy = eventually(lambda: node.allocated("mig-healthy"), 60, "allocation of 'mig-healthy'")
    assert healthy[0].startswith("gpu-2-mig-1g-10gb-")
    eventually(lambda: node.events("mig-tainted", "FailedScheduling"), 60, "FailedScheduling for 'mig-tainted'")
    time.sleep(3)
    assert node.allocated("mig-tainted") is None
    print(f"\n[e2e] gpu-1 DBE: MIG claim on gpu-1 unallocated (FailedScheduling); control on gpu-2 -> {healthy}")
    node.sim_cli("inject-event", "--uuid", u1, "--kind", "cleared")
    landed = eventually(lambda: node.allocated("mig-tainted"), 90, "allocation of 'mig-tainted' after recovery")
    assert landed[0].startswith("gpu-1-mig-1g-10gb-")
    print(f"[e2e] after recovery the MIG claim landed on {landed}")


def test_mps_tiers_metrics_and_noisy_neighbour_event(node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    on3 = f"{attr('minor')} == 3"
    node.run("gold", claim("gold", "mps-gold.gpu.gpuplane.dev", on3, share=60))
    node.run("bronze", claim("bronze", "mps-bronze.gpu.gpuplane.dev", on3, share=20))
    for name in ("gold", "bronze"):
        eventually(lambda n=name: node.running(n), 90, f"pod {name} running")  # type: ignore[misc]
    uids = {n: node.claim_obj(n)["metadata"]["uid"] for n in ("gold", "bronze")}
    daemons = {d.claim_uid: d.pid for d in MpsControl(node.sim.mps_root, str(simnodes.MPS_STANDIN)).list_daemons()}
    gold_pid, bronze_pid = daemons[uids["gold"]], daemons[uids["bronze"]]
    assert gold_pid and bronze_pid
    u3 = node.uuid(3)
    node.sim_cli(
        "set-telemetry", "--uuid", u3, "sm_active=0.85", "temperature=78", "power=612.5",
        "memory_bandwidth_util=0.9", f"memory_used_bytes={30 * 1024**3}",
        f"per_process_bandwidth={bronze_pid}:0.8,{gold_pid}:0.1",
    )  # fmt: skip
    t0 = time.monotonic()
    for name in ("bronze", "gold"):
        eventually(lambda n=name: node.events(n, "NoisyNeighbour"), 60, f"NoisyNeighbour Event on {name}")  # type: ignore[misc]
    fired_after = time.monotonic() - t0
    text = node.scrape()
    shown = [
        line
        for line in text.splitlines()
        if not line.startswith("#")
        and ('gpu="3"' in line or line.startswith("gpuplane_noisy_neighbour_events_total"))
        and (
            line.startswith(("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_DEV_POWER_USAGE"))
            or line.startswith(("gpuplane_claim_", "gpuplane_noisy_neighbour"))
        )
    ]
    with capsys.disabled():
        print(f"\n[e2e] /metrics of {node.sim.name} with gold and bronze MPS claims on gpu-3 (excerpt):")
        for line in shown:
            print("   ", line)
        for name in ("bronze", "gold"):
            for e in node.events(name, "NoisyNeighbour"):
                print(f"[e2e] Event {e.type} {e.reason} on ResourceClaim {node.ns}/{name}: {e.message}")
        print(f"[e2e] noisy-neighbour Events fired {fired_after:.1f}s after the bandwidth hog started (sustain 3 s)")
    for name, tier in (("gold", "gold"), ("bronze", "bronze")):
        assert any(
            line.startswith("DCGM_FI_DEV_GPU_TEMP{")
            and f'claim="{name}"' in line
            and f'namespace="{node.ns}"' in line
            and f'tier="{tier}"' in line
            and line.endswith(" 78.0")
            for line in shown
        ), name
    assert any(
        line.startswith("gpuplane_claim_memory_bandwidth_share{") and 'claim="bronze"' in line and line.endswith(" 0.8")
        for line in shown
    )
    assert any(
        line.startswith("gpuplane_noisy_neighbour{") and 'claim="bronze"' in line and 'role="hog"' in line
        for line in shown
    )
    assert f'gpuplane_noisy_neighbour_events_total{{namespace="{node.ns}",role="hog",tier="bronze"}} 1.0' in text
    assert f'gpuplane_noisy_neighbour_events_total{{namespace="{node.ns}",role="victim",tier="gold"}} 1.0' in text
    assert 'gpuplane_gpu_seconds_total{kind="mps",namespace="' + node.ns + '",tier="gold"}' in text


def _same(taint: dict[str, Any], want: dict[str, str]) -> bool:
    return all(taint.get(k) == v for k, v in want.items())
