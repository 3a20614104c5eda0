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

Pure: Jobs as indexed (:class:`JobView`, parsed once from the body by :func:`job_view`) in, a verdict
and object references out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from gpuplane.api.boundedjson import mapping, mappings
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


class Owned(Protocol):
    """An owner object as indexed: its name and the gang its template joins."""

    @property
    def name(self) -> str: ...
    @property
    def gang(self) -> str | None: ...


OwnedT = TypeVar("OwnedT", bound=Owned)


@dataclass(frozen=True, slots=True)
class JobView:
    """A Job as the controller reads it: parsed once, at the informer, into what the gang decisions use.

    Nothing of the pod template is kept but the gang it joins (a tenant's template may be large)."""

    name: str
    namespace: str = ""
    uid: str = ""
    gang: str | None = None  # "ns/gang" its pod template joins
    suspend: bool = False  # spec.suspend is set
    ever_suspended: bool = False  # spec.suspend is true, or the Job controller recorded a Suspended condition
    failed: str | None = None  # Failed or FailureTarget True: "reason: message" (either may be empty)
    complete: bool = False  # Complete or SuccessCriteriaMet True
    finished: bool = False  # Complete or Failed True (a Job nobody needs to suspend)
    jobset: events.ObjectRef | None = None  # the JobSet that controls it

    def ref(self) -> events.ObjectRef:
        """The Job as an Event target."""
        return events.ObjectRef("batch/v1", "Job", self.name, self.namespace, self.uid)


def _true(conditions: Sequence[Mapping[str, Any]], *kinds: str) -> Mapping[str, Any] | None:
    for c in conditions:
        if c.get("type") in kinds and c.get("status") == "True":
            return c
    return None


def gang_of_job(job: Mapping[str, Any]) -> str | None:
    """The gang a Job's pod template joins ("ns/gang"), if any."""
    template = mapping(mapping(mapping(job.get("spec")).get("template")).get("metadata"))
    gang = mapping(template.get("labels")).get(names.LABEL_GANG)
    if not isinstance(gang, str) or not gang:
        return None
    return f"{mapping(job.get('metadata')).get('namespace', '')}/{gang}"


def job_view(job: Mapping[str, Any]) -> JobView:
    """The indexed form of a Job (total on any body)."""
    meta, spec = mapping(job.get("metadata")), mapping(job.get("spec"))
    conditions = mappings(mapping(job.get("status")).get("conditions"))
    failed = _true(conditions, "Failed", "FailureTarget")
    jobset = next(
        (
            events.ObjectRef(
                str(r.get("apiVersion", "")),
                "JobSet",
                str(r.get("name", "")),
                str(meta.get("namespace") or ""),
                str(r.get("uid", "")),
            )
            for r in mappings(meta.get("ownerReferences"))
            if r.get("controller") and r.get("kind") == "JobSet"
        ),
        None,
    )
    return JobView(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace") or ""),
        uid=str(meta.get("uid", "")),
        gang=gang_of_job(job),
        suspend=bool(spec.get("suspend")),
        ever_suspended=spec.get("suspend") is True or any(c.get("type") == "Suspended" for c in conditions),
        failed=None
        if failed is None
        else ": ".join(str(p) for p in (failed.get("reason"), failed.get("message")) if p),
        complete=_true(conditions, "Complete", "SuccessCriteriaMet") is not None,
        finished=_true(conditions, "Complete", "Failed") is not None,
        jobset=jobset,
    )


def group_by_gang(items: Iterable[OwnedT]) -> dict[str, tuple[OwnedT, ...]]:
    """Group owner objects by the gang ("ns/gang") their template joins, each group sorted by name."""
    out: dict[str, list[OwnedT]] = {}
    for item in items:
        if item.gang:
            out.setdefault(item.gang, []).append(item)
    return {k: tuple(sorted(v, key=lambda o: o.name)) for k, v in out.items()}


def jobs_by_gang(jobs: Iterable[Mapping[str, Any]]) -> dict[str, tuple[JobView, ...]]:
    """Group Job bodies, as indexed, by the gang their template joins."""
    return group_by_gang(job_view(j) for j in jobs)


def verdict(jobs: Sequence[JobView]) -> Verdict:
    """Given up when any Job failed (or is about to: FailureTarget) or is suspended; else still trying.

    ``active`` while a Job has not completed: its pods may all be gone for a moment (a Job about to fail
    deletes the others before this replica's Job watch shows it failed; deleted pods are replaced).
    """
    for job in jobs:
        if job.failed is not None:
            why = f" ({job.failed})" if job.failed else ""
            return Verdict(True, events.GANG_OWNER_FAILED, f"Job {job.name} failed{why}")
        if job.suspend:
            return Verdict(True, events.GANG_OWNER_SUSPENDED, f"Job {job.name} is suspended")
    if any(not j.complete for j in jobs):
        return Verdict(False, active=True)
    return STILL_TRYING


def to_suspend(jobs: Iterable[JobView]) -> tuple[Owner, ...]:
    """Each Job not yet suspended nor finished, as itself or as the JobSet that controls it (once each)."""
    out: list[Owner] = []
    for job in jobs:
        if job.suspend or job.finished:
            continue
        owner = Owner("JobSet", job.jobset.name) if job.jobset else Owner("Job", job.name)
        if owner.name and owner not in out:
            out.append(owner)
    return tuple(out)


def event_targets(jobs: Sequence[JobView]) -> tuple[events.ObjectRef, ...]:
    """Each Job, then each JobSet that controls one (once), as Event targets."""
    out: list[events.ObjectRef] = []
    seen: set[str] = set()
    for job in jobs:
        out.append(job.ref())
        if job.jobset is not None and job.jobset.name not in seen:
            seen.add(job.jobset.name)
            out.append(job.jobset)
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
