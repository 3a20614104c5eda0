"""The invariants the chaos e2e asserts once the cluster is quiet: the API against each node's own state.

:func:`read_node` reads what a node's driver left on the node, through the production code's own
readers: its checkpoint (``checkpoint.decode``, integrity-checked), its CDI specs
(``cdi.list_claim_specs``), the simulator's MIG instances (``sim_cli show``, run in this process),
the per-claim MPS directories and the live MPS control daemons (``MpsProcesses.scan``: ``/proc``
and the daemons' environment). :func:`read_api` reads the pods, claims and Events. :func:`check` is pure and
returns a :class:`Verdict`: how many checks it made and every violation, each a sentence naming
the object. The invariants:

1. **Prepared exactly once.** Every Running pod's claim is allocated, reserved for the pod and on
   the pod's node; the claim is ``PrepareCompleted`` in that node's checkpoint with exactly the
   allocated devices, in no other node's checkpoint, and has exactly one CDI spec (on that node);
   a MIG device's instance exists exactly once; an MPS claim has exactly one live daemon.
2. **Nothing without an owner.** Every checkpoint entry belongs to a claim that exists (same uid)
   and is allocated on that node (none is left ``PrepareStarted``); every CDI spec, MIG instance,
   MPS directory and MPS daemon belongs to a completed checkpoint entry.
3. **Nothing held twice.** A GPU prepared for an exclusive claim is prepared for no other; a MIG
   instance belongs to one claim; the shares the scheduler allocated on a GPU sum to at most 100 %.
4. **Every pending claim explained.** A claim without an allocation carries the controller's
   reason (the ``gpuplane.dev/unallocated-reason`` annotation or a ``NotAllocated`` Event); a pod
   whose claims are allocated but that does not run has an Event saying why.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from kubernetes import client

from e2e.plane.simnode_plan import SimNode
from gpuplane.api import names
from gpuplane.driver.hw import sim_cli
from gpuplane.driver.prepare import cdi, checkpoint
from gpuplane.driver.sharing.mps_procs import MpsProcesses
from gpuplane.driver.sharing.mps_spec import CLAIM_UID

EXPLAINED_ANNOTATION = "gpuplane.dev/unallocated-reason"
NOT_ALLOCATED = "NotAllocated"
POD_REASONS = ("FailedPrepareDynamicResources", "FailedScheduling")
SHARE = "sharePercent"


@dataclasses.dataclass(frozen=True)
class NodeView:
    """What one node's driver left on the node."""

    name: str
    checkpoint: checkpoint.Checkpoint
    cdi_claims: frozenset[str]  # claim uids with a CDI spec
    mig_instances: tuple[tuple[str, int], ...]  # (parent GPU uuid, GI id), one per instance in the simulator
    mps_dirs: frozenset[str]  # claim uids with a directory under the MPS root
    mps_daemons: tuple[str, ...]  # claim uid of each live control daemon


@dataclasses.dataclass(frozen=True)
class ApiView:
    """Pods and Events of the workload's namespace; every ResourceClaim of the cluster."""

    namespace: str
    pods: Sequence[Mapping[str, Any]]
    claims: Sequence[Mapping[str, Any]]
    events: Sequence[Mapping[str, Any]]


@dataclasses.dataclass
class Verdict:
    """How many checks were made and what failed."""

    checks: int = 0
    violations: list[str] = dataclasses.field(default_factory=list)

    def expect(self, ok: bool, violation: str) -> None:
        """One check: count it; keep ``violation`` if it failed."""
        self.checks += 1
        if not ok:
            self.violations.append(violation)


