"""Gangs on the real control plane with simulated GPU nodes and two controller replicas.

Nodes: ``hgx-h100:2`` (two 8-GPU NVLink domains) and ``gb200-nvl72:4`` (one
16-GPU clique across four nodes), each a real ``gpuplane-driver`` on the
simulator plus the kubelet stand-in (``e2e.plane.simnodes``). The controller runs as
two real ``gpuplane-controller`` processes; the real
kube-scheduler allocates the claims the controller creates.
The replicas elect a leader with the Lease ``default/gpuplane-controller``
(client-go timings: 15 s lease, 10 s renew deadline, 2 s retry).

The tests run in order and share the cluster: a TP=8 gang lands in the
clique; a TP=16 gang on H100s is refused with the reason; a gang that cannot
fit stays gated and is placed once capacity frees; a higher-priority gang
preempts a lower one; and the leader is killed, the standby takes over, and
no decision is lost.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.cluster import controlplane, procs
from e2e.cluster import handle as cluster
from e2e.plane import nodes, simnodes
from tests.e2e.conftest import eventually

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
GROUP, VERSION, PLURAL = "gpuplane.dev", "v1alpha1", "gpugangs"
GB200 = 'device.attributes["gpu.gpuplane.dev"].productName == "NVIDIA GB200"'
H100 = 'device.attributes["gpu.gpuplane.dev"].productName == "NVIDIA H100 80GB HBM3"'
LEASE_NAMESPACE, LEASE_NAME = "default", "gpuplane-controller"
T = TypeVar("T")


class Controller:
    """One ``gpuplane-controller`` replica as a real process."""

    def __init__(self, handle: cluster.Cluster, identity: str) -> None:
        assert handle.state_dir is not None
        self.identity = identity
        self.port = controlplane.free_port(set())
        self.log = handle.state_dir / "logs" / f"controller-{identity}.log"
        argv = [
            str(Path(sys.executable).parent / "gpuplane-controller"),
            f"--kubeconfig={handle.kubeconfig}",
            f"--identity={identity}",
            f"--lease-namespace={LEASE_NAMESPACE}",
            f"--liveness=http://127.0.0.1:{self.port}/healthz",
            "--eviction-grace=0",
            "--resync=1",
            "--status-interval=2",
            "--log-format=json",
        ]
        self.proc, self.record = procs.spawn(
            f"controller-{identity}", argv, log=self.log, pid_dir=handle.state_dir / "pids", die_with_parent=True
        )

    def kill(self) -> None:
        """SIGKILL: no goodbye to the peers, like a crashed pod."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        procs.stop(self.record, self.proc)

    def log_lines(self, event: str) -> list[dict[str, Any]]:
        """JSON log records of this replica whose event is ``event``."""
        out = []
        for line in (self.log.read_text(errors="replace") if self.log.exists() else "").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and rec.get("event") == event:
                out.append(rec)
        return out


def lease_holder(handle: cluster.Cluster) -> str:
    """The identity holding the controller's leader Lease ('' when none)."""
    try:
        lease = client.CoordinationV1Api(handle.api).read_namespaced_lease(LEASE_NAME, LEASE_NAMESPACE)
    except ApiException as exc:
        if exc.status == 404:
            return ""
        raise
    return str((lease.spec and lease.spec.holder_identity) or "")


@pytest.fixture(scope="module")
def gpu_cluster(control_plane: cluster.Cluster) -> Iterator[tuple[cluster.Cluster, list[Controller]]]:
    assert control_plane.state_dir is not None
    sims = simnodes.SimNodes(control_plane.state_dir, control_plane.kubeconfig, die_with_parent=True)
    controllers: list[Controller] = []
    try:
        sims.start([nodes.NodeGroup("hgx-h100", 2), nodes.NodeGroup("gb200-nvl72", 4)])
        control_plane.kubectl("apply", "-f", str(REPO / "manifests" / "deviceclasses"), "-f", str(REPO / "crds"))
        control_plane.kubectl("wait", "--for=condition=established", "crd/gpugangs.gpuplane.dev", "--timeout=60s")
        controllers.append(Controller(control_plane, "ctl-a"))  # the standby starts in the HA test
        eventually(lambda: lease_holder(control_plane) == "ctl-a", 30, "ctl-a to take the leader Lease")
        yield control_plane, controllers
    finally:
        for c in controllers:
            c.stop()
        sims.stop()


