"""Behaviours 3 and 4 with the real kubelet: driver restart, pod deletion, a failed prepare; and a kubelet restart.

3. With pods running (a whole GPU, a MIG device, an MPS share) the driver is
   restarted: kubelet registers it again by itself, the running containers keep
   their devices (same process, same env and /dev), and a new pod still
   prepares. Deleting the pods unprepares only after their containers stopped
   (the containers ignore SIGTERM, so they die at the end of the grace period);
   the MIG instance, the MPS daemon and the CDI specs are gone afterwards.
4. A claim with an opaque config only the driver can refuse (an MPS pinned-memory
   limit above the allocated GPU's memory: the admission policy and the controller
   see a valid config) fails NodePrepareResources: the pod gets
   kubelet's own ``FailedPrepareDynamicResources`` Warning event with the
   driver's message and no container ever starts; a new pod with a fixed claim
   runs.

And a kubelet restart: kubelet deletes the node's ResourceSlices when it
starts; the driver, still running, publishes them again and new pods prepare.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster.realnode import images
from e2e.plane.realnode import inspect, readiness
from e2e.plane.realnode.plan import RealNode
from gpuplane.api import names
from gpuplane.driver.prepare import cdi
from tests.e2e import realchecks
from tests.e2e.conftest import eventually
from tests.e2e.realfixtures import RealCluster

pytestmark = pytest.mark.e2e
# The driver as a host process on purpose: the test restarts the process in place (SIGTERM, same command
# line) to separate a driver restart from a pod replacement (the rollout test replaces the DaemonSet's pods),
# and reads the driver's call log across that restart (a deleted pod's log is gone).
HOST_DRIVER = True

NAMESPACE = "gpuplane-realnode-lifecycle"
STUBBORN = "trap '' TERM; while true; do sleep 1; done"  # only SIGKILL at the end of the grace period stops it
GRACE_S = 4
MIG_1G = 'device.attributes["gpu.gpuplane.dev"].migProfile == "1g.10gb"'


def claim(name: str, device_class: str, *, selector: str = "", share: str = "", config: Any = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    if share:
        exactly["capacity"] = {"requests": {"sharePercent": share}}
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if config is not None:
        devices["config"] = [{"opaque": {"driver": names.DRIVER_NAME, "parameters": config}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": devices},
    }


def pod(name: str, claim_name: str, node: RealNode, command: str = STUBBORN) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node.name},
            "terminationGracePeriodSeconds": GRACE_S,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
            "containers": [
                {
                    "name": "work",
                    "image": images.BUSYBOX_IMAGE,
                    "command": ["sh", "-c", command],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def lifecycle(only_real_nodes: RealCluster) -> Iterator[RealCluster]:
    only_real_nodes.kubectl("create", "namespace", NAMESPACE)
    try:
        yield only_real_nodes
    finally:
        only_real_nodes.kubectl("delete", "namespace", NAMESPACE, "--wait=true", "--timeout=150s", timeout=180)
        only_real_nodes.wait_clean()


def apply(real: RealCluster, *objects: dict[str, Any]) -> None:
    real.gpu.cluster.apply("\n---\n".join(json.dumps(o) for o in objects))


def running(real: RealCluster, name: str, timeout: float = 120) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        found = real.kubectl_json("get", "pod", "-n", NAMESPACE, name)
        return found if found["status"].get("phase") == "Running" else None

    return eventually(probe, timeout, f"pod {name} Running")


def pool_generation(real: RealCluster, node: RealNode) -> int:
    listed = real.kubectl_json("get", "resourceslices", "--field-selector", f"spec.nodeName={node.name}")
    return max((int(s["spec"]["pool"]["generation"]) for s in listed["items"]), default=0)


def driver_log(real: RealCluster, node: RealNode) -> Path:
    return real.real.log(node.processes[0])


def test_driver_restart_keeps_running_pods_and_new_pods_prepare(lifecycle: RealCluster) -> None:
    real = lifecycle
    (node,) = real.of_profile("hgx-h100")
    apply(
        real,
        claim("whole", "gpu.gpuplane.dev"),
        claim("mig", "mig.gpuplane.dev", selector=MIG_1G),
        claim("mps", "mps-bronze.gpu.gpuplane.dev", share="20"),
        pod("whole", "whole", node),
        pod("mig", "mig", node),
        pod("mps", "mps", node),
    )
    before = {name: running(real, name) for name in ("whole", "mig", "mps")}
    views = {name: inspect.view(node, p, "work") for name, p in before.items()}
    claims_before = real.checkpoint(node).claims
    calls_before = len(realchecks.kubelet_calls(driver_log(real, node)))

    seconds = real.real.restart(node, "driver")
    print(f"\ndriver restarted; kubelet registered it again after {seconds:.1f}s")
    # kubelet: GetInfo, then (concurrently) the health stream and NotifyRegistrationStatus. The restart
    # returns once kubelet registered the plugin; the health stream's call may reach the log a moment later.

    def registered() -> list[Any] | None:
        calls = realchecks.kubelet_calls(driver_log(real, node))[calls_before:]
        return calls if {c.method for c in calls[1:3]} >= {"NodeWatchResources", "NotifyRegistrationStatus"} else None

    after_restart = eventually(registered, 30, "kubelet's GetInfo, NodeWatchResources and NotifyRegistrationStatus")
    assert after_restart[0].method == "GetInfo"
    assert {c.method for c in after_restart[1:3]} == {"NodeWatchResources", "NotifyRegistrationStatus"}
    (notify,) = [c for c in after_restart if c.method == "NotifyRegistrationStatus"]
    assert notify.request == {"plugin_registered": True, "error": ""}
    for name, old in before.items():
        now = real.kubectl_json("get", "pod", "-n", NAMESPACE, name)
        status = now["status"]["containerStatuses"][0]
        assert (
            status["restartCount"] == 0
            and status["containerID"] == old["status"]["containerStatuses"][0]["containerID"]
        )
        view = inspect.view(node, now, "work")
        assert (view.pid, dict(view.env), dict(view.devices)) == (
            views[name].pid,
            dict(views[name].env),
            dict(views[name].devices),
        ), f"{name}: the running container's devices changed across the driver restart"
    assert real.checkpoint(node).claims.keys() == claims_before.keys()
    mig_record = claims_before[real.gpu.claim(NAMESPACE, "mig")["metadata"]["uid"]]
    (mig,) = [d.mig for d in mig_record.devices]
    assert mig is not None and any(
        g["gi_id"] == mig.gi_id for g in real.sim_state(node)["gpus"][mig.parent_uuid]["gis"]
    )

    apply(real, claim("late", "gpu.gpuplane.dev"), pod("late", "late", node))
    late = running(real, "late")
    late_uid = real.gpu.claim(NAMESPACE, "late")["metadata"]["uid"]
    prepares = [
        c for c in realchecks.kubelet_calls(driver_log(real, node))[calls_before:] if c.method == "NodePrepareResources"
    ]
    assert [c.claims() for c in prepares] == [[(NAMESPACE, "late", late_uid)]], "only the new pod's claim was prepared"
    realchecks.assert_sees_claim(inspect.view(node, late, "work"), real.checkpoint(node).claims[late_uid], node)


def test_unprepare_comes_after_the_containers_stopped(lifecycle: RealCluster) -> None:
    real = lifecycle
    (node,) = real.of_profile("hgx-h100")
    pods = {p["metadata"]["name"]: p for p in real.gpu.pods(NAMESPACE)}
    assert {"whole", "mig", "mps"} <= set(pods), "runs after the restart test, with its pods"
    uids = {name: real.gpu.claim(NAMESPACE, name)["metadata"]["uid"] for name in ("whole", "mig", "mps")}
    pids = {name: inspect.view(node, pods[name], "work").pid for name in uids}
    died: dict[str, float] = {}

    def watch() -> None:
        deadline = time.monotonic() + 60
        while len(died) < len(pids) and time.monotonic() < deadline:
            for name, pid in pids.items():
                if name not in died and not Path(f"/proc/{pid}").exists():
                    died[name] = time.time()
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    deleted_at = time.time()
    real.kubectl("delete", "pod", "-n", NAMESPACE, "whole", "mig", "mps", "--wait=true", timeout=120)
    watcher.join()
    calls = [c for c in realchecks.kubelet_calls(driver_log(real, node)) if c.method == "NodeUnprepareResources"]
    for name, uid in uids.items():
        call = next(c for c in calls if uid in {u for _, _, u in c.claims()})
        assert name in died, f"{name}: container process never exited"
        assert died[name] <= call.at, f"{name}: unprepared {died[name] - call.at:.2f}s before its container stopped"
        assert call.at - deleted_at >= GRACE_S - 0.5, f"{name}: unprepared before the grace period ended"
        assert not cdi.spec_path(node.cdi_root, uid).exists()
        assert not (node.mps_root / uid).exists()
    assert uids["mps"] not in real.checkpoint(node).claims
    mig_gis = [g for g in real.sim_state(node)["gpus"].values() for g in g["gis"]]
    assert mig_gis == [], f"MIG instances left: {mig_gis}"


def test_failed_prepare_is_kubelets_pod_event_and_a_fixed_claim_runs(lifecycle: RealCluster) -> None:
    real = lifecycle
    (node,) = real.of_profile("hgx-h100")
    # Valid on its own (the claim-configs policy admits it) and under its class (the controller's check
    # passes): only the driver, which knows the allocated GPU (an H100 of 80 GiB), can refuse it at prepare.
    limit = {"defaultPinnedDeviceMemoryLimit": "1Ti"}
    bad = {"apiVersion": names.CONFIG_API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mps": limit}}
    apply(real, claim("bad", "gpu.gpuplane.dev", config=bad), pod("bad", "bad", node, command="sleep 3600"))

    def event() -> dict[str, Any] | None:
        events = real.kubectl_json("get", "events", "-n", NAMESPACE)["items"]
        found = [
            e for e in events if e["reason"] == "FailedPrepareDynamicResources" and e["involvedObject"]["name"] == "bad"
        ]
        return found[0] if found else None

    found = eventually(event, 90, "kubelet's FailedPrepareDynamicResources event")
    assert found["type"] == "Warning" and found["source"] == {"component": "kubelet", "host": node.name}
    assert "exceeds the device's memory" in found["message"], found["message"]
    assert "defaultPinnedDeviceMemoryLimit" in found["message"], found["message"]
    print(f"\nkubelet event: {found['message']}")
    time.sleep(3)
    bad_pod = real.kubectl_json("get", "pod", "-n", NAMESPACE, "bad")
    assert bad_pod["status"]["phase"] == "Pending"
    assert all(not s.get("containerID") for s in bad_pod["status"].get("containerStatuses") or []), (
        "a container started"
    )
    bad_uid = real.gpu.claim(NAMESPACE, "bad")["metadata"]["uid"]
    assert bad_uid not in real.checkpoint(node).claims and not cdi.spec_path(node.cdi_root, bad_uid).exists()

    real.kubectl("delete", "pod", "-n", NAMESPACE, "bad", "--wait=true", timeout=120)
    good = {**bad, "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Short"}}}
    apply(real, claim("fixed", "gpu.gpuplane.dev", config=good), pod("fixed", "fixed", node, command="sleep 3600"))
    fixed = running(real, "fixed")
    fixed_uid = real.gpu.claim(NAMESPACE, "fixed")["metadata"]["uid"]
    record = real.checkpoint(node).claims[fixed_uid]
    assert record.sharing.strategy == "TimeSlicing"
    realchecks.assert_sees_claim(inspect.view(node, fixed, "work"), record, node)


def test_kubelet_restart_slices_come_back_and_pods_keep_running(lifecycle: RealCluster) -> None:
    real = lifecycle
    (node,) = real.of_profile("hgx-h100")
    fixed = running(real, "fixed")
    pid = inspect.view(node, fixed, "work").pid
    generation = pool_generation(real, node)
    seconds = real.real.restart(node, "kubelet")
    print(f"\nkubelet restarted; it registered the driver again after {seconds:.1f}s")

    def republished() -> bool:
        complete = readiness.pool_problem(real.gpu.cluster.api, node.name) is None
        return complete and pool_generation(real, node) > generation

    began = time.monotonic()
    eventually(republished, 60, "the node's ResourceSlices published again after kubelet's start-up wipe")
    print(
        f"slices wiped by kubelet's start-up and published again by the driver within {time.monotonic() - began:.1f}s"
    )
    assert inspect.view(node, real.kubectl_json("get", "pod", "-n", NAMESPACE, "fixed"), "work").pid == pid
    apply(real, claim("after-kubelet", "gpu.gpuplane.dev"), pod("after-kubelet", "after-kubelet", node, "sleep 3600"))
    running(real, "after-kubelet")