def read_node(node: SimNode, mps_binary: str) -> NodeView:
    """The node's checkpoint, CDI specs, MIG instances, MPS directories and MPS daemons."""
    cp = checkpoint.decode(node.checkpoint.read_bytes()) if node.checkpoint.exists() else checkpoint.Checkpoint()
    shown = sim_cli.run(["--state-dir", str(node.sim_state_dir), "show"])  # ``sim_cli show``, in this process
    gpus = cast(dict[str, Any], shown).get("gpus", {})
    instances = tuple((uuid, int(gi["gi_id"])) for uuid, gpu in sorted(gpus.items()) for gi in gpu.get("gis") or [])
    root = node.mps_root.absolute()
    dirs = frozenset(p.name for p in root.iterdir() if p.is_dir() and CLAIM_UID.match(p.name)) if root.is_dir() else ()
    daemons = tuple(pipe.parent.name for _, pipe in MpsProcesses(Path(mps_binary).name, root, Path("/proc")).scan(None))
    return NodeView(node.name, cp, frozenset(cdi.list_claim_specs(node.cdi_root)), instances, frozenset(dirs), daemons)


def read_api(api: client.ApiClient, namespace: str) -> ApiView:
    """The namespace's pods and Events, and every ResourceClaim (plain dicts, as the API serves them)."""
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    plain: Callable[[object], dict[str, Any]] = api.sanitize_for_serialization
    pods = plain(core.list_namespaced_pod(namespace))["items"]
    events = plain(core.list_namespaced_event(namespace))["items"]
    claims = cast(dict[str, Any], custom.list_cluster_custom_object("resource.k8s.io", "v1", "resourceclaims"))["items"]
    return ApiView(namespace=namespace, pods=pods, claims=claims, events=events)


def pod_claim_names(pod: Mapping[str, Any]) -> list[str]:
    """The ResourceClaim names a pod uses (direct references and the ones made from its templates)."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    made = {s.get("name"): s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []}
    out = []
    for ref in spec.get("resourceClaims") or []:
        name = ref.get("resourceClaimName") or made.get(ref.get("name"))
        out.append(str(name) if name else f"<not yet made for {ref.get('name')}>")
    return out


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return cast(Mapping[str, Any], obj.get("metadata") or {})


def _results(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    alloc = (claim.get("status") or {}).get("allocation") or {}
    return [r for r in (alloc.get("devices") or {}).get("results") or [] if r.get("driver") == names.DRIVER_NAME]


def _is_allocated(claim: Mapping[str, Any]) -> bool:
    return bool((claim.get("status") or {}).get("allocation"))


def _share(result: Mapping[str, Any]) -> float:
    raw = (result.get("consumedCapacity") or {}).get(SHARE)
    try:
        return float(raw) if raw is not None else 100.0
    except ValueError:
        return 100.0


def check(
    api: ApiView, nodes: Sequence[NodeView], must_run: Callable[[Mapping[str, Any]], bool] = lambda _: False
) -> Verdict:
    """Every invariant of the module docstring over one reading of API and nodes; pods ``must_run`` must run."""
    v = Verdict()
    by_uid = {str(_meta(c).get("uid")): c for c in api.claims}
    by_key = {f"{_meta(c).get('namespace')}/{_meta(c).get('name')}": c for c in api.claims}
    views = {n.name: n for n in nodes}
    _prepared_exactly_once(v, api, by_key, views)
    for node in nodes:
        _owned(v, node, by_uid)
        _not_twice(v, node)
    _shares(v, api.claims)
    _explained(v, api, by_key)
    _claims_have_pods(v, api)
    for pod in api.pods:
        if must_run(pod) and not _meta(pod).get("deletionTimestamp"):
            phase = (pod.get("status") or {}).get("phase")
            v.expect(phase == "Running", f"pod {api.namespace}/{_meta(pod).get('name')} is {phase}, not Running")
    return v


def terminating(api: ApiView) -> list[str]:
    """The workload's pods and claims that are being deleted (a quiet cluster has none left)."""
    mine = [c for c in api.claims if _meta(c).get("namespace") == api.namespace]
    return [
        f"{kind} {api.namespace}/{_meta(o).get('name')} (deleted at {_meta(o).get('deletionTimestamp')})"
        for kind, objs in (("pod", api.pods), ("claim", mine))
        for o in objs
        if _meta(o).get("deletionTimestamp")
    ]