@pytest.fixture(scope="module")
def ns(gpu_cluster: tuple[cluster.Cluster, list[Controller]]) -> Iterator[str]:
    handle, _ = gpu_cluster
    name = f"gangs-{uuid.uuid4().hex[:6]}"
    handle.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    eventually(lambda: handle.core.list_namespaced_service_account(name).items, what="default service account")
    yield name
    # Leave no gang behind: a Queued one would be placed by the next controller on this control plane.
    handle.kubectl("delete", "namespace", name, "--wait=true", "--timeout=120s", timeout=150)


def make_gang(handle: cluster.Cluster, ns: str, name: str, *, priority_class: str = "", **spec: Any) -> None:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GpuGang", "metadata": {"name": name}, "spec": spec}
    handle.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
    for i in range(spec["members"]):
        pod: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{name}-{i}", "labels": {"gpuplane.dev/gang": name}},
            "spec": {
                "schedulingGates": [{"name": "gpuplane.dev/gang"}],
                "resourceClaims": [{"name": "gpus", "resourceClaimName": f"{name}-{i}"}],
                "containers": [{"name": "main", "image": "busybox", "resources": {"claims": [{"name": "gpus"}]}}],
                "terminationGracePeriodSeconds": 0,
            },
        }
        if priority_class:  # a gang's priority is its pods' PriorityClass (issue 32), never spec.priority
            pod["spec"]["priorityClassName"] = priority_class
        handle.core.create_namespaced_pod(ns, pod)


