"""What one reconcile decides for a gang (:class:`Outcome`), the gang as read (:class:`GangRead`), :func:`finish`.

:func:`gpuplane.controller.gang.reconciler.decide` reads a gang once into a frozen
:class:`GangRead` (spec, members, claims, the Jobs whose template makes its pods)
and each of its phases ends with :func:`finish`, which turns a phase, a reason and
a message into the status to write, the Events on the gang and, when asked, the
same Event on the gang's owners (each Job and its JobSet, each LeaderWorkerSet), where a user of a
Job looks. Pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuplane.controller import events, steps
from gpuplane.controller.gang import leaderworkersets, membership, owners, status, world, writes
from gpuplane.controller.gang.desired import GangRef
from gpuplane.controller.gang.spec import GangSpec

EventTuple = tuple[events.EventType, str, str]
OwnerEvent = tuple[events.ObjectRef, events.EventType, str, str]


@dataclass(frozen=True)
class Outcome:
    """What to write for one gang."""

    status: dict[str, Any]
    steps: tuple[steps.Step, ...] = ()
    events: tuple[EventTuple, ...] = ()
    victims: tuple[str, ...] = ()
    placed_after_s: float | None = None  # set when this outcome places the gang (wait-time metric)
    owner_events: tuple[OwnerEvent, ...] = ()  # on the Jobs / JobSets making the members


@dataclass(frozen=True)
class GangRead:
    """What every phase of ``decide`` reads: the gang as the API shows it, parsed once."""

    key: str
    ref: GangRef
    spec: GangSpec
    members: membership.Members
    claims: Mapping[str, writes.ExistingClaim]
    prev: Mapping[str, Any]
    stamp: str
    created: float
    base: Mapping[str, Any]  # the status fields every outcome carries (counts, problems)
    events: tuple[EventTuple, ...] = ()  # raised before the phase is known (new member problems)
    jobs: tuple[owners.JobView, ...] = ()  # the Jobs whose pod template joins the gang
    leaderworkersets: tuple[leaderworkersets.LwsView, ...] = ()  # the LeaderWorkerSets whose templates join it
    owner: owners.Verdict = owners.STILL_TRYING  # whether those Jobs gave the gang up
    shape: tuple[str, ...] = ()  # template members whose claim does not ask what the gang places

    @property
    def prev_phase(self) -> str:
        return str(self.prev.get("phase", ""))

    @property
    def present(self) -> int:
        return len(self.members.by_index)

    def with_problems(self, problems: Sequence[str]) -> GangRead:
        """The gang with ``problems`` reported (status field and a Warning each) when they are new."""
        if not problems or sorted(problems) == sorted(self.prev.get("problems") or []):
            return self
        return dataclasses.replace(
            self,
            base={**self.base, "problems": sorted(problems)},
            events=(*self.events, *(("Warning", events.GANG_MEMBER_PROBLEM, p) for p in problems)),
        )

    def with_event(self, event: EventTuple) -> GangRead:
        return dataclasses.replace(self, events=(*self.events, event))


def finish(
    g: GangRead,
    phase: str,
    reason: str,
    message: str,
    extra: Mapping[str, Any] | None = None,
    *,
    steps: Sequence[steps.Step] = (),
    etype: events.EventType = "Normal",
    victims: tuple[str, ...] = (),
    placed_after: float | None = None,
    tell_owners: str = "",
) -> Outcome:
    """The outcome of gang ``g`` ending in ``phase``: status with conditions, and an Event when the phase changes.

    ``tell_owners``: the reason of the same Event on each of the gang's Jobs and JobSets (when the phase changes).
    """
    st = {**g.base, "phase": phase, "reason": reason, "message": message, **(extra or {})}
    placement = st.get("placement", g.prev.get("placement"))
    st["conditions"] = status.gang_conditions(
        g.prev.get("conditions") or [],
        g.stamp,
        present=g.members.complete(g.spec.members),
        placed=phase in world.HOLDING_PHASES,
        scheduled=phase in ("Scheduled", "Running"),
        msg=message,
    )
    if placement is None:
        st.setdefault("placement", None)
    out_events = list(g.events)
    told: tuple[OwnerEvent, ...] = ()
    if phase != g.prev_phase or reason != g.prev.get("reason"):
        out_events.append((etype, reason, message))
        if tell_owners:
            gang = g.ref.name
            targets = (*owners.event_targets(g.jobs), *leaderworkersets.event_targets(g.leaderworkersets))
            told = tuple((ref, etype, tell_owners, f"gang {gang}: {message}") for ref in targets)
    return Outcome(
        status=st,
        steps=tuple(steps),
        events=tuple(out_events),
        victims=victims,
        placed_after_s=placed_after,
        owner_events=told,
    )
