"""ResourceSlices + allocated ResourceClaims + Nodes -> the placement module's immutable Snapshot.

:func:`build_view` reads the API objects once into a :class:`ClusterView` (slices as the
controller indexes them, :class:`~gpuplane.controller.node.slice_index.SliceDigest`, or as the
API's dicts): every whole GPU the driver publishes (id ``<node>/<device>``, its NVLink domain and
attributes), every MIG device mapped onto the placement geometry (compute and memory slices read
from the device's counter consumption, so no hardware table is duplicated here; looked up on
demand, since a fleet publishes ~10^5 of them), what allocated claims and not-yet-allocated gang
reservations hold, and which gang holds what. :meth:`ClusterView.snapshot` then builds a Snapshot
restricted to the GPUs a gang's selectors admit.

Nothing here talks to the API or mutates its inputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpuplane.api import names as dn
from gpuplane.controller import indexed
from gpuplane.controller.node import slice_index
from gpuplane.controller.node.device_attrs import geometry_name
from gpuplane.mig.geometry import HOPPER, MigGeometry
from gpuplane.placement import geometry as slot_geometry
from gpuplane.placement import model, snapshot

GpuFilter = Callable[[str, Mapping[str, Any]], bool]  # (driver, attributes) -> admitted


GpuInfo = slice_index.GpuInfo
MigInfo = slice_index.MigInfo


class MigLookup(Mapping[str, MigInfo]):
    """``<node>/<device>`` -> MigInfo, read from the slices' digests on demand (a fleet has ~10^5 MIG devices;
    a view is built for every queue pass, and only allocated claims' devices are ever looked up)."""

    def __init__(
        self,
        by_node: Mapping[str, tuple[slice_index.SliceDigest, ...]],
        gpus: Mapping[str, GpuInfo],
        geometry_of: Mapping[tuple[str, int, int], str],
    ) -> None:
        self._by_node = by_node
        self._gpus = gpus
        self._geometry_of = geometry_of

    def _info(self, node: str, device: slice_index.MigDevice) -> MigInfo | None:
        parent = f"{node}/gpu-{device.parent_minor}"
        profile = self._geometry_of.get((device.driver_profile, device.memory_slices, device.compute))
        if profile is None or parent not in self._gpus:
            return None
        return MigInfo(node, device.name, parent, profile, device.first_slice, device.driver_profile)

    def __getitem__(self, key: str) -> MigInfo:
        node, _, name = key.partition("/")
        for d in self._by_node.get(node, ()):
            device = d.mig.get(name)
            if device is not None:
                info = self._info(node, device)
                if info is not None:
                    return info
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        for node, digests in self._by_node.items():
            for d in digests:
                for device in d.mig.values():
                    if self._info(node, device) is not None:
                        yield f"{node}/{device.name}"

    def __len__(self) -> int:
        return sum(1 for _ in self)


