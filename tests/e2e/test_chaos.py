"""Chaos: pods come and go while each component is SIGKILLed and restarted; then nothing is leaked or doubled.

On a control plane of its own (kube-apiserver is killed: other modules' clients and add-ons with
leader election must not see that), two simulated ``hgx-h100`` nodes (MIG-capable) and two
``gb200-nvl72`` trays of one NVLink clique (each running its ``nvidia-imex`` stand-in), a real
``gpuplane-driver`` on the simulator and the kubelet stand-in each, and two controller replicas,
as ``python -m e2e up`` runs them (``running_plane``). Pods with whole-GPU, MIG (``1g.10gb``) and
MPS (bronze tier) claims on the H100s are created and deleted in a loop (``e2e.plane.chaos_load``),
with one pod whose claim can never fit; beside it, GpuGangs of 2 members x 3 GB200 GPUs (they span
both trays, so each needs an IMEX domain and channel) are made and deleted one at a time
(``e2e.plane.chaos_imex``). Meanwhile each component in turn is SIGKILLed and started again with
its own command line (``e2e.plane.chaos``): an HGX node's driver, a tray's driver (with its IMEX
daemon: the process group), the controller replica holding the leader Lease (in even rounds the
live gang is deleted right after, while no replica leads), kube-apiserver, kube-scheduler and
kube-controller-manager. Then the loops stop (one gang left alive), and once the cluster is quiet
the invariants of ``e2e.plane.chaos_invariants`` and ``e2e.plane.chaos_imex`` must hold with zero
violations: every Running pod's devices prepared exactly once (checkpoint, CDI spec, MIG instance,
MPS daemon against the API), no MIG instance, MPS daemon or directory, CDI spec or checkpoint
entry without an owner claim, nothing held twice, every pending claim explained; every
``ImexDomain`` naming only live gangs and claims and ready on its nodes, each running member's CDI
spec carrying exactly its gang's channel, no channel without a domain, a daemon exactly on the
trays a domain lists, no claim outliving its gang, no gang left ``Terminating``. The counts are
printed (``pytest -s``).

Sizes come from the environment, for a longer nightly-style run:
``GPUPLANE_CHAOS_PODS`` (pods to create, 24), ``GPUPLANE_CHAOS_LIVE`` (pods alive at once, 6),
``GPUPLANE_CHAOS_ROUNDS`` (kills of each component, 1), ``GPUPLANE_CHAOS_INTERVAL`` (seconds
between churn steps, 1.5), ``GPUPLANE_CHAOS_GAP`` (seconds between kills, 3),
``GPUPLANE_CHAOS_COMPONENTS`` (comma list; ``kubelet``, the node's kubelet stand-in, may be added),
``GPUPLANE_CHAOS_QUIET_TIMEOUT`` (seconds, 150), ``GPUPLANE_CHAOS_LEADER_DOWN`` (seconds the killed
leader stays down in even rounds, 22: past its 15 s Lease, so the standby takes over; in odd rounds it
is back after 1 s and finds its own Lease), ``GPUPLANE_CHAOS_GANG_HOLD`` (seconds each IMEX gang lives
before the loop deletes it, 25).
The drivers sweep orphans every 10 s (``GPUPLANE_CLEANUP_INTERVAL``) instead of 60 s, so the
quiet state comes within the test's time.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from kubernetes import client, config

from e2e.cluster import build, controlplane
from e2e.cluster import handle as cluster
from e2e.plane import chaos, chaos_imex, chaos_invariants, chaos_load, components, identity, simnodes
from tests.e2e.conftest import GpuCluster, eventually, running_plane

pytestmark = pytest.mark.e2e

NODE_SPEC = "hgx-h100:2,gb200-nvl72:2"
NAMESPACE = "chaos"
DEFAULT_COMPONENTS = "driver,tray-driver,controller,kube-apiserver,kube-scheduler,kube-controller-manager"
DRIVER_ENV = {"GPUPLANE_CLEANUP_INTERVAL": "10"}


def _num(name: str, default: float) -> float:
    return float(os.environ.get(f"GPUPLANE_CHAOS_{name}", default))


PODS = int(_num("PODS", 24))
LIVE = int(_num("LIVE", 6))
ROUNDS = int(_num("ROUNDS", 1))
INTERVAL_S = _num("INTERVAL", 1.5)
GAP_S = _num("GAP", 3)
QUIET_TIMEOUT_S = _num("QUIET_TIMEOUT", 150)
LEADER_DOWN_S = _num("LEADER_DOWN", 22)
GANG_HOLD_S = _num("GANG_HOLD", 25)
COMPONENTS = [c for c in os.environ.get("GPUPLANE_CHAOS_COMPONENTS", DEFAULT_COMPONENTS).split(",") if c]


@pytest.fixture(scope="module")
def chaos_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GpuCluster, chaos.Restarter]]:
    bins = build.ensure_binaries()
    plane = controlplane.ControlPlane(tmp_path_factory.mktemp("chaos-plane"), bins, die_with_parent=True)
    restarter = chaos.Restarter(plane.state_dir)
    saved = {k: os.environ.get(k) for k in DRIVER_ENV}
    os.environ.update(DRIVER_ENV)  # the drivers inherit it
    try:
        handle = cluster.Cluster.connect(plane.start(), bins, state_dir=plane.state_dir)
        try:
            with running_plane(handle, NODE_SPEC) as gpu:
                try:
                    yield gpu, restarter
                finally:  # running_plane stops only the processes it started; the restarted ones are ours
                    restarter.stop(("driver-", "kubelet-", "controller-"))
        finally:
            handle.close()
    finally:
        restarter.stop()
        plane.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _leader_process(api: client.ApiClient) -> str:
    holder = components.lease_holder(api)
    prefix = components.Controllers.replica_name(0)[:-1]
    assert holder.startswith(prefix), f"the leader Lease is held by {holder!r}"
    return f"{components.CONTROLLER_PREFIX}{holder[len(prefix) :]}"


def _lease_renewed_since(api: client.ApiClient, since: datetime.datetime) -> str | None:
    lease = client.CoordinationV1Api(api).read_namespaced_lease(components.LEASE_NAME, identity.NAMESPACE)
    renewed = lease.spec.renew_time if lease.spec else None
    return str(lease.spec.holder_identity) if renewed and renewed > since else None


def _crash(
    gpu: GpuCluster, restarter: chaos.Restarter, component: str, round_: int, gangs: chaos_imex.GangChurn
) -> chaos.Kill:
    api = gpu.cluster.api
    if component == "tray-driver":  # with its IMEX daemon (the driver's process group)
        tray = gpu.of_profile("gb200-nvl72")[round_ % 2]
        print(f"[chaos] tray driver of {tray.name} killed (its nvidia-imex with it); live gangs {gangs.live()}")
        return restarter.crash(component, tray.driver_process)
    if component in ("driver", "kubelet"):
        hgx = gpu.of_profile("hgx-h100")
        node = hgx[round_ % len(hgx)]
        starting = _starting_pod(gpu, node.name)
        print(f"[chaos] {component} of {node.name} killed while {starting or 'no pod'} was being started there")
        return restarter.crash(component, node.driver_process if component == "driver" else node.kubelet_process)
    if component == "controller":
        # Even rounds: the leader stays down past the Lease (15 s), so the standby takes over; odd rounds: it
        # comes back at once under the same identity and finds its own Lease.
        leaderless = round_ % 2 == 0
        if leaderless:  # a gang placed, to be deleted while no replica leads
            print(f"[chaos] gang {gangs.ensure_placed()} placed; it is deleted once the leader is killed")
        name = _leader_process(api)
        killed_at = datetime.datetime.now(datetime.UTC)
        kill = restarter.crash(
            component,
            name,
            downtime_s=LEADER_DOWN_S if leaderless else 1.0,
            while_down=gangs.delete_live if leaderless else None,
        )
        holder = eventually(lambda: _lease_renewed_since(api, killed_at), 90, "a live leader to renew the Lease")
        print(f"[chaos] leader Lease renewed by {holder} {kill.ready_s:.1f}s+ after {name} was killed")
        return kill
    return restarter.crash(component, component)


def _starting_pod(gpu: GpuCluster, node: str, wait_s: float = 20.0) -> str | None:
    """Wait (a while) for a pod bound to ``node`` that does not run yet: its claims are being prepared."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        listed = gpu.cluster.core.list_namespaced_pod(NAMESPACE, field_selector=f"spec.nodeName={node}")
        for pod in listed.items:
            if pod.status and pod.status.phase == "Pending" and pod.metadata and not pod.metadata.deletion_timestamp:
                return str(pod.metadata.name)
        time.sleep(0.2)
    return None


