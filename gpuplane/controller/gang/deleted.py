"""What deleting a GpuGang means: its placement is released and every member pod is told, so none waits for it.

A member pod cannot run without its gang: its gate is the gang's to lift, and a hand-written
member's claim (``<gang>-<i>``) is the gang's to create (and is owned by the gang, so the garbage
collector deletes it with the gang). Left alone, a gang deleted while ``Queued`` or ``Placing``
leaves its pods Pending forever (gated, or "cannot allocate all claims" once the claims are gone),
and one deleted while ``Running`` leaves pods running on claims that are terminating. So deletion
ends the gang the way a timeout does (:func:`gpuplane.controller.gang.release.timeout_steps`):

* each live member pod first gets a Warning Event ``GangDeleted`` saying so and what to do;
* the Jobs (or their JobSet) making the members are suspended, so they make no more pods gated
  for a gang that is gone (their controllers delete the pods they made), with the same Event;
* every other member pod is deleted (with the eviction grace period), then the claims the
  controller made for the gang.

The gang's placement goes with it, so the queue's next pass sees the devices free.
Pure: :func:`end` makes the writes (the Events first, then every step, each tried once).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gpuplane.controller import events
from gpuplane.controller.gang import membership, owners, release
from gpuplane.controller.gang.desired import GangRef
from gpuplane.controller.gang.podview import MemberPodView
from gpuplane.controller.steps import Step

REASON = "GangDeleted"
ABANDONED = "GangReleaseAbandoned"  # on the gang: its release kept failing and it was let go

OwnerEvent = tuple[events.ObjectRef, events.EventType, str, str]


@dataclass(frozen=True)
class Deletion:
    """The writes that end a deleted gang, and the Events that tell its pods and owners first."""

    steps: tuple[Step, ...]
    told: tuple[OwnerEvent, ...]

    @property
    def pods_told(self) -> int:
        return sum(1 for ref, *_ in self.told if ref.kind == "Pod")


def deletion(
    ref: GangRef,
    phase: str,
    pods: Iterable[MemberPodView],
    claims: Iterable[str],
    jobs: Sequence[owners.JobView],
    *,
    grace_seconds: int | None,
) -> Deletion:
    """What deleting gang ``ref`` (last seen in ``phase``) writes; empty when nothing of it is left."""
    members = membership.members_of(ref.name, 1 << 20, pods)
    was = f" while {phase}" if phase else ""
    why = f"GpuGang {ref.namespace}/{ref.name} was deleted{was}"
    stop = release.timeout_steps(ref, members, claims, jobs, grace_seconds=grace_seconds, why=why)
    suspended = {str(o) for o in stop.suspended}
    deleted = {s.name for s in stop.steps if s.kind == "delete-pod"}
    told: list[OwnerEvent] = []
    for pod in sorted(members.by_index.values(), key=lambda p: p.index):
        fate = "this pod is deleted" if pod.name in deleted else f"its Job {pod.job} is suspended, which deletes it"
        text = (
            f"{why}: its placement is released (claims deleted) and {fate}; a member pod cannot run without "
            f"its gang. To run the gang again, create GpuGang {ref.name} and its member pods again"
        )
        target = events.ObjectRef(api_version="v1", kind="Pod", name=pod.name, namespace=ref.namespace, uid=pod.uid)
        told.append((target, "Warning", REASON, text))
    if suspended:
        owner_text = (
            f"{why}: {', '.join(sorted(suspended))} suspended so that no member pod waits gated for a gang that "
            f"is gone. Re-create GpuGang {ref.name} and resume, or drop the gang label and gate from the template"
        )
        told += [(target, "Warning", REASON, owner_text) for target in owners.event_targets(jobs)]
    return Deletion(steps=stop.steps, told=tuple(told))


def end(writer: Any, recorder: events.Recorder, namespace: str, d: Deletion) -> list[str]:
    """Tell the pods and owners, then make every step (a failed one does not stop the others: no later
    reconcile of a gang that is gone would resume them). Returns the failures, as text."""
    for target, etype, reason, message in d.told:
        recorder.event(target, etype, reason, message)
    failed = []
    for step in d.steps:
        try:
            writer.run(namespace, step)
        except Exception as exc:  # StepFailed, or a lost connection: said, and the rest still tried
            failed.append(f"{step.kind} {step.name}: {exc}")
    return failed