def _claims_have_pods(v: Verdict, api: ApiView) -> None:
    """A claim made for a pod goes with it (kube-controller-manager deletes it once the pod is gone)."""
    pods = {str(_meta(p).get("uid")) for p in api.pods}
    for claim in api.claims:
        meta = _meta(claim)
        if meta.get("namespace") != api.namespace or meta.get("deletionTimestamp"):
            continue
        owners = {str(o.get("uid")) for o in meta.get("ownerReferences") or [] if o.get("kind") == "Pod"}
        v.expect(not owners or bool(owners & pods), f"claim {api.namespace}/{meta.get('name')} outlives its pod")


def _prepared_exactly_once(
    v: Verdict, api: ApiView, by_key: Mapping[str, Mapping[str, Any]], views: Mapping[str, NodeView]
) -> None:
    for pod in api.pods:
        meta, spec = _meta(pod), pod.get("spec") or {}
        if (pod.get("status") or {}).get("phase") != "Running" or meta.get("deletionTimestamp"):
            continue
        who, node_name = f"pod {meta.get('namespace')}/{meta.get('name')}", str(spec.get("nodeName") or "")
        v.expect(node_name in views, f"{who} runs on {node_name!r}, not one of the chaos nodes")
        for name in pod_claim_names(pod):
            claim = by_key.get(f"{meta.get('namespace')}/{name}")
            v.expect(claim is not None, f"{who}: its claim {name} does not exist")
            if claim is None:
                continue
            uid = str(_meta(claim).get("uid"))
            reserved = {r.get("uid") for r in (claim.get("status") or {}).get("reservedFor") or []}
            v.expect(_is_allocated(claim), f"{who}: claim {name} runs unallocated")
            v.expect(meta.get("uid") in reserved, f"{who}: claim {name} is not reserved for the pod")
            results = _results(claim)
            pools = {str(r.get("pool")) for r in results}
            v.expect(pools <= {node_name}, f"{who} on {node_name}: claim {name} is allocated on {sorted(pools)}")
            holders = [n for n in views.values() if uid in n.checkpoint.claims]
            v.expect(
                [n.name for n in holders] == [node_name],
                f"{who}: claim {name} is in the checkpoint of {[n.name for n in holders]}, want [{node_name}]",
            )
            specs = [n.name for n in views.values() if uid in n.cdi_claims]
            v.expect(specs == [node_name], f"{who}: claim {name} has CDI specs on {specs}, want [{node_name}]")
            node = views.get(node_name)
            rec = node.checkpoint.claims.get(uid) if node else None
            if node is None or rec is None:
                continue
            v.expect(rec.phase == "PrepareCompleted", f"{who}: claim {name} is {rec.phase} on {node_name}")
            want = sorted((str(r.get("pool")), str(r.get("device"))) for r in results)
            got = sorted((d.pool, d.device) for d in rec.devices)
            v.expect(got == want, f"{who}: claim {name} prepared {got} on {node_name}, allocated {want}")
            for dev in rec.devices:
                if dev.kind == "mig":
                    key = (dev.mig.parent_uuid, dev.mig.gi_id) if dev.mig else ("?", -1)
                    found = node.mig_instances.count(key)
                    v.expect(found == 1, f"{who}: MIG device {dev.device} of claim {name}: {found} instances {key}")
            if rec.sharing.strategy == "MPS":
                found = node.mps_daemons.count(uid)
                v.expect(found == 1, f"{who}: MPS claim {name} has {found} live control daemons on {node_name}")


