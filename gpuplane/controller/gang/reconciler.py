"""One gang's reconcile: the pure decision (:func:`decide`) and the ordered writes that apply it.

:func:`decide` takes the gang, the world, the queue plan and the time, and
returns an :class:`Outcome`: the desired status, the API steps, the Events, and
the victims to release. Phases:

``Pending`` (members missing) -> ``Queued`` (waiting for room; may be
``Preempting``) or ``Unschedulable`` (can never fit the cluster as it is) ->
``Placing`` (decision in status; claims, affinities, gates being written) ->
``Placed`` (gates lifted, the scheduler allocates) -> ``Scheduled`` (every
member bound) -> ``Running``. Side exits: ``TimedOut`` (not scheduled within
``timeoutSeconds``: claims and member pods are released), ``Preempted``
(evicted for a higher-priority gang; re-queues if its pods come back),
``Released`` (every member pod finished or was deleted, the Job making them
failed or was suspended, the LeaderWorkerSet making them is being deleted, or a
member nobody replaces failed: what is left of the
gang is deleted, see :mod:`gpuplane.controller.gang.release`), ``Invalid`` (spec refused).

:func:`decide` reads the gang once (:func:`_read`: spec, members, claims) and asks its phases in
order, the first that applies deciding: :func:`_timed_out`, :func:`_holding` (a placement in
status: apply it, follow it to Running, or release it), :func:`_waiting_for_members`,
:func:`_queued` (the queue pass's action). Each returns an :class:`Outcome` built by
:func:`~gpuplane.controller.gang.outcome.finish`; nothing is mutated on the way.

:func:`apply` writes the status first (state in the API), then the steps in
order, stopping at the first failure; a later reconcile computes only what is
left, from the API, so a crash at any point converges.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from gpuplane.api import kubetime
from gpuplane.controller import events, kube, names
from gpuplane.controller.gang import (
    desired,
    leaderworkersets,
    owners,
    placement_record,
    preemption,
    queue_runner,
    release,
    status,
    unbound,
    world,
    writes,
)
from gpuplane.controller.gang.outcome import EventTuple, GangRead, Outcome, finish
from gpuplane.controller.gang.view import GangView
from gpuplane.controller.imex import hold, readiness
from gpuplane.controller.node import snapshot_builder
from gpuplane.controller.steps import Step

__all__ = ["Outcome", "Settings", "apply", "checked_preemption", "decide", "victim_outcome"]

log = structlog.get_logger(__name__)

Planned = Callable[[], tuple[queue_runner.Plan, snapshot_builder.ClusterView]]
Domains = Callable[[], Mapping[str, str]]  # GPU id -> NVLink domain (world.gpu_domains)
PRE_SCHEDULE = ("", "Pending", "Queued", "Unschedulable", "Placing", "Placed", "Preempted")


@dataclass(frozen=True)
class Settings:
    """Reconcile settings from the controller config."""

    eviction_grace_s: int | None = None
    bind_timeout_s: float = 0.0  # release a placement still unbound this long after placedAt (0: never)
    imex_ready_timeout_s: float = 0.0  # release a placement whose IMEX domain is not ready this long (0: never)
    queue: queue_runner.Settings = field(default_factory=queue_runner.Settings)


def decide(
    key: str,
    gang: GangView,
    w: world.World,
    *,
    planned: Planned,
    domains: Domains,
    now: float,
    settings: Settings,
    imex: hold.Written | None = hold.NOT_SERVED,
) -> Outcome:
    """The desired status, steps, Events and victims for gang ``key`` (pure but for ``planned``).

    The phases, in order; the first that applies decides: an invalid spec, a timeout, a
    placement the gang holds, members still missing or ungated, and the queue's action.
    ``planned`` gives the queue pass's plan and view; only the queue's action calls it, so a gang
    with a bad spec, timed out, waiting for its members or holding a placement costs no pass over the
    cluster. A held placement reads back with ``domains`` alone (the GPUs' NVLink domains). ``imex``: what the
    last IMEX pass wrote (None: no pass yet); a gang across nodes of one clique keeps its gates until it names
    every member claim (:mod:`gpuplane.controller.imex.hold`).
    """
    g = _read(key, gang, w, now)
    if isinstance(g, Outcome):
        return g
    outcome = _timed_out(g, settings, now)
    if outcome is None:
        outcome = _holding(g, w, domains, settings, now, imex=imex)
    if outcome is None:
        outcome = _waiting_for_members(g, w, settings)
    if outcome is None:
        outcome = _queued(g, w, planned()[0], now, domains=domains, imex=imex)
    return outcome


def _read(key: str, gang: GangView, w: world.World, now: float) -> GangRead | Outcome:
    """Find the gang's members and claims; an ``Invalid`` outcome for a spec that does not parse."""
    ns, name = key.split("/", 1)
    prev = dict(gang.status)
    spec = gang.spec
    if spec is None:
        st = {"phase": "Invalid", "reason": "InvalidSpec", "message": gang.invalid}
        evs: tuple[EventTuple, ...] = (
            (("Warning", events.GANG_INVALID, gang.invalid),) if gang.phase != "Invalid" else ()
        )
        return Outcome(status=st, events=evs)
    members = w.members(key, spec.members)
    jobs = w.jobs.get(key, ())
    lws = w.leaderworkersets.get(key, ())
    shape = release.shape_problems(spec, members, w.claims, ns)
    problems = sorted({*members.problems, *shape})
    base: dict[str, Any] = {
        "observedGeneration": gang.generation,
        "membersPresent": len(members.by_index),
        "placedMembers": members.bound,
        "runningMembers": members.running,
        "problems": problems or None,
    }
    new_problems: tuple[EventTuple, ...] = ()
    if problems != sorted(prev.get("problems") or []):
        new_problems = tuple(("Warning", events.GANG_MEMBER_PROBLEM, p) for p in problems)
    return GangRead(
        key=key,
        ref=desired.GangRef(namespace=ns, name=name, uid=gang.uid),
        spec=spec,
        members=members,
        claims=w.gang_claims(key),
        prev=prev,
        stamp=kubetime.rfc3339(now),
        created=gang.created,
        base=base,
        events=new_problems,
        jobs=jobs,
        leaderworkersets=lws,
        owner=leaderworkersets.combined(owners.verdict(jobs), leaderworkersets.verdict(lws)),
        shape=tuple(shape),
    )


def _timed_out(g: GangRead, settings: Settings, now: float) -> Outcome | None:
    """Not scheduled within ``timeoutSeconds`` of creation: give the gang up (and stay ``TimedOut``).

    Its pods and claims go; the Jobs (or JobSet) making its pods are suspended rather than left to make
    them again, gated for nothing, and are told so by an Event (:func:`release.timeout_steps`).
    """
    grace = settings.eviction_grace_s
    if g.prev_phase == "TimedOut":
        message = str(g.prev.get("message", ""))
        again = release.timeout_steps(g.ref, g.members, (), g.jobs, grace_seconds=grace, why=message, again=True)
        return finish(g, "TimedOut", g.prev.get("reason", "Timeout"), message, steps=again.steps)
    timeout = g.spec.timeoutSeconds
    if not timeout or g.prev_phase not in PRE_SCHEDULE or now - g.created <= timeout:
        return None
    why = f"not scheduled within {timeout}s"
    if g.prev.get("message"):
        why += f"; last state {g.prev_phase}: {g.prev['message']}"
    stop = release.timeout_steps(g.ref, g.members, g.claims, g.jobs, grace_seconds=grace, why=why)
    return finish(
        g,
        "TimedOut",
        "Timeout",
        why + stop.note(g.ref.namespace, g.ref.name),
        {"placement": None, "domain": None, "nominatedVictims": None},
        steps=stop.steps,
        etype="Warning",
        tell_owners=events.GANG_OWNER_TIMED_OUT,
    )


def _holding(
    g: GangRead, w: world.World, domains: Domains, settings: Settings, now: float, *, imex: hold.Written | None
) -> Outcome | None:
    """A gang that holds a placement: apply what is left of it, or follow its members to Running (or Released)."""
    if g.prev_phase not in world.HOLDING_PHASES:
        return None
    gpus = domains()
    decision = placement_record.decision_from_status(g.key, g.prev.get("placement"), gpus)
    if decision is None:
        return None
    spec, members = g.spec, g.members
    ends = release.verdict(g.owner, members, spec.members, g.prev_phase, g.present)
    if ends is not None:
        steps = writes.release_steps(g.ref, members, g.claims, settings.eviction_grace_s, ends.message)
        return finish(
            g,
            "Released",
            ends.reason,
            ends.message,
            {"placement": None, "domain": None},
            steps=steps,
            etype=ends.severity,
            tell_owners=ends.reason if ends.severity == "Warning" else "",
        )
    since = kubetime.epoch(g.prev.get("placedAt")) or g.created
    g, applied, reason = hold.apply_steps(
        g, decision, claims=w.claims, gpu_domains=gpus, written=imex, since=since, now=now
    )
    g = g.with_problems(applied.problems)
    domain = ",".join(decision.domains)
    if applied.steps:
        msg = applied.blocked or f"applying placement in NVLink domain {domain}"
        return finish(g, "Placing", reason, msg, {"domain": domain}, steps=applied.steps)
    if members.complete(spec.members) and members.running == spec.members:
        return finish(g, "Running", "AllRunning", f"all {spec.members} members running in {domain}", {"domain": domain})
    late, why = unbound.overdue(g.prev, members.bound, spec.members, now, settings.bind_timeout_s), unbound.REASON
    if not late and imex is not None:  # its IMEX domain never ready on every node (imex/readiness.py)
        unready, limit = imex.unready.get(g.ref.uid), settings.imex_ready_timeout_s
        late = readiness.overdue(unready, g.prev, members.running, spec.members, now=now, timeout_s=limit)
        why = readiness.RELEASED
    if late:
        gone = writes.release_steps(g.ref, members, g.claims, settings.eviction_grace_s, late)
        extra = {"placement": None, "domain": None, "readySince": None}
        return finish(g, "Preempted", why, late, extra, steps=gone, etype="Warning")
    if members.complete(spec.members) and members.bound == spec.members:
        return finish(g, "Scheduled", "AllBound", f"all {spec.members} members bound in {domain}", {"domain": domain})
    return finish(
        g,
        "Placed",
        "GatesLifted",
        f"gates lifted; {members.bound} of {spec.members} members bound by the scheduler",
        {"domain": domain},
    )


def _waiting_for_members(g: GangRead, w: world.World, settings: Settings) -> Outcome | None:
    """Members missing or not gated: ``Pending`` (a preempted or released gang stays so until its pods return).

    A gang preempted by another finishes its release here (:func:`preemption.leftover_steps`): its pods
    still running are evicted (as their PodDisruptionBudgets allow), its claims deleted once no pod is left.
    """
    spec, members = g.spec, g.members
    if members.complete(spec.members) and all(p.gated for p in members.by_index.values()):
        return None
    message = str(g.prev.get("message") or "")
    preempted = g.prev_phase == "Preempted" and message.startswith(world.PREEMPTED_BY)
    if g.prev_phase in ("Preempted", "Released") and (g.present < spec.members or preempted):
        # Stay in whichever of the two it is until its pods come back (then it queues again).
        steps: tuple[Step, ...] = ()
        if preempted:
            left = preemption.terminating(w.pods.get(g.key, ()))
            steps = preemption.leftover_steps(members, g.claims, left, settings.eviction_grace_s, message)
        return finish(g, g.prev_phase, str(g.prev.get("reason") or g.prev_phase), message, steps=steps)
    ungated = [p.name for p in members.by_index.values() if not p.gated]
    msg = (
        f"{g.present} of {spec.members} member pods present"
        if not ungated
        else f"member pods {', '.join(ungated[:5])} lack the {names.SCHEDULING_GATE} gate"
    )
    if g.owner.gave_up:
        msg += f" ({g.owner.message})"
    return finish(g, "Pending", events.GANG_WAITING_MEMBERS, msg, {"placement": None})


def _queued(
    g: GangRead, w: world.World, plan: queue_runner.Plan, now: float, *, domains: Domains, imex: hold.Written | None
) -> Outcome:
    """A complete, gated gang: what the queue pass decided for it (place, refuse, preempt, wait)."""
    spec = g.spec
    if g.shape:
        return finish(g, "Pending", events.GANG_MEMBER_PROBLEM, g.shape[0], {"placement": None}, etype="Warning")
    ready_since = g.prev.get("readySince") or g.stamp
    if not g.prev.get("readySince"):  # once per queueing: the gang just became ready
        ignored = preemption.priority_ignored_note(spec.priority, g.members)
        if ignored:
            g = g.with_event(("Normal", preemption.REASON_PRIORITY_IGNORED, ignored))
        approx = world.unfiltered_selectors(w, spec)
        if approx:
            g = g.with_event(
                (
                    "Normal",
                    events.GANG_SELECTOR_APPROXIMATE,
                    f"selector(s) not evaluated by the controller: {'; '.join(approx)}. Placement treated them "
                    "as matching every device; the scheduler still enforces them, so a placement may not allocate",
                )
            )
    action = plan.actions.get(g.key)
    queue_extra: dict[str, Any] = {"readySince": ready_since}
    if action is None:
        return finish(g, "Queued", events.GANG_QUEUED, "waiting for the next queue pass", queue_extra)
    queue_extra.update({"queuePosition": action.position, "effectivePriority": action.effective_priority})
    if action.kind == "place" and action.decision is not None:
        decision = action.decision
        placement = placement_record.placement_status(decision)
        gpus = domains()
        g, applied, reason = hold.apply_steps(
            g, decision, claims=w.claims, gpu_domains=gpus, written=imex, since=now, now=now
        )
        domain = ",".join(decision.domains)
        waited = now - (kubetime.epoch(ready_since) or now)
        msg = f"placed {spec.members} members in NVLink domain {domain} (decision {placement['id']})"
        msg += f"; {applied.blocked}" if reason == hold.WAITING else ""  # the Placed Event says the gates wait
        return finish(
            g,
            "Placing",
            events.GANG_PLACED,
            msg,
            {**queue_extra, "placement": placement, "domain": domain, "nominatedVictims": None, "placedAt": g.stamp},
            steps=applied.steps,
            placed_after=waited,
        )
    if action.kind == "unschedulable":
        return finish(
            g,
            "Unschedulable",
            events.GANG_UNSCHEDULABLE,
            action.reason,
            queue_extra,
            etype="Warning",
            tell_owners=events.GANG_REFUSED,
        )
    if action.kind == "preempt":
        return finish(
            g,
            "Queued",
            events.GANG_PREEMPTING,
            action.reason,
            {**queue_extra, "nominatedVictims": list(action.victims)},
            etype="Warning",
            victims=action.victims,
        )
    if action.kind == "await-victims":
        return finish(g, "Queued", events.GANG_PREEMPTING, action.reason, queue_extra)
    return finish(g, "Queued", events.GANG_QUEUED, action.reason, queue_extra)


def victim_outcome(victim_key: str, preemptor: str, w: world.World, settings: Settings) -> Outcome | None:
    """Release a preempted gang (:func:`preemption.victim_outcome`)."""
    return preemption.victim_outcome(victim_key, preemptor, w, settings.eviction_grace_s)


def checked_preemption(
    writer: kube.KubeWriter, gang: GangView, outcome: Outcome, w: world.World, settings: Settings
) -> Outcome:
    """``outcome`` once every victim pod's eviction passed a dry run (:func:`preemption.checked`)."""
    return preemption.checked(
        writer.run, gang, outcome, w, grace_seconds=settings.eviction_grace_s, failed=kube.StepFailed
    )


def apply(
    writer: kube.KubeWriter,
    recorder: events.Recorder,
    coalescer: status.Coalescer,
    *,
    key: str,
    gang: GangView,
    outcome: Outcome,
    now: float,
) -> tuple[dict[str, Any], bool]:
    """Write status (first, if changed and admitted), then steps in order, then Events.

    Returns the status patch written (empty if none) and whether every step succeeded.
    """
    ns, name = key.split("/", 1)
    patch = status.merge_patch(gang.status, outcome.status)
    written: dict[str, Any] = {}
    if patch and coalescer.admit(key, patch, now):
        writer.patch_gang_status(ns, name, patch)
        written = patch
    ok = True
    for step in outcome.steps:
        try:
            writer.run(ns, step)
        except kube.StepFailed as exc:
            ok = False
            if step.kind != "wait":
                log.warning("gang step failed; the next reconcile resumes from here", gang=key, error=str(exc))
            break
    ref = gang.ref
    for etype, reason, message in outcome.events:
        recorder.event(ref, etype, reason, message)
    for target, etype, reason, message in outcome.owner_events:
        recorder.event(target, etype, reason, message)
    return written, ok
