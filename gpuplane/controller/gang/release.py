"""When a placed gang ends, and whether its template members match it: the failure semantics of gangs.

A gang is all or nothing after it starts too: a tensor-parallel job whose rank
died is stuck, and its other ranks hold GPUs for nothing. :func:`verdict` says
when a placed gang is over and its devices go back (the reconciler then deletes
what is left of it: member pods, the claims the controller made):

* its Job (or a Job of its JobSet) failed or was suspended, or its LeaderWorkerSet
  is being deleted: the owner gave up;
* a member failed, or was deleted after the gang started, and no controller
  owns the pods to replace it (hand-written pods): nothing will bring it back;
* every member pod finished or was deleted (and no Job that makes them is still
  active: one about to fail deletes the other pods before it says so; nor a
  LeaderWorkerSet, which recreates a whole group when one of its pods restarts).

While a Job still retries, a failed or deleted member is *not* the end: the Job
makes a replacement pod (gated, from its template), and the reconciler narrows
it to the member's node and lifts its gate; the gang's reservation keeps the
member's GPUs meanwhile.

:func:`timeout_steps`: a gang not scheduled within ``timeoutSeconds`` is given up
for good. Deleting a Job's pods would only make it create them again, gated for a
gang that no longer places anything, so its Jobs (or their JobSet) are suspended
instead: their controllers delete the pods and make no more; pods nobody
suspended makes again (hand-written ones) are deleted, and the claims the
controller made. While the gang stays ``TimedOut`` a Job that was never
suspended (the write failed, a Job created later) is suspended again; one the
user resumed is left alone.

:func:`shape_problems`: a template member's claim must ask for as many devices
of the gang's class as the GpuGang places per member, or the placement is a lie.

Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuplane.controller import events, indexed
from gpuplane.controller.gang import membership, owners
from gpuplane.controller.gang import spec as gangspec
from gpuplane.controller.gang.desired import GangRef
from gpuplane.controller.gang.writes import release_steps
from gpuplane.controller.steps import Step

STARTED = ("Scheduled", "Running")
RESUME_PATCH = '{"spec":{"suspend":false}}'


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
        return Ending(owner.reason, f"{owner.message}; {released}", owner.severity)
    orphans = sorted((i, p.name) for i, p in members.failed.items() if not p.controlled)
    if orphans:
        who = ", ".join(f"member {i} (pod {n})" for i, n in orphans)
        return Ending(events.GANG_MEMBER_FAILED, f"{who} failed and no controller replaces it; {released}")
    if present == 0:
        if owner.active:
            return None  # its Job may replace them, or is about to say it failed: its verdict decides
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


@dataclass(frozen=True)
class Stop:
    """What giving up a timed-out gang writes, and what it tells the user about its owners."""

    steps: tuple[Step, ...]
    suspended: tuple[owners.Owner, ...] = ()

    def note(self, namespace: str, gang: str) -> str:
        """What the gang's message adds: who was suspended, and how to try again."""
        if not self.suspended:
            return ""
        who = ", ".join(str(o) for o in self.suspended)
        resume = "; ".join(
            f"kubectl patch {o.kind.lower()} -n {namespace} {o.name} --type merge -p '{RESUME_PATCH}'"
            for o in self.suspended
        )
        return (
            f"; {who} suspended, so no member pod waits gated for it. To try again, delete and re-create "
            f"GpuGang {gang} (its timeout counts from creation), then resume: {resume}"
        )


def timeout_steps(
    gang: GangRef,
    members: membership.Members,
    claims: Iterable[str],
    jobs: Sequence[owners.JobView],
    *,
    grace_seconds: int | None,
    why: str,
    again: bool = False,
) -> Stop:
    """The writes that give up a gang that timed out (rules in the module docstring).

    ``again``: the gang is already ``TimedOut``; only Jobs never suspended are suspended (nothing is deleted).
    """
    if again:
        stop = owners.to_suspend(j for j in jobs if not j.ever_suspended)
        return Stop(tuple(Step(f"suspend-{o.kind.lower()}", o.name, why=why) for o in stop), stop)
    stop = owners.to_suspend(jobs)
    if not stop:
        return Stop(release_steps(gang, members, claims, grace_seconds, why))
    suspended_jobs = {j.name for j in jobs}
    steps = [Step(f"suspend-{o.kind.lower()}", o.name, why=why) for o in stop]
    steps += [
        Step("delete-pod", p.name, grace_seconds, why=why)
        for p in members.by_index.values()
        if not p.job or p.job not in suspended_jobs
    ]
    steps += [Step("delete-claim", c, why=why) for c in sorted(claims)]
    return Stop(tuple(steps), stop)


def shape_problems(
    spec: gangspec.GangSpec, members: membership.Members, claims: Mapping[str, indexed.ClaimView], namespace: str
) -> list[str]:
    """Template members whose generated claim (``claims``: the claim index) does not ask what the gang places
    per member."""
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


def _foreign(claim: indexed.ClaimView, spec: gangspec.GangSpec) -> bool:
    """A claim that asks nothing of the gang's class at all (a second claim of the pod, e.g. a NIC)."""
    return all((r.get("exactly") or {}).get("deviceClassName") != spec.device_class for r in claim.requests)
