"""IMEX readiness and failures on the session's simulated GB200 trays (issue 35, "Must show" 2).

The two ``gb200-nvl72`` trays' drivers run their ``nvidia-imex`` as a child (``--imex-daemons=process``, the
stand-in of ``tests/fakes``), report it in their own entry of the ``ImexDomain`` status, and a member's
prepare waits until every node of its domain says ready. The stand-in's control directory on each tray
(``SimNode.imex_control_dir``, ``GPUPLANE_IMEX_STANDIN_CONTROL``) makes a daemon slow, crash or lose a peer.
A gang of two members x 3 GPUs cannot sit on one 4-GPU tray, so it spans both.

In order (a daemon is started fresh only when no gang holds the trays, so the slow cases come first):

1. **slow daemon**: tray 1's daemon takes ``SLOW_S`` to start; the members' prepares fail retryably, the pods'
   ``FailedPrepareDynamicResources`` Events (kubelet's, with the driver's message) name the tray not ready and
   why; then the members run. Printed: how long prepare waited.
2. **crashed daemon** (the gang running): tray 0's daemon exits 3; the driver restarts it (backoff), counts it
   (``gpuplane_driver_imex_daemon_exits_total``), its status entry goes not ready and ready again, and the gang
   is told (Warning ``ImexNodeNotReady`` naming the tray and the exit, then ``ImexNodeReady``). Printed: the
   restart count and the time to recover.
3. **lost peer** (still running): tray 0 drops tray 1; the gang is told (Warning naming the node), and when the
   peer is back the daemons reconnect and the gang is told ``ImexDomainReady``. Printed: time to recover.
4. **readiness bound** (e2e: ``--imex-ready-timeout=60``): tray 1's daemon never gets ready; the gang is
   released (phase ``Preempted``, reason ``ImexNotReady``, Warning Event naming the tray), its pods and claims
   deleted, its domain and the daemons gone. Printed: when it was released.
5. **killed controller and driver mid-setup**: the leader controller and tray 1's driver (with its daemon:
   SIGKILL to the process group) are killed while the gang's domain is set up; the standby takes over, the
   driver comes back; the gang runs; after deleting it nothing is left (no ``ImexDomain``, no daemon process,
   no CDI spec, no channel in one). Printed: time to converge.
6. **a gang deleted while no replica leads** (``test_a_gang_deleted_while_no_replica_leads_...``): the leader is
   SIGKILLed and the running gang deleted at once, before the standby holds the Lease. The gang stays
   ``Terminating`` (kopf's finalizer, the controller's ``on.delete`` handler) until the standby leads, which then
   tells the members (``GangDeleted``), deletes them and their claims, and lets the gang go; nothing is left.
   (It leaked before: the standby let the gang go unreleased, its pods ran on in their deleted claims, and their
   CDI specs kept the channel of a domain that was gone.) Printed: time from the deletion to the release.
"""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from e2e.cluster import procs
from e2e.plane import components, imex_gangs, simnodes
from e2e.plane.imex_gangs import gang_objects
from tests.e2e.conftest import GpuCluster, eventually
from tests.e2e.test_imex import domains, running
from tests.hostilekit import apply_text, ns_fixture  # noqa: F401  (fixture ns)

pytestmark = pytest.mark.e2e

SLOW_S = 12.0
BOUND_S = 60.0  # components.controller_argv's --imex-ready-timeout


@pytest.fixture
def trays(gpu_cluster: GpuCluster) -> Iterator[list[simnodes.SimNode]]:
    found = sorted(gpu_cluster.of_profile("gb200-nvl72"), key=lambda n: n.name)
    assert len(found) == 2 and all(n.imex_port for n in found), found
    yield found
    for node in found:  # no control left for the next module
        for control in ("slow", "crash", "drop"):
            (node.imex_control_dir / control).unlink(missing_ok=True)


def events_of(gc: GpuCluster, ns: str, name: str) -> list[dict[str, Any]]:
    items = gc.kubectl_json("get", "events", "-n", ns, f"--field-selector=involvedObject.name={name}")["items"]
    return list(items)


def told(gc: GpuCluster, ns: str, gang: str, reason: str) -> list[str]:
    return [e["message"] for e in events_of(gc, ns, gang) if e["reason"] == reason]


