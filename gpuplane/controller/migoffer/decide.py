"""Which GPUs publish MIG placements: the offer, decided from one snapshot of the fleet. Pure.

Per node pool (the ``gpuplane.dev/node-pool`` label, else the GPU product) the offer is:

- every GPU with an allocated MIG device (never withdrawn while one is allocated: the scheduler
  accounts it through the GPU's counters, which only an offered GPU publishes);
- GPUs for the MIG claims that wait (unallocated, their pod pending), the oldest first: each waiting
  claim is given room on an idle offered GPU its pod may use, or a new GPU is offered for it at once
  (grow fast), on a node that already offers MIG where one fits. A claim is counted from its first pass,
  not only once it is older than ``grace_s``: room is accounted to every claim that waits, so a new pod
  that the scheduler places on room given to an older one (whose pod sits out the scheduler's back-off)
  leaves its own room for it instead of taking the only one (that race left requests waiting 30 s and
  more, docs/benchmarks.md). ``grace_s`` only keeps a claim served by room already offered (the
  scheduler's first try places it) from being told it waits;
- ``spare_per_pool`` idle GPUs more, so that a MIG request is usually allocated without waiting.

One namespace's waiting claims are given room on at most ``gpus_per_namespace`` GPUs at a time (counted
as the offered GPUs its waiting claims are placed on in a pass); its further claims wait, told why,
until earlier ones are allocated. A waiting claim is any tenant's to make (a pod the scheduler can
never place, for a reason of its own, waits for ever), and every offered GPU adds its MIG placements
to the catalogue kube-scheduler walks for every pod of every tenant (issue 36): without the bound one
namespace's unplaceable pods could turn the whole fleet's offer on.

An offered GPU is withdrawn only after ``shrink_after_s`` without being needed (no MIG device
allocated, no claim waiting for it), at most ``withdraw_per_pass`` per pool and pass (shrink slowly).
A GPU a driver publishes MIG placements for on its own (in MIG mode, holding instances) counts as
offered. docs/mig-offer.md has the reasoning and the bound on a waiting claim.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpuplane.api.mig_offer import NODE_LABEL, NODE_LABEL_VALUE, Offer
from gpuplane.mig.models import model_for_product

Allowed = Callable[[str, Mapping[str, str]], bool]
Key = tuple[str, str]  # (node, GPU device name)


@dataclass(frozen=True)
class Gpu:
    name: str  # "gpu-3"
    product: str
    mig_published: bool = False  # its MIG placements are in the node's slices now
    mig_allocated: bool = False  # a claim holds one of its MIG devices
    whole_allocated: bool = False  # a claim holds (a share of) the whole GPU


@dataclass(frozen=True)
class Node:
    name: str
    pool: str
    schedulable: bool
    labels: Mapping[str, str]
    gpus: tuple[Gpu, ...]  # its MIG-capable GPUs


@dataclass(frozen=True)
class Waiting:
    """A MIG claim that waits: unallocated, its pod pending."""

    key: str  # "<namespace>/<name>"
    profiles: frozenset[str]  # the MIG profiles it accepts; empty: any
    allowed: Allowed | None  # may its pod run on (node, labels); None: anywhere
    age_s: float


@dataclass(frozen=True)
class Settings:
    spare_per_pool: int = 2
    shrink_after_s: float = 600.0
    withdraw_per_pass: int = 1
    grace_s: float = 2.0  # a claim younger than this, given room already offered, is not told it waits
    settle_s: float = 60.0  # a GPU withdrawn this recently may still be published: that is not a driver's own
    gpus_per_namespace: int = 16  # offered GPUs one namespace's waiting claims may be placed on at a time


@dataclass(frozen=True)
class Memory:
    """What one pass leaves the next: the offer as written, when each offered GPU was last needed."""

    offer: Offer = field(default_factory=Offer)
    written: bool = False  # the ConfigMap exists (before it does, every driver publishes every GPU's MIG)
    needed_at: Mapping[Key, float] = field(default_factory=dict)
    explained: frozenset[str] = frozenset()
    withdrawn_at: Mapping[Key, float] = field(default_factory=dict)  # until its driver has republished


@dataclass(frozen=True)
class Decision:
    offer: Offer
    memory: Memory
    explain: tuple[tuple[str, str], ...] = ()  # (claim key, message): an Event on each newly waiting claim
    grown: tuple[Key, ...] = ()
    withdrawn: tuple[Key, ...] = ()


def published(nodes: tuple[Node, ...]) -> Offer:
    """The GPUs whose MIG placements the nodes' slices publish now, as an offer (what is labelled without one)."""
    out = {n.name: frozenset(g.name for g in n.gpus if g.mig_published) for n in nodes}
    return Offer({n: gpus for n, gpus in out.items() if gpus})


