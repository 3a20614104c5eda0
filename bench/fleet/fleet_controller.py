"""Fleet benchmark, measurement 3: gpuplane's controller at fleet scale.

The controller runs as ``gpuplane-controller`` (one replica, its own ServiceAccount token, leader
Lease; ``e2e.plane.components.Controllers``) against the fleet, and is measured at three moments:

1. started on the published fleet: until every fleet node carries the NVLink-domain label it
   derives from the node's slices (proof that it indexed every slice);
2. with the background claims in place: ``claims`` ResourceClaims, each used by a Running pod
   and allocated by kube-scheduler (4-GPU NVLink, whole-GPU and time-sliced share claims on the
   HGX nodes, so the GB200 racks stay free for the gangs; see ``background_mix``);
3. placing ``gangs`` TP=8 gangs (2 GB200 trays x 4 GPUs, all-or-nothing in one NVL72 domain):
   from the first GpuGang created until every gang is ``Placed`` by the controller, and until
   every member pod is bound and Running. Each gang is then checked: one NVLink domain in its
   placement, both members bound to the nodes the placement named, every node of that domain.

Resident memory is sampled every 0.5 s (``fleet_probe.PeakSampler``; the peak of each step is reported
beside the value at its end);
CPU seconds come from ``/proc/<pid>/stat``.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kubernetes import client

from bench.dra import dra_setup, dra_watch
from bench.fleet import fleet_probe, fleet_sched
from e2e.cluster import procs
from e2e.cluster.handle import Cluster
from e2e.plane import components, fleet
from gpuplane.controller import names as cnames

Printer = Callable[[str], None]
GANG_NAMESPACE = "fleet-gangs"
GB200 = "NVIDIA GB200"
DECIDED = ("Placing", "Placed", "Scheduled", "Running")  # the decision is in the gang's status


@dataclasses.dataclass(frozen=True)
class Moment:
    """The controller at one point of the run."""

    what: str
    seconds: float
    rss_mb: float
    peak_rss_mb: float
    cpu_s: float  # CPU seconds spent during this step
    detail: str


def env_pairs(items: Sequence[str]) -> dict[str, str]:
    """``NAME=VALUE`` items (``--controller-env``) as a mapping; a malformed one ends the run at start."""
    pairs = [item.partition("=") for item in items]
    bad = [item for item, (name, eq, _) in zip(items, pairs, strict=True) if not eq or not name]
    if bad:
        raise SystemExit(f"--controller-env takes NAME=VALUE, got {bad}")
    return {name: value for name, _, value in pairs}


def start_controller(
    cluster: Cluster,
    state_dir: Path,
    out: Printer,
    *,
    trace_frames: int = 0,
    env: Mapping[str, str] | None = None,
) -> tuple[components.Controllers, int]:
    """One controller replica; returns it and its pid (``trace_frames``: run it with allocation tracing;
    ``env``: more environment for it)."""
    env = dict(env or {}) | ({"PYTHONTRACEMALLOC": str(trace_frames)} if trace_frames else {})
    ctl = components.Controllers(
        state_dir, cluster, replicas=1, token_seconds=6 * 3600, die_with_parent=True, env=env, out=out
    )
    ctl.start()
    record = procs.read_records(state_dir / "pids")[f"{components.CONTROLLER_PREFIX}0"]
    return ctl, record.pid


def unlabelled(api: client.ApiClient, nodes: Sequence[fleet.FleetNode]) -> int:
    """Fleet nodes that do not carry the NVLink-domain label yet."""
    wanted = {n.name for n in nodes}
    listed = client.CoreV1Api(api).list_node(label_selector=f"{fleet.FLEET_LABEL}=true")
    labelled = {
        i.metadata.name
        for i in listed.items
        if i.metadata and cnames.NODE_LABEL_NVLINK_DOMAIN in (i.metadata.labels or {})
    }
    return len(wanted - labelled)


def background_mix(claims: int) -> list[tuple[str, int]]:
    """How the background claims split, in creation order: 5 % four GPUs, 15 % one whole GPU,
    80 % a 25 % time-sliced share of a GPU (10,000 claims hold 5,500 of 800 HGX nodes' 6,400 GPUs).

    They are allocated while the fleet publishes whole GPUs only (kube-scheduler 1.36 needs
    seconds per pod on a partitionable fleet of this size, see the scheduler table), then the
    fleet republishes its MIG placements: the allocated whole-GPU devices keep their names,
    so the claims stay valid and the controller sees them beside every published device.
    """
    gpu4 = claims // 20
    gpu1 = claims * 3 // 20
    return [("gpu-4", gpu4), ("gpu-1", gpu1), ("gpu-share", claims - gpu1 - gpu4)]


def background(
    api: client.ApiClient,
    probe: fleet_probe.Probe,
    claims: int,
    *,
    timeout: float,
    workers: int,
    out: Printer,
    share_pods: int | None = None,
) -> list[fleet_sched.Round]:
    """Create the background claims and their pods (kept), through the scheduler; return the rounds.

    ``share_pods``: at most this many of the time-sliced share claims get a pod; the others are
    created without one and stay pending (kube-scheduler 1.37.2 slows with every shared allocation
    in the cluster: docs/benchmarks.md, the 1,000-node run with 10,000 claims).
    """
    rounds = []
    for kind, wanted in background_mix(claims):
        count = wanted
        if kind == "gpu-share" and share_pods is not None and wanted > share_pods:
            count = share_pods
            _pending_claims(api, kind, wanted - count, workers, out)
        if count:
            out(f"background: {count} pods with {fleet_sched.KIND_TEXT[kind]} (kept) ...")
            rounds.append(
                fleet_sched.run_round(
                    api,
                    probe,
                    fleet_variant="b",
                    kind=kind,
                    pods=count,
                    label=f"bg-{kind}",
                    timeout=timeout,
                    workers=workers,
                    h100_only=True,
                    keep=True,
                    out=out,
                )
            )
    return rounds


def _pending_claims(api: client.ApiClient, kind: str, count: int, workers: int, out: Printer) -> None:
    """``count`` background claims of ``kind`` without a pod: nothing allocates them."""
    out(f"background: {count} claims with {fleet_sched.KIND_TEXT[kind]}, no pod (they stay pending) ...")
    names_ = [f"bg-pending-{i:05d}" for i in range(count)]
    fleet_sched.create_claims(
        api, kind, names_, "bg-pending", what="bg-pending: claims created", h100_only=True, workers=workers, out=out
    )


def gang_objects(index: int) -> list[dict[str, Any]]:
    """GpuGang ``tp8-<index>`` (2 x 4 GB200 GPUs, TP=8) and its two gated member pods."""
    name = f"tp8-{index:03d}"
    gang = {
        "apiVersion": cnames.GANG_API_VERSION,
        "kind": cnames.GANG_KIND,
        "metadata": {"name": name, "namespace": GANG_NAMESPACE},
        "spec": {
            "members": 2,
            "gpusPerMember": 4,
            "tensorParallelSize": 8,
            "selectors": [f'device.attributes["gpu.gpuplane.dev"].productName == "{GB200}"'],
        },
    }
    pods = []
    for member in range(2):
        pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{name}-{member}",
                    "namespace": GANG_NAMESPACE,
                    "labels": {cnames.LABEL_GANG: name},
                },
                "spec": {
                    "schedulingGates": [{"name": cnames.SCHEDULING_GATE}],
                    "resourceClaims": [{"name": "gpus", "resourceClaimName": cnames.claim_name(name, member)}],
                    "containers": [
                        {"name": "rank", "image": dra_setup.PAUSE, "resources": {"claims": [{"name": "gpus"}]}}
                    ],
                    "terminationGracePeriodSeconds": 0,
                },
            }
        )
    return [gang, *pods]


@dataclasses.dataclass(frozen=True)
class GangResult:
    """What placing the gangs took (seconds from the first gang created; nan: not reached)."""

    gangs: int
    decided: int  # gangs whose placement decision is in their status
    decided_s: float
    members_running: int
    running_s: float  # every member pod bound and Running
    phase_running: int  # gangs whose status says Running (the controller saw its members run)
    phase_running_s: float
    one_domain: int  # one NVLink domain in the placement, both members bound on the nodes it named
    create_s: float


def _ensure_namespace(core: client.CoreV1Api) -> None:
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=GANG_NAMESPACE)))
    except client.ApiException as err:
        if err.status != 409:
            raise
    dra_watch.wait(
        lambda: bool(
            core.list_namespaced_service_account(GANG_NAMESPACE, field_selector="metadata.name=default").items
        ),
        60,
        "the default ServiceAccount",
    )


def _one_domain(gangs: Sequence[Mapping[str, Any]], pods: Sequence[Any], node_domain: Mapping[str, Any]) -> int:
    bound = {p.metadata.name: p.spec.node_name for p in pods if p.metadata and p.spec}
    ok_count = 0
    for g in gangs:
        placement = (g.get("status") or {}).get("placement") or {}
        domains = placement.get("domains") or []
        members: Mapping[str, str] = placement.get("members") or {}
        name = g["metadata"]["name"]
        ok = len(domains) == 1 and len(members) == 2
        for member, node in members.items():
            ok = ok and bound.get(f"{name}-{member}") == node and node_domain.get(node) == domains[0]
        ok_count += int(ok)
    return ok_count


def place_gangs(api: client.ApiClient, count: int, timeout: float, out: Printer) -> GangResult:
    """Create ``count`` gangs with their pods; wait until all are decided, their pods Running, their status Running."""
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    _ensure_namespace(core)
    started = time.monotonic()

    def create(index: int) -> None:
        gang, *pods = gang_objects(index)
        custom.create_namespaced_custom_object(cnames.GROUP, cnames.VERSION, GANG_NAMESPACE, cnames.GANG_PLURAL, gang)
        for pod in pods:
            core.create_namespaced_pod(GANG_NAMESPACE, pod)  # type: ignore[arg-type]

    fleet.parallel(list(range(count)), create, what="gangs created (GpuGang + 2 gated pods)", workers=8, out=out)
    create_s = time.monotonic() - started
    reached: dict[str, float] = {}
    deadline = started + timeout
    last_note = started
    gangs: list[dict[str, Any]] = []
    pods: list[Any] = []
    counts = {"decided": 0, "running": 0, "phase": 0}
    while time.monotonic() < deadline:
        listed: dict[str, Any] = custom.list_namespaced_custom_object(  # type: ignore[assignment]
            cnames.GROUP, cnames.VERSION, GANG_NAMESPACE, cnames.GANG_PLURAL
        )
        gangs = listed["items"]
        pods = core.list_namespaced_pod(GANG_NAMESPACE).items
        now = time.monotonic()
        phases = [(g.get("status") or {}).get("phase") for g in gangs]
        counts = {
            "decided": sum(1 for p in phases if p in DECIDED),
            "running": sum(1 for p in pods if p.status and p.status.phase == "Running"),
            "phase": sum(1 for p in phases if p == "Running"),
        }
        for key, target in (("decided", count), ("running", 2 * count), ("phase", count)):
            if counts[key] >= target:
                reached.setdefault(key, now - started)
        if len(reached) == 3:
            break
        if now - last_note > 15:
            last_note = now
            out(
                f"  gangs: {counts['decided']}/{count} decided, {counts['running']}/{2 * count} member pods Running, "
                f"{counts['phase']}/{count} gangs Running ({now - started:.0f}s)"
            )
        time.sleep(0.5)
    else:
        out(f"  gangs: not all decided, running and reported Running after {timeout:.0f}s")
    node_domain: dict[str, Any] = {
        str(i.metadata.name): (i.metadata.labels or {}).get(cnames.NODE_LABEL_NVLINK_DOMAIN)
        for i in core.list_node(label_selector=f"{fleet.FLEET_LABEL}=true").items
        if i.metadata
    }
    nan = float("nan")
    return GangResult(
        gangs=count,
        decided=counts["decided"],
        decided_s=reached.get("decided", nan),
        members_running=counts["running"],
        running_s=reached.get("running", nan),
        phase_running=counts["phase"],
        phase_running_s=reached.get("phase", nan),
        one_domain=_one_domain(gangs, pods, node_domain),
        create_s=create_s,
    )


def settle(pid: int, timeout: float, *, window_s: float = 10.0, busy_below: float = 0.25) -> float:
    """Seconds until ``pid`` used under ``busy_below`` of a CPU over ``window_s`` (at least 20 s in; nan: timeout).

    A leader with many gangs never idles (each gang's timer reconciles it every resync period), so the
    threshold is a quarter of a CPU and the caller bounds the wait."""
    started = time.monotonic()
    samples: list[tuple[float, float]] = []
    while time.monotonic() - started < timeout:
        now = time.monotonic()
        samples.append((now, fleet_probe.cpu_s(pid)))
        old = [x for x in samples if x[0] <= now - window_s]
        if old and now - started >= 20:
            t_old, c_old = old[-1]
            if (samples[-1][1] - c_old) / (now - t_old) < busy_below:
                return now - started
        time.sleep(1.0)
    return float("nan")


def memory_report(pid: int, timeout: float = 300.0) -> str:
    """The controller's own memory report (``kill -USR2``, :mod:`gpuplane.controller.memdump`), as text."""
    path = Path(tempfile.gettempdir()) / f"gpuplane-controller-memory-{pid}.txt"
    path.unlink(missing_ok=True)
    os.kill(pid, signal.SIGUSR2)
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            return f"(no memory report from pid {pid} within {timeout:.0f} s)"
        time.sleep(0.5)
    return path.read_text()


def moments_table(moments: Sequence[Moment], target_mb: float) -> str:
    """Markdown table of the controller's moments."""
    rows = [
        "| moment | took s | RSS MB | peak RSS MB | CPU s in step | detail |",
        "|---|---|---|---|---|---|",
    ]
    rows += [
        f"| {m.what} | {m.seconds:.1f} | {m.rss_mb:.0f} | {m.peak_rss_mb:.0f} | {m.cpu_s:.1f} | {m.detail} |"
        for m in moments
    ]
    peak = max((m.peak_rss_mb for m in moments), default=0.0)
    verdict = "PASS" if peak <= target_mb else "FAIL"
    return "\n".join(rows) + f"\n\ncontroller peak RSS {peak:.0f} MB, target <= {target_mb:.0f} MB: {verdict}\n"
