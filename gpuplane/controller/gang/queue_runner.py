"""The gang queue as a thin adapter over :mod:`gpuplane.placement.queue`: gangs in, one action per gang out.

The queue *policy* is the placement module's; this module translates gangs
into :class:`~gpuplane.placement.model.Request` values and the cluster view
into snapshots, calls the placement API, and turns its answers into actions
the reconciler applies:

* order: :func:`gpuplane.placement.queue.order` (effective priority with
  :class:`~gpuplane.placement.queue.Aging`, then arrival, then id); a gang's
  arrival is when it became ready (``readySince``), so aging counts waiting;
* fairness: among gangs of equal effective priority, the namespace with the
  smallest :func:`~gpuplane.placement.queue.dominant_share` (of
  :func:`~gpuplane.placement.queue.demand` over
  :func:`~gpuplane.placement.queue.capacity`) goes first, recomputed as the
  pass places gangs;
* preemption: :func:`gpuplane.placement.queue.select_victims` (the fewest
  strictly-lower-priority gangs in one NVLink domain; never for equal priority).
  A gang's priority is its member pods' Kubernetes priority (the lowest member's,
  resolved by the API server from a PriorityClass an administrator grants), never
  the tenant's ``spec.priority``; a gang whose PriorityClass says
  ``preemptionPolicy: Never`` never preempts, and gangs in system namespaces are
  never victims.
  The plan only nominates them; the gang is placed by a later pass, from the
  real allocations, once their capacity is really free.

What the adapter adds, because placement's queue API has no place for it:

* a device filter per gang (DeviceClass and CEL selectors): each gang is
  decided on the working snapshot restricted to the GPUs it admits. That is
  why :func:`~gpuplane.placement.queue.drf_schedule`, which places every
  request on one snapshot and orders tenants by share before priority, is not
  called: the loop below applies the same share rule per gang, priority first;
* per-gang outcomes with reasons (can never fit vs waits), ``await-victims``
  for a preemptor whose victims still hold GPUs, and the starvation barrier: a
  gang that waited past ``starvation_s`` (or is preempting) blocks everything
  after it, so freed capacity drains towards it instead of to a backfill.

It is pure and deterministic: the same gangs and view give the same plan on
any replica, so whichever replica leads applies the same decisions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpuplane.controller.gang.membership import SYSTEM_NAMESPACES
from gpuplane.controller.gang.spec import GangSpec, to_request
from gpuplane.controller.node import snapshot_builder
from gpuplane.placement import model, place, snapshot
from gpuplane.placement import queue as pq
from gpuplane.placement.policies import base

Admit = snapshot_builder.GpuFilter


@dataclass(frozen=True)
class Entry:
    """A gang as the queue sees it."""

    key: str  # "ns/name"
    namespace: str
    spec: GangSpec
    created: float
    waiting_since: float
    ready: bool  # every member pod exists and is gated: the gang wants a placement
    holding: bool  # placed (or being placed): holds capacity in the view
    nominated: tuple[str, ...] = ()  # victims this gang already asked to evict
    geometry_profile: str | None = None  # MIG profile in geometry names (None: not offered)
    priority: int = 0  # Kubernetes priority of its lowest member pod (membership.Members.priority)
    preempts: bool = True  # no member's PriorityClass says preemptionPolicy: Never


@dataclass(frozen=True)
class Action:
    """What the pass decided for one gang. ``kind``: place, wait, unschedulable, preempt, await-victims."""

    kind: str
    reason: str = ""
    decision: model.Decision | None = None
    victims: tuple[str, ...] = ()
    domain: str = ""
    effective_priority: int = 0
    position: int = 0


@dataclass(frozen=True)
class Settings:
    """Queue tuning, read once from the controller config."""

    aging_s: float = 60.0
    aging_cap: int = 10
    starvation_s: float = 600.0

    @property
    def aging(self) -> pq.Aging:
        """The placement module's aging rule with these settings."""
        return pq.Aging(period_s=self.aging_s, max_boost=self.aging_cap)


@dataclass(frozen=True)
class Plan:
    """One action per waiting gang, and the order they were considered in."""

    actions: Mapping[str, Action]
    order: tuple[str, ...]


def request_of(entry: Entry) -> model.Request:
    """The placement request for a gang; its arrival is when it became ready."""
    return to_request(
        entry.spec, entry.key, entry.namespace, entry.waiting_since, entry.geometry_profile, priority=entry.priority
    )


def effective_priority(entry: Entry, now: float, settings: Settings) -> int:
    """Base priority plus aging, capped (placement's rule)."""
    return pq.effective_priority(request_of(entry), now, settings.aging)


def with_allocation(view: snapshot_builder.ClusterView, decision: model.Decision) -> snapshot_builder.ClusterView:
    """The view with ``decision`` taken (so the next gang of the pass sees it)."""
    whole = set(view.taken_whole)
    mig = {k: list(v) for k, v in view.taken_mig.items()}
    for m in decision.members:
        whole.update(m.gpus)
        for s in m.mig:
            mig.setdefault(s.gpu, []).append(model.MigInstance(s.profile, s.start))
    return dataclasses.replace(
        view,
        taken_whole=frozenset(whole),
        taken_mig={k: tuple(sorted(v, key=lambda i: (i.start, i.profile))) for k, v in mig.items()},
    )


