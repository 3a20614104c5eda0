"""A move's record: the DeviceTaintRule that keeps the replacement off the GPU, and the ledger line. Pure.

Keeping the replacement off the GPU: the evicted pod's controller (a ReplicaSet, a Job...) makes
a new pod from its own template, and a new claim from the pod's ResourceClaimTemplate; neither a
node affinity nor a device selector of ours can be put on it (templates and claim specs are
immutable, the pod is not ours to edit before it is scheduled). What can reach it is a
**DeviceTaintRule** (resource.k8s.io/v1, GA in 1.37; v1beta2 behind DRADeviceTaintRules on 1.36)
that taints exactly that
device (driver, pool, device) ``NoSchedule`` for the cool-down: the scheduler then allocates it
to no claim that does not tolerate the taint, the replacement included, while the claims already
allocated on it (the higher-tier victim) are untouched (``NoSchedule`` evicts nothing). The cost:
for the cool-down the GPU takes no new claim at all, which is also what the victim wants. The
rule is created before the eviction (the replacement can be scheduled within a second) and
deleted after the cool-down; its annotation is the move's record (who, when, the figures), so a
restarted leader knows the cool-down and what is still to be charged.

The ledger: when the replacement runs (or, failing that, when the cool-down ends), one segment of
kind ``moved`` in the cost ledger's format (:class:`gpuplane.api.ledger.Segment`): the
moved pod, its fraction of the GPU, from the eviction until its replacement ran, i.e. the
GPU-seconds the move cost it. When it ran: :func:`charge_end` (Kubernetes keeps the Ready time to
the second only, the controller's own clock has the sub-second eviction time).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from gpuplane.api import boundedjson, kubetime
from gpuplane.api import names as dn
from gpuplane.api.ledger import Segment
from gpuplane.controller import indexed, names

API_VERSION = "resource.k8s.io/v1"  # the writer uses the version served (v1beta2 on 1.36)
PLURAL = "devicetaintrules"
LABEL = "gpuplane.dev/noisy-neighbour-move"
ANNOTATION = "gpuplane.dev/move"
TAINT_KEY = "gpuplane.dev/moved-noisy-neighbour"
LEDGER_KIND = "moved"
# A condition's lastTransitionTime and a pod's startTime are RFC 3339 to the whole second, rounded
# down (metav1.Time): "Ready at 12:00:05" means some instant of [12:00:05, 12:00:06).
RECORDED_RESOLUTION_S = 1.0


@dataclass(frozen=True)
class Move:
    """What a move's DeviceTaintRule records."""

    pool: str
    node: str
    device: str
    hog_uid: str
    namespace: str
    claim: str
    pod: str
    tier: str
    owner: str  # "ReplicaSet/name"
    owner_uid: str
    fraction: float
    evicted_at: float
    figures: str
    victims: str
    replacement: str = ""
    charged: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: object) -> Move | None:
        if not isinstance(text, str):
            return None
        try:
            data = json.loads(text)
            return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})
        except (ValueError, TypeError, KeyError):
            return None


def rule_name(pool: str, device: str) -> str:
    """One rule name per GPU (a DNS subdomain; hashed when too long)."""
    name = f"gpuplane-moved.{pool}.{device}".lower()
    if len(name) <= 253:
        return name
    return "gpuplane-moved." + hashlib.sha256(f"{pool}/{device}".encode()).hexdigest()[:32]


def rule(move: Move) -> dict[str, Any]:
    """The DeviceTaintRule of a move."""
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": rule_name(move.pool, move.device),
            "labels": {LABEL: "true", "app.kubernetes.io/managed-by": names.COMPONENT},
            "annotations": {ANNOTATION: move.to_json()},
        },
        "spec": {
            "deviceSelector": {"driver": dn.DRIVER_NAME, "pool": move.pool, "device": move.device},
            "taint": {"key": TAINT_KEY, "value": move.hog_uid, "effect": "NoSchedule"},
        },
    }


