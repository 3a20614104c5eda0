"""Plan a claim before anything is touched: device lookup, configs, sharing rules, co-tenants.

Pure functions over the inventory and the checkpoint's records: a claim that cannot be
prepared is refused here with a message naming what is wrong and what to do, and the
state machine (gpuplane.driver.prepare.state) only executes plans that passed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuplane.api import configs, names, quantity
from gpuplane.driver.inventory import GpuEntry, Inventory, MigSlot
from gpuplane.driver.prepare.checkpoint import ClaimRecord, SharingRecord
from gpuplane.driver.prepare.claims import AllocatedDevice, ClaimAllocation, ClaimError
from gpuplane.driver.sharing import timeslice_tiers


@dataclass
class Plan:
    """What a claim needs: its devices in the inventory and the sharing to apply."""

    alloc: ClaimAllocation
    devices: list[tuple[AllocatedDevice, GpuEntry, MigSlot | None]]
    sharing: SharingRecord
    warnings: tuple[str, ...] = ()  # for the user (an Event), not a refusal


def plan_claim(
    inv: Inventory, claims: Mapping[str, ClaimRecord], alloc: ClaimAllocation, node_name: str, driver_name: str
) -> Plan:
    """Validate an allocation against the inventory, the configs and the co-tenants; decide what to do.

    Pure: raises ClaimError/ConfigError naming what is wrong, touches nothing.
    """
    devices: list[tuple[AllocatedDevice, GpuEntry, MigSlot | None]] = []
    effective: list[tuple[AllocatedDevice, GpuEntry, MigSlot | None, configs.DeviceConfig]] = []
    for dev in alloc.devices:
        found = inv.mig_slot(dev.device)
        if found is not None:
            gpu, slot = found
            dtype = names.DEVICE_TYPE_MIG
        else:
            entry = inv.gpu(dev.device)
            if entry is None or not entry.offer_whole:
                raise ClaimError(
                    f"device {dev.device} is not published by node {node_name} "
                    "(it may have been removed); delete the pod so the claim is allocated again"
                )
            gpu, slot = entry, None
            dtype = names.DEVICE_TYPE_GPU
        if dev.admin_access:
            raise ClaimError(f"device {dev.device}: adminAccess is not supported by {driver_name}")
        cfg = configs.merge_configs(alloc.configs, dev.request, dtype)
        devices.append((dev, gpu, slot))
        effective.append((dev, gpu, slot, cfg))
    strategies = {cfg.sharing.strategy for *_, cfg in effective}
    if len(strategies) > 1:
        raise ClaimError(
            f"claim {alloc.namespace}/{alloc.name} mixes sharing strategies {sorted(strategies)}; "
            "use one strategy per claim (split it into several claims)"
        )
    strategy = strategies.pop() if strategies else "Exclusive"
    if strategy == "Exclusive":
        for dev, _gpu, slot in devices:
            share = consumed_percent(dev)
            if slot is None and share is not None and share < 100:
                raise ClaimError(
                    f"device {dev.device} was allocated with sharePercent {share} but the claim's sharing "
                    "strategy is Exclusive; a partial share needs strategy MPS or TimeSlicing (e.g. class "
                    "mps-bronze.gpu.gpuplane.dev), or drop the capacity request to hold the whole GPU"
                )
    sharing = SharingRecord(strategy=strategy)
    if strategy == "TimeSlicing":
        intervals = {
            (cfg.sharing.timeSlicing.interval if cfg.sharing.timeSlicing else "Default") for *_, cfg in effective
        }
        if len(intervals) > 1:
            raise ClaimError(f"requests ask for different time-slice intervals {sorted(intervals)}; pick one")
        sharing.timeslice_interval = intervals.pop()
        sharing.timeslice_share_lower = any(
            cfg.sharing.timeSlicing is not None and cfg.sharing.timeSlicing.shareWithLowerTiers for *_, cfg in effective
        )
    warnings: tuple[str, ...] = ()
    if strategy == "MPS":
        _plan_mps(alloc, effective, sharing)
        warnings = _unknown_limit_devices(effective)
    _check_co_tenants(claims, alloc, devices, sharing)
    return Plan(alloc=alloc, devices=devices, sharing=sharing, warnings=warnings)


def _unknown_limit_devices(
    effective: Sequence[tuple[AllocatedDevice, GpuEntry, MigSlot | None, configs.DeviceConfig]],
) -> tuple[str, ...]:
    """perDevicePinnedMemoryLimit entries naming no device of this claim: said, not silently ignored."""
    allocated = sorted({dev.device for dev, *_ in effective})
    named = {
        name
        for *_, cfg in effective
        if cfg.sharing.mps is not None
        for name in cfg.sharing.mps.perDevicePinnedMemoryLimit
    }
    unknown = sorted(named - set(allocated))
    if not unknown:
        return ()
    shown = ", ".join(unknown[:8]) + (f" and {len(unknown) - 8} more" if len(unknown) > 8 else "")
    return (
        f"mps.perDevicePinnedMemoryLimit names {shown}, not allocated to this claim (it got "
        f"{', '.join(allocated[:8])}); those limits do not apply: the devices get "
        "defaultPinnedDeviceMemoryLimit. Name the devices of the ResourceSlice (e.g. gpu-0) or drop the entries",
    )


def _plan_mps(
    alloc: ClaimAllocation,
    effective: Sequence[tuple[AllocatedDevice, GpuEntry, MigSlot | None, configs.DeviceConfig]],
    sharing: SharingRecord,
) -> None:
    percentages: set[int] = set()
    priorities: set[int] = set()
    for dev, gpu, slot, cfg in effective:
        mps = cfg.sharing.mps or configs.MpsConfig()
        priority = mps.client_priority_value()
        if priority is not None:
            priorities.add(priority)
        pct = mps.defaultActiveThreadPercentage
        share = consumed_percent(dev)
        if share is not None:
            pct = min(pct, share) if pct is not None else share
        if pct is not None:
            percentages.add(pct)
        device_memory = slot.profile.memory_bytes if slot is not None else gpu.info.memory_bytes
        limit = mps.limit_bytes_for(dev.device)
        consumed_mem = consumed_bytes(dev)
        if consumed_mem:
            limit = min(limit, consumed_mem) if limit is not None else consumed_mem
        if limit is not None:
            if limit > device_memory:
                raise ClaimError(
                    f"device {dev.device}: MPS pinned memory limit {limit} bytes exceeds the device's memory "
                    f"{device_memory} bytes; lower mps.defaultPinnedDeviceMemoryLimit"
                )
            uuid = device_uuid_hint(gpu, slot)
            sharing.mps_pinned_limits[uuid] = limit
    if len(percentages) > 1:
        raise ClaimError(
            f"requests of claim {alloc.namespace}/{alloc.name} ask for different MPS thread percentages "
            f"{sorted(percentages)}; one MPS daemon serves the claim, so use one value"
        )
    sharing.mps_active_thread_percentage = percentages.pop() if percentages else None
    # Two requests of one claim with different priorities get the lower one: one daemon serves the claim.
    sharing.mps_client_priority = max(priorities) if priorities else None


def _check_co_tenants(
    claims: Mapping[str, ClaimRecord],
    alloc: ClaimAllocation,
    devices: Sequence[tuple[AllocatedDevice, GpuEntry, MigSlot | None]],
    sharing: SharingRecord,
) -> None:
    """Refuse to mix an exclusive holder with sharers on one physical GPU, or time-slice intervals."""
    strategy = sharing.strategy
    _check_whole_and_mig(claims, alloc, devices)
    for dev, gpu, slot in devices:
        if slot is not None:
            continue
        for other in claims.values():
            if other.uid == alloc.uid:
                continue
            if not any(d.kind == "gpu" and d.gpu_uuid == gpu.info.uuid for d in other.devices):
                continue
            theirs = other.sharing.strategy
            if theirs == "Exclusive" or strategy == "Exclusive" or theirs != strategy:
                raise ClaimError(
                    f"device {dev.device} is already held by claim {other.namespace}/{other.name} "
                    f"with sharing strategy {theirs}; a {strategy} claim cannot share it "
                    "(only MPS with MPS, or time-slicing with time-slicing, may share a GPU)"
                )
            if strategy == "TimeSlicing":
                why = timeslice_tiers.mix_refusal(
                    (sharing.timeslice_interval, sharing.timeslice_share_lower),
                    (other.sharing.timeslice_interval, other.sharing.timeslice_share_lower),
                    f"{other.namespace}/{other.name}",
                    dev.device,
                )
                if why is not None:
                    raise ClaimError(why)


def _check_whole_and_mig(
    claims: Mapping[str, ClaimRecord],
    alloc: ClaimAllocation,
    devices: Sequence[tuple[AllocatedDevice, GpuEntry, MigSlot | None]],
) -> None:
    """Refuse a MIG device of a GPU a claim holds whole. The GPU's counters keep the scheduler from allocating
    both; only in the moment its MIG offer is withdrawn (docs/mig-offer.md) could it. (A whole GPU beside MIG
    instances is refused where it is prepared: ``mig_ops``.)"""
    for dev, gpu, slot in devices:
        if slot is None:
            continue
        for other in claims.values():
            if other.uid != alloc.uid and any(d.kind == "gpu" and d.gpu_uuid == gpu.info.uuid for d in other.devices):
                raise ClaimError(
                    f"device {dev.device}: GPU {gpu.name} is already held whole by claim {other.namespace}/"
                    f"{other.name}; delete the pod so the claim is allocated again (the GPU's MIG offer changed "
                    "while it was allocated)"
                )


def limit_key(gpu_uuid: str, mig_start: int | None) -> str:
    """Key of a device's MPS memory limit, known before a MIG device has its own uuid."""
    return gpu_uuid if mig_start is None else f"{gpu_uuid}/{mig_start}"


def device_uuid_hint(gpu: GpuEntry, slot: MigSlot | None) -> str:
    return limit_key(gpu.info.uuid, slot.start if slot is not None else None)


def consumed_percent(dev: AllocatedDevice) -> int | None:
    """The share of the GPU the scheduler allocated (1..100); a claim with any other share is refused."""
    value = dev.consumed_capacity.get(names.CAP_SHARE_PERCENT)
    if value is None:
        return None
    try:
        return quantity.share_percent(value)
    except ValueError as exc:
        raise ClaimError(f"device {dev.device} was allocated with a share the driver refuses: {exc}") from exc


def consumed_bytes(dev: AllocatedDevice) -> int | None:
    value = dev.consumed_capacity.get(names.CAP_MEMORY)
    if value is None:
        return None
    try:
        return (
            quantity.parse_quantity(value if isinstance(value, str) else str(value)[: quantity.MAX_CHARS + 1]) or None
        )
    except ValueError as exc:
        raise ClaimError(f"device {dev.device}: the allocated memory is not a quantity: {exc}") from exc
