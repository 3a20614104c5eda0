"""Kubernetes Events for every decision: what they refer to and how they are recorded.

:class:`ObjectRef` is the involved object; :class:`Recorder` is what the
reconcilers call (the API-backed one lives in :mod:`gpuplane.controller.kube`; tests use
a list). An Event's name is derived from its object, reason and message, so
the same message repeated is one Event with a rising count, as client-go's
aggregation does, and a reconcile loop can never flood the API with Events.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

EventType = Literal["Normal", "Warning"]

# Reasons (CamelCase, as kubectl shows them).
GANG_WAITING_MEMBERS = "WaitingForMembers"
GANG_QUEUED = "Queued"
GANG_UNSCHEDULABLE = "Unschedulable"
GANG_PLACED = "Placed"
GANG_GATES_LIFTED = "GatesLifted"
GANG_SCHEDULED = "Scheduled"
GANG_PREEMPTING = "Preempting"
GANG_PREEMPTED = "Preempted"
GANG_TIMED_OUT = "TimedOut"
GANG_INVALID = "InvalidSpec"
GANG_MEMBER_PROBLEM = "MemberProblem"
GANG_SELECTOR_APPROXIMATE = "SelectorNotPrefiltered"
GANG_OWNER_FAILED = "OwnerFailed"  # the Job making the members failed: the gang is released
GANG_OWNER_SUSPENDED = "OwnerSuspended"  # the Job is suspended: the gang is released
GANG_MEMBER_FAILED = "MemberFailed"  # a member without a controller to replace it failed or went away
GANG_REFUSED = "GangRefused"  # on a Job or JobSet: its gang can never fit (the reason is the message)
GANG_OWNER_TIMED_OUT = "GangTimedOut"  # on a Job or JobSet: its gang timed out, so it was suspended
CLAIM_INVALID_CONFIG = "InvalidDeviceConfig"
OBJECT_REJECTED = "Rejected"  # nested too deeply to read (controller.rejects)
CLAIM_UNALLOCATED = "NotAllocated"
CLAIM_NO_DOMAIN_CONSTRAINT = "NoNVLinkDomainConstraint"
NODE_DOMAIN_LABELLED = "NVLinkDomainLabelled"


@dataclass(frozen=True)
class ObjectRef:
    """The involved object of an Event."""

    api_version: str
    kind: str
    name: str
    namespace: str
    uid: str

    @staticmethod
    def of(body: Mapping[str, Any], api_version: str = "", kind: str = "") -> ObjectRef:
        """The reference for an object body (apiVersion/kind may be given when the body lacks them)."""
        meta = body.get("metadata") or {}
        return ObjectRef(
            api_version=str(body.get("apiVersion") or api_version),
            kind=str(body.get("kind") or kind),
            name=str(meta.get("name", "")),
            namespace=str(meta.get("namespace") or ""),
            uid=str(meta.get("uid", "")),
        )


def event_name(ref: ObjectRef, reason: str, message: str) -> str:
    """A stable Event name: the same object, reason and message aggregate into one Event."""
    digest = hashlib.sha256(f"{ref.uid}|{reason}|{message}".encode()).hexdigest()[:16]
    return f"{ref.name[:200]}.{digest}"


class Recorder(Protocol):
    """Records Events."""

    def event(self, ref: ObjectRef, kind: EventType, reason: str, message: str) -> None:
        """Record one Event (errors are logged, never raised: an Event is never worth failing a decision)."""
        ...


@dataclass
class ListRecorder:
    """A Recorder that keeps Events in a list (for tests and dry runs)."""

    events: list[tuple[str, EventType, str, str]]

    def event(self, ref: ObjectRef, kind: EventType, reason: str, message: str) -> None:
        """Append ``(object name, type, reason, message)``."""
        self.events.append((ref.name, kind, reason, message))