def move_of(rule_body: Mapping[str, Any]) -> Move | None:
    """The record a rule carries (None for a rule that is not one of ours)."""
    meta = rule_body.get("metadata") or {}
    if (meta.get("labels") or {}).get(LABEL) != "true":
        return None
    return Move.from_json((meta.get("annotations") or {}).get(ANNOTATION))


def fraction_of(claim: indexed.ClaimView, pool: str, device: str) -> float:
    """The claim's share of the GPU (consumed sharePercent / 100; 1 when it holds it whole)."""
    for r in claim.results:
        if r.pool == pool and r.device == device:
            share = r.share_percent
            try:
                return max(0.0, min(1.0, float(str(share)) / 100.0)) if share is not None else 1.0
            except ValueError:
                return 1.0
    return 1.0


def segment(move: Move, end: float) -> Segment:
    """The ledger line of a move: the moved pod's fraction from its eviction until ``end``."""
    return Segment(
        start=move.evicted_at,
        end=max(move.evicted_at, end),
        node=move.node,
        claim_uid=move.hog_uid,
        namespace=move.namespace,
        name=move.pod,
        tier=move.tier,
        kind=LEDGER_KIND,
        device=move.device,
        fraction=move.fraction,
    )


def charge_end(move: Move, recorded: float | None, seen: float) -> float:
    """When a move's charge ends: the replacement's recorded Ready second, read as its last instant.

    ``recorded`` is the Ready (or start) time Kubernetes recorded, to the whole second; ``seen`` the
    controller's own sub-second time of the pass that first found the replacement running. The
    replacement became Ready within ``[recorded, recorded + 1 s)`` and before ``seen``, so the charge
    ends at ``min(seen, recorded + 1 s)``: never before it was Ready (no move is charged less than it
    cost, and none 0 s: an eviction and the Ready in one wall-clock second, which a quiet machine
    does in 20 ms, used to charge ``max(evicted_at, recorded) - evicted_at = 0``), at most 1 s after,
    and never later than the controller saw it (a leader that restarts an hour later still charges
    the Ready time). A recorded time that cannot be right (its second ended before the eviction:
    clock skew, a stale condition) or none at all: ``seen``.
    """
    if recorded is None or recorded + RECORDED_RESOLUTION_S <= move.evicted_at:
        return seen
    return min(seen, recorded + RECORDED_RESOLUTION_S)


@dataclass(frozen=True, slots=True)
class PodFacts:
    """What a move reads of a pod it evicts or of its replacement, parsed once from the API's body."""

    name: str
    uid: str
    owner: tuple[str, str, str] | None  # (kind, name, uid) of its controller, None for a bare pod
    created: float  # unix seconds (0 when unknown)
    running: bool
    ready_since: float | None  # Ready's last transition, else the start time (Kubernetes': whole seconds)


def pod_facts(body: Mapping[str, Any]) -> PodFacts:
    """A pod's :class:`PodFacts`; total on any body (a field of the wrong type reads as absent)."""
    meta, status = boundedjson.mapping(body.get("metadata")), boundedjson.mapping(body.get("status"))
    owner = next((r for r in boundedjson.mappings(meta.get("ownerReferences")) if r.get("controller") is True), None)
    ready = [
        kubetime.epoch(c.get("lastTransitionTime"))
        for c in boundedjson.mappings(status.get("conditions"))
        if c.get("type") == "Ready" and c.get("status") == "True"
    ]
    text = boundedjson.text
    return PodFacts(
        name=text(meta.get("name")),
        uid=text(meta.get("uid")),
        owner=None if owner is None else (text(owner.get("kind")), text(owner.get("name")), text(owner.get("uid"))),
        created=kubetime.epoch(meta.get("creationTimestamp")) or 0.0,
        running=status.get("phase") == "Running",
        ready_since=next((t for t in ready if t), None) or kubetime.epoch(status.get("startTime")),
    )
