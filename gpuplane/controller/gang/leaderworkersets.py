"""The LeaderWorkerSets that make a gang's pods, and what they say about the gang: still there, or going away.

A LeaderWorkerSet (LWS, ``leaderworkerset.x-k8s.io/v1``) makes one group of pods
per replica: a leader from ``leaderTemplate`` (or the worker template when there
is none) and ``size - 1`` workers from ``workerTemplate``, through two
StatefulSets. A gang's LWS is found by its templates' gang label, so it is known
while none of its pods exists (it recreates a whole group when one of its pods
restarts or is deleted: ``RecreateGroupOnPodRestart``).

An LWS has no Failed or suspended state, so :func:`verdict` knows two cases:

* the LWS exists: it will make (or make again) the group's pods, so a placed gang
  whose pods are gone for a moment waits for them, as for an active Job; the
  replacements come gated from the templates and are narrowed to the members'
  nodes again;
* the LWS is being deleted (``deletionTimestamp``): the owner gave the gang up and
  its devices go back. An LWS deleted in the background is gone before its pods
  are; the gang then ends when its last pod goes (``MembersGone``).

A timed-out gang's LWS pods are deleted as main does for any pod nobody can
suspend (LWS has no ``suspend``); the LWS makes them again, gated, and they wait
while the gang stays ``TimedOut`` until the user deletes the LWS or re-creates the
gang. :func:`event_targets` names each LWS for Events such as "this gang can never
fit". Pure: LWS dicts in, a verdict and object references out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuplane.controller import events, names
from gpuplane.controller.gang import owners

API_VERSION = "leaderworkerset.x-k8s.io/v1"
KIND = "LeaderWorkerSet"
GROUP, VERSION, PLURAL = "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"
OWNER_DELETED = "OwnerDeleted"


def _template_gang(template: Any) -> str:
    if not isinstance(template, Mapping):
        return ""
    labels = (template.get("metadata") or {}).get("labels") or {}
    return str(labels.get(names.LABEL_GANG) or "") if isinstance(labels, Mapping) else ""


def gang_of(lws: Mapping[str, Any]) -> str | None:
    """The gang ("ns/gang") the LWS's worker template (or, failing that, its leader template) joins."""
    template = (lws.get("spec") or {}).get("leaderWorkerTemplate") or {}
    if not isinstance(template, Mapping):
        return None
    gang = _template_gang(template.get("workerTemplate")) or _template_gang(template.get("leaderTemplate"))
    if not gang:
        return None
    return f"{(lws.get('metadata') or {}).get('namespace', '')}/{gang}"


def by_gang(items: Iterable[Mapping[str, Any]]) -> dict[str, tuple[Mapping[str, Any], ...]]:
    """Group LeaderWorkerSets by the gang their templates join."""
    return owners.group_by_gang(items, gang_of)


def verdict(items: Sequence[Mapping[str, Any]]) -> owners.Verdict:
    """Given up when an LWS is being deleted; else active while one exists (rules in the module docstring)."""
    for lws in items:
        meta = lws.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            why = f"{KIND} {meta.get('name', '')} is being deleted"
            return owners.Verdict(True, OWNER_DELETED, why, severity="Normal")
    return owners.Verdict(False, active=True) if items else owners.STILL_TRYING


def combined(jobs: owners.Verdict, lws: owners.Verdict) -> owners.Verdict:
    """One verdict from the Jobs' and the LeaderWorkerSets': either giving up ends the gang; either active waits."""
    if jobs.gave_up:
        return jobs
    if lws.gave_up:
        return lws
    return owners.Verdict(False, active=jobs.active or lws.active)


def event_targets(items: Sequence[Mapping[str, Any]]) -> tuple[events.ObjectRef, ...]:
    """Each LeaderWorkerSet, as an Event target."""
    return tuple(events.ObjectRef.of(lws, API_VERSION, KIND) for lws in items)
