"""A fleet of GPU nodes for scale tests: Node objects that KWOK keeps Ready, no kubelet, no driver process.

``plan(hgx, gb200)`` names the nodes: ``hgx-h100-<i>`` (8-GPU HGX H100 boards, MIG
partitionable) and ``gb200-nvl72-<i>`` (4-GPU GB200 compute trays; 18 trays make one NVL72
rack, and the trays of a rack share one fabric cluster UUID, so the driver's discovery puts
their GPUs in one NVLink domain, as ``e2e.plane.simnodes`` does for its racks).

``create_nodes`` creates the Node objects (labels a kubelet would set, the simulator profile,
KWOK's management label; capacity and allocatable in the status, which a Node may carry on
create) and ``wait_ready`` waits until KWOK has made every one Ready and the node-lifecycle
controller has lifted the not-ready taint. Their ResourceSlices come from
:mod:`e2e.plane.fleetslices`. Every bulk operation runs on a small thread pool and prints
its progress.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.cluster import kwok
from e2e.plane import plan_files

Printer = Callable[[str], None]
T = TypeVar("T")
R = TypeVar("R")

HGX_PROFILE = "hgx-h100"
GB200_PROFILE = plan_files.GB200_PROFILE
RACK_TRAYS = plan_files.GB200_RACK_NODES
FLEET_LABEL = "gpuplane.dev/fleet"
CAPACITY = {"cpu": "224", "memory": "2Ti", "pods": "110", "ephemeral-storage": "30Ti"}
PROGRESS_EVERY_S = 15.0


@dataclasses.dataclass(frozen=True)
class FleetNode:
    """One simulated node: its name, hardware profile and (GB200 trays) rack and fabric cluster."""

    name: str
    profile: str
    rack: int | None = None
    cluster_uuid: str | None = None

    @property
    def labels(self) -> dict[str, str]:
        """The labels the Node is created with."""
        out = {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            plan_files.PROFILE_LABEL: self.profile,
            FLEET_LABEL: "true",
            kwok.MANAGED_LABEL: kwok.MANAGED_VALUE,
        }
        if self.rack is not None:
            out["gpuplane.dev/rack"] = f"nvl72-{self.rack}"
        return out


def plan(hgx: int, gb200: int, *, prefix: str = "", seed: str = "gpuplane-fleet") -> tuple[FleetNode, ...]:
    """``hgx`` HGX H100 nodes, then ``gb200`` GB200 trays in racks of 18 (the last rack may be partial).

    Names are ``<prefix><profile>-<i>`` (zero-padded to the same width).
    """
    if hgx < 0 or gb200 < 0 or hgx + gb200 == 0:
        raise ValueError(f"a fleet needs at least one node (got hgx={hgx}, gb200={gb200})")
    width = len(str(max(hgx, gb200, 1) - 1))
    nodes = [FleetNode(f"{prefix}{HGX_PROFILE}-{i:0{width}d}", HGX_PROFILE) for i in range(hgx)]
    for i in range(gb200):
        rack = i // RACK_TRAYS
        cluster = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{seed}:{prefix}rack-{rack}"))
        nodes.append(FleetNode(f"{prefix}{GB200_PROFILE}-{i:0{width}d}", GB200_PROFILE, rack, cluster))
    return tuple(nodes)


def node_body(node: FleetNode) -> dict[str, Any]:
    """The Node object: labels, KWOK's annotation, capacity/allocatable in the status."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": node.labels,
            "annotations": {kwok.MANAGED_LABEL: kwok.MANAGED_VALUE},
        },
        "status": {"capacity": dict(CAPACITY), "allocatable": dict(CAPACITY)},
    }


