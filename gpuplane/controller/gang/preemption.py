"""Preempting another gang: who may be a victim, and the eviction that PodDisruptionBudgets may refuse.

A gang preempts only with the Kubernetes priority of its pods (a PriorityClass an
administrator grants a namespace, see :attr:`membership.Members.priority`), never with
the ``spec.priority`` its tenant writes, and never gangs in a system namespace.

The victim's pods go through the Eviction API, pinned to their uids, so their
PodDisruptionBudgets apply. Before anything is written the preemptor's pass evicts every
victim pod with ``dryRun`` (:func:`preflight`): if any is refused the preemption is
refused as a whole, the victim keeps running untouched and the preemptor says why in its
status and an Event (:func:`refused`). Only then are the victim's pods evicted for real; its
claims are deleted by its own reconcile once none of its pods is left
(:func:`leftover_steps`), so no running pod loses its devices. A budget that allows fewer
evictions than the gang has pods passes each dry run alone; the real eviction it then
refuses leaves the victim ``Preempted`` with its remaining pods, evicted again on each of
its reconciles as the budget allows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import structlog

from gpuplane.controller import events, steps
from gpuplane.controller.gang import membership, world, writes
from gpuplane.controller.gang.outcome import EventTuple, Outcome
from gpuplane.controller.gang.podview import MemberPodView
from gpuplane.controller.gang.view import GangView

log = structlog.get_logger(__name__)

SYSTEM_NAMESPACES = membership.SYSTEM_NAMESPACES

REASON_REFUSED = "PreemptionRefused"
REASON_PRIORITY_IGNORED = "SpecPriorityIgnored"
PREEMPTING = "Preempting"  # events.GANG_PREEMPTING


def priority_ignored_note(spec_priority: int, members: membership.Members) -> str:
    """The Event telling a tenant their ``spec.priority`` does nothing ('' when they set none)."""
    if not spec_priority:
        return ""
    return (
        f"spec.priority {spec_priority} is ignored: a gang's priority is its pods' Kubernetes priority "
        f"(priorityClassName, granted by an administrator), here {members.priority}"
    )


def preflight_steps(victim: membership.Members, grace_seconds: int | None, why: str) -> tuple[steps.Step, ...]:
    """The victim's evictions as dry runs: what the API server (and every PodDisruptionBudget) would say."""
    return writes.eviction_steps(victim.by_index.values(), grace_seconds, why, dry_run=True)


def preflight(
    run: Callable[[str, steps.Step], None],
    victims: Iterable[tuple[str, membership.Members]],
    grace_seconds: int | None,
    failed: type[Exception],
) -> str:
    """Dry-run every victim pod's eviction with ``run(namespace, step)``; the refusal ('' when all pass).

    A victim in a system namespace is refused without asking."""
    for key, members in victims:
        ns = key.split("/", 1)[0]
        if ns in SYSTEM_NAMESPACES:
            return f"preemption of gang {key} refused: {ns} is a system namespace; waiting"
        for step in preflight_steps(members, grace_seconds, "preemption dry run"):
            try:
                run(ns, step)
            except failed as exc:
                return f"preemption of gang {key} refused: {exc}; waiting"
    return ""


def refused(outcome: Outcome, prev: Mapping[str, Any], why: str) -> Outcome:
    """The preemptor's outcome when its preemption was refused: it waits, nominating nobody, and says why."""
    st = {**outcome.status, "reason": REASON_REFUSED, "message": why, "nominatedVictims": None}
    kept: list[EventTuple] = [e for e in outcome.events if e[1] != PREEMPTING]
    if prev.get("reason") != REASON_REFUSED or prev.get("message") != why:
        kept.append(("Warning", REASON_REFUSED, why))
    return dataclasses.replace(outcome, status=st, events=tuple(kept), victims=())


def leftover_steps(
    members: membership.Members,
    claims: Mapping[str, writes.ExistingClaim],
    pods_left: bool,
    grace_seconds: int | None,
    why: str,
) -> tuple[steps.Step, ...]:
    """What is left of a preemption on the victim: evict its pods still running under the old placement
    (not the gated ones its owner made again), and once no pod of it is left, delete its own claims."""
    old = [p for p in members.by_index.values() if not p.gated]
    if old:
        return writes.eviction_steps(old, grace_seconds, why)
    if pods_left:
        return ()
    return tuple(
        steps.Step("delete-claim", c, why=why) for c, e in sorted(claims.items()) if e.owned and not e.deleting
    )


def victim_members(victim_key: str, w: world.World) -> membership.Members:
    """A victim gang's member pods (every labelled pod of its namespace when its spec does not parse)."""
    gang = w.gangs.get(victim_key)
    spec = gang.spec if gang is not None else None
    name = victim_key.split("/", 1)[1]
    return membership.members_of(name, spec.members if spec else 1 << 20, w.pods.get(victim_key, ()))


def victim_outcome(victim_key: str, preemptor: str, w: world.World, grace_seconds: int | None) -> Outcome | None:
    """Release a preempted gang: status Preempted (first), then its member pods through the Eviction API.

    Its claims are deleted by its own reconcile once its pods are gone (:func:`leftover_steps`).
    Never a gang of a system namespace."""
    if victim_key not in w.gangs or victim_key.split("/", 1)[0] in SYSTEM_NAMESPACES:
        return None
    members = victim_members(victim_key, w)
    why = f"{world.PREEMPTED_BY}{preemptor}"
    steps = writes.eviction_steps(members.by_index.values(), grace_seconds, why)
    st: dict[str, Any] = {"phase": "Preempted", "reason": "Preempted", "message": why}
    st.update(dict.fromkeys(("placement", "domain", "readySince")))  # what it held: cleared
    return Outcome(status=st, steps=steps, events=(("Warning", events.GANG_PREEMPTED, why),))


def checked(
    run: Callable[[str, steps.Step], None],
    gang: GangView,
    outcome: Outcome,
    w: world.World,
    *,
    grace_seconds: int | None,
    failed: type[Exception],
) -> Outcome:
    """``outcome`` if every victim pod's eviction passes a dry run, else the preemptor waiting, saying why.

    Run before anything of the preemption is written, so a refused one leaves the victim untouched."""
    if not outcome.victims:
        return outcome
    victims = [(v, victim_members(v, w)) for v in outcome.victims]
    why = preflight(run, victims, grace_seconds, failed)
    if not why:
        return outcome
    log.info("gang preemption refused", gang=gang.key, why=why)
    return refused(outcome, gang.status, why)


def terminating(pods: Iterable[MemberPodView]) -> bool:
    """Whether a pod of these is being deleted and not finished (it may still use its devices)."""
    return any(p.deleting and p.phase not in ("Succeeded", "Failed") for p in pods)