def _owned(v: Verdict, node: NodeView, by_uid: Mapping[str, Mapping[str, Any]]) -> None:
    done = {uid for uid, rec in node.checkpoint.claims.items() if rec.phase == "PrepareCompleted"}
    for uid, rec in node.checkpoint.claims.items():
        where = f"{node.name}: checkpoint entry {rec.namespace}/{rec.name} ({uid})"
        claim = by_uid.get(uid)
        v.expect(claim is not None, f"{where} has no ResourceClaim")
        v.expect(rec.phase == "PrepareCompleted", f"{where} is left {rec.phase}")
        if claim is not None:
            pools = {str(r.get("pool")) for r in _results(claim)}
            v.expect(_is_allocated(claim) and node.name in pools, f"{where}: its claim is not allocated here")
    for uid in sorted(node.cdi_claims):
        v.expect(uid in done, f"{node.name}: CDI spec of claim {uid} without a completed checkpoint entry")
    owned_gis = [
        (d.mig.parent_uuid, d.mig.gi_id)
        for uid in done
        for d in node.checkpoint.claims[uid].devices
        if d.kind == "mig" and d.mig is not None
    ]
    for gi in node.mig_instances:
        v.expect(gi in owned_gis, f"{node.name}: MIG instance {gi[1]} on {gi[0]} has no owner claim")
    mps_owners = {uid for uid in done if node.checkpoint.claims[uid].mps_daemon}
    for uid in sorted(node.mps_dirs):
        v.expect(uid in mps_owners, f"{node.name}: MPS directory of claim {uid} without an owner claim")
    for uid in node.mps_daemons:
        v.expect(uid in mps_owners, f"{node.name}: MPS control daemon of claim {uid} without an owner claim")


def _not_twice(v: Verdict, node: NodeView) -> None:
    users: dict[str, list[tuple[str, str]]] = collections.defaultdict(list)
    gis: dict[tuple[str, int], list[str]] = collections.defaultdict(list)
    for uid, rec in node.checkpoint.claims.items():
        for dev in rec.devices:
            if dev.kind == "gpu":
                users[dev.device].append((uid, rec.sharing.strategy))
            elif dev.mig is not None and dev.mig.gi_id is not None:
                gis[(dev.mig.parent_uuid, dev.mig.gi_id)].append(uid)
    for device, held in sorted(users.items()):
        exclusive = [uid for uid, strategy in held if strategy == "Exclusive"]
        v.expect(not exclusive or len(held) == 1, f"{node.name}: {device} is exclusive to {exclusive} but held {held}")
    for gi, owners in sorted(gis.items()):
        v.expect(len(owners) == 1, f"{node.name}: MIG instance {gi} belongs to {len(owners)} claims {owners}")


def _shares(v: Verdict, claims: Iterable[Mapping[str, Any]]) -> None:
    total: dict[tuple[str, str], float] = collections.defaultdict(float)
    for claim in claims:
        for r in _results(claim):
            if "-mig-" not in str(r.get("device")):
                total[(str(r.get("pool")), str(r.get("device")))] += _share(r)
    for (pool, device), share in sorted(total.items()):
        v.expect(share <= 100.0, f"{pool}/{device}: claims allocated {share:.0f} % of it")


def _explained(v: Verdict, api: ApiView, by_key: Mapping[str, Mapping[str, Any]]) -> None:
    reasons: dict[tuple[str, str], set[str]] = collections.defaultdict(set)
    for event in api.events:
        involved = event.get("involvedObject") or {}
        reasons[(str(involved.get("kind")), str(involved.get("name")))].add(str(event.get("reason")))
    for pod in api.pods:
        meta = _meta(pod)
        if meta.get("deletionTimestamp"):
            continue
        ns, who = meta.get("namespace"), f"pod {meta.get('namespace')}/{meta.get('name')}"
        claims = [by_key.get(f"{ns}/{n}") for n in pod_claim_names(pod)]
        for name, claim in zip(pod_claim_names(pod), claims, strict=True):
            if claim is None or _is_allocated(claim):
                continue
            said = (_meta(claim).get("annotations") or {}).get(EXPLAINED_ANNOTATION)
            evented = NOT_ALLOCATED in reasons[("ResourceClaim", name)]
            v.expect(bool(said) or evented, f"{who}: claim {name} is pending and nothing says why")
        running = (pod.get("status") or {}).get("phase") == "Running"
        if claims and all(c is not None and _is_allocated(c) for c in claims) and not running:
            told = reasons[("Pod", str(meta.get("name")))] & set(POD_REASONS)
            v.expect(bool(told), f"{who}: its claims are allocated, it does not run, and no Event says why")