@dataclass(frozen=True)
class ClusterView:
    """Everything placement needs from the API, read once."""

    gpus: tuple[GpuInfo, ...]
    mig: Mapping[str, MigInfo]
    taken_whole: frozenset[str]
    taken_mig: Mapping[str, tuple[model.MigInstance, ...]]
    holdings: Mapping[str, model.Decision]  # gang key "ns/name" -> what its claims hold or reserve
    profiles: Mapping[str, str]  # driver MIG profile name -> geometry profile name
    geometry: MigGeometry = HOPPER
    # GPU id -> the driver MIG profiles its node publishes for it: a profile name is one GPU model's
    # (1g.10gb is H100's, 1g.23gb GB200's) though both map to the geometry's 1g slot.
    mig_published: Mapping[str, frozenset[str]] = field(default_factory=lambda: MappingProxyType({}))
    by_id: Mapping[str, GpuInfo] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_id", MappingProxyType({g.id: g for g in self.gpus}))

    def driver_profile_names(self, geometry_profile: str) -> tuple[str, ...]:
        """Driver names that map to a geometry profile (for messages)."""
        return tuple(sorted({d for d, g in self.profiles.items() if g == geometry_profile}))

    def admitted(self, admit: GpuFilter) -> frozenset[str]:
        """Ids of the GPUs ``admit`` accepts: a pass asks once per distinct filter, then :meth:`snapshot`
        with ``only`` (a selector over 8,000 GPUs per gang was most of a queue pass at 1,000 nodes)."""
        return frozenset(g.id for g in self.gpus if admit(dn.DRIVER_NAME, g.attributes))

    def snapshot(
        self, admit: GpuFilter | None = None, *, mig_profile: str | None = None, only: frozenset[str] | None = None
    ) -> snapshot.Snapshot:
        """A Snapshot of the GPUs ``admit`` accepts (all when None), with allocations applied.

        ``mig_profile`` (a driver profile name) keeps only the GPUs that publish it; ``only`` only those ids.
        """
        per_domain: dict[str, dict[str, list[model.Gpu]]] = {}
        for g in self.gpus:
            if only is not None and g.id not in only:
                continue
            if admit is not None and not admit(dn.DRIVER_NAME, g.attributes):
                continue
            if mig_profile is not None and mig_profile not in self.mig_published.get(g.id, ()):
                continue
            gpu = model.Gpu(
                id=g.id,
                node=g.node,
                domain=g.domain,
                model=g.product,
                whole=g.id in self.taken_whole,
                mig=() if g.id in self.taken_whole else self.taken_mig.get(g.id, ()),
                memory_gib=g.memory_bytes / 2**30 if g.memory_bytes else None,
            )
            per_domain.setdefault(g.domain, {}).setdefault(g.node, []).append(gpu)
        domains = [
            model.Domain(
                name=d,
                nodes=tuple(model.Node(name=n, domain=d, gpus=tuple(nodes[n])) for n in sorted(nodes)),
            )
            for d, nodes in sorted(per_domain.items())
        ]
        return snapshot.Snapshot.build(domains, self.geometry)

    def node_domains(self) -> Mapping[str, frozenset[str]]:
        """Node -> the NVLink domains of its GPUs."""
        out: dict[str, set[str]] = {}
        for g in self.gpus:
            out.setdefault(g.node, set()).add(g.domain)
        return {k: frozenset(v) for k, v in out.items()}

    def gpu_memory(self, gpu_id: str) -> int:
        """Memory bytes of a GPU (0 if unknown)."""
        got = self.by_id.get(gpu_id)
        return got.memory_bytes if got else 0


@dataclass(frozen=True)
class Reservation:
    """A gang member placed by the controller whose claim the scheduler has not allocated yet."""

    gang: str  # "ns/name"
    placement: model.MemberPlacement


def build_view(
    slices: Iterable[slice_index.SliceDigest | Mapping[str, Any]],
    claims: Iterable[indexed.ClaimView] = (),
    nodes: Mapping[str, bool] | None = None,
    *,
    reservations: Sequence[Reservation] = (),
    claim_gangs: Mapping[str, tuple[str, int]] | None = None,
    driver: str = dn.DRIVER_NAME,
    geometry: MigGeometry = HOPPER,
) -> ClusterView:
    """Read slices (digests, or the API's dicts), claims and nodes into a :class:`ClusterView`.

    ``nodes`` maps node name -> schedulable; GPUs of unknown or unschedulable
    nodes are left out (None: every node counts). Only the newest generation of
    each pool is used, as the scheduler does. ``claim_gangs`` maps "ns/claim" -> (gang key, member index)
    for claims a gang member got from a template (owned by its pod, not by the GpuGang).
    """
    gpus: dict[str, GpuInfo] = {}
    by_node: dict[str, list[slice_index.SliceDigest]] = {}
    kinds: set[tuple[str, int, int]] = set()
    per_parent: dict[tuple[str, int | None], set[tuple[str, int, int]]] = {}  # (node, parent minor) -> kinds
    for d in _counted(slices, nodes, driver):
        for g in d.gpus:
            gpus[g.id] = g
        if d.mig:
            by_node.setdefault(d.node, []).append(d)
            for m in d.mig.values():
                kind = (m.driver_profile, m.memory_slices, m.compute)
                kinds.add(kind)
                per_parent.setdefault((d.node, m.parent_minor), set()).add(kind)
    geometry_of: dict[tuple[str, int, int], str] = {}
    profiles: dict[str, str] = {}
    for kind in sorted(kinds):
        got = geometry_name(*kind, geometry)
        if got is not None:
            geometry_of[kind] = got
            profiles.setdefault(kind[0], got)
    published: dict[str, frozenset[str]] = {}
    one_copy: dict[frozenset[str], frozenset[str]] = {}  # GPUs of one model publish the same profiles
    for (node, minor), ks in per_parent.items():
        parent = f"{node}/gpu-{minor}"
        if parent in gpus:
            profs = frozenset(k[0] for k in ks if k in geometry_of)
            published[parent] = one_copy.setdefault(profs, profs)
    mig = MigLookup({n: tuple(ds) for n, ds in by_node.items()}, gpus, geometry_of)

    taken_whole: set[str] = set()
    taken_mig: dict[str, set[model.MigInstance]] = {}
    held: dict[str, list[model.MemberPlacement]] = {}

    def take(gang: str | None, placement: model.MemberPlacement) -> None:
        for gid in placement.gpus:
            if gid in gpus:
                taken_whole.add(gid)
        for ms in placement.mig:
            if ms.gpu in gpus:
                taken_mig.setdefault(ms.gpu, set()).add(model.MigInstance(ms.profile, ms.start))
        if gang is not None:
            held.setdefault(gang, []).append(placement)

    for claim in claims:
        placement = claim_placement(claim, gpus, mig)
        if placement is not None:
            gang = claim.gang
            if gang is None and claim_gangs:
                found = claim_gangs.get(claim.key)
                if found is not None:
                    gang = found[0]
                    placement = dataclasses.replace(placement, member=found[1])
            take(gang, placement)
    slots = slot_geometry.slots_for(geometry)
    for r in reservations:
        # A reservation is a prediction: where what is really allocated took its place meanwhile (a
        # claim the scheduler put elsewhere on that GPU), the allocation wins and the reservation is left out.
        if _fits(r.placement, taken_whole, taken_mig, slots):
            take(r.gang, r.placement)
    holdings = {
        gang: model.Decision(request_id=gang, members=tuple(sorted(ms, key=lambda m: m.member)))
        for gang, ms in held.items()
    }
    return ClusterView(
        gpus=tuple(sorted(gpus.values(), key=lambda g: (g.domain, g.node, _device_order(g.device)))),
        mig=mig,
        taken_whole=frozenset(taken_whole),
        taken_mig=MappingProxyType(
            {k: tuple(sorted(v, key=lambda i: (i.start, i.profile))) for k, v in taken_mig.items()}
        ),
        holdings=MappingProxyType(holdings),
        profiles=MappingProxyType(profiles),
        geometry=geometry,
        mig_published=MappingProxyType(published),
    )


