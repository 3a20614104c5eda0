"""A consistent read of everything the gang queue needs, from the indexes, plus the placement view.

The kopf indexes are the cache of API state; :class:`World` copies what they
hold at one instant (no awaits in between), so a queue pass sees one state.
Decisions this replica wrote but its indexes have not shown yet are overlaid
from the memo (a write-through cache keyed by the decision id), so two gangs
reconciled back to back cannot be placed on the same GPUs.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuplane.api import kubetime
from gpuplane.controller import indexed, names
from gpuplane.controller.deviceclass import ClassView
from gpuplane.controller.gang import (
    leaderworkersets,
    membership,
    owners,
    placement_record,
    queue_runner,
    writes,
)
from gpuplane.controller.gang.podview import MemberPodView
from gpuplane.controller.gang.spec import GangSpec
from gpuplane.controller.gang.view import GangView
from gpuplane.controller.node import selectors, snapshot_builder
from gpuplane.controller.node.selectors import class_selectors
from gpuplane.placement import model

HOLDING_PHASES = ("Placing", "Placed", "Scheduled", "Running")
PREEMPTED_BY = "preempted by higher-priority gang "
"""The start of a victim's status message; the rest is its preemptor's key (reconciler.victim_outcome)."""


@dataclass(frozen=True)
class World:
    """Copies of the indexes at one instant (the values are the index entries: read-only)."""

    gangs: Mapping[str, GangView]  # "ns/name" -> GpuGang
    pods: Mapping[str, tuple[MemberPodView, ...]]  # gang key -> member pods
    claims: Mapping[str, indexed.ClaimView]  # "ns/name" -> ResourceClaim
    slices: tuple[Mapping[str, Any], ...]
    nodes: Mapping[str, bool]  # node -> schedulable
    classes: Mapping[str, ClassView]  # DeviceClass name -> its view
    jobs: Mapping[str, tuple[owners.JobView, ...]] = field(default_factory=dict)  # gang key -> its Jobs
    leaderworkersets: Mapping[str, tuple[leaderworkersets.LwsView, ...]] = field(default_factory=dict)  # gang -> LWSs
    addresses: Mapping[str, str] = field(default_factory=dict)  # node -> its InternalIP (IMEX node files)

    @functools.cached_property
    def member_uids(self) -> frozenset[str]:
        """The uids of every gang member pod (computed once per world)."""
        return frozenset(p.uid for pods in self.pods.values() for p in pods if p.uid)

    @functools.cached_property
    def claim_keys(self) -> tuple[str, ...]:
        """Every claim's "ns/name", sorted (once per world): a prefix's claims are one range of it."""
        return tuple(sorted(self.claims))

    def members(self, key: str, count: int) -> membership.Members:
        """The gang's member pods (:func:`membership.members_of`)."""
        return membership.members_of(key.split("/", 1)[1], count, self.pods.get(key, ()))

    def claim_gangs(self) -> dict[str, tuple[str, int]]:
        """ "ns/claim" -> (gang key, member index) for every claim a template member's pod was given."""
        out: dict[str, tuple[str, int]] = {}
        for key, gang in self.gangs.items():
            spec = gang.spec
            if spec is None:
                continue
            ns = key.split("/", 1)[0]
            for pod in self.members(key, spec.members).by_index.values():
                for cname in pod.claims:
                    out[f"{ns}/{cname}"] = (key, pod.index)
        return out

    def gang_claims(self, key: str) -> dict[str, writes.ExistingClaim]:
        """Member-claim-named claims in the gang's namespace, by claim name."""
        ns, name = key.split("/", 1)
        out: dict[str, writes.ExistingClaim] = {}
        prefix = f"{ns}/{name}-"  # a member claim's name is "<gang>-<index>": no pattern match for the others
        keys = self.claim_keys  # 100 gang timers each scanned 10,000 claims every 2 s (fleet run 7's profile)
        first = bisect.bisect_left(keys, prefix)
        ours = itertools.takewhile(lambda k: k.startswith(prefix), itertools.islice(keys, first, None))
        names_ = [k[len(ns) + 1 :] for k in ours]
        for cname in membership.gang_claim_names(name, names_):
            claim = self.claims[f"{ns}/{cname}"]
            out[cname] = writes.ExistingClaim(
                name=cname, decision=claim.decision, deleting=claim.deleting, owned=claim.gang == key
            )
        return out


