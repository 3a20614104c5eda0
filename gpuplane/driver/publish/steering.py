"""The steered layout: each MIG profile's placements in one slice, in gpuplane's order for the node's state.

kube-scheduler's DRA allocator walks a pool's slices by name and their devices
in order, and takes the first device that fits. Today's layout (``slices``)
puts two GPUs' devices in each slice, so the walk is fixed. This layout puts
every device of one profile (all GPUs) in one slice, whole GPUs in another,
so that, for a claim asking for one profile, the whole walk is one slice's
device list. The driver lists those devices in the order gpuplane's policy
prefers for what is prepared on the node now (``placement.preference``) and
re-lists them after every prepare/unprepare. A reordering keeps every device
in its slice, so the publisher rewrites only the slices whose order changed,
in place and at the same pool generation: the pool is never incomplete or
invalid while it changes.

The allocator skips a device it cannot allocate (its counters or the device are
taken), so only the order of the devices it could pick matters: the free
placements of a profile, the whole GPUs not holding MIG instances. A new order
that lists those exactly as the last one did is the same walk, and the layout
keeps the last order (``stable``): a prepare that only takes a placement, or
frees one whose place in the order is unchanged, writes nothing. Between a
claim's deallocation and its unprepare the scheduler may see free a device the
driver still counts as taken; that device keeps its last place in the order
(today's layout: its fixed place), so the walk can give the slot back to the
next claim of its profile.

``withhold`` taints the placements that strand compute in every layout
(Hopper: 3g at slot 0, 1g.20gb at 0/2/4) with ``gpuplane.dev/strands-compute``
(NoSchedule): the allocator skips them unless a claim tolerates the taint.

A profile with more than 64 placements on the node (more than nine GPUs of
seven 1g each) is split into slices by GPU, in the natural order; the order
is then steered within each of those slices only.

Pure: inventory and checkpoint in, slice specs out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuplane.api import names
from gpuplane.driver.inventory import GpuEntry, Inventory, MigSlot
from gpuplane.driver.prepare.checkpoint import Checkpoint
from gpuplane.driver.publish import slices
from gpuplane.mig.geometry import HOPPER
from gpuplane.mig.models import MigProfile
from gpuplane.placement import fragmentation, geometry, model, preference
from gpuplane.placement.policies import gpuplane

STRANDS_TAINT_KEY = "gpuplane.dev/strands-compute"
GEOMETRY = HOPPER


@dataclass(frozen=True)
class SteeringSettings:
    """What the driver steers: the published order, the stranding taint, and the mix it ranks for."""

    order: bool = False
    withhold: bool = False
    mix: fragmentation.SizeMix | None = None  # None: gpuplane's flat prior
    # False: re-list every order from scratch on every state change (the behaviour before the stable
    # order, kept so that bench.placement.steer_writes measures both side by side; the driver never sets it)
    stable: bool = True

    @property
    def active(self) -> bool:
        """Whether the steered layout replaces today's."""
        return self.order or self.withhold


def geometry_profile(p: MigProfile) -> str | None:
    """The placement geometry's name for a driver MIG profile ("3g.40gb" -> "3g"), None when it has none."""
    exclusive = "+me" in p.name
    for g in GEOMETRY.profiles:
        if g.compute == p.compute_slices and g.memory == p.memory_slices and g.exclusive == exclusive:
            return g.name
    return None


def _steerable(gpu: GpuEntry) -> bool:
    return bool(gpu.profiles) and all(p.memory_slices <= GEOMETRY.memory_slices for p in gpu.profiles)


