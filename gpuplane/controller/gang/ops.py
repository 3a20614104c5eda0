"""Gangs, purely: member pods in, the all-or-nothing sequence of idempotent API writes out.

How a member pod joins a gang (the contract users and Job templates follow):

* label ``gpuplane.dev/gang: <gang>``;
* scheduling gate ``gpuplane.dev/gang``;
* ``spec.resourceClaims: [{name: gpus, resourceClaimName: <gang>-<i>}]`` with a
  distinct ``i`` in ``0 .. members-1``. A pod's ``resourceClaims`` cannot change
  after creation, so the pod names its claim up front; the claim itself is
  created by the controller only when the whole gang is placed (a gated pod may
  reference a claim that does not exist yet). ``i`` is the member index.

Applying a placement is a list of :class:`Step` computed from what the API
shows now, in this order: the decision is already in the gang's status (the
caller writes it first), then every member's claim is created (deterministic
name, ownerReference to the gang, the decision id in an annotation), then
every pod's required node affinity is narrowed to its node, then every gate is
lifted. A step that is already done is not emitted, so recomputing the list
after a crash at any point yields exactly the remaining writes; gates are only
lifted once every claim and affinity is in place.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuplane.controller import names
from gpuplane.controller.gang import spec as gangspec
from gpuplane.controller.placement import model
from gpuplane.driver.api import names as dn

HOSTNAME_LABEL = "kubernetes.io/hostname"


# --- member discovery -----------------------------------------------------------


@dataclass(frozen=True)
class MemberPod:
    """A member pod as the controller sees it."""

    name: str
    index: int
    gated: bool
    node: str  # spec.nodeName ('' while unbound)
    phase: str
    uid: str
    affinity: Mapping[str, Any] | None
    gates: tuple[str, ...]


@dataclass(frozen=True)
class Members:
    """Member pods by index, plus why some pods were not counted."""

    by_index: Mapping[int, MemberPod]
    problems: tuple[str, ...] = ()

    def complete(self, count: int) -> bool:
        """Every index 0..count-1 has a pod."""
        return all(i in self.by_index for i in range(count))

    @property
    def bound(self) -> int:
        """Members the scheduler has bound to a node."""
        return sum(1 for p in self.by_index.values() if p.node)

    @property
    def running(self) -> int:
        """Members in phase Running."""
        return sum(1 for p in self.by_index.values() if p.phase == "Running")


def _claim_index(gang: str, pod: Mapping[str, Any]) -> int | None:
    pattern = re.compile(rf"^{re.escape(gang)}-(\d+)$")
    for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
        m = pattern.match(str(ref.get("resourceClaimName") or ""))
        if m:
            return int(m.group(1))
    return None


def members_of(gang: str, member_count: int, pods: Iterable[Mapping[str, Any]]) -> Members:
    """Member pods of ``gang``: live pods with the gang label and a claim named ``<gang>-<i>``."""
    by_index: dict[int, MemberPod] = {}
    problems: list[str] = []
    for pod in sorted(pods, key=lambda p: (p.get("metadata") or {}).get("name", "")):
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        if (meta.get("labels") or {}).get(names.LABEL_GANG) != gang:
            continue
        if meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
            continue
        name = meta.get("name", "")
        index = _claim_index(gang, pod)
        if index is None:
            problems.append(f"pod {name} has no resourceClaims entry with resourceClaimName {gang}-<index>")
            continue
        if index >= member_count:
            problems.append(f"pod {name} claims member index {index}, but the gang has {member_count} members")
            continue
        if index in by_index:
            problems.append(f"pods {by_index[index].name} and {name} both claim member index {index}")
            continue
        gates = tuple(g.get("name", "") for g in spec.get("schedulingGates") or [])
        by_index[index] = MemberPod(
            name=name,
            index=index,
            gated=names.SCHEDULING_GATE in gates,
            node=spec.get("nodeName") or "",
            phase=status.get("phase") or "Pending",
            uid=meta.get("uid", ""),
            affinity=spec.get("affinity"),
            gates=gates,
        )
    return Members(by_index=by_index, problems=tuple(problems))


# --- decisions in status ----------------------------------------------------------


def decision_id(decision: model.Decision) -> str:
    """A short stable id of a placement (same placement, same id, on any replica)."""
    text = ";".join(
        f"{m.member}@{m.node}:{','.join(m.gpus)}:{','.join(f'{s.gpu}/{s.profile}/{s.start}' for s in m.mig)}"
        for m in sorted(decision.members, key=lambda m: m.member)
    )
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _device(gpu_id: str) -> str:
    return gpu_id.split("/", 1)[1] if "/" in gpu_id else gpu_id


def placement_status(decision: model.Decision) -> dict[str, Any]:
    """The compact status form: member -> node and member -> devices, as string maps."""
    members: dict[str, str] = {}
    devices: dict[str, str] = {}
    for m in decision.members:
        members[str(m.member)] = m.node
        parts = [_device(g) for g in m.gpus] + [f"{_device(s.gpu)}:{s.profile}@{s.start}" for s in m.mig]
        devices[str(m.member)] = ",".join(parts)
    return {
        "id": decision_id(decision),
        "domains": list(decision.domains),
        "members": members,
        "devices": devices,
    }


def decision_from_status(
    request_id: str, placement: Mapping[str, Any] | None, domains_of: Mapping[str, str]
) -> model.Decision | None:
    """Inverse of :func:`placement_status`; ``domains_of`` maps GPU id -> domain (unknown GPUs keep '')."""
    if not placement or not placement.get("members"):
        return None
    out: list[model.MemberPlacement] = []
    for key, node in sorted(placement["members"].items(), key=lambda kv: int(kv[0])):
        gpus: list[str] = []
        mig: list[model.MigSlot] = []
        for part in filter(None, str((placement.get("devices") or {}).get(key, "")).split(",")):
            if ":" in part:
                dev, rest = part.split(":", 1)
                profile, _, start = rest.partition("@")
                mig.append(model.MigSlot(gpu=f"{node}/{dev}", profile=profile, start=int(start or 0)))
            else:
                gpus.append(f"{node}/{part}")
        first = gpus[0] if gpus else (mig[0].gpu if mig else "")
        out.append(
            model.MemberPlacement(
                member=int(key), node=node, domain=domains_of.get(first, ""), gpus=tuple(gpus), mig=tuple(mig)
            )
        )
    return model.Decision(request_id=request_id, members=tuple(out))


# --- desired objects --------------------------------------------------------------------


@dataclass(frozen=True)
class GangRef:
    """Identity of a gang for owner references and names."""

    namespace: str
    name: str
    uid: str

    @property
    def key(self) -> str:
        """ "ns/name"."""
        return f"{self.namespace}/{self.name}"


def _minor(device: str) -> int | None:
    tail = device.rsplit("-", 1)[-1]
    return int(tail) if device.startswith("gpu-") and tail.isdigit() and device.count("-") == 1 else None


def claim_selectors(spec: gangspec.GangSpec, placement: model.MemberPlacement, driver_profile: str | None) -> list[str]:
    """CEL selectors for a member's claim: the gang's, its NVLink domain, and the chosen devices."""
    attrs = f'device.attributes["{dn.DRIVER_NAME}"]'
    out = list(spec.selectors)
    out.append(f'{attrs}.{dn.ATTR_NVLINK_DOMAIN} == "{placement.domain}"')
    if placement.mig:
        slot = placement.mig[0]
        parent = _minor(_device(slot.gpu))
        if driver_profile:
            out.append(f'{attrs}.{dn.ATTR_MIG_PROFILE} == "{driver_profile}"')
        if parent is not None:
            out.append(f"{attrs}.{dn.ATTR_PARENT_MINOR} == {parent} && {attrs}.{dn.ATTR_MIG_PLACEMENT} == {slot.start}")
    else:
        minors = [m for m in (_minor(_device(g)) for g in placement.gpus) if m is not None]
        if minors and len(minors) == len(placement.gpus):
            out.append(f"{attrs}.{dn.ATTR_MINOR} in [{', '.join(str(m) for m in sorted(minors))}]")
    return out


def desired_claim(
    gang: GangRef,
    spec: gangspec.GangSpec,
    placement: model.MemberPlacement,
    decision: str,
    driver_profile: str | None = None,
) -> dict[str, Any]:
    """The ResourceClaim for one member, pinned to its domain (CEL) and kept in one domain (matchAttribute)."""
    count = spec.devices_per_member
    exactly: dict[str, Any] = {
        "deviceClassName": spec.device_class,
        "allocationMode": "ExactCount",
        "count": count,
        "selectors": [{"cel": {"expression": e}} for e in claim_selectors(spec, placement, driver_profile)],
    }
    devices: dict[str, Any] = {"requests": [{"name": names.CLAIM_REQUEST, "exactly": exactly}]}
    if count > 1:
        devices["constraints"] = [{"requests": [names.CLAIM_REQUEST], "matchAttribute": names.MATCH_ATTRIBUTE_DOMAIN}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": names.claim_name(gang.name, placement.member),
            "namespace": gang.namespace,
            "labels": {names.LABEL_GANG: gang.name, names.LABEL_MEMBER_INDEX: str(placement.member)},
            "annotations": {names.ANNOTATION_DECISION: decision},
            "ownerReferences": [
                {
                    "apiVersion": names.GANG_API_VERSION,
                    "kind": names.GANG_KIND,
                    "name": gang.name,
                    "uid": gang.uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {"devices": devices},
    }


def _host_expr(node: str) -> dict[str, Any]:
    return {"key": HOSTNAME_LABEL, "operator": "In", "values": [node]}


def narrowed_affinity(affinity: Mapping[str, Any] | None, node: str) -> dict[str, Any] | None:
    """``affinity`` with every required node-selector term narrowed to ``node`` (None: already narrowed).

    Only narrowing is allowed on a gated pod: a term gains a matchExpression; an
    absent required section is created with one term.
    """
    aff = dict(affinity or {})
    na = dict(aff.get("nodeAffinity") or {})
    req = dict(na.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = [dict(t) for t in req.get("nodeSelectorTerms") or []]
    if not terms:
        terms = [{"matchExpressions": [_host_expr(node)]}]
    else:
        changed = False
        for t in terms:
            exprs = list(t.get("matchExpressions") or [])
            if _host_expr(node) not in exprs:
                exprs.append(_host_expr(node))
                changed = True
            t["matchExpressions"] = exprs
        if not changed:
            return None
    req["nodeSelectorTerms"] = terms
    na["requiredDuringSchedulingIgnoredDuringExecution"] = req
    aff["nodeAffinity"] = na
    return aff


def pinned_elsewhere(affinity: Mapping[str, Any] | None, node: str) -> str | None:
    """The node a pod's affinity already narrows it to, if that is not ``node`` (it cannot be widened)."""
    req = ((affinity or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    for t in req.get("nodeSelectorTerms") or []:
        for e in t.get("matchExpressions") or []:
            if e.get("key") == HOSTNAME_LABEL and e.get("operator") == "In" and node not in (e.get("values") or []):
                return ",".join(e.get("values") or [])
    return None


# --- steps ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One idempotent API write. ``kind``: create-claim, delete-claim, patch-pod, delete-pod, wait."""

    kind: str
    name: str
    body: Any = None
    why: str = ""


@dataclass(frozen=True)
class ExistingClaim:
    """A claim named like a member claim, as observed."""

    name: str
    decision: str
    deleting: bool
    owned: bool  # controlled by this gang


@dataclass(frozen=True)
class ApplyPlan:
    """Steps to converge on a decision; ``blocked`` says why gates cannot be lifted (yet)."""

    steps: tuple[Step, ...]
    blocked: str = ""
    problems: tuple[str, ...] = field(default_factory=tuple)

    @property
    def done(self) -> bool:
        """Nothing left to write and nothing blocking."""
        return not self.steps and not self.blocked


def apply_steps(
    gang: GangRef,
    spec: gangspec.GangSpec,
    decision: model.Decision,
    members: Members,
    claims: Mapping[str, ExistingClaim],
    *,
    driver_profile: str | None = None,
) -> ApplyPlan:
    """The remaining writes that make the API match ``decision`` (claims, then affinities, then gates)."""
    did = decision_id(decision)
    claim_steps: list[Step] = []
    affinity_steps: list[Step] = []
    gate_steps: list[Step] = []
    problems: list[str] = []
    blocked = ""
    for placement in sorted(decision.members, key=lambda m: m.member):
        cname = names.claim_name(gang.name, placement.member)
        have = claims.get(cname)
        if have is not None and (have.decision != did or not have.owned):
            if not have.owned:
                blocked = f"claim {cname} exists and is not owned by gang {gang.name}"
                problems.append(blocked)
            elif not have.deleting:
                claim_steps.append(Step("delete-claim", cname, why=f"left from an earlier decision {have.decision}"))
                blocked = blocked or f"waiting for stale claim {cname} to go"
            else:
                blocked = blocked or f"waiting for stale claim {cname} to go"
        elif have is None:
            body = desired_claim(gang, spec, placement, did, driver_profile)
            claim_steps.append(Step("create-claim", cname, body, why=f"member {placement.member} on {placement.node}"))
        pod = members.by_index.get(placement.member)
        if pod is None:
            blocked = blocked or f"member {placement.member} has no pod"
            continue
        if pod.node and pod.node != placement.node:
            problems.append(f"pod {pod.name} is bound to {pod.node}, the decision says {placement.node}")
            continue
        elsewhere = pinned_elsewhere(pod.affinity, placement.node)
        if elsewhere:
            blocked = blocked or f"pod {pod.name} is already narrowed to {elsewhere}; recreate it"
            problems.append(blocked)
            continue
        if pod.gated:
            aff = narrowed_affinity(pod.affinity, placement.node)
            if aff is not None:
                affinity_steps.append(
                    Step(
                        "patch-pod",
                        pod.name,
                        [{"op": "add", "path": "/spec/affinity", "value": aff}],
                        why=f"narrow to node {placement.node}",
                    )
                )
            remaining = [{"name": g} for g in pod.gates if g != names.SCHEDULING_GATE]
            gate_steps.append(
                Step(
                    "patch-pod",
                    pod.name,
                    [
                        {"op": "test", "path": "/spec/schedulingGates", "value": [{"name": g} for g in pod.gates]},
                        {"op": "replace", "path": "/spec/schedulingGates", "value": remaining},
                    ],
                    why="lift the gang gate",
                )
            )
    steps = claim_steps + affinity_steps
    if blocked:
        steps.append(Step("wait", gang.name, why=blocked))
    else:
        steps.extend(gate_steps)
    return ApplyPlan(steps=tuple(steps), blocked=blocked, problems=tuple(problems))


def release_steps(
    gang: GangRef,
    members: Members,
    claims: Iterable[str],
    grace_seconds: int | None,
    why: str,
) -> tuple[Step, ...]:
    """Writes that release a gang (timeout, preemption): delete its member pods, then its claims."""
    steps = [Step("delete-pod", p.name, grace_seconds, why=why) for p in members.by_index.values()]
    steps.extend(Step("delete-claim", c, why=why) for c in sorted(claims))
    return tuple(steps)


def gang_claim_names(gang: str, claim_names: Sequence[str]) -> list[str]:
    """Which of ``claim_names`` are member claims of ``gang``."""
    pattern = re.compile(rf"^{re.escape(gang)}-\d+$")
    return [c for c in claim_names if pattern.match(c)]