def overlay(gangs_: Mapping[str, GangView], written: Mapping[str, Mapping[str, Any]]) -> dict[str, GangView]:
    """The gangs with status fields this replica wrote but has not yet seen come back."""
    out: dict[str, GangView] = dict(gangs_)
    for key, patch in written.items():
        gang = out.get(key)
        if gang is not None:
            out[key] = gang.with_status(patch)
    return out


def _allocated(world: World, ns: str, claim_names: Iterable[str]) -> bool:
    found = [world.claims.get(f"{ns}/{c}") for c in claim_names]
    return bool(found) and all(c is not None and c.allocated for c in found)


def _on_free_gpus(
    m: model.MemberPlacement, base: snapshot_builder.ClusterView, reserved: set[str]
) -> model.MemberPlacement:
    """A template member's whole-GPU reservation moved onto GPUs of its node that nothing holds yet.

    The decision names GPUs, but the scheduler may allocate a template member any free GPUs of the
    narrowed node; once another member's claim took the named ones, the reservation must still
    count as many GPUs of that node, not the same GPUs twice.
    """
    if m.mig or not m.gpus:
        return m
    free = [g.id for g in base.gpus if g.node == m.node and g.id not in base.taken_whole and g.id not in reserved]
    keep = [g for g in m.gpus if g in free]
    extra = [g for g in free if g not in keep][: len(m.gpus) - len(keep)]
    chosen = tuple(keep + extra) if len(keep) + len(extra) == len(m.gpus) else m.gpus
    return dataclasses.replace(m, gpus=chosen)


def reservations(world: World, base: snapshot_builder.ClusterView) -> list[snapshot_builder.Reservation]:
    """Members of holding gangs whose claims are not allocated yet, at their decided devices (or node)."""
    domains = {g.id: g.domain for g in base.gpus}
    out: list[snapshot_builder.Reservation] = []
    reserved: set[str] = set()
    for key, gang in sorted(world.gangs.items()):
        if gang.phase not in HOLDING_PHASES:
            continue
        decision = placement_record.decision_from_status(key, gang.status.get("placement"), domains)
        if decision is None:
            continue
        ns, name = key.split("/", 1)
        spec = gang.spec
        pods = world.members(key, spec.members).by_index if spec is not None else {}
        for m in decision.members:
            pod = pods.get(m.member)
            if pod is not None and pod.templated:
                if _allocated(world, ns, pod.claims):
                    continue
                m = _on_free_gpus(m, base, reserved)  # noqa: PLW2901
            elif _allocated(world, ns, [names.claim_name(name, m.member)]):
                continue
            reserved.update(m.gpus)
            out.append(snapshot_builder.Reservation(gang=key, placement=m))
    return out


def cluster_view(world: World) -> snapshot_builder.ClusterView:
    """The placement view: published GPUs, allocated claims, and not-yet-allocated gang reservations."""
    owned = world.claim_gangs()
    base = snapshot_builder.build_view(world.slices, world.claims.values(), world.nodes, claim_gangs=owned)
    extra = reservations(world, base)
    if not extra:
        return base
    return snapshot_builder.build_view(
        world.slices, world.claims.values(), world.nodes, reservations=extra, claim_gangs=owned
    )


def gpu_domains(world: World) -> dict[str, str]:
    """GPU id -> NVLink domain, as :func:`cluster_view` would give it, from the slices alone."""
    return snapshot_builder.gpu_domains(world.slices, world.nodes)


class DomainCache:
    """:func:`gpu_domains` of the last world, reused while its slices are the same objects and its nodes
    the same: at 1,000 nodes the map takes 10 ms and every gang timer asks for it; the check takes
    microseconds (a tuple of the same digests compares by identity). It holds the digests it was made
    from, so none can be freed and its id reused while it stands."""

    def __init__(self) -> None:
        self._last: tuple[tuple[Any, ...], dict[str, bool], dict[str, str]] | None = None

    def of(self, world: World) -> dict[str, str]:
        """The GPU id -> NVLink domain map of ``world``."""
        last = self._last
        if last is None or last[0] != world.slices or last[1] != world.nodes:
            last = self._last = (tuple(world.slices), dict(world.nodes), gpu_domains(world))
        return last[2]


