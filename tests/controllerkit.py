"""Test kit for the controller: the ResourceSlices the real driver publishes, DeviceClasses, gangs, pods, claims.

The slices come from the production driver code (inventory and slice rendering) on the
simulator, so the controller's tests read what a real node publishes; a queue pass and a
reconcile are the production ones (:func:`run_pass`, :func:`decide`). :class:`FakeApi` applies
steps to in-memory pods and claims (fine for unit tests; the e2e suite runs the same steps
against a real API server).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from gpuplane.api import kubetime
from gpuplane.controller import deviceclass, indexed, names, steps
from gpuplane.controller.gang import podview, queue_runner, reconciler, world
from gpuplane.controller.gang import view as gang_view
from gpuplane.controller.gang.podview import MemberPodView
from gpuplane.controller.gang.view import GangView
from gpuplane.controller.imex import hold
from gpuplane.controller.node import snapshot_builder
from gpuplane.driver import inventory
from gpuplane.driver.hw.sim import SimConfig, Simulator
from gpuplane.driver.publish import slices
from gpuplane.placement.policies import make as make_policy

T0 = 1_700_000_000.0
CLUSTER = "6a1c4a2e-9a53-4a44-9a3c-3a1c4a2e9a53"


def node_slices(
    tmp: Path,
    node: str,
    profile: str,
    clique: int | None = None,
    *,
    taints: Mapping[str, Sequence[slices.DeviceTaint]] | None = None,
    generation: int = 1,
) -> list[dict[str, Any]]:
    """The ResourceSlices the real driver publishes for a simulated node (``taints``: GPU name -> taints)."""
    cfg = SimConfig(
        profile=profile,
        state_dir=tmp / node,
        node_name=node,
        durable=False,
        cluster_uuid=CLUSTER if clique is not None else None,
        clique_id=clique,
    )
    (tmp / node).mkdir(parents=True, exist_ok=True)
    with Simulator(cfg) as sim:
        inv = inventory.discover(node, sim)
    return slices.render_slices(slices.build_pool(inv, taints=taints), generation)


def cluster_slices(tmp: Path) -> list[dict[str, Any]]:
    """Two HGX H100 nodes and four GB200 trays of one NVL72 clique."""
    out: list[dict[str, Any]] = []
    for i in range(2):
        out += node_slices(tmp, f"hgx-{i}", "hgx-h100")
    for i in range(4):
        out += node_slices(tmp, f"nvl-{i}", "gb200-nvl72", clique=1)
    return out


GB200 = 'device.attributes["gpu.gpuplane.dev"].productName == "NVIDIA GB200"'
H100 = 'device.attributes["gpu.gpuplane.dev"].productName == "NVIDIA H100 80GB HBM3"'
GPU_CLASS = {
    "metadata": {"name": "gpu.gpuplane.dev"},
    "spec": {
        "selectors": [
            {
                "cel": {
                    "expression": 'device.driver == "gpu.gpuplane.dev" && '
                    'device.attributes["gpu.gpuplane.dev"].type == "gpu"'
                }
            }
        ]
    },
}
MIG_CLASS = {
    "metadata": {"name": "mig.gpuplane.dev"},
    "spec": {
        "selectors": [
            {
                "cel": {
                    "expression": 'device.driver == "gpu.gpuplane.dev" && '
                    'device.attributes["gpu.gpuplane.dev"].type == "mig"'
                }
            }
        ]
    },
}
CLASSES = {"gpu.gpuplane.dev": deviceclass.view(GPU_CLASS), "mig.gpuplane.dev": deviceclass.view(MIG_CLASS)}


def claim_body(
    requests: list[dict[str, Any]],
    config: list[dict[str, Any]] | None = None,
    constraints: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": requests}
    if config:
        devices["config"] = config
    if constraints:
        devices["constraints"] = constraints
    return {"metadata": {"name": "c", "namespace": "ns"}, "spec": {"devices": devices}, "status": {}}


def req(name: str, cls: str = "gpu.gpuplane.dev", count: int = 1, sel: Sequence[str] = ()) -> dict[str, Any]:
    return {
        "name": name,
        "exactly": {"deviceClassName": cls, "count": count, "selectors": [{"cel": {"expression": s}} for s in sel]},
    }


def gang_body(
    name: str, ns: str = "team-a", created: float = T0, status_: Mapping[str, Any] | None = None, **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": names.GANG_API_VERSION,
        "kind": names.GANG_KIND,
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"uid-{name}",
            "generation": 1,
            "creationTimestamp": kubetime.rfc3339(created),
        },
        "spec": spec,
        "status": dict(status_ or {}),
    }


def member_pod(
    gang: str,
    i: int,
    *,
    ns: str = "team-a",
    gated: bool = True,
    node: str = "",
    affinity: Mapping[str, Any] | None = None,
    priority: int | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "resourceClaims": [{"name": "gpus", "resourceClaimName": f"{gang}-{i}"}],
        "schedulingGates": [{"name": names.SCHEDULING_GATE}] if gated else [],
    }
    if priority is not None:  # as the API server's Priority admission resolves it from priorityClassName
        spec["priority"] = priority
    if node:
        spec["nodeName"] = node
    if affinity:
        spec["affinity"] = affinity
    return {
        "metadata": {
            "name": f"{gang}-pod-{i}",
            "namespace": ns,
            "uid": f"pod-{gang}-{i}",
            "labels": {names.LABEL_GANG: gang},
        },
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def make_world(
    slices_: Sequence[Mapping[str, Any]],
    gangs_: Sequence[Mapping[str, Any] | GangView],
    pods: Sequence[dict[str, Any]] = (),
    claims_: Sequence[Mapping[str, Any] | indexed.ClaimView] = (),
) -> world.World:
    return world.World(
        gangs=gang_index(gangs_),
        pods=world.member_lists(pod_index(pods)),
        claims=claim_index(claims_),
        slices=tuple(slices_),
        nodes={s["spec"]["nodeName"]: True for s in slices_},
        classes=CLASSES,
    )


def gang_index(gangs: Iterable[Mapping[str, Any] | GangView]) -> dict[str, GangView]:
    """Gangs as the gang index holds them (bodies through the informer's transform), by ``ns/name``."""
    views = [g if isinstance(g, GangView) else gang_view.view(g) for g in gangs]
    return {v.key: v for v in views}


def pod_index(pods: Iterable[Mapping[str, Any] | MemberPodView]) -> list[MemberPodView]:
    """Pods as the member-pod index holds them (bodies through the informer's transform)."""
    return [p if isinstance(p, MemberPodView) else podview.view(p) for p in pods]


def pod_body(v: MemberPodView) -> dict[str, Any]:
    """A pod body the member-pod index reads back as ``v`` (``podview.view(pod_body(v)) == v``): what the fake
    API holds of a pod its world gave it, so steps can patch it and a new world can be made from it."""
    meta: dict[str, Any] = {"name": v.name, "namespace": v.namespace, "uid": v.uid, "labels": dict(v.labels)}
    if v.annotations:
        meta["annotations"] = dict(v.annotations)
    if v.deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    if v.controller is not None:
        meta["ownerReferences"] = [{"kind": v.controller[0], "name": v.controller[1], "controller": True}]
    spec: dict[str, Any] = {
        "resourceClaims": [
            {
                "name": r.name,
                **({"resourceClaimName": r.claim} if r.claim else {}),
                **({"resourceClaimTemplateName": r.template} if r.template else {}),
            }
            for r in v.claims
        ],
        "schedulingGates": [{"name": g} for g in v.gates],
    }
    if v.node:
        spec["nodeName"] = v.node
    if v.affinity is not None:
        spec["affinity"] = copy.deepcopy(dict(v.affinity))
    if v.priority:
        spec["priority"] = v.priority
    if v.never_preempts:
        spec["preemptionPolicy"] = "Never"
    status: dict[str, Any] = {"resourceClaimStatuses": [{"name": "c", "resourceClaimName": c} for c in v.given]}
    if v.phase:
        status["phase"] = v.phase
    return {"metadata": meta, "spec": spec, "status": status}


def explain(body: Mapping[str, Any], classes: Mapping[str, deviceclass.ClassView], view: Any) -> str:
    """Why a claim finds no room, as the controller asks it: the claim through the index, its requests explained."""
    from gpuplane.controller.claim import checks

    return checks.explain_requests(indexed.claim(body).requests, classes, view)


def claim_index(claims: Iterable[Mapping[str, Any] | indexed.ClaimView]) -> dict[str, indexed.ClaimView]:
    """Claims as the claim index holds them (bodies through the informer's transform), by ``ns/name``."""
    views = [c if isinstance(c, indexed.ClaimView) else indexed.claim(c) for c in claims]
    return {v.key: v for v in views}


def run_pass(w: world.World, now: float = T0 + 10) -> tuple[queue_runner.Plan, snapshot_builder.ClusterView]:
    view = world.cluster_view(w)
    entries = world.entries(w, view)
    compiled = {e.key: world.admit_for(w, e.spec) for e in entries}
    plan = queue_runner.plan(entries, view, lambda e: compiled[e.key].predicate, make_policy("gpuplane"), now=now)
    return plan, view


def decide(
    w: world.World,
    key: str,
    now: float = T0 + 10,
    settings: reconciler.Settings | None = None,
    imex: hold.Written | None = hold.NOT_SERVED,
) -> reconciler.Outcome:
    """One gang's reconcile decision after a pass at ``now`` (``imex``: the last IMEX pass's ``hold.Written``)."""
    plan, view = run_pass(w, now)
    return reconciler.decide(
        key,
        w.gangs[key],
        w,
        planned=lambda: (plan, view),
        domains=lambda: world.gpu_domains(w),
        now=now,
        settings=settings or reconciler.Settings(eviction_grace_s=0),
        imex=imex,
    )


class FakeApi:
    """Applies steps to in-memory pods and claims, with an optional crash after N writes."""

    def __init__(self, w: world.World, crash_after: int | None = None) -> None:
        self.pods = {p.name: pod_body(p) for ps in w.pods.values() for p in ps}
        # the world's claims as indexed (views), and the bodies of the claims the steps create
        self.claims: dict[str, Mapping[str, Any] | indexed.ClaimView] = {c.name: c for c in w.claims.values()}
        self.writes: list[str] = []
        self.crash_after = crash_after

    def run(self, step: steps.Step) -> None:
        if self.crash_after is not None and len(self.writes) >= self.crash_after:
            raise RuntimeError("crash")
        self.writes.append(f"{step.kind} {step.name}")
        if step.kind == "create-claim":
            assert step.name not in self.claims, f"claim {step.name} created twice"
            self.claims[step.name] = step.body
        elif step.kind == "delete-claim":
            self.claims.pop(step.name, None)
        elif step.kind == "patch-pod":
            pod = self.pods[step.name]
            for op in step.body:
                field = op["path"].rsplit("/", 1)[1]
                if op["op"] == "test":
                    assert pod["spec"].get(field, []) == op["value"], "json-patch test failed"
                else:
                    pod["spec"][field] = op["value"]
        elif step.kind == "delete-pod" or (step.kind == "evict-pod" and not step.body.dry_run):
            self.pods.pop(step.name, None)
        elif step.kind == "wait":
            raise RuntimeError(step.why)


def apply_all(api: FakeApi, steps: Sequence[steps.Step]) -> bool:
    for step in steps:
        try:
            api.run(step)
        except RuntimeError:
            return False
    return True


def gang_world(cluster_slices: list[dict[str, Any]], body: dict[str, Any], n: int) -> world.World:
    name = body["metadata"]["name"]
    return make_world(cluster_slices, [body], [member_pod(name, i) for i in range(n)])


def holding(
    name: str, ns: str, priority: int, nodes: Sequence[str], created: float, *, gpus: int = 4
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """A placed gang whose claims are allocated on ``nodes`` (``gpus`` whole GPUs each)."""
    members = {str(i): n for i, n in enumerate(nodes)}
    devices = {str(i): ",".join(f"gpu-{k}" for k in range(gpus)) for i in range(len(nodes))}
    st = {"phase": "Scheduled", "placement": {"id": "x", "domains": [], "members": members, "devices": devices}}
    body = gang_body(name, ns=ns, created=created, status_=st, members=len(nodes), gpusPerMember=gpus)
    pods = [member_pod(name, i, ns=ns, gated=False, node=n, priority=priority) for i, n in enumerate(nodes)]
    claim_objs = []
    for i, n in enumerate(nodes):
        results = [
            {"driver": "gpu.gpuplane.dev", "pool": n, "device": f"gpu-{k}", "request": "gpus"} for k in range(gpus)
        ]
        claim_objs.append(
            {
                "metadata": {
                    "name": f"{name}-{i}",
                    "namespace": ns,
                    "labels": {names.LABEL_MEMBER_INDEX: str(i)},
                    "annotations": {names.ANNOTATION_DECISION: "x"},
                    "ownerReferences": [{"apiVersion": names.GANG_API_VERSION, "kind": names.GANG_KIND, "name": name}],
                },
                "spec": {},
                "status": {"allocation": {"devices": {"results": results}}},
            }
        )
    return body, pods, claim_objs


def pods_bound(gang: str, n: int, bound: int) -> Iterator[dict[str, Any]]:
    for i in range(n):
        yield member_pod(gang, i, gated=False, node="hgx-0" if i < bound else "")


def shipped_classes(files: Sequence[str] = ("gpu.yaml", "mig.yaml")) -> dict[str, deviceclass.ClassView]:
    """The DeviceClasses of ``manifests/deviceclasses`` named by ``files`` (every one: ``("*.yaml",)``), by name,
    as users apply them and the class index keeps them."""
    root = Path(__file__).resolve().parents[1] / "manifests" / "deviceclasses"
    out = {}
    for pattern in files:
        for path in sorted(root.glob(pattern)):
            body = yaml.safe_load(path.read_text())
            out[body["metadata"]["name"]] = deviceclass.view(body)
    return out


@dataclasses.dataclass
class Flag:
    """A Leadership whose answer the test sets (and may flip, mid-test, to a new term)."""

    leading: bool = False
    term: int = 0

    def is_leader(self) -> bool:
        return self.leading