def told_count(gc: GpuCluster, ns: str, gang: str, reason: str, contains: str = "") -> int:
    """How many times the gang was told (one Event per reason and message, its count bumped on each repeat)."""
    return sum(
        int(e.get("count") or 1) for e in events_of(gc, ns, gang) if e["reason"] == reason and contains in e["message"]
    )


def entries(gc: GpuCluster) -> dict[str, dict[str, Any]]:
    (obj,) = domains(gc)
    return {e["node"]: e for e in obj.get("status", {}).get("nodes", [])}


def all_ready(gc: GpuCluster) -> bool:
    found = domains(gc)
    if len(found) != 1:
        return False
    generation = found[0]["metadata"]["generation"]
    nodes = found[0].get("status", {}).get("nodes", [])
    return len(nodes) == len(found[0]["spec"]["nodes"]) and all(
        e["ready"] and e.get("observedGeneration", 0) >= generation for e in nodes
    )


def daemon_pids(node: simnodes.SimNode) -> list[int]:
    """Live processes running the node's IMEX daemon (its config under the node's plugin dir)."""
    return imex_gangs.daemon_pids(node.plugin_dir)


def exits_metric(node: simnodes.SimNode) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("gpuplane_driver_imex_daemon_exits_total{")
    )


def delete_gang(gc: GpuCluster, ns: str, name: str) -> None:
    gc.cluster.kubectl("delete", "gpugang", "-n", ns, name, "--wait=true", "--timeout=60s", timeout=90)
    gc.cluster.kubectl("delete", "pods", "-n", ns, "--all", "--wait=true", "--timeout=60s", timeout=90)


def nothing_left(gc: GpuCluster, trays: list[simnodes.SimNode]) -> None:
    eventually(lambda: domains(gc) == [], 60, "no ImexDomain left")
    eventually(lambda: not any(daemon_pids(n) for n in trays), 30, "no IMEX daemon process left")
    eventually(gc.nodes_are_clean, 60, "no claim prepared, no CDI spec left (none with a channel)")
    assert not any((n.plugin_dir / "imex").exists() for n in trays), "a daemon directory left"