def parallel(
    items: Sequence[T],
    work: Callable[[T], R],
    *,
    what: str,
    workers: int = 8,
    out: Printer = print,
) -> list[R]:
    """``work(item)`` for every item on ``workers`` threads, in order; progress every 15 s; the first error raises."""
    started = time.monotonic()
    results: list[R | None] = [None] * len(items)
    done = 0
    last_note = started
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fleet") as pool:
        futures = {pool.submit(work, item): index for index, item in enumerate(items)}
        try:
            for future in concurrent.futures.as_completed(futures):
                results[futures[future]] = future.result()
                done += 1
                now = time.monotonic()
                if now - last_note > PROGRESS_EVERY_S:
                    last_note = now
                    out(f"  {what}: {done}/{len(items)} ({now - started:.0f}s)")
        except BaseException:
            for future in futures:
                future.cancel()
            raise
    out(f"  {what}: {len(items)} in {time.monotonic() - started:.1f}s")
    return cast(list[R], results)


def create_nodes(api: client.ApiClient, nodes: Sequence[FleetNode], *, workers: int = 8, out: Printer = print) -> None:
    """Create every Node (an existing one keeps its status; its labels are brought up to date)."""
    core = client.CoreV1Api(api)

    def create(node: FleetNode) -> None:
        try:
            core.create_node(node_body(node))  # type: ignore[arg-type]  # a plain dict body is sent as is
        except ApiException as err:
            if err.status != 409:
                raise
            core.patch_node(node.name, {"metadata": {"labels": node.labels}})

    parallel(nodes, create, what="Node objects created", workers=workers, out=out)


def not_ready(api: client.ApiClient, names: Iterable[str]) -> dict[str, str]:
    """Node name -> why it is not usable yet (absent: Ready and without node.kubernetes.io taints)."""
    wanted = set(names)
    listed = client.CoreV1Api(api).list_node(label_selector=f"{FLEET_LABEL}=true")
    problems = {name: "no Node object" for name in wanted}
    for item in listed.items:
        name = item.metadata.name if item.metadata else None
        if name not in wanted:
            continue
        conditions = (item.status.conditions if item.status else None) or []
        ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
        taints = [t.key for t in ((item.spec.taints if item.spec else None) or []) if t.key.startswith("node.")]
        if not ready:
            problems[name] = "not Ready (KWOK has not initialized it)"
        elif taints:
            problems[name] = f"tainted {','.join(taints)} (node-lifecycle controller)"
        else:
            del problems[name]
    return problems


def wait_ready(
    api: client.ApiClient, nodes: Sequence[FleetNode], *, timeout: float = 600.0, out: Printer = print
) -> float:
    """Wait until every node is Ready and untainted; return the seconds it took."""
    started = time.monotonic()
    last_note = started
    while True:
        problems = not_ready(api, (n.name for n in nodes))
        if not problems:
            took = time.monotonic() - started
            out(f"  {len(nodes)} nodes Ready and schedulable after {took:.1f}s")
            return took
        now = time.monotonic()
        if now - started > timeout:
            sample = "; ".join(f"{n}: {why}" for n, why in sorted(problems.items())[:5])
            raise TimeoutError(
                f"{len(problems)} of {len(nodes)} fleet nodes not usable after {timeout:.0f}s ({sample}); "
                "check the KWOK log (state dir logs/kwok.log) and kube-controller-manager's"
            )
        if now - last_note > PROGRESS_EVERY_S:
            last_note = now
            out(f"  waiting for {len(problems)}/{len(nodes)} nodes ({now - started:.0f}s)")
        time.sleep(1.0)


def delete_nodes(api: client.ApiClient, nodes: Sequence[FleetNode], *, workers: int = 8, out: Printer = print) -> None:
    """Delete the Node objects (their Leases and the pods bound to them are garbage-collected)."""
    core = client.CoreV1Api(api)

    def delete(node: FleetNode) -> None:
        try:
            core.delete_node(node.name)
        except ApiException as err:
            if err.status != 404:
                raise

    parallel(nodes, delete, what="Node objects deleted", workers=workers, out=out)
