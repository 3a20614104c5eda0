"""ResourceSlices + allocated ResourceClaims + Nodes -> the placement module's immutable Snapshot.

:func:`build_view` reads the API objects once into a :class:`ClusterView`: every
whole GPU the driver publishes (id ``<node>/<device>``, its NVLink domain and
attributes), every MIG device mapped onto the placement geometry (compute and
memory slices read from the device's counter consumption, so no hardware
table is duplicated here), what allocated claims and not-yet-allocated gang
reservations hold, and which gang holds what. :meth:`ClusterView.snapshot`
then builds a Snapshot restricted to the GPUs a gang's selectors admit.

Nothing here talks to the API or mutates its inputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpuplane.controller import names
from gpuplane.controller.node.device_attrs import geometry_profile, qualified_attributes, quantity_bytes
from gpuplane.controller.placement import geometry as slot_geometry
from gpuplane.controller.placement import model, snapshot
from gpuplane.driver.api import names as dn
from gpuplane.mig.geometry import HOPPER, MigGeometry

GpuFilter = Callable[[str, Mapping[str, Any]], bool]  # (driver, attributes) -> admitted


@dataclass(frozen=True)
class GpuInfo:
    """One whole GPU as published: id ``<node>/<device>``."""

    id: str
    node: str
    device: str
    domain: str
    attributes: Mapping[str, Any]
    memory_bytes: int
    product: str


@dataclass(frozen=True)
class MigInfo:
    """One published MIG placement, mapped onto the geometry."""

    node: str
    device: str
    parent: str  # GpuInfo.id
    profile: str  # geometry name ("3g")
    start: int
    driver_profile: str  # the driver's name ("3g.71gb")


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

    def snapshot(self, admit: GpuFilter | None = None, *, mig_profile: str | None = None) -> snapshot.Snapshot:
        """A Snapshot of the GPUs ``admit`` accepts (all when None), with allocations applied.

        ``mig_profile`` (a driver profile name) keeps only the GPUs that publish it.
        """
        per_domain: dict[str, dict[str, list[model.Gpu]]] = {}
        for g in self.gpus:
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


_Parsed = tuple[tuple["GpuInfo", ...], tuple[tuple[str, str, str, int, str], ...]]


class SliceCache:
    """Parsed slices by (name, resourceVersion), so a view rebuild parses only the slices that changed.

    Pass one instance to every :func:`build_view` call of a loop; entries of slices that were not
    in the last call are dropped. Objects without a resourceVersion are never cached.
    """

    def __init__(self) -> None:
        self._parsed: dict[tuple[str, str], _Parsed] = {}

    def get(self, key: tuple[str, str]) -> _Parsed | None:
        """A parsed slice, if cached."""
        return self._parsed.get(key)

    def put(self, key: tuple[str, str], value: _Parsed) -> None:
        """Remember a parsed slice."""
        self._parsed[key] = value

    def keep(self, keys: set[tuple[str, str]]) -> None:
        """Forget every slice not in ``keys``."""
        for k in [k for k in self._parsed if k not in keys]:
            del self._parsed[k]


def _parse_slice(spec: Mapping[str, Any], node: str, driver: str, geometry: MigGeometry) -> _Parsed:
    """One slice's whole GPUs and MIG devices (key, parent, geometry profile, start, driver profile)."""
    gpus: list[GpuInfo] = []
    mig: list[tuple[str, str, str, int, str]] = []
    for device in spec.get("devices") or []:
        attrs = qualified_attributes(device, driver)
        kind = attrs.get(f"{driver}/{dn.ATTR_TYPE}")
        if kind == dn.DEVICE_TYPE_GPU:
            gid = f"{node}/{device['name']}"
            caps = device.get("capacity") or {}
            gpus.append(
                GpuInfo(
                    id=gid,
                    node=node,
                    device=device["name"],
                    domain=str(attrs.get(f"{driver}/{dn.ATTR_NVLINK_DOMAIN}") or f"{node}.{device['name']}"),
                    attributes=MappingProxyType(attrs),
                    memory_bytes=quantity_bytes((caps.get(dn.CAP_MEMORY) or {}).get("value", "0")),
                    product=str(attrs.get(f"{driver}/{dn.ATTR_PRODUCT_NAME}") or ""),
                )
            )
        elif kind == dn.DEVICE_TYPE_MIG:
            driver_profile = str(attrs.get(f"{driver}/{dn.ATTR_MIG_PROFILE}") or "")
            parent = f"{node}/gpu-{attrs.get(f'{driver}/{dn.ATTR_PARENT_MINOR}')}"
            got = geometry_profile(device, driver_profile, geometry)
            if got is not None:
                mig.append((f"{node}/{device['name']}", parent, got[0], got[1], driver_profile))
    return tuple(gpus), tuple(mig)