def _churn_client(handle: cluster.Cluster) -> client.CoreV1Api:
    load: Callable[..., client.ApiClient] = config.new_client_from_config
    return client.CoreV1Api(load(config_file=str(handle.kubeconfig), persist_config=False))


def _converge(gpu: GpuCluster) -> tuple[chaos_invariants.Verdict, int, int, list[str], int]:
    """Check until a quiet reading has no violation, or the time is up.

    Returns the last verdict, the passes, the checks made in all, what earlier passes found
    (the cluster settling: a claim just made is not explained yet, a pod being deleted), and how
    many of the last verdict's checks were IMEX's.
    """
    deadline = time.monotonic() + QUIET_TIMEOUT_S
    passes = checks = 0
    transient: list[str] = []
    trays = gpu.of_profile("gb200-nvl72")

    def must_run(pod: Mapping[str, Any]) -> bool:
        return ((pod.get("metadata") or {}).get("labels") or {}).get(chaos_load.KIND_LABEL) in chaos_load.KINDS

    while True:
        api = chaos_invariants.read_api(gpu.cluster.api, NAMESPACE)
        nodes = [chaos_invariants.read_node(n, str(simnodes.MPS_STANDIN)) for n in gpu.nodes]
        imex_view = chaos_imex.read_api(gpu.cluster.api, NAMESPACE)
        member = chaos_imex.live_member(imex_view)
        verdict = chaos_invariants.check(api, nodes, lambda pod, member=member: must_run(pod) or member(pod))
        before = verdict.checks
        chaos_imex.check(verdict, imex_view, api.pods, api.claims, [chaos_imex.read_tray(t) for t in trays])
        imex_checks = verdict.checks - before
        stuck = chaos_invariants.terminating(api) + chaos_imex.stuck(imex_view)
        passes, checks = passes + 1, checks + verdict.checks
        if not stuck and not verdict.violations:
            return verdict, passes, checks, transient, imex_checks
        if time.monotonic() > deadline:  # a pod, claim or gang that never finishes terminating is a violation too
            for what in stuck:
                verdict.expect(False, f"{what} is still terminating {QUIET_TIMEOUT_S:.0f}s after the faults")
            return verdict, passes, checks + len(stuck), transient, imex_checks
        transient += [v for v in verdict.violations if v not in transient]
        time.sleep(3)


