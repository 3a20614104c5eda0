"""gpuplane's ranking of one node's devices, for a driver that publishes them in that order.

kube-scheduler's DRA allocator walks a node's ResourceSlices (sorted by name)
and their devices in order and takes the first device that fits. A driver that
lists each MIG profile's placements in the order gpuplane's policy prefers for
the node's current state therefore steers the device the scheduler picks on
that node. ``mig_order`` computes that order from the GPUs' occupancy states
with the same keys ``GpuPlane`` minimises (stranded compute first, then the
fragmentation gradient, then the largest free blocks), without the stranding
hold: a placement that strands is ranked last, not hidden.

``stranding_placements`` lists the placements that strand compute in every
layout they fit (on Hopper/Ampere: 3g at slot 0, 1g.2m at 0, 2 and 4), which a
driver may withhold or taint so that the allocator never takes them.

Pure functions over occupancy states (``geometry`` ints); nothing here knows
about Kubernetes or the driver.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuplane.mig.geometry import HOPPER
from gpuplane.placement import geometry
from gpuplane.placement.policies import base, gpuplane

_STRANDING: dict[str, frozenset[tuple[str, int]]] = {}


def mig_order(
    policy: gpuplane.GpuPlane,
    slots: geometry.Slots,
    states: Sequence[int],
    profile: str,
    withheld: frozenset[tuple[str, int]] = frozenset(),
) -> list[tuple[int, int]]:
    """(GPU position, start) of every free, not withheld ``profile`` placement on one node, best first.

    ``states`` are the node's GPUs in position order (``geometry.WHOLE`` for a
    GPU held whole). Empty GPUs are keyed as gpuplane keys opening an empty GPU
    on a node with that many empty GPUs (the node taken as its own domain: a
    driver sees only its node). Ties go to the lower position, then the lower start.
    """
    return [(i, s) for _, i, s in _ranked(policy, slots, states, profile, withheld)]


def best_on_node(
    policy: gpuplane.GpuPlane,
    slots: geometry.Slots,
    states: Sequence[int],
    profile: str,
    withheld: frozenset[tuple[str, int]] = frozenset(),
) -> tuple[int, int] | None:
    """The first entry of :func:`mig_order` (None when no placement is free), without sorting them all."""
    ranked = _ranked(policy, slots, states, profile, withheld)
    if not ranked:
        return None
    _, i, s = min(ranked)
    return i, s


def _ranked(
    policy: gpuplane.GpuPlane,
    slots: geometry.Slots,
    states: Sequence[int],
    profile: str,
    withheld: frozenset[tuple[str, int]],
) -> list[tuple[base.Key, int, int]]:
    node_gpus = len(states)
    empty = sum(1 for st in states if st == geometry.EMPTY)
    sig = (empty,)
    out: list[tuple[base.Key, int, int]] = []
    empty_keys: list[tuple[base.Key, int]] | None = None
    for i, st in enumerate(states):
        if st == geometry.WHOLE:
            continue
        if st == geometry.EMPTY:
            if empty_keys is None:
                empty_keys = policy.empty_start_keys(slots, profile, sig, empty, node_gpus)
            keys = empty_keys
        else:
            keys = policy.start_keys(slots, st, profile)
        out.extend((k, i, s) for k, s in keys if (profile, s) not in withheld)
    out.sort()
    return out


def stranding_placements(slots: geometry.Slots) -> frozenset[tuple[str, int]]:
    """(profile, start) pairs that strand compute in every layout they fit (memoised per geometry).

    ``Slots.stranded`` decides per layout; this enumerates every layout
    reachable from an empty GPU. On the Hopper geometry the answer is 3g@0 and
    1g.2m@0/2/4; no other placement ever strands, so withholding these is a
    static rule that needs no republishing.
    """
    got = _STRANDING.get(slots.geometry.name)
    if got is not None:
        return got
    states = {geometry.EMPTY}
    frontier = [geometry.EMPTY]
    fillers = [p for p in slots.geometry.profiles if p.memory < slots.geometry.memory_slices]
    while frontier:
        st = frontier.pop()
        for p in fillers:
            for s in slots.starts(st, p.name):
                nxt = slots.add(st, p.name, s)
                if nxt not in states:
                    states.add(nxt)
                    frontier.append(nxt)
    out: set[tuple[str, int]] = set()
    for p in slots.geometry.profiles:
        for s in p.starts:
            fits = [st for st in states if slots.fits(st, p.name, s)]
            if fits and all(slots.stranded(slots.add(st, p.name, s)) > slots.stranded(st) for st in fits):
                out.add((p.name, s))
    got = frozenset(out)
    _STRANDING[slots.geometry.name] = got
    return got


def hopper_stranding() -> frozenset[tuple[str, int]]:
    """:func:`stranding_placements` of the Hopper geometry."""
    return stranding_placements(geometry.slots_for(HOPPER))