def build_view(
    slices: Iterable[Mapping[str, Any]],
    claims: Iterable[Mapping[str, Any]] = (),
    nodes: Mapping[str, bool] | None = None,
    *,
    reservations: Sequence[Reservation] = (),
    claim_gangs: Mapping[str, tuple[str, int]] | None = None,
    driver: str = dn.DRIVER_NAME,
    geometry: MigGeometry = HOPPER,
    cache: SliceCache | None = None,
) -> ClusterView:
    """Read slices, claims and nodes into a :class:`ClusterView`.

    ``nodes`` maps node name -> schedulable; GPUs of unknown or unschedulable
    nodes are left out (None: every node counts). Only the newest generation of
    each pool is used, as the scheduler does. ``claim_gangs`` maps "ns/claim" -> (gang key, member index)
    for claims a gang member got from a template (owned by its pod, not by the GpuGang).
    ``cache`` (optional) keeps parsed slices between calls.
    """
    slices = [s for s in slices if (s.get("spec") or {}).get("driver") == driver]
    newest: dict[str, int] = {}
    for s in slices:
        pool = s["spec"].get("pool") or {}
        newest[pool.get("name", "")] = max(newest.get(pool.get("name", ""), 0), int(pool.get("generation", 0)))
    gpus: dict[str, GpuInfo] = {}
    mig: dict[str, MigInfo] = {}
    profiles: dict[str, str] = {}
    published: dict[str, set[str]] = {}
    pending_mig: list[tuple[str, str, str, int, str]] = []
    seen: set[tuple[str, str]] = set()
    for s in slices:
        spec = s["spec"]
        pool = spec.get("pool") or {}
        if int(pool.get("generation", 0)) != newest.get(pool.get("name", ""), 0):
            continue
        node = spec.get("nodeName")
        if not node or (nodes is not None and not nodes.get(node, False)):
            continue
        meta = s.get("metadata") or {}
        key = (str(meta.get("name", "")), str(meta.get("resourceVersion", "")))
        parsed = cache.get(key) if cache is not None and key[1] else None
        if parsed is None:
            parsed = _parse_slice(spec, node, driver, geometry)
            if cache is not None and key[1]:
                cache.put(key, parsed)
        seen.add(key)
        for g in parsed[0]:
            gpus[g.id] = g
        pending_mig.extend(parsed[1])
    if cache is not None:
        cache.keep(seen)
    for mkey, parent, prof, start, driver_profile in pending_mig:
        if parent not in gpus:
            continue
        profiles.setdefault(driver_profile, prof)
        published.setdefault(parent, set()).add(driver_profile)
        mnode, mdevice = mkey.split("/", 1)
        mig[mkey] = MigInfo(mnode, mdevice, parent, prof, start, driver_profile)

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
        placement = claim_placement(claim, gpus, mig, driver)
        if placement is not None:
            gang = owner_gang(claim)
            if gang is None and claim_gangs:
                meta = claim.get("metadata") or {}
                found = claim_gangs.get(f"{meta.get('namespace', '')}/{meta.get('name', '')}")
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
        mig=MappingProxyType(mig),
        taken_whole=frozenset(taken_whole),
        taken_mig=MappingProxyType(
            {k: tuple(sorted(v, key=lambda i: (i.start, i.profile))) for k, v in taken_mig.items()}
        ),
        holdings=MappingProxyType(holdings),
        profiles=MappingProxyType(profiles),
        geometry=geometry,
        mig_published=MappingProxyType({k: frozenset(v) for k, v in published.items()}),
    )


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


def owner_gang(claim: Mapping[str, Any]) -> str | None:
    """ "ns/name" of the GpuGang owning a claim, if any."""
    meta = claim.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == names.GANG_KIND and str(ref.get("apiVersion", "")).startswith(names.GROUP + "/"):
            return f"{meta.get('namespace', '')}/{ref.get('name')}"
    return None


def member_index(claim: Mapping[str, Any]) -> int:
    """The gang member index recorded on a claim (0 when absent)."""
    labels = (claim.get("metadata") or {}).get("labels") or {}
    raw = labels.get(names.LABEL_MEMBER_INDEX, "0")
    return int(raw) if str(raw).isdigit() else 0


def claim_placement(
    claim: Mapping[str, Any],
    gpus: Mapping[str, GpuInfo],
    mig: Mapping[str, MigInfo],
    driver: str = dn.DRIVER_NAME,
) -> model.MemberPlacement | None:
    """What an allocated claim holds of this driver's devices, as a MemberPlacement (None: nothing)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    whole: list[str] = []
    slots: list[model.MigSlot] = []
    node = ""
    domain = ""
    for r in results:
        if r.get("driver") != driver:
            continue
        key = f"{r.get('pool')}/{r.get('device')}"
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
        member=member_index(claim), node=node, domain=domain, gpus=tuple(whole), mig=tuple(slots)
    )
