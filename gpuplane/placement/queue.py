"""Who goes next: priority then age with aging, preemption victims, and DRF fair share across namespaces.

All functions are pure and deterministic: ties break on creation time, then
request id (or namespace name), never on input order.

* ``order``: effective priority (base priority plus one step per ``Aging.period_s``
  waited, capped) descending, then older first, so nothing starves.
* ``select_victims``: the fewest running gangs of strictly lower *base* priority,
  all in one NVLink domain, whose eviction lets the request fit there. Never
  for equal priority (aging never makes a request preempt its equals).
* ``drf_schedule``: Dominant Resource Fairness over GPUs and GPU memory; the
  tenant with the smallest dominant share goes next (ties: share, then its next
  task's creation time, then namespace name); a tenant whose next task does not
  fit is skipped for this round instead of stopping everyone.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuplane.placement import model, place, snapshot
from gpuplane.placement.policies import base


@dataclass(frozen=True, slots=True)
class Aging:
    """Waiting ``period_s`` raises effective priority by one, at most ``max_boost`` in total."""

    period_s: float = 300.0
    max_boost: int = 100


def effective_priority(request: model.Request, now: float, aging: Aging = Aging()) -> int:
    """Base priority plus the aging boost earned by waiting since ``request.created``."""
    waited = max(0.0, now - request.created)
    boost = min(aging.max_boost, math.floor(waited / aging.period_s)) if aging.period_s > 0 else 0
    return request.priority + boost


def order(requests: Iterable[model.Request], now: float, aging: Aging = Aging()) -> list[model.Request]:
    """Queue order: effective priority descending, then creation time, then id."""
    return sorted(requests, key=lambda r: (-effective_priority(r, now, aging), r.created, r.id))


@dataclass(frozen=True, slots=True)
class Running:
    """A placed gang: the request and the decision that placed it."""

    request: model.Request
    decision: model.Decision


@dataclass(frozen=True, slots=True)
class Preemption:
    """Evict ``victims`` (request ids) in ``domain``; then ``decision`` places the request."""

    request_id: str
    domain: str
    victims: tuple[str, ...]
    decision: model.Decision


# Exhaustive search over victim sets up to this many combinations per size; greedy beyond.
MAX_COMBINATIONS = 2000


def select_victims(
    request: model.Request,
    snap: snapshot.Snapshot,
    running: Sequence[Running],
    policy: base.Policy,
) -> Preemption | None:
    """The fewest strictly-lower-priority gangs in one domain whose eviction makes ``request`` fit there.

    Candidates are tried lowest priority first, then youngest first. For each
    domain the smallest victim set is found exhaustively while the number of
    combinations stays under ``MAX_COMBINATIONS``, else greedily (evict in
    candidate order until it fits, then drop victims that were not needed).
    Across domains: fewest victims, then lowest total victim priority, then
    domain order. Returns None when no such set exists (or the request fits
    already: then there is nothing to preempt).
    """
    if place.check(request, snap) or place.place(request, snap, policy).placed:
        return None
    cands = sorted(
        (r for r in running if r.request.priority < request.priority),
        key=lambda r: (r.request.priority, -r.request.created, r.request.id),
    )
    best: tuple[tuple[int, int, int], Preemption] | None = None
    for di, dom in enumerate(snap.domains):
        local = [r for r in cands if dom.name in r.decision.domains]
        if not local:
            continue
        found = _smallest_set(
            request=request,
            snap=snap,
            di=di,
            local=local,
            policy=policy,
            limit=best[0][0] if best else len(local),
        )
        if found is None:
            continue
        victims, decision = found
        key = (len(victims), sum(v.request.priority for v in victims), di)
        if best is None or key < best[0]:
            best = (key, Preemption(request.id, dom.name, tuple(v.request.id for v in victims), decision))
    return None if best is None else best[1]


def _fits_after(
    request: model.Request, snap: snapshot.Snapshot, di: int, victims: Sequence[Running], policy: base.Policy
) -> model.Decision | None:
    freed = snap
    for v in victims:
        freed = freed.with_release(v.decision)
    only = snapshot.Snapshot.build((freed.domains[di],), freed.slots.geometry)
    d = place.place(request, only, policy)
    return d if d.placed else None


def _smallest_set(
    *,
    request: model.Request,
    snap: snapshot.Snapshot,
    di: int,
    local: Sequence[Running],
    policy: base.Policy,
    limit: int,
) -> tuple[tuple[Running, ...], model.Decision] | None:
    for k in range(1, min(limit, len(local)) + 1):
        if math.comb(len(local), k) > MAX_COMBINATIONS:
            break
        for combo in itertools.combinations(local, k):
            d = _fits_after(request, snap, di, combo, policy)
            if d is not None:
                return combo, d
    else:
        return None
    # Greedy: evict in candidate order until it fits, then drop victims not needed.
    chosen: list[Running] = []
    decision: model.Decision | None = None
    for r in local:
        chosen.append(r)
        decision = _fits_after(request, snap, di, chosen, policy)
        if decision is not None:
            break
    if decision is None:
        return None
    for r in list(reversed(chosen)):
        trial = [c for c in chosen if c is not r]
        d = _fits_after(request, snap, di, trial, policy)
        if d is not None:
            chosen, decision = trial, d
    return (tuple(chosen), decision) if len(chosen) <= limit else None


@dataclass(frozen=True, slots=True)
class Usage:
    """Resources a tenant holds: GPUs (MIG instances by compute share) and GPU memory in GiB."""

    gpus: float = 0.0
    memory_gib: float = 0.0

    def plus(self, other: Usage) -> Usage:
        """Sum of two usages."""
        return Usage(self.gpus + other.gpus, self.memory_gib + other.memory_gib)


def capacity(snap: snapshot.Snapshot) -> Usage:
    """Total GPUs and GPU memory of the cluster."""
    mem = sum(g.memory for g in snap.gpus())
    return Usage(float(snap.gpu_total()), mem)


def demand(request: model.Request, snap: snapshot.Snapshot, gpu_memory_gib: float | None = None) -> Usage:
    """What ``request`` takes: whole GPUs and their memory, or a MIG profile's compute and memory share.

    Memory per GPU defaults to the cluster's mean published GPU memory (80 GiB for an empty cluster).
    """
    if gpu_memory_gib is None:
        cap = capacity(snap)
        gpu_memory_gib = cap.memory_gib / cap.gpus if cap.gpus else 80.0
    if request.mig_profile is not None:
        geo = snap.slots.geometry
        p = geo.profile(request.mig_profile)
        n = request.members
        return Usage(n * p.compute / geo.compute_slices, n * gpu_memory_gib * p.memory / geo.memory_slices)
    return Usage(float(request.total_gpus), request.total_gpus * gpu_memory_gib)


def dominant_share(usage: Usage, cap: Usage) -> float:
    """max(GPU share, GPU-memory share)."""
    return max(usage.gpus / cap.gpus if cap.gpus else 0.0, usage.memory_gib / cap.memory_gib if cap.memory_gib else 0.0)


@dataclass(frozen=True, slots=True)
class DrfResult:
    """Placed decisions in the order made, the snapshot after them, usage after, and who was skipped."""

    decisions: tuple[model.Decision, ...]
    snapshot: snapshot.Snapshot
    usage: Mapping[str, Usage]
    skipped: tuple[str, ...]


def drf_schedule(
    pending: Sequence[model.Request],
    usage: Mapping[str, Usage],
    snap: snapshot.Snapshot,
    policy: base.Policy,
    *,
    now: float,
    aging: Aging = Aging(),
) -> DrfResult:
    """Place pending requests tenant by tenant in DRF order until every tenant is done or skipped."""
    cap = capacity(snap)
    queues: dict[str, list[model.Request]] = {}
    for r in order(pending, now, aging):
        queues.setdefault(r.namespace, []).append(r)
    held = dict(usage)
    skipped: list[str] = []
    decisions: list[model.Decision] = []
    while True:
        live = [ns for ns, q in queues.items() if q and ns not in skipped]
        if not live:
            break
        ns = min(live, key=lambda n: (dominant_share(held.get(n, Usage()), cap), queues[n][0].created, n))
        r = queues[ns][0]
        d = place.place(r, snap, policy)
        if not d.placed:
            skipped.append(ns)
            continue
        queues[ns].pop(0)
        snap = snap.with_allocation(d)
        held[ns] = held.get(ns, Usage()).plus(demand(r, snap))
        decisions.append(d)
    return DrfResult(tuple(decisions), snap, held, tuple(sorted(skipped)))
