"""Discovery: turn what the hardware reports into the node's device inventory.

Naming and topology policy live here, above the hardware boundary:
- device names are derived from the GPU minor number (stable when another GPU
  falls off the bus, unlike the NVML index);
- the NVLink domain of a GPU is its fabric clique ``<clusterUuid>.<cliqueId>``
  when multi-node NVLink is up, else the connected component of NVLink P2P
  links on this node, else the GPU alone;
- which MIG placements are offered, and which existing MIG instances are an
  administrator's (published as fixed devices) versus the driver's own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from gpuplane.driver.hw import interface as hw
from gpuplane.mig.models import MigProfile

MAX_LABEL = 63


@dataclass(frozen=True)
class MigSlot:
    """One MIG profile at one placement on one GPU: a partitionable device."""

    name: str
    profile: MigProfile
    start: int
    static_instance: hw.GpuInstance | None = None  # an administrator's existing instance

    @property
    def end(self) -> int:
        return self.start + self.profile.memory_slices


@dataclass(frozen=True)
class GpuEntry:
    info: hw.GpuInfo
    name: str
    nvlink_domain: str
    mig_mode: hw.MigMode
    profiles: tuple[MigProfile, ...]
    instances: tuple[hw.GpuInstance, ...]
    # True when the whole-GPU device is offered.
    offer_whole: bool
    # True when dynamic MIG placements (with shared counters) are offered.
    offer_dynamic_mig: bool
    mig_slots: tuple[MigSlot, ...]
    # True when nvlink_domain is a fabric clique (multi-node NVLink is up): IMEX can apply to its claims.
    multi_node: bool = False
    # True when dynamic MIG placements could be offered but are not (the GPU is outside the MIG offer):
    # a placement allocated from an older slice generation still resolves (``Inventory.mig_slot``).
    mig_withdrawn: bool = False


@dataclass(frozen=True)
class Inventory:
    node_name: str
    gpus: tuple[GpuEntry, ...]

    def gpu(self, name: str) -> GpuEntry | None:
        return next((g for g in self.gpus if g.name == name), None)

    def gpu_by_uuid(self, uuid: str) -> GpuEntry | None:
        return next((g for g in self.gpus if g.info.uuid == uuid), None)

    def mig_slot(self, device_name: str) -> tuple[GpuEntry, MigSlot] | None:
        """The MIG placement named ``device_name``: a published one, else one of a GPU outside the MIG offer.

        The scheduler may have allocated a placement from an older slice generation, before the offer
        shrank: the driver prepares it all the same (refusing would strand a claim the scheduler holds),
        and the instance it creates puts the GPU back in the offer (:func:`discover`).
        """
        for gpu in self.gpus:
            for slot in gpu.mig_slots:
                if slot.name == device_name:
                    return gpu, slot
        for gpu in self.gpus:
            if not gpu.mig_withdrawn:
                continue
            for profile in gpu.profiles:
                for start in profile.placements:
                    if mig_device_name(gpu.info.minor, profile.name, start) == device_name:
                        return gpu, MigSlot(device_name, profile, start)
        return None

    def device_names(self) -> set[str]:
        out: set[str] = set()
        for gpu in self.gpus:
            if gpu.offer_whole:
                out.add(gpu.name)
            out.update(s.name for s in gpu.mig_slots)
        return out

    def published_view(self) -> tuple[object, ...]:
        """What the node's slices show of it: a change of this is a change to publish."""
        return tuple(
            (g.name, g.nvlink_domain, g.offer_whole, g.offer_dynamic_mig, tuple(s.name for s in g.mig_slots))
            for g in self.gpus
        )


def gpu_device_name(minor: int) -> str:
    return f"gpu-{minor}"


def profile_slug(profile_name: str) -> str:
    return profile_name.replace(".", "-").replace("+", "-").lower()


def mig_device_name(minor: int, profile_name: str, start: int) -> str:
    return f"gpu-{minor}-mig-{profile_slug(profile_name)}-{start}"


def _short(value: str) -> str:
    """Keep ids within the 63/64-character attribute and label limits."""
    if len(value) <= MAX_LABEL:
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:12]
    return f"{value[: MAX_LABEL - 13]}-{digest}"


def fabric_cliques(backend: hw.GpuBackend, gpus: Sequence[hw.GpuInfo]) -> dict[str, str]:
    """GPU uuid -> its fabric clique ``<clusterUuid>.<cliqueId>``, for the GPUs whose multi-node NVLink is up."""
    out: dict[str, str] = {}
    for gpu in gpus:
        try:
            fabric = backend.fabric_info(gpu.uuid)
        except hw.HardwareError:
            continue
        if fabric.completed:
            out[gpu.uuid] = f"{fabric.cluster_uuid}.{fabric.clique_id}"
    return out


def nvlink_domains(
    node_name: str, backend: hw.GpuBackend, gpus: Sequence[hw.GpuInfo], fabric: dict[str, str] | None = None
) -> dict[str, str]:
    """GPU uuid -> NVLink domain id (``fabric``: :func:`fabric_cliques`, when already read)."""
    out = dict(fabric_cliques(backend, gpus) if fabric is None else fabric)
    local = [gpu for gpu in gpus if gpu.uuid not in out]
    parent = {g.uuid: g.uuid for g in local}

    def find(u: str) -> str:
        while parent[u] != u:
            parent[u] = parent[parent[u]]
            u = parent[u]
        return u

    for i, a in enumerate(local):
        for b in local[i + 1 :]:
            if find(a.uuid) != find(b.uuid) and _linked(backend, a.uuid, b.uuid):
                parent[find(b.uuid)] = find(a.uuid)
    components: dict[str, list[hw.GpuInfo]] = {}
    for gpu in local:
        components.setdefault(find(gpu.uuid), []).append(gpu)
    for members in components.values():
        low = min(m.minor for m in members)
        domain = f"{node_name}.nvl{low}" if len(members) > 1 else f"{node_name}.gpu{low}"
        for m in members:
            out[m.uuid] = _short(domain)
    return out