@pytest.mark.timeout(int(300 + QUIET_TIMEOUT_S + ROUNDS * len(COMPONENTS) * 60 + PODS * INTERVAL_S))
def test_chaos_kills_each_component_and_nothing_leaks_or_doubles(
    chaos_cluster: tuple[GpuCluster, chaos.Restarter],
) -> None:
    gpu, restarter = chaos_cluster
    handle, started = gpu.cluster, time.monotonic()
    core = handle.core
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
    eventually(lambda: core.list_namespaced_service_account(NAMESPACE).items, what="default SA")
    for template in chaos_load.templates(NAMESPACE):
        handle.custom.create_namespaced_custom_object(
            "resource.k8s.io", "v1", NAMESPACE, "resourceclaimtemplates", template
        )
    core.create_namespaced_pod(NAMESPACE, chaos_load.pod("chaos-unfit", chaos_load.UNFIT))
    churn = chaos_load.Churn(_churn_client(handle), NAMESPACE, live=LIVE, total=PODS, interval=INTERVAL_S)
    gangs = chaos_imex.GangChurn(_churn_client(handle).api_client, NAMESPACE, interval=2.0, hold=GANG_HOLD_S)
    churn.start()
    gangs.start()
    try:
        gpu.running_pods(NAMESPACE, min(3, LIVE), timeout=120)  # the loop is under way before the first kill
        for round_ in range(ROUNDS):
            for component in COMPONENTS:
                _crash(gpu, restarter, component, round_, gangs)
                time.sleep(GAP_S)
        counts = churn.finish()
        gang_counts = gangs.finish()
    finally:
        churn.abort()
        gangs.abort()
    chaos_s = time.monotonic() - started
    verdict, passes, checks, transient, imex_checks = _converge(gpu)
    kills: dict[str, list[float]] = {}
    for kill in restarter.kills:
        kills.setdefault(kill.component, []).append(kill.ready_s)
    pods = chaos_invariants.read_api(handle.api, NAMESPACE).pods
    running = sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Running")
    print(
        f"\n[chaos] pods created {counts.total_created} {counts.created} (+1 unfit), deleted {counts.deleted}, "
        f"failed API calls during the faults {counts.failed_calls} {churn.last_errors[-2:]}"
    )
    for component, ready in kills.items():
        print(f"[chaos] kills of {component}: {len(ready)} (ready again after {', '.join(f'{s:.1f}s' for s in ready)})")
    print(
        f"[chaos] total kills {len(restarter.kills)}; churn and faults took {chaos_s:.0f}s; quiet after "
        f"{time.monotonic() - started - chaos_s:.0f}s more; {len(pods)} pods left, {running} running"
    )
    print(
        f"[chaos] IMEX gangs created {gang_counts.created}, deleted {gang_counts.deleted} (with no leader: "
        f"{gang_counts.deleted_leaderless}), failed calls {gang_counts.failed_calls}"
    )
    print(
        f"[chaos] invariant checks: {verdict.checks} in the final pass ({imex_checks} of them IMEX), {checks} in "
        f"{passes} passes; violations: {len(verdict.violations)}"
    )
    for seen in transient[:5]:
        print(f"[chaos] (while settling, gone since) {seen}")
    for violation in verdict.violations:
        print(f"[chaos] VIOLATION {violation}")
    assert counts.total_created >= PODS and len(restarter.kills) == ROUNDS * len(COMPONENTS)
    assert verdict.checks > 0 and imex_checks > 0
    if "controller" in COMPONENTS and ROUNDS > 0:  # the leak's case happened: a gang deleted with no leader
        assert gang_counts.deleted_leaderless, gang_counts
    logs = handle.state_dir / "logs" if handle.state_dir else "?"
    assert verdict.violations == [], "\n".join([*verdict.violations, f"component logs: {logs}"])
