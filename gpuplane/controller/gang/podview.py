"""A gang's member pod as the member-pod index keeps it: parsed once, at the informer, into a typed view. Pure.

The member-pod index (:mod:`gpuplane.controller.caches`, pods with the gang label) keeps a
:class:`MemberPodView`, not the pod: what :mod:`~gpuplane.controller.gang.membership` reads to tell which
member a pod is and what state it is in: its identity and gang, whether it is being deleted, the labels
and annotations a member index is read from (gpuplane's, an Indexed Job's, a JobSet's, a LeaderWorkerSet's;
no other key: a pod's owner may write 256 KiB of them), its claims (``spec.resourceClaims``) and the claims
it was given (``status.resourceClaimStatuses``, the extended-resource claim), its scheduling gates, node,
phase, its affinity as written (gate lifting writes it back whole), its controller, and the priority and
preemption policy the API server resolved from its PriorityClass. Total on any body: a field of the wrong
type reads as absent.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuplane.api.boundedjson import empty, mapping, mappings, strings, text
from gpuplane.controller import indexed, names

COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
JOBSET_GLOBAL_INDEX = "jobset.sigs.k8s.io/job-global-index"
JOBSET_GLOBAL_REPLICAS = "jobset.sigs.k8s.io/global-replicas"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
LWS_SIZE = "leaderworkerset.sigs.k8s.io/size"
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"

LABELS = (
    names.LABEL_GANG,
    names.LABEL_MEMBER_INDEX,
    COMPLETION_INDEX,
    JOBSET_GLOBAL_INDEX,
    JOBSET_GLOBAL_REPLICAS,
    JOBSET_NAME,
    LWS_WORKER_INDEX,
    LWS_GROUP_INDEX,
    LWS_NAME,
)
ANNOTATIONS = (COMPLETION_INDEX, LWS_SIZE)
PRIORITY_BOUND = 2_000_001_000  # the API server's limit (system-node-critical); anything past it is not a priority


@dataclass(frozen=True, slots=True)
class MemberPodView:
    """A pod with the gang label, as the gang reads it; read-only."""

    name: str
    namespace: str = ""
    uid: str = ""
    labels: Mapping[str, str] = field(default_factory=empty)  # the keys of :data:`LABELS` only
    annotations: Mapping[str, str] = field(default_factory=empty)  # the keys of :data:`ANNOTATIONS` only
    deleting: bool = False  # deletionTimestamp is set
    claims: tuple[indexed.PodClaimRef, ...] = ()  # spec.resourceClaims
    given: tuple[str, ...] = ()  # the claims its template entries and extended resources were given
    gates: tuple[str, ...] = ()  # spec.schedulingGates, in order
    node: str = ""  # spec.nodeName ("" while unbound)
    phase: str = ""  # status.phase ("" when absent)
    affinity: Mapping[str, Any] | None = None  # spec.affinity as written (read-only; gate lifting copies it)
    controller: tuple[str, str] | None = None  # (kind, name) of the owner reference marked controller
    priority: int = 0  # spec.priority, resolved by the API server from priorityClassName (0 when none)
    never_preempts: bool = False  # spec.preemptionPolicy: Never (resolved from the PriorityClass)

    @property
    def gang(self) -> str:
        """The gang label's value ("" when absent)."""
        return self.labels.get(names.LABEL_GANG, "")

    @property
    def gang_key(self) -> str:
        """``namespace/gang``: the GpuGang the pod joins ("" without the label)."""
        return f"{self.namespace}/{self.gang}" if self.gang else ""


def priority_of(raw: Any) -> int:
    """A pod's Kubernetes priority from ``spec.priority``, which the API server's Priority admission writes
    from the pod's ``priorityClassName`` (and refuses when a pod states another number); 0 when absent or
    unreadable."""
    if isinstance(raw, bool) or not isinstance(raw, int) or abs(raw) > PRIORITY_BOUND:
        return 0
    return raw


def _controller(meta: Mapping[str, Any]) -> tuple[str, str] | None:
    for ref in mappings(meta.get("ownerReferences")):
        if ref.get("controller") is True:
            return text(ref.get("kind")), text(ref.get("name"))
    return None


def view(body: Mapping[str, Any]) -> MemberPodView:
    """The indexed form of a pod with the gang label."""
    meta, spec, status = mapping(body.get("metadata")), mapping(body.get("spec")), mapping(body.get("status"))
    given = [text(s.get("resourceClaimName")) for s in mappings(status.get("resourceClaimStatuses"))]
    given.append(text(mapping(status.get("extendedResourceClaimStatus")).get("resourceClaimName")))
    affinity = spec.get("affinity")
    return MemberPodView(
        name=text(meta.get("name")),
        namespace=text(meta.get("namespace")),
        uid=text(meta.get("uid")),
        labels=strings(mapping(meta.get("labels")), LABELS),
        annotations=strings(mapping(meta.get("annotations")), ANNOTATIONS),
        deleting=bool(meta.get("deletionTimestamp")),
        claims=tuple(
            indexed.PodClaimRef(
                text(r.get("name")), text(r.get("resourceClaimName")), text(r.get("resourceClaimTemplateName"))
            )
            for r in mappings(spec.get("resourceClaims"))
        ),
        given=tuple(g for g in given if g),
        gates=tuple(text(g.get("name")) for g in mappings(spec.get("schedulingGates"))),
        node=text(spec.get("nodeName")),
        phase=text(status.get("phase")),
        affinity=copy.deepcopy(dict(affinity)) if isinstance(affinity, Mapping) else None,
        controller=_controller(meta),
        priority=priority_of(spec.get("priority")),
        never_preempts=spec.get("preemptionPolicy") == "Never",
    )