def gpu_domains(
    slices: Iterable[slice_index.SliceDigest | Mapping[str, Any]],
    nodes: Mapping[str, bool] | None = None,
    driver: str = dn.DRIVER_NAME,
) -> dict[str, str]:
    """GPU id -> NVLink domain of the GPUs :func:`build_view` would count, without reading a claim.

    A gang that holds a placement needs only this of the cluster (to read its decision back); at
    1,000 nodes it takes milliseconds where the whole view takes a second (docs/benchmarks.md).
    """
    return {g.id: g.domain for d in _counted(slices, nodes, driver) for g in d.gpus}


def _counted(
    slices: Iterable[slice_index.SliceDigest | Mapping[str, Any]], nodes: Mapping[str, bool] | None, driver: str
) -> Iterator[slice_index.SliceDigest]:
    """The newest generation's slices of known, schedulable nodes (None: every node counts)."""
    digests = [d for d in (slice_index.as_digest(s, driver) for s in slices) if d is not None]
    for d in slice_index.newest(digests):
        if d.node and (nodes is None or nodes.get(d.node, False)):
            yield d


def _fits(
    placement: model.MemberPlacement,
    whole: set[str],
    mig: Mapping[str, set[model.MigInstance]],
    slots: slot_geometry.Slots,
) -> bool:
    """Whether ``placement`` can be added to what is taken without an overlap."""
    if any(g in whole or mig.get(g) for g in placement.gpus):
        return False
    for ms in placement.mig:
        if ms.gpu in whole:
            return False
        have = sorted(
            {*mig.get(ms.gpu, set()), model.MigInstance(ms.profile, ms.start)}, key=lambda i: (i.start, i.profile)
        )
        try:
            slots.state_of(False, have)
        except ValueError:
            return False
    return True


def _device_order(device: str) -> tuple[int, str]:
    tail = device.rsplit("-", 1)[-1]
    return (int(tail), device) if tail.isdigit() else (1 << 30, device)


def claim_placement(
    claim: indexed.ClaimView, gpus: Mapping[str, GpuInfo], mig: Mapping[str, MigInfo]
) -> model.MemberPlacement | None:
    """What an allocated claim holds of this driver's devices, as a MemberPlacement (None: nothing)."""
    whole: list[str] = []
    slots: list[model.MigSlot] = []
    node = ""
    domain = ""
    for r in claim.results:
        key = r.key
        if key in gpus:
            whole.append(key)
            node, domain = gpus[key].node, gpus[key].domain
        elif key in mig:
            m = mig[key]
            slots.append(model.MigSlot(gpu=m.parent, profile=m.profile, start=m.start))
            node, domain = m.node, gpus[m.parent].domain
    if not whole and not slots:
        return None
    return model.MemberPlacement(
        member=claim.member_index, node=node, domain=domain, gpus=tuple(whole), mig=tuple(slots)
    )