def _linked(backend: hw.GpuBackend, a: str, b: str) -> bool:
    try:
        return backend.nvlink_p2p(a, b)
    except hw.HardwareError:
        return False  # a GPU that stopped answering is not a usable NVLink peer


_LOST = (hw.ErrorCode.GPU_IS_LOST, hw.ErrorCode.NOT_FOUND, hw.ErrorCode.UNKNOWN)


def _probe(
    backend: hw.GpuBackend, info: hw.GpuInfo
) -> tuple[hw.MigMode, tuple[MigProfile, ...], tuple[hw.GpuInstance, ...], bool]:
    """MIG facts of one GPU; a GPU that stopped answering is reported as lost, not as an error.

    A lost GPU keeps its whole-GPU device (so its name, and the health taint on it, stay
    published) but offers no MIG placements until it answers again.
    """
    if not info.mig_capable:
        return hw.MigMode(False, False), (), (), False
    try:
        mode = backend.mig_mode(info.uuid)
        profiles = tuple(backend.mig_profiles(info.uuid))
        instances = tuple(backend.gpu_instances(info.uuid)) if mode.current else ()
    except hw.HardwareError as exc:
        if exc.code not in _LOST:
            raise
        return hw.MigMode(False, False), (), (), True
    return mode, profiles, instances, False


def _overlaps(a_start: int, a_size: int, b_start: int, b_size: int) -> bool:
    return a_start < b_start + b_size and b_start < a_start + a_size


def discover(
    node_name: str,
    backend: hw.GpuBackend,
    driver_instances: Iterable[tuple[str, int]] = (),
    withheld: Collection[str] = (),
    *,
    mig_placements: bool = True,
    mig_offer: Collection[str] | None = None,
) -> Inventory:
    """Build the inventory. ``driver_instances`` are (gpu uuid, gi id) pairs the checkpoint owns.

    ``withheld`` GPUs (uuids) offer no device: the driver still owes a MIG instance there.

    ``mig_placements=False`` offers whole GPUs only: no dynamic MIG placements and no counter
    sets (an administrator's existing instances are still published as fixed devices). A GPU
    that still holds MIG instances is then not offered whole either, because without counters
    nothing would keep the scheduler from handing it out beside them.

    ``mig_offer`` (GPU device names; None: every GPU) limits the dynamic MIG placements to the GPUs
    the controller offers for MIG, plus every GPU already in MIG mode or holding MIG instances (its
    placements and counters stay, so the scheduler keeps accounting what is carved). A GPU outside
    the offer is a whole GPU without counters (docs/mig-offer.md).
    """
    owned = set(driver_instances)
    infos = sorted(backend.gpus(), key=lambda g: g.minor)
    fabric = fabric_cliques(backend, infos)
    domains = nvlink_domains(node_name, backend, infos, fabric)
    entries: list[GpuEntry] = []
    for info in infos:
        name = gpu_device_name(info.minor)
        mode, profiles, instances, _lost = _probe(backend, info)
        admin = [gi for gi in instances if (info.uuid, gi.gi_id) not in owned]
        by_id = {p.profile_id: p for p in profiles}
        held_back = info.uuid in withheld
        dynamic = (
            info.mig_capable and bool(profiles) and (not info.mig_toggle_needs_reset or mode.current) and not held_back
        )
        dynamic = dynamic and mig_placements
        withdrawn = False
        if dynamic and mig_offer is not None and name not in mig_offer and not mode.current and not instances:
            dynamic, withdrawn = False, True
        # A GPU whose MIG toggle needs a reset is offered whole only while MIG is off.
        offer_whole = not (info.mig_toggle_needs_reset and mode.current) and not admin and not held_back
        offer_whole = offer_whole and (mig_placements or not instances)
        admin = [] if held_back else admin
        slots: list[MigSlot] = []
        if dynamic:
            for profile in profiles:
                for start in profile.placements:
                    blocked = any(
                        _overlaps(start, profile.memory_slices, gi.placement_start, gi.placement_size) for gi in admin
                    )
                    if not blocked:
                        slots.append(MigSlot(mig_device_name(info.minor, profile.name, start), profile, start))
        for gi in admin:
            admin_profile = by_id.get(gi.profile_id)
            if admin_profile is None or gi.mig_uuid is None:
                continue  # incomplete admin instance (no compute instance): not usable, not offered
            slots.append(
                MigSlot(
                    mig_device_name(info.minor, admin_profile.name, gi.placement_start),
                    admin_profile,
                    gi.placement_start,
                    gi,
                )
            )
        entries.append(
            GpuEntry(
                info=info,
                name=name,
                nvlink_domain=domains[info.uuid],
                mig_mode=mode,
                profiles=profiles,
                instances=instances,
                offer_whole=offer_whole,
                offer_dynamic_mig=dynamic,
                mig_slots=tuple(slots),
                multi_node=info.uuid in fabric,
                mig_withdrawn=withdrawn,
            )
        )
    return Inventory(node_name=node_name, gpus=tuple(entries))
