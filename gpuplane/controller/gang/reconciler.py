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
``Released`` (every member pod finished or was deleted: claims deleted),
``Invalid`` (spec refused).

:func:`apply` writes the status first (state in the API), then the steps in
order, stopping at the first failure; a later reconcile computes only what is
left, from the API, so a crash at any point converges.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from gpuplane.controller import events, kube, names
from gpuplane.controller.gang import desired, membership, placement_record, queue_runner, status, world, writes
from gpuplane.controller.gang.spec import SpecError, parse_gang_spec
from gpuplane.controller.node import snapshot_builder

log = structlog.get_logger(__name__)

PRE_SCHEDULE = ("", "Pending", "Queued", "Unschedulable", "Placing", "Placed", "Preempted")


@dataclass(frozen=True)
class Outcome:
    """What to write for one gang."""

    status: dict[str, Any]
    steps: tuple[writes.Step, ...] = ()
    events: tuple[tuple[events.EventType, str, str], ...] = ()
    victims: tuple[str, ...] = ()
    placed_after_s: float | None = None  # set when this outcome places the gang (wait-time metric)


@dataclass(frozen=True)
class Settings:
    """Reconcile settings from the controller config."""

    eviction_grace_s: int | None = None
    queue: queue_runner.Settings = field(default_factory=queue_runner.Settings)


def _conditions(
    previous: Sequence[Mapping[str, Any]], now: str, *, present: bool, placed: bool, scheduled: bool, msg: str
) -> list[dict[str, Any]]:
    prev = {c.get("type"): c for c in previous}
    return [
        status.condition(
            "MembersPresent",
            present,
            "AllMembers" if present else "WaitingForMembers",
            "",
            previous=prev.get("MembersPresent"),
            now=now,
        ),
        status.condition(
            "Placed",
            placed,
            "Placed" if placed else "NotPlaced",
            "" if placed else msg,
            previous=prev.get("Placed"),
            now=now,
        ),
        status.condition(
            "Scheduled", scheduled, "AllBound" if scheduled else "NotBound", "", previous=prev.get("Scheduled"), now=now
        ),
    ]