def gpu_states(inventory: Inventory, checkpoint: Checkpoint) -> tuple[int, ...]:
    """Each GPU's occupancy (``geometry`` state, inventory order) from the claims prepared here.

    A GPU any claim holds whole (exclusively or shared) is ``WHOLE``; a MIG
    device counts at its placement; an administrator's MIG instance counts
    always. A GPU whose records do not form a valid layout counts as ``WHOLE``
    (it then offers nothing to the ranking and its devices go last).
    """
    slots = geometry.slots_for(GEOMETRY)
    whole: set[int] = set()
    mig: dict[int, list[model.MigInstance]] = {}
    by_minor = {g.info.minor: g for g in inventory.gpus}
    for rec in checkpoint.claims.values():
        for d in rec.devices:
            if d.kind == "gpu":
                whole.add(d.gpu_minor)
            elif d.mig is not None and d.mig.created_by_driver:
                gpu = by_minor.get(d.gpu_minor)
                prof = next((p for p in gpu.profiles if p.name == d.mig.profile_name), None) if gpu else None
                name = geometry_profile(prof) if prof is not None else None
                if name is None:
                    whole.add(d.gpu_minor)
                else:
                    mig.setdefault(d.gpu_minor, []).append(model.MigInstance(name, d.mig.start))
    out: list[int] = []
    for gpu in inventory.gpus:
        minor = gpu.info.minor
        if minor in whole or not _steerable(gpu):
            out.append(geometry.WHOLE)
            continue
        inst = list(mig.get(minor, ()))
        for slot in gpu.mig_slots:
            name = geometry_profile(slot.profile)
            if slot.static_instance is not None and name is not None:
                inst.append(model.MigInstance(name, slot.start))
        try:
            out.append(slots.state_of(False, sorted(set(inst), key=lambda i: (i.start, i.profile))))
        except ValueError:
            out.append(geometry.WHOLE)
    return tuple(out)


