"""Who is in a gang: which member a pod is, where its devices come from, and why a pod was not counted.

A gang's pods are written by hand or made from one template (an Indexed Job, a
JobSet, a training operator). Every member carries the gang label and the
gang's scheduling gate; what differs is how it says which member it is and who
makes its ResourceClaim:

* **named claim** (hand-written pods): ``resourceClaims[].resourceClaimName:
  <gang>-<i>``; ``i`` is the member index and the controller creates that claim,
  pinned to the chosen devices, once the gang is placed. A pod's
  ``resourceClaims`` cannot change after creation, so the pod names its claim up
  front; a gated pod may reference a claim that does not exist yet;
* **template** (every other pod): the claims come from
  ``resourceClaimTemplateName`` (kube-controller-manager makes one per pod,
  named in ``status.resourceClaimStatuses``) or from an extended resource such
  as ``nvidia.com/gpu`` (the scheduler makes it at binding). The controller
  creates nothing: it narrows the gated pod's required node affinity to the
  decided node and lifts the gate; the scheduler allocates there.

A template pod's member index, first rule that applies:

1. label ``gpuplane.dev/member-index``;
2. a JobSet pod (labels ``jobset.sigs.k8s.io/job-global-index`` and
   ``jobset.sigs.k8s.io/global-replicas``): ``global index x pods per Job +
   completion index``, where pods per Job is ``members / global-replicas`` (so
   every Job of the JobSet has as many pods);
3. a LeaderWorkerSet pod (label ``leaderworkerset.sigs.k8s.io/worker-index``, which
   LWS sets to 0 on the leader and to the ordinal on each worker): the worker index.
   One GpuGang is one LWS group: every group's pods carry the same template label,
   so a pod of group (``leaderworkerset.sigs.k8s.io/group-index``) other than 0 is a
   problem (give the LWS ``replicas: 1``, one LWS and one GpuGang per group), and so
   is a group size (annotation ``leaderworkerset.sigs.k8s.io/size``) other than the
   gang's ``members``;
4. an Indexed Job pod: label or annotation ``batch.kubernetes.io/job-completion-index``.

:func:`members_of` reads a gang's pods into :class:`Members` (live members by
index, failed ones whose index nobody took again, and why some pods count not).
Pure: pod dicts in, indices and problems out. A template member's claim is read as the claim index holds
it (:class:`gpuplane.controller.indexed.ClaimView`: its requests as written).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuplane.controller import indexed, names
from gpuplane.controller.gang.podview import (
    COMPLETION_INDEX,
    JOBSET_GLOBAL_INDEX,
    JOBSET_GLOBAL_REPLICAS,
    JOBSET_NAME,
    LWS_GROUP_INDEX,
    LWS_NAME,
    LWS_SIZE,
    LWS_WORKER_INDEX,
    MemberPodView,
)

__all__ = [
    "COMPLETION_INDEX",
    "JOBSET_GLOBAL_INDEX",
    "JOBSET_GLOBAL_REPLICAS",
    "JOBSET_NAME",
    "LWS_GROUP_INDEX",
    "LWS_NAME",
    "LWS_SIZE",
    "LWS_WORKER_INDEX",
    "MODE_NAMED",
    "MODE_TEMPLATE",
    "SYSTEM_NAMESPACES",
    "Identity",
    "MemberPod",
    "Members",
    "claim_shape_problem",
    "device_count",
    "gang_claim_names",
    "identity",
    "members_of",
    "named_claim_index",
    "uses_templates",
]

SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease", "gpuplane-system"})
"""Namespaces whose gangs gpuplane never preempts (issue 32; :mod:`gpuplane.controller.gang.preemption`)."""

MODE_NAMED = "named-claim"
MODE_TEMPLATE = "template"


@dataclass(frozen=True)
class Identity:
    """A pod's member index and claim mode, or why it has none (``problem``)."""

    index: int = -1
    mode: str = ""
    problem: str = ""


def _int(raw: Any) -> int | None:
    text = str(raw) if raw is not None else ""
    return int(text) if text.isdigit() else None


def named_claim_index(gang: str, pod: MemberPodView) -> int | None:
    """``i`` of a ``resourceClaimName: <gang>-<i>`` entry, if the pod has one."""
    pattern = re.compile(rf"^{re.escape(gang)}-(\d+)$")
    for ref in pod.claims:
        m = pattern.match(ref.claim)
        if m:
            return int(m.group(1))
    return None