class CopyCache:
    """The last World copied out of the indexes, handed out again while nothing indexed has changed
    (the same index version and the same index objects) for at most ``reuse_s``. With 100 gangs, each
    gang timer copied 10,000 claims and 4,600 slices out of kopf's indexes every ``resync_s``: 55 % of
    a CPU in a quiet cluster at 1,000 nodes. ``reuse_s`` bounds how late a time-based change of the
    copy (an overlay entry's expiry) is seen."""

    def __init__(self, reuse_s: float = 1.0) -> None:
        self.reuse_s = reuse_s
        self._last: tuple[int, float, tuple[Any, ...], World] | None = None
        self.hits = 0

    def get(self, version: int, now: float, inputs: tuple[Any, ...]) -> World | None:
        """The last copy, if it was made at ``version`` from the same ``inputs`` under ``reuse_s`` ago."""
        last = self._last
        if last is None or last[0] != version or not 0 <= now - last[1] < self.reuse_s:
            return None
        if len(last[2]) != len(inputs) or any(a is not b for a, b in zip(last[2], inputs, strict=True)):
            return None
        self.hits += 1
        return last[3]

    def put(self, version: int, now: float, inputs: tuple[Any, ...], world: World) -> None:
        self._last = (version, now, inputs, world)


def admit_for(world: World, spec: GangSpec) -> selectors.Compiled:
    """The pre-filter of GPUs a gang may use: its class's selectors and its own (MIG: parents, by class)."""
    if spec.migProfile:
        # Class and gang selectors of a MIG gang talk about MIG devices; parents are not filtered.
        return _compiled(())
    return _compiled((*class_selectors(world.classes.get(spec.device_class)), *spec.selectors))


@functools.lru_cache(maxsize=256)
def _compiled(expressions: tuple[str, ...]) -> selectors.Compiled:
    """One compiled filter per distinct selector list: gangs of one shape share it, and a queue pass
    evaluates each distinct filter over the fleet once (``queue_runner.plan``)."""
    return selectors.compile_all(expressions)


def unfiltered_selectors(world: World, spec: GangSpec) -> tuple[str, ...]:
    """Selectors of the gang (and its class) that the pre-filter could not evaluate (treated as match-all)."""
    if spec.migProfile:
        return tuple(spec.selectors)  # a MIG gang's selectors are not pre-filtered at all (see admit_for)
    return admit_for(world, spec).unsupported


def entries(world: World, view: snapshot_builder.ClusterView) -> list[queue_runner.Entry]:
    """Queue entries for every valid gang."""
    out: list[queue_runner.Entry] = []
    # A preemptor's victims are also read from the victims' own status: when a victim's Preempted status
    # is seen before the preemptor's nominatedVictims (two objects, two watch streams), the preemptor must
    # still wait for it rather than nominate another gang (a loaded e2e run preempted two for one).
    released_for: dict[str, list[str]] = {}
    for key, gang in sorted(world.gangs.items()):
        message = str(gang.status.get("message") or "")
        if gang.phase == "Preempted" and message.startswith(PREEMPTED_BY):
            released_for.setdefault(message[len(PREEMPTED_BY) :], []).append(key)
    for key, gang in sorted(world.gangs.items()):
        spec = gang.spec
        if spec is None:
            continue
        st = gang.status
        phase = gang.phase
        ns = key.split("/", 1)[0]
        members = world.members(key, spec.members)
        complete = members.complete(spec.members)
        all_gated = all(p.gated for p in members.by_index.values())
        created = gang.created
        ready = complete and all_gated and phase not in (*HOLDING_PHASES, "TimedOut", "Invalid")
        out.append(
            queue_runner.Entry(
                key=key,
                namespace=ns,
                spec=spec,
                created=created,
                waiting_since=kubetime.epoch(st.get("readySince")) or created,
                ready=ready,
                holding=phase in HOLDING_PHASES,
                nominated=tuple(dict.fromkeys([*(st.get("nominatedVictims") or ()), *released_for.get(key, ())])),
                geometry_profile=view.profiles.get(spec.migProfile) if spec.migProfile else None,
                priority=members.priority,
                preempts=members.preempts,
            )
        )
    return out


def member_lists(pods: Iterable[MemberPodView]) -> dict[str, tuple[MemberPodView, ...]]:
    """Group labelled pods by gang key."""
    out: dict[str, list[MemberPodView]] = {}
    for pod in pods:
        if pod.gang_key:
            out.setdefault(pod.gang_key, []).append(pod)
    return {k: tuple(v) for k, v in out.items()}