def gang(handle: cluster.Cluster, ns: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = handle.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    return obj


def phase(handle: cluster.Cluster, ns: str, name: str) -> str:
    return str((gang(handle, ns, name).get("status") or {}).get("phase", ""))


def wait_phase(handle: cluster.Cluster, ns: str, name: str, want: str, timeout: float = 90) -> dict[str, Any]:
    eventually(lambda: phase(handle, ns, name) == want, timeout, f"gang {name} phase {want}")
    return gang(handle, ns, name)


def pods_of(handle: cluster.Cluster, ns: str, name: str) -> list[client.V1Pod]:
    return list(handle.core.list_namespaced_pod(ns, label_selector=f"gpuplane.dev/gang={name}").items)


def claim_domains(handle: cluster.Cluster, ns: str, claim: str) -> set[str]:
    """NVLink domains of the devices the scheduler allocated to a claim."""
    obj = handle.custom.get_namespaced_custom_object("resource.k8s.io", "v1", ns, "resourceclaims", claim)
    results = obj["status"]["allocation"]["devices"]["results"]
    slices = handle.custom.list_cluster_custom_object("resource.k8s.io", "v1", "resourceslices")["items"]
    attrs = {
        (s["spec"]["pool"]["name"], d["name"]): d.get("attributes", {})
        for s in slices
        for d in s["spec"].get("devices") or []
    }
    return {attrs[(r["pool"], r["device"])]["nvlinkDomain"]["string"] for r in results}


def events_for(handle: cluster.Cluster, ns: str, name: str, reason: str) -> list[str]:
    evs = handle.core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
    return [e.message or "" for e in evs if e.reason == reason]


# --- tests --------------------------------------------------------------------------------------


def test_crd_rules_and_printer_columns(gpu_cluster: tuple[cluster.Cluster, list[Controller]], ns: str) -> None:
    handle, _ = gpu_cluster
    bad = [
        ({"members": 2, "gpusPerMember": 4, "migProfile": "3g.40gb"}, "exactly one of gpusPerMember or migProfile"),
        ({"members": 3, "gpusPerMember": 4, "tensorParallelSize": 8}, "tensorParallelSize must divide"),
        ({"members": 1, "migProfile": "3g.40gb", "tensorParallelSize": 2}, "a MIG gang has tensorParallelSize 1"),
    ]
    for spec, message in bad:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GpuGang", "metadata": {"name": "bad"}, "spec": spec}
        with pytest.raises(ApiException) as err:
            handle.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
        assert err.value.status == 422 and message in str(err.value.body), err.value.body
    out = handle.kubectl("get", "gang", "-n", ns)
    assert out == "" or out.split()[:6] == ["NAME", "PHASE", "DOMAIN", "MEMBERS", "PLACED", "AGE"]


def test_nodes_carry_their_nvlink_domain(gpu_cluster: tuple[cluster.Cluster, list[Controller]]) -> None:
    handle, _ = gpu_cluster

    def labels() -> dict[str, str] | None:
        got = {
            n.metadata.name: (n.metadata.labels or {}).get("gpuplane.dev/nvlink-domain", "")
            for n in handle.core.list_node().items
        }
        return got if all(got.values()) else None

    got = eventually(labels, 60, "NVLink domain labels")
    gb = {v for k, v in got.items() if k.startswith("gb200")}
    hgx = {v for k, v in got.items() if k.startswith("hgx")}
    assert len(gb) == 1 and len(hgx) == 2, got


@pytest.mark.smoke
def test_tp8_gang_lands_in_one_gb200_clique(gpu_cluster: tuple[cluster.Cluster, list[Controller]], ns: str) -> None:
    handle, _ = gpu_cluster
    started = time.monotonic()
    make_gang(handle, ns, "tp8", members=2, gpusPerMember=4, tensorParallelSize=8, selectors=[GB200])
    obj = wait_phase(handle, ns, "tp8", "Running")
    print(f"\ntp8: Running after {time.monotonic() - started:.1f}s, domain {obj['status']['domain']}")
    pods = pods_of(handle, ns, "tp8")
    assert {p.spec.node_name[:5] for p in pods} == {"gb200"}
    domains = set().union(*(claim_domains(handle, ns, f"tp8-{i}") for i in range(2)))
    assert domains == {obj["status"]["domain"]}, domains
    assert obj["status"]["placedMembers"] == 2 and set(obj["status"]["placement"]["members"]) == {"0", "1"}
    assert events_for(handle, ns, "tp8", "Placed")


def test_tp16_on_h100_is_refused_with_reason(gpu_cluster: tuple[cluster.Cluster, list[Controller]], ns: str) -> None:
    handle, _ = gpu_cluster
    make_gang(handle, ns, "tp16", members=2, gpusPerMember=8, tensorParallelSize=16, selectors=[H100])
    obj = wait_phase(handle, ns, "tp16", "Unschedulable")
    msg = obj["status"]["message"]
    print(f"\ntp16: {msg}")
    assert "TP size 16 exceeds the largest NVLink domain (8 GPUs)" in msg
    assert all(p.spec.scheduling_gates for p in pods_of(handle, ns, "tp16"))
    assert eventually(lambda: events_for(handle, ns, "tp16", "Unschedulable"), 30, "Unschedulable event")


def test_gang_stays_gated_then_places_when_capacity_frees(
    gpu_cluster: tuple[cluster.Cluster, list[Controller]], ns: str
) -> None:
    handle, _ = gpu_cluster
    make_gang(handle, ns, "fill", members=2, gpusPerMember=4, tensorParallelSize=8, selectors=[GB200])
    wait_phase(handle, ns, "fill", "Running")  # the clique (16 GPUs) is now full
    make_gang(handle, ns, "waiter", members=2, gpusPerMember=4, tensorParallelSize=8, selectors=[GB200])
    obj = wait_phase(handle, ns, "waiter", "Queued")
    assert "no NVLink domain has room" in obj["status"]["message"]
    time.sleep(3)
    assert all(p.spec.scheduling_gates for p in pods_of(handle, ns, "waiter"))
    assert phase(handle, ns, "waiter") == "Queued"
    freed = time.monotonic()
    for p in pods_of(handle, ns, "fill"):
        handle.core.delete_namespaced_pod(p.metadata.name, ns, grace_period_seconds=0)
    wait_phase(handle, ns, "waiter", "Running")
    print(f"\nwaiter: Running {time.monotonic() - freed:.1f}s after capacity was freed")
    # Released, and it stays Released over later reconciles (it used to turn "Preempted" one resync later).
    for _ in range(8):
        assert phase(handle, ns, "fill") == "Released", gang(handle, ns, "fill")["status"]
        time.sleep(0.5)
    assert not events_for(handle, ns, "fill", "Preempted")


def test_high_priority_gang_preempts_a_lower_one(
    gpu_cluster: tuple[cluster.Cluster, list[Controller]], ns: str
) -> None:
    handle, _ = gpu_cluster
    # The clique holds tp8 and waiter (priority 0). An equal-priority gang must not preempt.
    make_gang(handle, ns, "peer", members=2, gpusPerMember=4, tensorParallelSize=8, selectors=[GB200])
    wait_phase(handle, ns, "peer", "Queued")
    time.sleep(3)
    assert {phase(handle, ns, g) for g in ("tp8", "waiter")} == {"Running"}
    started = time.monotonic()
    urgent = client.V1PriorityClass(metadata=client.V1ObjectMeta(name="gpuplane-e2e-urgent"), value=10)
    try:
        client.SchedulingV1Api(handle.api).create_priority_class(urgent)
    except ApiException as exc:
        if exc.status != 409:  # left by an earlier run on this control plane
            raise
    make_gang(
        handle,
        ns,
        "urgent",
        members=2,
        gpusPerMember=4,
        tensorParallelSize=8,
        selectors=[GB200],
        priority_class="gpuplane-e2e-urgent",
    )
    obj = wait_phase(handle, ns, "urgent", "Running", timeout=120)
    print(f"\nurgent: Running {time.monotonic() - started:.1f}s after creation")
    victims = [g for g in ("tp8", "waiter") if phase(handle, ns, g) == "Preempted"]
    assert len(victims) == 1, victims  # the fewest: one gang frees 8 GPUs
    assert obj["status"].get("nominatedVictims") in (None, [f"{ns}/{victims[0]}"])
    assert events_for(handle, ns, victims[0], "Preempted")
    assert not pods_of(handle, ns, victims[0])
    assert phase(handle, ns, "peer") == "Queued"  # the freed capacity went to the preemptor
    client.SchedulingV1Api(handle.api).delete_priority_class("gpuplane-e2e-urgent")


def test_leader_killed_standby_takes_over_without_losing_decisions(
    gpu_cluster: tuple[cluster.Cluster, list[Controller]], ns: str
) -> None:
    handle, controllers = gpu_cluster
    leader = controllers[0]
    standby = Controller(handle, "ctl-b")
    controllers.append(standby)
    # The standby starts, warms its caches, and under load (a new gang) still never decides: no split brain.
    eventually(lambda: standby.log_lines("starting"), 30, "the standby to start")
    make_gang(handle, ns, "busy", members=1, gpusPerMember=8, tensorParallelSize=8, selectors=[H100])
    wait_phase(handle, ns, "busy", "Running")
    time.sleep(15)  # longer than a lease duration: a standby that thought the leader dead would act by now
    assert lease_holder(handle) == "ctl-a"
    assert not standby.log_lines("became leader") and not standby.log_lines("gang decision")
    before = {g: gang(handle, ns, g)["status"].get("placement", {}).get("id") for g in ("urgent", "busy")}
    leader.kill()
    killed = time.monotonic()
    make_gang(handle, ns, "after", members=1, gpusPerMember=8, tensorParallelSize=8, selectors=[H100])
    eventually(lambda: lease_holder(handle) == "ctl-b", 40, "ctl-b to take the leader Lease")
    took_over = time.monotonic() - killed
    wait_phase(handle, ns, "after", "Running", timeout=120)
    placed = time.monotonic() - killed
    print(f"\nfail-over: ctl-b leads {took_over:.1f}s after the leader was killed; gang placed after {placed:.1f}s")
    assert took_over < 15 + 2 * 2.2 + 3  # lease duration + one jittered retry + slack for the loaded machine
    assert standby.log_lines("became leader")
    after = {g: gang(handle, ns, g)["status"].get("placement", {}).get("id") for g in ("urgent", "busy")}
    assert before == after  # the standby kept the leader's decisions, no re-placement
    assert {phase(handle, ns, g) for g in ("urgent", "busy")} == {"Running"}
    claims = handle.custom.list_namespaced_custom_object("resource.k8s.io", "v1", ns, "resourceclaims")["items"]
    names_ = sorted(c["metadata"]["name"] for c in claims)
    assert len(names_) == len(set(names_))