def identity(gang: str, members: int, pod: MemberPodView) -> Identity:
    """The pod's member index in a gang of ``members`` (rules in the module docstring)."""
    labels, annotations, name = pod.labels, pod.annotations, pod.name
    named = named_claim_index(gang, pod)
    if named is not None:
        return Identity(named, MODE_NAMED)
    explicit = labels.get(names.LABEL_MEMBER_INDEX)
    if explicit is not None:
        value = _int(explicit)
        if value is None:
            return Identity(problem=f"pod {name}: label {names.LABEL_MEMBER_INDEX}={explicit!r} is not an index")
        return Identity(value, MODE_TEMPLATE)
    completion = _int(labels.get(COMPLETION_INDEX, annotations.get(COMPLETION_INDEX)))
    if JOBSET_GLOBAL_INDEX in labels:
        job = _int(labels.get(JOBSET_GLOBAL_INDEX))
        jobs = _int(labels.get(JOBSET_GLOBAL_REPLICAS))
        if job is None or not jobs:
            return Identity(
                problem=f"pod {name}: JobSet labels {JOBSET_GLOBAL_INDEX}/{JOBSET_GLOBAL_REPLICAS} unreadable"
            )
        if members % jobs:
            return Identity(
                problem=f"pod {name}: the gang's {members} members do not split evenly over the JobSet's {jobs} Jobs"
            )
        per_job = members // jobs
        local = completion if completion is not None else 0
        if local >= per_job:
            return Identity(
                problem=f"pod {name}: completion index {local} but the gang has {per_job} member(s) per Job "
                f"({members} members over {jobs} Jobs)"
            )
        return Identity(job * per_job + local, MODE_TEMPLATE)
    if LWS_WORKER_INDEX in labels:
        return _lws_identity(name, members, labels, annotations)
    if completion is not None:
        return Identity(completion, MODE_TEMPLATE)
    return Identity(
        problem=f"pod {name} says no member index: give it resourceClaimName {gang}-<index>, the label "
        f"{names.LABEL_MEMBER_INDEX}, or make it from an Indexed Job, a JobSet or a LeaderWorkerSet"
    )


def _lws_identity(name: str, members: int, labels: Mapping[str, Any], annotations: Mapping[str, Any]) -> Identity:
    """A LeaderWorkerSet pod's member index: its worker index (the leader is 0), in group 0 of a group as big."""
    worker = _int(labels.get(LWS_WORKER_INDEX))
    if worker is None:
        return Identity(problem=f"pod {name}: label {LWS_WORKER_INDEX}={labels.get(LWS_WORKER_INDEX)!r} unreadable")
    lws = labels.get(LWS_NAME, "?")
    group = labels.get(LWS_GROUP_INDEX)
    if group is not None and str(group) != "0":
        return Identity(
            problem=f"pod {name}: LeaderWorkerSet {lws} group {group}: a GpuGang places one LWS group; give the "
            "LWS replicas: 1 (one LeaderWorkerSet and one GpuGang per group)"
        )
    size = annotations.get(LWS_SIZE)
    if size is not None and _int(size) != members:
        return Identity(
            problem=f"pod {name}: LeaderWorkerSet {lws} has size {size} (leader and workers), the gang "
            f"{members} members; make leaderWorkerTemplate.size and the GpuGang agree"
        )
    return Identity(worker, MODE_TEMPLATE)


def uses_templates(pod: MemberPodView) -> bool:
    """Whether any claim of the pod comes from a ResourceClaimTemplate."""
    return any(r.template for r in pod.claims)


def device_count(claim: indexed.ClaimView, device_class: str) -> int | None:
    """Devices the claim asks of ``device_class`` (None: it asks for none of that class, or All)."""
    total = 0
    seen = False
    for req in claim.requests:
        exactly = req.get("exactly") or {}
        if exactly.get("deviceClassName") != device_class:
            continue
        if exactly.get("allocationMode") == "All":
            return None
        total += int(exactly.get("count") or 1)
        seen = True
    return total if seen else None


