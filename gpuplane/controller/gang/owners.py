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

Pure: Job dicts in, a verdict and object references out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuplane.controller import events, names


@dataclass(frozen=True)
class Verdict:
    """Whether the gang's owners gave it up (``reason`` says how), from the Jobs' status."""

    gave_up: bool
    reason: str = ""
    message: str = ""


STILL_TRYING = Verdict(False)


def gang_of_job(job: Mapping[str, Any]) -> str | None:
    """The gang a Job's pod template joins ("ns/gang"), if any."""
    template = ((job.get("spec") or {}).get("template") or {}).get("metadata") or {}
    gang = (template.get("labels") or {}).get(names.LABEL_GANG)
    if not gang:
        return None
    return f"{(job.get('metadata') or {}).get('namespace', '')}/{gang}"


def jobs_by_gang(jobs: Iterable[Mapping[str, Any]]) -> dict[str, tuple[Mapping[str, Any], ...]]:
    """Group Jobs by the gang their template joins."""
    out: dict[str, list[Mapping[str, Any]]] = {}
    for job in jobs:
        key = gang_of_job(job)
        if key:
            out.setdefault(key, []).append(job)
    return {k: tuple(sorted(v, key=lambda j: (j.get("metadata") or {}).get("name", ""))) for k, v in out.items()}


def _condition(job: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    conditions: list[Mapping[str, Any]] = (job.get("status") or {}).get("conditions") or []
    for c in conditions:
        if c.get("type") == kind and c.get("status") == "True":
            return c
    return None


def verdict(jobs: Sequence[Mapping[str, Any]]) -> Verdict:
    """Given up when any Job failed (or is about to: FailureTarget) or is suspended; else still trying."""
    for job in jobs:
        name = (job.get("metadata") or {}).get("name", "")
        failed = _condition(job, "Failed") or _condition(job, "FailureTarget")
        if failed is not None:
            why = ": ".join(str(p) for p in (failed.get("reason"), failed.get("message")) if p)
            return Verdict(True, events.GANG_OWNER_FAILED, f"Job {name} failed" + (f" ({why})" if why else ""))
        if (job.get("spec") or {}).get("suspend"):
            return Verdict(True, events.GANG_OWNER_SUSPENDED, f"Job {name} is suspended")
    return STILL_TRYING


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


def has_controller(pod: Mapping[str, Any]) -> bool:
    """Whether some controller (a Job, a ReplicaSet, an operator) owns the pod and may replace it."""
    return any(ref.get("controller") for ref in (pod.get("metadata") or {}).get("ownerReferences") or [])