def test_slow_crash_lost_peer_bound_and_kills(gpu_cluster: GpuCluster, ns: str, trays: list[simnodes.SimNode]) -> None:
    gc = gpu_cluster
    tray0, tray1 = trays
    assert domains(gc) == [] and not any(daemon_pids(n) for n in trays)

    # 1. slow daemon: prepare waits (retryable, the pods' Events say why), then the members run
    (tray1.imex_control_dir / "slow").write_text(f"{SLOW_S}\n")
    t0 = time.monotonic()
    apply_text(gc, gang_objects(ns, "tp", 2, 3))
    eventually(lambda: running(gc, ns, "tp", 2), 180, "gang tp's members Running after the slow daemon")
    took = time.monotonic() - t0
    (tray1.imex_control_dir / "slow").unlink()
    waits = [
        e
        for i in range(2)
        for e in events_of(gc, ns, f"tp-pod-{i}")
        if e["reason"] == "FailedPrepareDynamicResources" and "IMEX domain" in e["message"]
    ]
    assert waits, "no FailedPrepareDynamicResources Event naming the IMEX domain on the members"
    said = sorted({e["message"] for e in waits})
    print(f"\n[e2e] slow daemon ({SLOW_S:g}s on {tray1.name}): the members' Events: {said}")
    assert all("is not ready on node(s) " in m and "the prepare is retried" in m for m in said), said
    assert any(f"{tray1.name} (nvidia-imex-ctl -q says " in m for m in said), said  # what its driver reported
    placed_at = gc.kubectl_json("get", "gpugang", "-n", ns, "tp")["status"]["placedAt"]
    count = sum(int(e.get("count") or 1) for e in waits)
    print(f"[e2e] slow daemon: gang Running {took:.1f}s after apply (placedAt {placed_at}); {count} failed")
    assert took >= SLOW_S, "the members ran before the slow daemon was ready"
    eventually(lambda: told(gc, ns, "tp", "ImexDomainReady"), 30, "gang tp told ImexDomainReady")
    assert not told(gc, ns, "tp", "ImexNodeNotReady")  # a start-up is no alarm

    # 2. crashed daemon: restarted, counted, reported, the gang told
    before_pid = daemon_pids(tray0)
    assert len(before_pid) == 1, before_pid
    exits_before = exits_metric(tray0)
    (tray0.imex_control_dir / "slow").write_text("5\n")  # its restart takes 5 s: a not-ready window the pass sees
    t0 = time.monotonic()
    (tray0.imex_control_dir / "crash").write_text("")

    def exited() -> dict[str, Any] | None:
        e = entries(gc).get(tray0.name)
        return e if e and not e["ready"] and "exited with code 3" in e.get("message", "") else None

    not_ready = eventually(exited, 30, "tray 0's entry not ready, naming the exit")
    print(f"[e2e] crash: {tray0.name}'s status entry: {not_ready['message']}")
    # The gang is told once, on the transition, with what the driver reported at that look: the exit, or the
    # moment before it when nvidia-imex-ctl could no longer reach the crashed daemon (both seen in CI runs).
    warned = eventually(
        lambda: [m for m in told(gc, ns, "tp", "ImexNodeNotReady") if tray0.name in m],
        30,
        "gang tp warned of tray 0's exit",
    )
    assert any("exited with code 3" in m or "cannot reach the IMEX command service" in m for m in warned), warned
    (tray0.imex_control_dir / "slow").unlink()  # the restarted daemon read it at its start
    eventually(lambda: all_ready(gc), 60, "the domain ready again after the restart")
    recovered = time.monotonic() - t0
    after_pid = daemon_pids(tray0)
    assert len(after_pid) == 1 and after_pid != before_pid, (before_pid, after_pid)
    exits = exits_metric(tray0) - exits_before
    assert exits == 1, exits
    eventually(lambda: told(gc, ns, "tp", "ImexNodeReady"), 30, "gang tp told ImexNodeReady")
    print(
        f"[e2e] crash: restarted (pid {before_pid[0]} -> {after_pid[0]}), exits counted {exits:g}, domain ready "
        f"again after {recovered:.1f}s (5 s of it the stand-in's slow restart); gang told: {warned[0]}"
    )
    assert running(gc, ns, "tp", 2)

    # 3. lost peer: the gang told, recovered once the peer is back
    warned_before = told_count(gc, ns, "tp", "ImexNodeNotReady", "NOT_READY")
    ready_before = told_count(gc, ns, "tp", "ImexDomainReady")
    t0 = time.monotonic()
    (tray0.imex_control_dir / "drop").write_text(f"{tray1.host_ip}\n")
    eventually(
        lambda: told_count(gc, ns, "tp", "ImexNodeNotReady", "NOT_READY") > warned_before,
        30,
        "the gang told of the lost peer",
    )
    lost = [m for m in told(gc, ns, "tp", "ImexNodeNotReady") if "NOT_READY" in m]
    print(f"[e2e] lost peer: told after {time.monotonic() - t0:.1f}s: {lost}")
    t1 = time.monotonic()
    (tray0.imex_control_dir / "drop").unlink()
    eventually(lambda: all_ready(gc), 60, "the domain ready again once the peer is back")
    eventually(lambda: told_count(gc, ns, "tp", "ImexDomainReady") > ready_before, 30, "ImexDomainReady again")
    print(f"[e2e] lost peer: domain ready {time.monotonic() - t1:.1f}s after the peer came back")
    assert running(gc, ns, "tp", 2)
    delete_gang(gc, ns, "tp")
    nothing_left(gc, trays)

    # 4. readiness bound: a daemon that never gets ready; the gang is released with the reason
    (tray1.imex_control_dir / "slow").write_text("100000\n")
    t0 = time.monotonic()
    apply_text(gc, gang_objects(ns, "stuck", 2, 3))

    def released() -> dict[str, Any] | None:
        st = gc.kubectl_json("get", "gpugang", "-n", ns, "stuck").get("status") or {}
        return st if st.get("phase") == "Preempted" else None

    st = eventually(released, BOUND_S + 90, "gang stuck released by the readiness bound")
    print(f"[e2e] bound: released {time.monotonic() - t0:.1f}s after apply: {st['reason']}: {st['message']}")
    assert st["reason"] == "ImexNotReady" and tray1.name in st["message"], st
    assert told(gc, ns, "stuck", "ImexNotReady"), "no Warning Event ImexNotReady on the gang"
    assert [e["type"] for e in events_of(gc, ns, "stuck") if e["reason"] == "ImexNotReady"] == ["Warning"]
    eventually(lambda: not gc.pods(ns), 60, "the stuck gang's pods deleted")
    eventually(lambda: domains(gc) == [], 60, "its domain gone with its placement")
    (tray1.imex_control_dir / "slow").unlink()
    delete_gang(gc, ns, "stuck")
    nothing_left(gc, trays)

    # 5. killed controller and driver mid-setup: converge, then nothing leaked
    assert gc.controllers is not None
    state_dir = gc.cluster.state_dir
    assert state_dir is not None
    records = procs.read_records(state_dir / "pids")
    holder = components.lease_holder(gc.cluster.api)
    leader = f"{components.CONTROLLER_PREFIX}{holder.rsplit('-', 1)[1]}"
    t0 = time.monotonic()
    apply_text(gc, gang_objects(ns, "kill", 2, 3))
    eventually(lambda: domains(gc), 60, "the gang's ImexDomain written")
    os.killpg(records[leader].pid, signal.SIGKILL)
    driver = records[tray1.driver_process]
    os.killpg(driver.pid, signal.SIGKILL)  # with its daemon (the driver's process group)
    eventually(lambda: not procs.is_alive(driver) and not daemon_pids(tray1), 15, "tray 1's driver and daemon gone")
    gc.sim.restart(tray1.driver_process)
    print(f"[e2e] kill: SIGKILLed {leader} (leader) and {tray1.driver_process} with its daemon mid-setup")
    try:
        eventually(lambda: running(gc, ns, "kill", 2), 180, "gang kill Running after the kills")
        print(
            f"[e2e] kill: gang Running {time.monotonic() - t0:.1f}s after apply; the new leader "
            f"{components.lease_holder(gc.cluster.api)}"
        )
        assert all_ready(gc) and all(len(daemon_pids(n)) == 1 for n in trays)
        delete_gang(gc, ns, "kill")
        nothing_left(gc, trays)
    finally:
        gc.controllers.start()  # both replicas again for the modules after this one