def claim_shape_problem(pod_name: str, claim: indexed.ClaimView, device_class: str, per_member: int) -> str:
    """Why a member's template claim (as the claim index holds it) does not match the gang ('' when it does)."""
    cname = claim.name
    got = device_count(claim, device_class)
    if got is None:
        return (
            f"pod {pod_name}: its claim {cname} asks no exact count of DeviceClass {device_class}; the gang "
            f"places {per_member} device(s) of it per member"
        )
    if got != per_member:
        return (
            f"pod {pod_name}: its claim {cname} asks {got} device(s) of {device_class}, the gang places "
            f"{per_member} per member; make the template and the GpuGang agree"
        )
    return ""


# --- member pods -----------------------------------------------------------------


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
    mode: str = MODE_NAMED  # named-claim: the controller makes <gang>-<i>; template: claims come with the pod
    claims: tuple[str, ...] = ()  # template mode: the pod's generated claims known so far
    controlled: bool = False  # a controller (Job, ...) owns it and may replace it
    job: str = ""  # the Job that controls it ('' when none does)
    priority: int = 0  # spec.priority, resolved by the API server from priorityClassName (0 when none)
    never_preempts: bool = False  # spec.preemptionPolicy: Never (resolved from the PriorityClass)

    @property
    def templated(self) -> bool:
        """Its claims are not the controller's to create."""
        return self.mode == MODE_TEMPLATE


@dataclass(frozen=True)
class Members:
    """Member pods by index, plus why some pods were not counted."""

    by_index: Mapping[int, MemberPod]
    problems: tuple[str, ...] = ()
    failed: Mapping[int, MemberPod] = field(default_factory=dict)  # terminal, and no live pod took the index

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

    @property
    def templated(self) -> bool:
        """Some member's claims come from a template (the controller creates none for it)."""
        return any(p.templated for p in self.by_index.values())

    @property
    def priority(self) -> int:
        """The gang's Kubernetes priority: its lowest member's (0 with no members).

        Only what the API server resolved from a PriorityClass counts; a GpuGang's own ``spec.priority``
        is a number its tenant picks and never orders or preempts across namespaces."""
        return min((p.priority for p in self.by_index.values()), default=0)

    @property
    def preempts(self) -> bool:
        """Whether the gang may preempt: no member's PriorityClass says ``preemptionPolicy: Never``."""
        return not any(p.never_preempts for p in self.by_index.values())


def _member(pod: MemberPodView, who: Identity) -> MemberPod:
    controller = pod.controller
    return MemberPod(
        name=pod.name,
        index=who.index,
        gated=names.SCHEDULING_GATE in pod.gates,
        node=pod.node,
        phase=pod.phase or "Pending",
        uid=pod.uid,
        affinity=pod.affinity,
        gates=pod.gates,
        mode=who.mode,
        claims=pod.given if who.mode == MODE_TEMPLATE else (),
        controlled=controller is not None,
        job=controller[1] if controller is not None and controller[0] == "Job" else "",
        priority=pod.priority,
        never_preempts=pod.never_preempts,
    )


def members_of(gang: str, member_count: int, pods: Iterable[MemberPodView]) -> Members:
    """Member pods of ``gang``: live pods with the gang label and a member index (rules above)."""
    by_index: dict[int, MemberPod] = {}
    failed: dict[int, MemberPod] = {}
    problems: list[str] = []
    for pod in sorted(pods, key=lambda p: p.name):
        if pod.gang != gang or pod.deleting:
            continue
        name = pod.name
        who = identity(gang, member_count, pod)
        if who.problem:
            problems.append(who.problem)
            continue
        if who.index >= member_count:
            problems.append(f"pod {name} claims member index {who.index}, but the gang has {member_count} members")
            continue
        if pod.phase in ("Succeeded", "Failed"):
            if pod.phase == "Failed":
                failed.setdefault(who.index, _member(pod, who))
            continue
        if who.index in by_index:
            problems.append(f"pods {by_index[who.index].name} and {name} both claim member index {who.index}")
            continue
        by_index[who.index] = _member(pod, who)
    for index in by_index:
        failed.pop(index, None)
    return Members(by_index=by_index, problems=tuple(problems), failed=failed)


def gang_claim_names(gang: str, claim_names: Sequence[str]) -> list[str]:
    """Which of ``claim_names`` are member claims of ``gang``."""
    pattern = re.compile(rf"^{re.escape(gang)}-\d+$")
    return [c for c in claim_names if pattern.match(c)]