class SteeredLayout:
    """Builds the steered pool; one instance per driver (its ranking policy memoises per GPU state)."""

    def __init__(self, settings: SteeringSettings, taint_time: str = "") -> None:
        """``taint_time``: the stranding taint's ``timeAdded`` (RFC 3339). The API server fills in the time of
        the write when it is absent, so a driver that left it out could never see its own slices as
        unchanged; a fixed time (the driver's start) keeps every republish comparable."""
        self.settings = settings
        self.strands_taint = slices.DeviceTaint(
            key=STRANDS_TAINT_KEY, value="true", effect="NoSchedule", time_added=taint_time or None
        )
        self.policy = gpuplane.GpuPlane(settings.mix, hold_stranding=False)
        self.slots = geometry.slots_for(GEOMETRY)
        self.withheld = preference.stranding_placements(self.slots) if settings.withhold else frozenset()
        self._last: dict[str, tuple[str, ...]] = {}  # group ("" whole GPUs, else profile) -> device order built

    def build_pool(
        self,
        inventory: Inventory,
        states: Sequence[int],
        driver_name: str = names.DRIVER_NAME,
        taints: Mapping[str, Sequence[slices.DeviceTaint]] | None = None,
    ) -> slices.PoolContent:
        """Counter slices as today, then one slice of whole GPUs and one per MIG profile, each in order."""
        taints = taints or {}
        base = {"driver": driver_name, "nodeName": inventory.node_name}
        specs: list[dict[str, Any]] = [
            {**base, "sharedCounters": [slices.counter_set(g)]} for g in inventory.gpus if g.offer_dynamic_mig
        ]
        position = {g.name: i for i, g in enumerate(inventory.gpus)}
        whole = [g for g in inventory.gpus if g.offer_whole]
        groups: list[list[tuple[GpuEntry, dict[str, Any]]]] = []
        if self.settings.order:
            whole.sort(key=lambda g: (states[position[g.name]] != geometry.EMPTY, position[g.name]))
        whole_group = [(g, slices.whole_gpu_device(g, taints.get(g.name, ()))) for g in whole]
        # A GPU holding MIG instances cannot be allocated whole; an empty or (shared) whole one can.
        pickable = (
            {g.name for g in whole if states[position[g.name]] in (geometry.EMPTY, geometry.WHOLE)}
            if self.settings.order
            else set()
        )
        groups.append(self._stable("", whole_group, pickable))
        for pname in _profile_names(inventory):
            members = [(g, s) for g in inventory.gpus for s in g.mig_slots if s.profile.name == pname]
            ranked, free = self._rank(inventory, states, position, members) if self.settings.order else (members, None)
            group = [(g, self._mig_device(g, s, taints.get(g.name, ()))) for g, s in ranked]
            if free is not None:
                pick = {
                    d["name"]
                    for (g, s), (_, d) in zip(ranked, group, strict=True)
                    if (position[g.name], s.start) in free
                }
                group = self._stable(pname, group, pick)
            groups.append(group)
        for group in groups:
            for chunk in _chunks(group, position):
                specs.append({**base, "devices": [d for _, d in chunk]})
        if not specs:
            specs.append({**base, "devices": []})
        return slices.PoolContent(pool=inventory.node_name, slice_specs=tuple(specs))

    def _stable(
        self, key: str, group: list[tuple[GpuEntry, dict[str, Any]]], pickable: set[str]
    ) -> list[tuple[GpuEntry, dict[str, Any]]]:
        """``group`` in the order last built for ``key`` when that lists the same devices and the
        ``pickable`` ones (those the allocator could take now) in the same order; else ``group`` as is,
        which becomes the order kept."""
        if not self.settings.order:
            return group
        names = tuple(d["name"] for _, d in group)
        last = self._last.get(key)
        if (
            self.settings.stable
            and last is not None
            and sorted(last) == sorted(names)
            and [n for n in last if n in pickable] == [n for n in names if n in pickable]
        ):
            by_name = {d["name"]: (g, d) for g, d in group}
            return [by_name[n] for n in last]
        self._last[key] = names
        return group

    def _mig_device(self, gpu: GpuEntry, slot: MigSlot, gpu_taints: Sequence[slices.DeviceTaint]) -> dict[str, Any]:
        name = geometry_profile(slot.profile)
        extra = (
            (self.strands_taint,)
            if slot.static_instance is None and name is not None and (name, slot.start) in self.withheld
            else ()
        )
        return slices.mig_device(gpu, slot, (*gpu_taints, *extra))

    def _rank(
        self,
        inventory: Inventory,
        states: Sequence[int],
        position: Mapping[str, int],
        members: list[tuple[GpuEntry, MigSlot]],
    ) -> tuple[list[tuple[GpuEntry, MigSlot]], set[tuple[int, int]] | None]:
        """``members`` best first: gpuplane's order of the free placements, then the rest as listed; and
        the free placements as (GPU position, start), None when the profile is not ranked."""
        if not members:
            return members, None
        gname = geometry_profile(members[0][1].profile)
        if gname is None or len(states) != len(inventory.gpus):
            return members, None
        order = preference.mig_order(self.policy, self.slots, states, gname)
        rank = {pos_start: i for i, pos_start in enumerate(order)}
        natural = {id(s): i for i, (_, s) in enumerate(members)}
        ranked = sorted(
            members,
            key=lambda gs: (rank.get((position[gs[0].name], gs[1].start), len(rank)), natural[id(gs[1])]),
        )
        return ranked, set(rank)


def _profile_names(inventory: Inventory) -> list[str]:
    seen: dict[str, None] = {}
    for g in inventory.gpus:
        for s in g.mig_slots:
            seen.setdefault(s.profile.name, None)
    return list(seen)


def _chunks(
    group: list[tuple[GpuEntry, dict[str, Any]]], position: Mapping[str, int]
) -> list[list[tuple[GpuEntry, dict[str, Any]]]]:
    """``group`` in slices of at most 64 devices; a larger group splits by GPU (natural order), order kept."""
    if not group:
        return []
    if len(group) <= slices.MAX_DEVICES_ADVANCED:
        return [group]
    per_gpu: dict[str, int] = {}
    for g, _ in group:
        per_gpu[g.name] = per_gpu.get(g.name, 0) + 1
    bins: list[set[str]] = [set()]
    size = 0
    for name in sorted(per_gpu, key=lambda n: position[n]):
        if size + per_gpu[name] > slices.MAX_DEVICES_ADVANCED and bins[-1]:
            bins.append(set())
            size = 0
        bins[-1].add(name)
        size += per_gpu[name]
    return [[gd for gd in group if gd[0].name in b] for b in bins]