def node_labels(offer: Offer, labels: Mapping[str, Mapping[str, str]]) -> tuple[tuple[str, bool], ...]:
    """(node, labelled) for every node whose ``gpuplane.dev/mig-offered`` label must change: on where the
    offer names the node, off everywhere else (``labels``: each known node's labels now)."""
    out = []
    for node in sorted(labels):
        has = labels[node].get(NODE_LABEL) == NODE_LABEL_VALUE
        want = bool(offer.for_node(node))
        if has != want:
            out.append((node, want))
    return tuple(out)


def memory_slices(product: str) -> int:
    model = model_for_product(product)
    return model.memory_slices if model is not None else 0


def need(product: str, profiles: frozenset[str]) -> int | None:
    """Memory slices the smallest accepted profile takes on ``product``; None when it offers none of them."""
    model = model_for_product(product)
    if model is None:
        return None
    if not profiles:
        return min((p.memory_slices for p in model.profiles), default=None)
    sizes = [p.memory_slices for name in profiles if (p := model.profile_by_name(name)) is not None]
    return min(sizes) if sizes else None


def _fits(node: Node, gpu: Gpu, *, w: Waiting) -> bool:
    return (w.allowed is None or w.allowed(node.name, node.labels)) and need(gpu.product, w.profiles) is not None


