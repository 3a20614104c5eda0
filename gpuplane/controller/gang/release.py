"""When a placed gang ends, and whether its template members match it: the failure semantics of gangs.

A gang is all or nothing after it starts too: a tensor-parallel job whose rank
died is stuck, and its other ranks hold GPUs for nothing. :func:`verdict` says
when a placed gang is over and its devices go back (the reconciler then deletes
what is left of it: member pods, the claims the controller made):

* its Job (or a Job of its JobSet) failed or was suspended: the owner gave up;
* a member failed, or was deleted after the gang started, and no controller
  owns the pods to replace it (hand-written pods): nothing will bring it back;
* every member pod finished or was deleted.

While a Job still retries, a failed or deleted member is *not* the end: the Job
makes a replacement pod (gated, from its template), and the reconciler narrows
it to the member's node and lifts its gate; the gang's reservation keeps the
member's GPUs meanwhile.

:func:`shape_problems`: a template member's claim must ask for as many devices
of the gang's class as the GpuGang places per member, or the placement is a lie.

Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuplane.controller import events
from gpuplane.controller.gang import membership, owners
from gpuplane.controller.gang import spec as gangspec

STARTED = ("Scheduled", "Running")


@dataclass(frozen=True)
class Ending:
    """Why a placed gang is over; ``severity`` Warning when it ended by a failure."""

    reason: str
    message: str
    severity: events.EventType = "Warning"


def verdict(
    owner: owners.Verdict, members: membership.Members, count: int, prev_phase: str, present: int
) -> Ending | None:
    """The end of a placed gang, or None while it lives (or waits for its owner to replace a member)."""
    released = "the gang's devices are released"
    if owner.gave_up:
        return Ending(owner.reason, f"{owner.message}; {released}")
    orphans = sorted((i, p.name) for i, p in members.failed.items() if not p.controlled)
    if orphans:
        who = ", ".join(f"member {i} (pod {n})" for i, n in orphans)
        return Ending(events.GANG_MEMBER_FAILED, f"{who} failed and no controller replaces it; {released}")
    if present == 0:
        return Ending("MembersGone", "every member pod finished or was deleted; claims released", "Normal")
    missing = [i for i in range(count) if i not in members.by_index and i not in members.failed]
    replaceable = any(p.controlled for p in members.by_index.values())
    if missing and prev_phase in STARTED and not replaceable:
        who = ", ".join(str(i) for i in missing)
        return Ending(
            events.GANG_MEMBER_FAILED,
            f"member(s) {who} went away after the gang started, nothing replaces them; {released}",
        )
    return None


def shape_problems(
    spec: gangspec.GangSpec, members: membership.Members, claims: Mapping[str, Mapping[str, Any]], namespace: str
) -> list[str]:
    """Template members whose generated claim does not ask what the gang places per member."""
    if spec.migProfile:
        return []  # a MIG member's claim asks one device of the MIG class; its profile is checked at allocation
    out = []
    for pod in members.by_index.values():
        for cname in pod.claims:
            claim = claims.get(f"{namespace}/{cname}")
            if claim is None or _foreign(claim, spec):
                continue
            problem = membership.claim_shape_problem(pod.name, claim, spec.device_class, spec.devices_per_member)
            if problem:
                out.append(problem)
    return out


def _foreign(claim: Mapping[str, Any], spec: gangspec.GangSpec) -> bool:
    """A claim that asks nothing of the gang's class at all (a second claim of the pod, e.g. a NIC)."""
    requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
    return all((r.get("exactly") or {}).get("deviceClassName") != spec.device_class for r in requests)