def decide(
    key: str,
    body: Mapping[str, Any],
    w: world.World,
    *,
    view: snapshot_builder.ClusterView,
    plan: queue_runner.Plan,
    now: float,
    settings: Settings,
) -> Outcome:
    """The desired status, steps, Events and victims for gang ``key`` (pure)."""
    ns, name = key.split("/", 1)
    meta = body.get("metadata") or {}
    prev = dict(body.get("status") or {})
    prev_phase = prev.get("phase", "")
    stamp = status.now_rfc3339(now)
    try:
        spec = parse_gang_spec(body.get("spec") or {})
    except SpecError as exc:
        st = {"phase": "Invalid", "reason": "InvalidSpec", "message": str(exc)}
        evs: tuple[tuple[events.EventType, str, str], ...] = (
            (("Warning", events.GANG_INVALID, str(exc)),) if prev_phase != "Invalid" else ()
        )
        return Outcome(status=st, events=evs)
    ref = desired.GangRef(namespace=ns, name=name, uid=meta.get("uid", ""))
    members = membership.members_of(name, spec.members, w.pods.get(key, ()))
    claims_here = w.gang_claims(key)
    present = len(members.by_index)
    base: dict[str, Any] = {
        "observedGeneration": meta.get("generation"),
        "membersPresent": present,
        "placedMembers": members.bound,
        "runningMembers": members.running,
    }
    out_events: list[tuple[events.EventType, str, str]] = []
    problems = sorted(members.problems)
    base["problems"] = problems or None
    if problems != sorted(prev.get("problems") or []):
        out_events.extend(("Warning", events.GANG_MEMBER_PROBLEM, p) for p in problems)
    created = world.created_at(body)

    def finish(
        phase: str,
        reason: str,
        message: str,
        extra: Mapping[str, Any] | None = None,
        *,
        steps: Sequence[writes.Step] = (),
        etype: events.EventType = "Normal",
        victims: tuple[str, ...] = (),
        placed_after: float | None = None,
    ) -> Outcome:
        st = {**base, "phase": phase, "reason": reason, "message": message, **(extra or {})}
        placement = st.get("placement", prev.get("placement"))
        st["conditions"] = _conditions(
            prev.get("conditions") or [],
            stamp,
            present=members.complete(spec.members),
            placed=phase in world.HOLDING_PHASES,
            scheduled=phase in ("Scheduled", "Running"),
            msg=message,
        )
        if placement is None:
            st.setdefault("placement", None)
        if phase != prev_phase or reason != prev.get("reason"):
            out_events.append((etype, reason, message))
        return Outcome(
            status=st, steps=tuple(steps), events=tuple(out_events), victims=victims, placed_after_s=placed_after
        )

    # Timeout: not scheduled within timeoutSeconds of creation -> release everything.
    if prev_phase == "TimedOut":
        return finish("TimedOut", prev.get("reason", "Timeout"), prev.get("message", ""))
    if spec.timeoutSeconds and prev_phase in PRE_SCHEDULE and now - created > spec.timeoutSeconds:
        why = f"not scheduled within {spec.timeoutSeconds}s"
        if prev.get("message"):
            why += f"; last state {prev_phase}: {prev['message']}"
        steps = writes.release_steps(ref, members, claims_here, settings.eviction_grace_s, why)
        return finish(
            "TimedOut",
            "Timeout",
            why,
            {"placement": None, "domain": None, "nominatedVictims": None},
            steps=steps,
            etype="Warning",
        )

    holding = prev_phase in world.HOLDING_PHASES
    domains = {g.id: g.domain for g in view.gpus}
    decision = placement_record.decision_from_status(key, prev.get("placement"), domains) if holding else None

    if decision is not None:
        if present == 0:
            gone = tuple(writes.Step("delete-claim", c, why="every member pod is gone") for c in sorted(claims_here))
            return finish(
                "Released",
                "MembersGone",
                "every member pod finished or was deleted; claims released",
                {"placement": None, "domain": None},
                steps=gone,
            )
        applied = writes.apply_steps(ref, spec, decision, members, claims_here, driver_profile=spec.migProfile)
        if applied.problems and sorted(applied.problems) != sorted(prev.get("problems") or []):
            base["problems"] = sorted(applied.problems)
            out_events.extend(("Warning", events.GANG_MEMBER_PROBLEM, p) for p in applied.problems)
        domain = ",".join(decision.domains)
        if applied.steps:
            msg = applied.blocked or f"applying placement in NVLink domain {domain}"
            return finish("Placing", "Applying", msg, {"domain": domain}, steps=applied.steps)
        if members.complete(spec.members) and members.running == spec.members:
            return finish(
                "Running", "AllRunning", f"all {spec.members} members running in {domain}", {"domain": domain}
            )
        if members.complete(spec.members) and members.bound == spec.members:
            return finish("Scheduled", "AllBound", f"all {spec.members} members bound in {domain}", {"domain": domain})
        return finish(
            "Placed",
            "GatesLifted",
            f"gates lifted; {members.bound} of {spec.members} members bound by the scheduler",
            {"domain": domain},
        )

    if not members.complete(spec.members) or not all(p.gated for p in members.by_index.values()):
        if prev_phase in ("Preempted", "Released") and present < spec.members:
            # Stay in whichever of the two it is until its pods come back (then it queues again).
            return finish(prev_phase, str(prev.get("reason") or prev_phase), str(prev.get("message") or ""))
        ungated = [p.name for p in members.by_index.values() if not p.gated]
        msg = (
            f"{present} of {spec.members} member pods present"
            if not ungated
            else f"member pods {', '.join(ungated[:5])} lack the {names.SCHEDULING_GATE} gate"
        )
        return finish("Pending", events.GANG_WAITING_MEMBERS, msg, {"placement": None})

    ready_since = prev.get("readySince") or stamp
    if not prev.get("readySince"):  # once per queueing: the gang just became ready
        approx = world.unfiltered_selectors(w, spec)
        if approx:
            out_events.append(
                (
                    "Normal",
                    events.GANG_SELECTOR_APPROXIMATE,
                    f"selector(s) not evaluated by the controller: {'; '.join(approx)}. Placement treated them "
                    "as matching every device; the scheduler still enforces them, so a placement may not allocate",
                )
            )
    action = plan.actions.get(key)
    queue_extra: dict[str, Any] = {"readySince": ready_since}
    if action is None:
        return finish("Queued", events.GANG_QUEUED, "waiting for the next queue pass", queue_extra)
    queue_extra.update({"queuePosition": action.position, "effectivePriority": action.effective_priority})
    if action.kind == "place" and action.decision is not None:
        decision = action.decision
        placement = placement_record.placement_status(decision)
        applied = writes.apply_steps(ref, spec, decision, members, claims_here, driver_profile=spec.migProfile)
        domain = ",".join(decision.domains)
        waited = now - (status.parse_time(ready_since) or now)
        msg = f"placed {spec.members} members in NVLink domain {domain} (decision {placement['id']})"
        return finish(
            "Placing",
            events.GANG_PLACED,
            msg,
            {**queue_extra, "placement": placement, "domain": domain, "nominatedVictims": None, "placedAt": stamp},
            steps=applied.steps,
            placed_after=waited,
        )
    if action.kind == "unschedulable":
        return finish("Unschedulable", events.GANG_UNSCHEDULABLE, action.reason, queue_extra, etype="Warning")
    if action.kind == "preempt":
        return finish(
            "Queued",
            events.GANG_PREEMPTING,
            action.reason,
            {**queue_extra, "nominatedVictims": list(action.victims)},
            etype="Warning",
            victims=action.victims,
        )
    if action.kind == "await-victims":
        return finish("Queued", events.GANG_PREEMPTING, action.reason, queue_extra)
    return finish("Queued", events.GANG_QUEUED, action.reason, queue_extra)


