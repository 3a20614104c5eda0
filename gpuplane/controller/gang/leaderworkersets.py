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
fit". Pure: LeaderWorkerSets as indexed (:class:`LwsView`) in, a verdict and object references out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuplane.api.boundedjson import mapping
from gpuplane.controller import events, names
from gpuplane.controller.gang import owners

API_VERSION = "leaderworkerset.x-k8s.io/v1"
KIND = "LeaderWorkerSet"
GROUP, VERSION, PLURAL = "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"
OWNER_DELETED = "OwnerDeleted"


def _template_gang(template: Any) -> str:
    gang = mapping(mapping(mapping(template).get("metadata")).get("labels")).get(names.LABEL_GANG)
    return gang if isinstance(gang, str) else ""


def gang_of(lws: Mapping[str, Any]) -> str | None:
    """The gang ("ns/gang") the LWS's worker template (or, failing that, its leader template) joins."""
    template = mapping(mapping(lws.get("spec")).get("leaderWorkerTemplate"))
    gang = _template_gang(template.get("workerTemplate")) or _template_gang(template.get("leaderTemplate"))
    if not gang:
        return None
    return f"{mapping(lws.get('metadata')).get('namespace', '')}/{gang}"


@dataclass(frozen=True, slots=True)
class LwsView:
    """A LeaderWorkerSet as the controller reads it (parsed once, at the informer); its templates are not kept."""

    name: str
    namespace: str = ""
    uid: str = ""
    gang: str | None = None  # "ns/gang" its templates join
    deleting: bool = False  # deletionTimestamp set

    def ref(self) -> events.ObjectRef:
        """The LeaderWorkerSet as an Event target."""
        return events.ObjectRef(API_VERSION, KIND, self.name, self.namespace, self.uid)


def view(lws: Mapping[str, Any]) -> LwsView:
    """The indexed form of a LeaderWorkerSet (total on any body)."""
    meta = mapping(lws.get("metadata"))
    return LwsView(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace") or ""),
        uid=str(meta.get("uid", "")),
        gang=gang_of(lws),
        deleting=bool(meta.get("deletionTimestamp")),
    )


def by_gang(items: Iterable[Mapping[str, Any]]) -> dict[str, tuple[LwsView, ...]]:
    """Group LeaderWorkerSet bodies, as indexed, by the gang their templates join."""
    return owners.group_by_gang(view(i) for i in items)


def verdict(items: Sequence[LwsView]) -> owners.Verdict:
    """Given up when an LWS is being deleted; else active while one exists (rules in the module docstring)."""
    for lws in items:
        if lws.deleting:
            why = f"{KIND} {lws.name} is being deleted"
            return owners.Verdict(True, OWNER_DELETED, why, severity="Normal")
    return owners.Verdict(False, active=True) if items else owners.STILL_TRYING


def combined(jobs: owners.Verdict, lws: owners.Verdict) -> owners.Verdict:
    """One verdict from the Jobs' and the LeaderWorkerSets': either giving up ends the gang; either active waits."""
    if jobs.gave_up:
        return jobs
    if lws.gave_up:
        return lws
    return owners.Verdict(False, active=jobs.active or lws.active)


def event_targets(items: Sequence[LwsView]) -> tuple[events.ObjectRef, ...]:
    """Each LeaderWorkerSet, as an Event target."""
    return tuple(lws.ref() for lws in items)