def _within(decision: model.Decision, snap: snapshot.Snapshot, ids: frozenset[str]) -> model.Decision | None:
    """The part of a running gang's decision on GPUs ``snap`` holds (None: nothing there)."""
    members = []
    for m in decision.members:
        gpus = tuple(g for g in m.gpus if g in ids)
        mig = tuple(s for s in m.mig if s.gpu in ids)
        if gpus or mig:
            members.append(dataclasses.replace(m, gpus=gpus, mig=mig))
    return dataclasses.replace(decision, members=tuple(members)) if members else None


def victims_for(
    request: model.Request,
    snap: snapshot.Snapshot,
    view: snapshot_builder.ClusterView,
    candidates: Mapping[str, model.Request],
    policy: base.Policy,
) -> pq.Preemption | None:
    """placement's select_victims over the running gangs in ``candidates``, seen through the gang's filter."""
    ids = frozenset(g.id for g in snap.gpus())
    running = []
    for key, req in sorted(candidates.items()):
        held = view.holdings.get(key)
        part = _within(held, snap, ids) if held is not None else None
        if part is not None:
            running.append(pq.Running(req, part))
    if not running:
        return None
    try:
        return pq.select_victims(request, snap, running, policy)
    except ValueError:  # holdings overlap in the view (a claim and a reservation on one GPU): try next pass
        return None


def plan(
    entries: Sequence[Entry],
    view: snapshot_builder.ClusterView,
    admit_for: Callable[[Entry], Admit],
    policy: base.Policy,
    *,
    now: float,
    settings: Settings = Settings(),
) -> Plan:
    """Decide, for every ready gang, whether it is placed now, waits, can never fit, or preempts."""
    aging = settings.aging
    requests = {e.key: request_of(e) for e in entries}
    everything = view.snapshot()
    cap = pq.capacity(everything)
    held: dict[str, pq.Usage] = {}
    for key in view.holdings:
        if key in requests:
            ns = requests[key].namespace
            held[ns] = held.get(ns, pq.Usage()).plus(pq.demand(requests[key], everything))
    admitted: dict[Admit, frozenset[str]] = {}  # per distinct filter: gangs of one shape share one

    waiting = [e for e in entries if e.ready and not e.holding]
    rank = {r.id: i for i, r in enumerate(pq.order([requests[e.key] for e in waiting], now, aging))}
    eff = {e.key: pq.effective_priority(requests[e.key], now, aging) for e in waiting}
    # Running gangs that may be preempted: placed ones, each nominated by at most one preemptor per pass.
    # Never a gang in a system namespace.
    preemptible = {e.key: requests[e.key] for e in entries if e.holding and e.namespace not in SYSTEM_NAMESPACES}
    actions: dict[str, Action] = {}
    order: list[str] = []
    barrier = ""
    work = view
    remaining = list(waiting)
    while remaining:
        nxt = min(
            remaining,
            key=lambda e: (-eff[e.key], pq.dominant_share(held.get(e.namespace, pq.Usage()), cap), rank[e.key]),
        )
        remaining.remove(nxt)
        order.append(nxt.key)
        position = len(order)
        prio = eff[nxt.key]
        if nxt.spec.migProfile and nxt.geometry_profile is None:
            actions[nxt.key] = Action(
                "unschedulable",
                f"no node publishes MIG profile {nxt.spec.migProfile!r}",
                effective_priority=prio,
                position=position,
            )
            continue
        request = requests[nxt.key]
        # A MIG gang only on GPUs that publish its profile (the geometry's slot names are shared by models).
        admit = admit_for(nxt)
        if admit not in admitted:
            admitted[admit] = view.admitted(admit)
        snap = work.snapshot(mig_profile=nxt.spec.migProfile or None, only=admitted[admit])
        never = place.check(request, snap)
        if never:
            actions[nxt.key] = Action("unschedulable", never, effective_priority=prio, position=position)
            continue
        if barrier:
            actions[nxt.key] = Action(
                "wait", f"queued behind {barrier}, which goes first", effective_priority=prio, position=position
            )
            continue
        decision = place.place(request, snap, policy)
        if decision.placed:
            actions[nxt.key] = Action(
                "place",
                decision=decision,
                domain=",".join(decision.domains),
                effective_priority=prio,
                position=position,
            )
            work = with_allocation(work, decision)
            held[nxt.namespace] = held.get(nxt.namespace, pq.Usage()).plus(pq.demand(request, snap))
            continue
        still_held = tuple(v for v in nxt.nominated if v in work.holdings)
        if still_held:
            actions[nxt.key] = Action(
                "await-victims",
                f"waiting for preempted gang(s) {', '.join(still_held)} to release their GPUs",
                victims=still_held,
                effective_priority=prio,
                position=position,
            )
            barrier = nxt.key
            continue
        chosen = victims_for(request, snap, work, preemptible, policy) if nxt.preempts else None
        if chosen is not None:
            victims = tuple(sorted(chosen.victims))  # a canonical form for status and Events
            for v in victims:
                preemptible.pop(v, None)
            actions[nxt.key] = Action(
                "preempt",
                f"preempting lower-priority gang(s) {', '.join(victims)} in NVLink domain {chosen.domain}",
                victims=victims,
                domain=chosen.domain,
                effective_priority=prio,
                position=position,
            )
            barrier = nxt.key
            continue
        why = decision.reason if nxt.preempts else f"{decision.reason} (preemptionPolicy Never: it does not preempt)"
        actions[nxt.key] = Action("wait", why, effective_priority=prio, position=position)
        if now - nxt.waiting_since >= settings.starvation_s:
            barrier = nxt.key
    return Plan(actions=actions, order=tuple(order))