def victim_outcome(victim_key: str, preemptor: str, w: world.World, settings: Settings) -> Outcome | None:
    """Release a preempted gang: status Preempted (first), then its member pods and claims."""
    body = w.gangs.get(victim_key)
    if body is None:
        return None
    ns, name = victim_key.split("/", 1)
    spec = world.parse_spec(body)
    members = membership.members_of(name, spec.members if spec else 1 << 20, w.pods.get(victim_key, ()))
    ref = desired.GangRef(ns, name, (body.get("metadata") or {}).get("uid", ""))
    why = f"preempted by higher-priority gang {preemptor}"
    steps = writes.release_steps(ref, members, w.gang_claims(victim_key), settings.eviction_grace_s, why)
    st = {
        "phase": "Preempted",
        "reason": "Preempted",
        "message": why,
        "placement": None,
        "domain": None,
        "readySince": None,
    }
    return Outcome(status=st, steps=steps, events=(("Warning", events.GANG_PREEMPTED, why),))


def apply(
    writer: kube.KubeWriter,
    recorder: events.Recorder,
    coalescer: status.Coalescer,
    *,
    key: str,
    body: Mapping[str, Any],
    outcome: Outcome,
    now: float,
) -> tuple[dict[str, Any], bool]:
    """Write status (first, if changed and admitted), then steps in order, then Events.

    Returns the status patch written (empty if none) and whether every step succeeded.
    """
    ns, name = key.split("/", 1)
    patch = status.merge_patch(body.get("status") or {}, outcome.status)
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
    ref = events.ObjectRef.of(body, names.GANG_API_VERSION, names.GANG_KIND)
    for etype, reason, message in outcome.events:
        recorder.event(ref, etype, reason, message)
    return written, ok
