"""The fleet benchmark's claims and pods written straight into the API, allocated as kube-scheduler would.

``bench.fleet.fleet_scale`` allocates its 10,000 background claims through kube-scheduler, which takes
15-30 minutes at 1,000 nodes (docs/benchmarks.md, runs 3-6). To measure the *controller* on that
state in minutes, :func:`populate` writes the same objects directly:

* the background mix of ``bench.fleet.fleet_controller.background_mix`` (5 % four GPUs in one NVLink
  domain, 15 % one whole GPU, 80 % a 25 % time-sliced share), the same claim bodies
  (``bench.fleet.fleet_sched.claim_body``);
* ``with_pods`` of them get a pod bound to an HGX node (``spec.nodeName``; KWOK marks it Running)
  and an allocation in the claim's status naming devices of that node's pool and reserved for the
  pod: the fields kube-scheduler writes (results with driver, pool, device, request; a share ID and
  the consumed share for a shared GPU; the node selector; the allocation time). The API server
  validates every write, and no two claims get the same whole GPU;
* the rest stay pending, without a pod (as ``--share-pods`` leaves them in ``bench.fleet.fleet_scale``).

What the controller indexes of these objects is what it indexes of scheduler-made ones (the index
keeps driver, pool, device, request, share and the reservations; ``gpuplane.controller.indexed``).
"""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from kubernetes import client

from bench.fleet import fleet_controller, fleet_sched
from e2e.plane import fleet
from gpuplane.api import names as dn

Printer = Callable[[str], None]
GPUS_PER_HGX = 8
SHARES_PER_GPU = 100 // fleet_sched.SHARE_PERCENT


@dataclasses.dataclass(frozen=True)
class Placed:
    """One claim with a pod: which node and devices kube-scheduler would have given it."""

    name: str
    kind: str
    node: str
    devices: tuple[str, ...]
    share: bool


def assign(kinds: Sequence[tuple[str, int]], hgx_nodes: Sequence[str], with_pods: int) -> Iterator[Placed]:
    """The first ``with_pods`` claims of the mix, each on devices no earlier claim holds (shares: four to a GPU)."""
    gpus = ((node, f"gpu-{i}") for node in hgx_nodes for i in range(GPUS_PER_HGX))
    left = with_pods
    for kind, count in kinds:
        wanted = min(count, left)
        left -= wanted
        if kind == "gpu-4":  # two claims per node, GPUs 0-3 and 4-7: one NVLink domain (the node's)
            taken = [next(gpus) for _ in range(4 * wanted)]
            for i in range(wanted):
                quad = taken[4 * i : 4 * i + 4]
                yield Placed(f"bg-{kind}-{i:05d}", kind, quad[0][0], tuple(d for _, d in quad), False)
        elif kind == "gpu-1":
            for i in range(wanted):
                node, dev = next(gpus)
                yield Placed(f"bg-{kind}-{i:05d}", kind, node, (dev,), False)
        else:
            for i in range(wanted):
                if i % SHARES_PER_GPU == 0:
                    node, dev = next(gpus)
                yield Placed(f"bg-{kind}-{i:05d}", kind, node, (dev,), True)


def allocation(p: Placed, pod_uid: str) -> dict[str, Any]:
    """The claim status kube-scheduler (and kubelet's reservation) would write for ``p``."""
    results = []
    for dev in p.devices:
        result: dict[str, Any] = {"request": "gpus", "driver": dn.DRIVER_NAME, "pool": p.node, "device": dev}
        if p.share:
            result["shareID"] = str(uuid.uuid4())
            result["consumedCapacity"] = {dn.CAP_SHARE_PERCENT: str(fleet_sched.SHARE_PERCENT)}
        results.append(result)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    field = {"key": "metadata.name", "operator": "In", "values": [p.node]}
    selector = {"nodeSelectorTerms": [{"matchFields": [field]}]}
    return {
        "status": {
            "allocation": {"devices": {"results": results}, "nodeSelector": selector, "allocationTimestamp": now},
            "reservedFor": [{"resource": "pods", "name": p.name, "uid": pod_uid}],
        }
    }


def populate(
    api: client.ApiClient,
    nodes: Sequence[fleet.FleetNode],
    claims: int,
    with_pods: int,
    *,
    workers: int,
    out: Printer,
) -> dict[str, int]:
    """Create the claims (``with_pods`` of them allocated, with a bound pod); return the counts by kind."""
    fleet_sched.ensure_namespace(api)
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    hgx = [n.name for n in nodes if n.profile == fleet.HGX_PROFILE]
    kinds = fleet_controller.background_mix(claims)
    if with_pods > len(hgx) * GPUS_PER_HGX:
        raise SystemExit(f"{with_pods} placed claims do not fit on {len(hgx)} HGX nodes")
    placed = list(assign(kinds, hgx, with_pods))
    ns, group, version = fleet_sched.NAMESPACE, fleet_sched.GROUP, fleet_sched.VERSION

    def place(p: Placed) -> None:
        body = fleet_sched.claim_body(p.kind, p.name, h100_only=True, label="bg-placed")
        custom.create_namespaced_custom_object(group, version, ns, "resourceclaims", body)
        pod = fleet_sched.pod_body(p.kind, p.name, "bg-placed")
        pod["spec"]["nodeName"] = p.node
        made = core.create_namespaced_pod(ns, pod)  # type: ignore[arg-type]
        uid = str(made.metadata.uid) if made.metadata else ""
        custom.patch_namespaced_custom_object_status(group, version, ns, "resourceclaims", p.name, allocation(p, uid))

    fleet.parallel(placed, place, what="claims allocated, each with a bound pod", workers=workers, out=out)
    done = {kind: sum(1 for p in placed if p.kind == kind) for kind, _ in kinds}
    pending = [(kind, f"bg-pending-{kind}-{i:05d}") for kind, count in kinds for i in range(count - done[kind])]
    fleet.parallel(
        pending,
        lambda kn: custom.create_namespaced_custom_object(
            group, version, ns, "resourceclaims", fleet_sched.claim_body(*kn, h100_only=True, label="bg-pending")
        ),
        what="claims created without a pod (pending)",
        workers=workers,
        out=out,
    )
    return {"allocated": len(placed), "pending": len(pending)} | {f"allocated {k}": v for k, v in done.items()}
