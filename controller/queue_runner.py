"""The gang queue: priority with aging, per-namespace Dominant Resource Fairness, backfill, preemption.

One pass (:func:`plan`) walks every waiting gang in order over a working copy
of the cluster view and returns one :class:`Action` per gang. It is pure and
deterministic: the same gangs and view give the same plan on any replica, so
whichever replica leads applies the same decisions after a fail-over.

Order: effective priority (priority plus one per ``aging_s`` waited, at most
``aging_cap``; so nothing starves), then the namespace's dominant share (DRF
over GPUs and GPU memory, recomputed as the pass places gangs), then creation
time, then namespace/name. A gang that does not fit is skipped (backfill), but
one that has waited past ``starvation_s`` becomes a barrier: nothing after it
is placed until it is, so freed capacity drains towards it.

Preemption: when a waiting gang does not fit, look for the fewest placed gangs
of strictly lower *base* priority (never equal; aging never preempts), all
holding capacity in one NVLink domain, whose release makes it fit. The plan
only nominates them; the gang is placed by a later pass, from the real
allocations, once their capacity is really free.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from controller import gangspec, snapshot_builder
from controller.placement import model, place
from controller.placement.policies import base

Admit = snapshot_builder.GpuFilter


@dataclass(frozen=True)
class Entry:
    """A gang as the queue sees it."""

    key: str  # "ns/name"
    namespace: str
    spec: gangspec.GangSpec
    created: float
    waiting_since: float
    ready: bool  # every member pod exists and is gated: the gang wants a placement
    holding: bool  # placed (or being placed): holds capacity in the view
    nominated: tuple[str, ...] = ()  # victims this gang already asked to evict
    geometry_profile: str | None = None  # MIG profile in geometry names (None: not offered)


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
    max_victim_sets: int = 512


@dataclass(frozen=True)
class Plan:
    """One action per waiting gang, and the order they were considered in."""

    actions: Mapping[str, Action]
    order: tuple[str, ...]


def effective_priority(entry: Entry, now: float, settings: Settings) -> int:
    """Base priority plus aging, capped."""
    waited = max(0.0, now - entry.waiting_since)
    bonus = int(waited // settings.aging_s) if settings.aging_s > 0 else 0
    return entry.spec.priority + min(settings.aging_cap, bonus)


def usage(view: snapshot_builder.ClusterView, decision: model.Decision) -> tuple[float, float]:
    """(GPUs, GPU memory bytes) a decision holds; a MIG slot counts its share of compute and memory."""
    geo = view.geometry
    gpus = 0.0
    mem = 0.0
    for m in decision.members:
        for g in m.gpus:
            gpus += 1
            mem += view.gpu_memory(g)
        for s in m.mig:
            p = geo.profile(s.profile)
            gpus += p.compute / geo.compute_slices
            mem += view.gpu_memory(s.gpu) * p.memory / geo.memory_slices
    return gpus, mem


def with_allocation(view: snapshot_builder.ClusterView, decision: model.Decision) -> snapshot_builder.ClusterView:
    """The view with ``decision`` taken."""
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


def with_release(
    view: snapshot_builder.ClusterView, decisions: Sequence[model.Decision]
) -> snapshot_builder.ClusterView:
    """The view with every GPU and MIG slot of ``decisions`` freed."""
    whole = set(view.taken_whole)
    mig = {k: list(v) for k, v in view.taken_mig.items()}
    for d in decisions:
        for m in d.members:
            whole.difference_update(m.gpus)
            for s in m.mig:
                inst = model.MigInstance(s.profile, s.start)
                if inst in mig.get(s.gpu, []):
                    mig[s.gpu].remove(inst)
    return dataclasses.replace(view, taken_whole=frozenset(whole), taken_mig={k: tuple(v) for k, v in mig.items() if v})


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
    by_key = {e.key: e for e in entries}
    total_gpus = float(len(view.gpus)) or 1.0
    total_mem = float(sum(g.memory_bytes for g in view.gpus)) or 1.0
    shares: dict[str, list[float]] = {}
    for key, held in view.holdings.items():
        ns = key.split("/", 1)[0]
        g, mem = usage(view, held)
        acc = shares.setdefault(ns, [0.0, 0.0])
        acc[0] += g
        acc[1] += mem

    def dominant(ns: str) -> float:
        g, mem = shares.get(ns, [0.0, 0.0])
        return max(g / total_gpus, mem / total_mem)

    waiting = [e for e in entries if e.ready and not e.holding]
    eff = {e.key: effective_priority(e, now, settings) for e in waiting}
    actions: dict[str, Action] = {}
    order: list[str] = []
    barrier = ""
    work = view
    remaining = list(waiting)
    while remaining:
        nxt = min(remaining, key=lambda e: (-eff[e.key], dominant(e.namespace), e.created, e.key))
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
        request = gangspec.to_request(nxt.spec, nxt.key, nxt.namespace, nxt.created, nxt.geometry_profile)
        admit = admit_for(nxt)
        snap = work.snapshot(admit)
        never = place.check(request, snap)
        if never:
            actions[nxt.key] = Action("unschedulable", never, effective_priority=prio, position=position)
            continue
        if barrier:
            actions[nxt.key] = Action(
                "wait", f"queued behind {barrier}, which has waited longest", effective_priority=prio, position=position
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
            g, mem = usage(work, decision)
            acc = shares.setdefault(nxt.namespace, [0.0, 0.0])
            acc[0] += g
            acc[1] += mem
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
            barrier = barrier or nxt.key
            continue
        victims = choose_victims(nxt, request, work, admit=admit, by_key=by_key, policy=policy, settings=settings)
        if victims is not None:
            names_, domain = victims
            actions[nxt.key] = Action(
                "preempt",
                f"preempting lower-priority gang(s) {', '.join(names_)} in NVLink domain {domain}",
                victims=names_,
                domain=domain,
                effective_priority=prio,
                position=position,
            )
            barrier = barrier or nxt.key
            continue
        actions[nxt.key] = Action("wait", decision.reason, effective_priority=prio, position=position)
        if now - nxt.waiting_since >= settings.starvation_s:
            barrier = nxt.key
    return Plan(actions=actions, order=tuple(order))


def choose_victims(
    entry: Entry,
    request: model.Request,
    view: snapshot_builder.ClusterView,
    *,
    admit: Admit,
    by_key: Mapping[str, Entry],
    policy: base.Policy,
    settings: Settings,
) -> tuple[tuple[str, ...], str] | None:
    """The fewest strictly-lower-priority gangs in one NVLink domain whose release lets ``request`` fit.

    Ties: fewer victims, then lower highest victim priority, then fewer GPUs
    released, then younger victims first, then names; domains in name order.
    """
    prio = entry.spec.priority
    per_domain: dict[str, list[str]] = {}
    for key, held in view.holdings.items():
        victim = by_key.get(key)
        if victim is None or not victim.holding or victim.spec.priority >= prio or key == entry.key:
            continue
        for d in held.domains:
            per_domain.setdefault(d, []).append(key)
    best: tuple[tuple[float, ...], tuple[str, ...], str] | None = None
    tries = 0
    rank: tuple[float, ...]
    for domain in sorted(per_domain):
        cands = sorted(per_domain[domain], key=lambda k: (by_key[k].spec.priority, -by_key[k].created, k))
        for size in range(1, len(cands) + 1):
            if best is not None and size > best[0][0]:
                break
            for combo in itertools.combinations(cands, size):
                tries += 1
                if tries > settings.max_victim_sets:
                    break
                released = with_release(view, [view.holdings[k] for k in combo])
                if not place.place(request, released.snapshot(admit), policy).placed:
                    continue
                gpus = sum(usage(view, view.holdings[k])[0] for k in combo)
                rank = (
                    float(size),
                    float(max(by_key[k].spec.priority for k in combo)),
                    gpus,
                    -sum(by_key[k].created for k in combo),
                )
                if best is None or (rank, tuple(sorted(combo)), domain) < best:
                    best = (rank, tuple(sorted(combo)), domain)
            if best is not None:
                break
    if best is None:
        return None
    return best[1], best[2]