def decide(nodes: tuple[Node, ...], waiting: tuple[Waiting, ...], memory: Memory, s: Settings, now: float) -> Decision:
    by_key = {(n.name, g.name): (n, g) for n in nodes for g in n.gpus}
    offered: set[Key] = {(n, g) for n, gpus in memory.offer.nodes.items() for g in gpus if (n, g) in by_key}
    settling = {k: t for k, t in memory.withdrawn_at.items() if now - t < s.settle_s}
    offered |= {
        k
        for k, (_, g) in by_key.items()
        if g.mig_allocated or (memory.written and g.mig_published and k not in settling)
    }
    needed_at = {k: memory.needed_at.get(k, now) for k in offered}
    for k in offered:
        if by_key[k][1].mig_allocated:
            needed_at[k] = now

    def usable(k: Key) -> bool:
        node, gpu = by_key[k]
        return node.schedulable and not gpu.mig_allocated and not gpu.whole_allocated

    room = {k: memory_slices(by_key[k][1].product) for k in offered if usable(k)}
    offered_nodes = {k[0] for k in offered}

    def candidates(pool: str | None, fits: Callable[[Node, Gpu], bool]) -> list[Key]:
        keys = [k for k, (n, g) in by_key.items() if k not in offered and usable(k) and fits(n, g)]
        keys = [k for k in keys if pool is None or by_key[k][0].pool == pool]
        return sorted(keys, key=lambda k: (k[0] not in offered_nodes, k[0], _minor(k[1])))

    grown: list[Key] = []

    def grow(k: Key) -> None:
        offered.add(k)
        offered_nodes.add(k[0])
        grown.append(k)
        needed_at[k] = now
        room[k] = memory_slices(by_key[k][1].product)

    explain: list[tuple[str, str]] = []
    served: set[Key] = set()
    held: dict[str, set[Key]] = {}  # namespace -> the offered GPUs its waiting claims are placed on
    for w in sorted(waiting, key=lambda w: (-w.age_s, w.key)):
        settled = w.age_s >= s.grace_s  # past the scheduler's first try on what is offered already
        mine = held.setdefault(w.key.partition("/")[0], set())
        at_limit = len(mine) >= s.gpus_per_namespace
        place = _room_for(w, by_key, room, within=mine if at_limit else None)
        fresh = place is None and not at_limit
        if fresh:
            more = candidates(None, functools.partial(_fits, w=w))
            if more:
                place = more[0]
                grow(place)
        if place is None:
            if settled and w.key not in memory.explained:
                explain.append((w.key, _at_limit(w, s.gpus_per_namespace) if at_limit else _no_room(w)))
            continue
        mine.add(place)
        room[place] -= need(by_key[place][1].product, w.profiles) or 0
        needed_at[place] = now
        served.add(place)
        if w.key not in memory.explained and (fresh or settled):
            node, gpu = by_key[place]
            how = "offered for MIG now" if fresh else "offered for MIG"
            explain.append((w.key, f"waiting for a MIG offer on {node.name} (pool {node.pool}): {gpu.name} is {how}"))

    withdrawn: list[Key] = []
    for pool in sorted({n.pool for n in nodes}):
        spare = [k for k in offered if by_key[k][0].pool == pool and k in room and k not in served]
        for k in candidates(pool, lambda n, g: True)[: max(0, s.spare_per_pool - len(spare))]:
            grow(k)
            spare.append(k)
        removable = [
            k
            for k in offered
            if by_key[k][0].pool == pool
            and not by_key[k][1].mig_allocated
            and k not in served
            and k not in grown
            and now - needed_at[k] >= s.shrink_after_s
        ]
        removable.sort(key=lambda k: (k in room, needed_at[k], k))  # unusable ones (whole-allocated, cordoned) first
        budget, spares = s.withdraw_per_pass, len(spare)
        for k in removable:
            if budget <= 0 or (k in room and spares <= s.spare_per_pool):
                break
            spares -= 1 if k in room else 0
            offered.discard(k)
            withdrawn.append(k)
            budget -= 1
    nodes_out: dict[str, set[str]] = {}
    for node_name, gpu_name in offered:
        nodes_out.setdefault(node_name, set()).add(gpu_name)
    offer = Offer({n: frozenset(g) for n, g in nodes_out.items()})
    waiting_keys = {w.key for w in waiting}
    told = frozenset((memory.explained & waiting_keys) | {k for k, _ in explain})
    kept = {k: t for k, t in needed_at.items() if k in offered}
    settling.update({k: now for k in withdrawn})
    for k in offered:
        settling.pop(k, None)
    after = Memory(offer, memory.written, kept, told, settling)
    return Decision(offer, after, tuple(explain), tuple(grown), tuple(withdrawn))


def _room_for(
    w: Waiting, by_key: Mapping[Key, tuple[Node, Gpu]], room: Mapping[Key, int], within: set[Key] | None = None
) -> Key | None:
    """The offered GPU with room for ``w`` (``within``: only among these)."""
    for k in sorted(room, key=lambda k: (room[k], k)):  # the fullest that still fits: packs small profiles
        if within is not None and k not in within:
            continue
        node, gpu = by_key[k]
        size = need(gpu.product, w.profiles)
        if size is not None and room[k] >= size and _fits(node, gpu, w=w):
            return k
    return None


def _no_room(w: Waiting) -> str:
    what = ", ".join(sorted(w.profiles)) or "any MIG profile"
    return (
        f"waiting for a MIG offer: no free GPU its pod may use offers {what}; "
        "it is offered as soon as one is free (or the pod's node constraints allow another)"
    )


def _at_limit(w: Waiting, limit: int) -> str:
    namespace = w.key.partition("/")[0]
    return (
        f"waiting for a MIG offer: the MIG claims of namespace {namespace} that wait already hold room on "
        f"{limit} offered GPUs, the most one namespace's waiting claims may (--mig-offer-gpus-per-namespace); "
        "it is offered room as soon as some of them are allocated or deleted"
    )


def _minor(name: str) -> int:
    digits = name.rpartition("-")[2]
    return int(digits) if digits.isdigit() else 0
