"""The Jobs that make a gang's pods, and what they say about the gang: still trying, suspended, or given up.

A gang's Jobs are found by their pod template (``spec.template.metadata.labels``
carries the gang label), so they are known even while no member pod exists (a
suspended Job has deleted them). A JobSet shows up through its Jobs, which
inherit the template's labels, and is named in each Job's controller reference.

* :func:`verdict`: a Job that failed or is suspended has given the gang up, and
  its devices go back (the reconciler releases the gang); a Job that is still
  running will replace a member that failed or was deleted, so the gang waits.
* :func:`event_targets`: the objects a user looks at, each Job and its JobSet,
  for Events such as "this gang can never fit".
* :func:`to_suspend`: what to suspend so that a gang that timed out gets no more
  gated pods: each Job, or the JobSet that controls it (suspending a JobSet's Job
  alone would be undone by the JobSet controller). Their own controllers then
  delete the pods, so a Job does not count them as failures.

Pure: Job dicts in, a verdict and object references out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuplane.controller import events, names


@dataclass(frozen=True)
class Verdict:
    """Whether the gang's owners gave it up (``reason`` says how), from the Jobs' status."""

    gave_up: bool
    reason: str = ""
    message: str = ""
    active: bool = False  # some Job has not finished: it may still make (or replace) member pods
    severity: events.EventType = "Warning"  # Normal when the owner ended the gang by no failure (deleted)


STILL_TRYING = Verdict(False)


@dataclass(frozen=True)
class Owner:
    """A Job or JobSet whose suspension stops it from making a gang's pods."""

    kind: str  # "Job" or "JobSet"
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"


def gang_of_job(job: Mapping[str, Any]) -> str | None:
    """The gang a Job's pod template joins ("ns/gang"), if any."""
    template = ((job.get("spec") or {}).get("template") or {}).get("metadata") or {}
    gang = (template.get("labels") or {}).get(names.LABEL_GANG)
    if not gang:
        return None
    return f"{(job.get('metadata') or {}).get('namespace', '')}/{gang}"


def group_by_gang(
    items: Iterable[Mapping[str, Any]], gang_of: Callable[[Mapping[str, Any]], str | None]
) -> dict[str, tuple[Mapping[str, Any], ...]]:
    """Group owner objects by the gang ("ns/gang") ``gang_of`` finds in them, each group sorted by name."""
    out: dict[str, list[Mapping[str, Any]]] = {}
    for item in items:
        key = gang_of(item)
        if key:
            out.setdefault(key, []).append(item)
    return {k: tuple(sorted(v, key=lambda o: (o.get("metadata") or {}).get("name", ""))) for k, v in out.items()}


def jobs_by_gang(jobs: Iterable[Mapping[str, Any]]) -> dict[str, tuple[Mapping[str, Any], ...]]:
    """Group Jobs by the gang their template joins."""
    return group_by_gang(jobs, gang_of_job)


def _condition(job: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    conditions: list[Mapping[str, Any]] = (job.get("status") or {}).get("conditions") or []
    for c in conditions:
        if c.get("type") == kind and c.get("status") == "True":
            return c
    return None


def verdict(jobs: Sequence[Mapping[str, Any]]) -> Verdict:
    """Given up when any Job failed (or is about to: FailureTarget) or is suspended; else still trying.

    ``active`` while a Job has not completed: its pods may all be gone for a moment (a Job about to fail
    deletes the others before this replica's Job watch shows it failed; deleted pods are replaced).
    """
    for job in jobs:
        name = (job.get("metadata") or {}).get("name", "")
        failed = _condition(job, "Failed") or _condition(job, "FailureTarget")
        if failed is not None:
            why = ": ".join(str(p) for p in (failed.get("reason"), failed.get("message")) if p)
            return Verdict(True, events.GANG_OWNER_FAILED, f"Job {name} failed" + (f" ({why})" if why else ""))
        if (job.get("spec") or {}).get("suspend"):
            return Verdict(True, events.GANG_OWNER_SUSPENDED, f"Job {name} is suspended")
    if any(not (_condition(j, "Complete") or _condition(j, "SuccessCriteriaMet")) for j in jobs):
        return Verdict(False, active=True)
    return STILL_TRYING


def _jobset_of(job: Mapping[str, Any]) -> str:
    """The name of the JobSet that controls the Job ('' when none does)."""
    for ref in (job.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == "JobSet":
            return str(ref.get("name", ""))
    return ""


def ever_suspended(job: Mapping[str, Any]) -> bool:
    """Whether the Job controller has recorded a suspension (condition Suspended, True or False once resumed)."""
    conditions: list[Mapping[str, Any]] = (job.get("status") or {}).get("conditions") or []
    return (job.get("spec") or {}).get("suspend") is True or any(c.get("type") == "Suspended" for c in conditions)


def to_suspend(jobs: Iterable[Mapping[str, Any]]) -> tuple[Owner, ...]:
    """Each Job not yet suspended nor finished, as itself or as the JobSet that controls it (once each)."""
    out: list[Owner] = []
    for job in jobs:
        if (job.get("spec") or {}).get("suspend") or _condition(job, "Complete") or _condition(job, "Failed"):
            continue
        jobset = _jobset_of(job)
        owner = Owner("JobSet", jobset) if jobset else Owner("Job", (job.get("metadata") or {}).get("name", ""))
        if owner.name and owner not in out:
            out.append(owner)
    return tuple(out)


def event_targets(jobs: Sequence[Mapping[str, Any]]) -> tuple[events.ObjectRef, ...]:
    """Each Job, then each JobSet that controls one (once), as Event targets."""
    out: list[events.ObjectRef] = []
    seen: set[tuple[str, str]] = set()
    for job in jobs:
        meta = job.get("metadata") or {}
        out.append(events.ObjectRef.of(job, "batch/v1", "Job"))
        for ref in meta.get("ownerReferences") or []:
            if ref.get("controller") and ref.get("kind") == "JobSet" and ("JobSet", ref.get("name", "")) not in seen:
                seen.add(("JobSet", ref.get("name", "")))
                out.append(
                    events.ObjectRef(
                        api_version=str(ref.get("apiVersion", "")),
                        kind="JobSet",
                        name=str(ref.get("name", "")),
                        namespace=str(meta.get("namespace", "")),
                        uid=str(ref.get("uid", "")),
                    )
                )
    return tuple(out)


def controller_of(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(kind, name) of the pod's controller (a Job, a ReplicaSet, an operator), if it has one."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("kind", "")), str(ref.get("name", ""))
    return None


def has_controller(pod: Mapping[str, Any]) -> bool:
    """Whether some controller (a Job, a ReplicaSet, an operator) owns the pod and may replace it."""
    return controller_of(pod) is not None