def test_a_gang_deleted_while_no_replica_leads_is_released_by_the_next_leader(
    gpu_cluster: GpuCluster, ns: str, trays: list[simnodes.SimNode]
) -> None:
    gc = gpu_cluster
    assert gc.controllers is not None and gc.cluster.state_dir is not None
    apply_text(gc, gang_objects(ns, "orphan", 2, 3))
    eventually(lambda: running(gc, ns, "orphan", 2), 180, "gang orphan Running across both trays")
    eventually(lambda: all_ready(gc), 60, "its IMEX domain ready on both trays")
    records = procs.read_records(gc.cluster.state_dir / "pids")
    holder = components.lease_holder(gc.cluster.api)
    leader = f"{components.CONTROLLER_PREFIX}{holder.rsplit('-', 1)[1]}"
    try:
        os.killpg(records[leader].pid, signal.SIGKILL)
        t0 = time.monotonic()
        gc.cluster.kubectl("delete", "gpugang", "-n", ns, "orphan", "--wait=false")
        print(f"[e2e] orphan: SIGKILLed {leader} (leader) and deleted the running gang at once")
        meta = gc.kubectl_json("get", "gpugang", "-n", ns, "orphan")["metadata"]
        assert meta.get("deletionTimestamp") and meta.get("finalizers"), meta  # held until a leader releases it
        assert [p["metadata"]["name"] for p in gc.pods(ns)] == ["orphan-pod-0", "orphan-pod-1"]

        def gang_gone() -> bool:
            return not gc.kubectl_json("get", "gpugangs", "-n", ns).get("items")

        eventually(gang_gone, 90, "the deleted gang released by the next leader, and gone")
        released_s = time.monotonic() - t0
        new_holder = components.lease_holder(gc.cluster.api)
        assert new_holder and new_holder != holder, (holder, new_holder)
        eventually(lambda: not gc.pods(ns), 60, "its member pods deleted")
        assert gc.kubectl_json("get", "resourceclaims", "-n", ns).get("items") == []
        for i in range(2):
            (text,) = told(gc, ns, f"orphan-pod-{i}", "GangDeleted")
            assert f"GpuGang {ns}/orphan was deleted while " in text, text
        nothing_left(gc, trays)
        print(f"[e2e] orphan: released by {new_holder} {released_s:.1f}s after the deletion; nothing left")
    finally:
        gc.controllers.start()
