"""Inventory -> ResourceSlices (resource.k8s.io/v1), within every API limit.

One pool per node (pool name = node name). Whole GPUs are devices; every
MIG-capable GPU also gets a counter set (its memory slices one by one, its
compute slices and engines, its memory), up to 8 counter sets per slice, and one device
per MIG profile x valid placement consuming exactly its share. The whole GPU
consumes everything, so the scheduler can never hand out overlapping pieces.
Slices that carry counter-consuming devices hold at most 64 devices; a GPU's
devices are never split across slices.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuplane.api import names
from gpuplane.driver.inventory import GpuEntry, Inventory, MigSlot
from gpuplane.mig.models import MigProfile

MAX_DEVICES = 128
MAX_DEVICES_ADVANCED = 64
MAX_COUNTER_SETS = 8
MAX_COUNTERS_PER_SET = 32
MAX_ATTRS_AND_CAPS = 32
MAX_ATTR_VALUE = 64
MAX_CONSUMPTIONS = 2
MAX_TAINTS = 16
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_C_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True)
class DeviceTaint:
    key: str
    value: str
    effect: str  # "NoSchedule" | "NoExecute" | "None"
    time_added: str | None = None


@dataclass(frozen=True)
class PoolContent:
    """The desired pool: slices in order, each a spec dict (without metadata/generation)."""

    pool: str
    slice_specs: tuple[dict[str, Any], ...] = field(default_factory=tuple)


def semver(text: str) -> str:
    """NVML versions ("9.0", "570.124.06") as semantic versions ("9.0.0", "570.124.6")."""
    parts = [p for p in re.split(r"[.\-]", text) if p][:3]
    numbers = [str(int(p)) if p.isdigit() else "0" for p in parts]
    while len(numbers) < 3:
        numbers.append("0")
    return ".".join(numbers)


def counter_set_name(gpu: GpuEntry) -> str:
    return f"{gpu.name}-counters"


def _full_engines(gpu: GpuEntry) -> dict[str, int]:
    """Engines of the whole GPU: the full profile's count, raised where a packing of one
    smaller profile needs more (each of seven 1g instances may hold a copy engine)."""
    totals: dict[str, int] = {}
    for key, attr in _ENGINES:
        totals[key] = max((getattr(p, attr) * max(1, p.max_count) for p in gpu.profiles), default=0)
    return {k: v for k, v in totals.items() if v > 0}


_ENGINES = (
    ("copy-engines", "copy_engines"),
    ("decoders", "decoders"),
    ("encoders", "encoders"),
    ("jpeg-engines", "jpegs"),
    ("ofa-engines", "ofas"),
)


def _memory_slices(gpu: GpuEntry) -> int:
    return max((p.memory_slices for p in gpu.profiles), default=8)


def counter_set(gpu: GpuEntry) -> dict[str, Any]:
    counters: dict[str, dict[str, str]] = {f"memory-slice-{i}": {"value": "1"} for i in range(_memory_slices(gpu))}
    counters["compute-slices"] = {"value": str(max(p.compute_slices for p in gpu.profiles))}
    counters["memory"] = {"value": str(gpu.info.memory_bytes)}
    for key, value in _full_engines(gpu).items():
        counters[key] = {"value": str(value)}
    return {"name": counter_set_name(gpu), "counters": counters}


def _slot_consumption(gpu: GpuEntry, slot: MigSlot) -> dict[str, Any]:
    p = slot.profile
    counters: dict[str, dict[str, str]] = {f"memory-slice-{i}": {"value": "1"} for i in range(slot.start, slot.end)}
    counters["compute-slices"] = {"value": str(p.compute_slices)}
    counters["memory"] = {"value": str(min(p.memory_bytes, gpu.info.memory_bytes))}
    engines = _full_engines(gpu)
    for key, attr in _ENGINES:
        value = getattr(p, attr)
        if value and key in engines:
            counters[key] = {"value": str(value)}
    return {"counterSet": counter_set_name(gpu), "counters": counters}


def _str(value: str) -> dict[str, str]:
    return {"string": value[:MAX_ATTR_VALUE]}


def _gpu_attributes(gpu: GpuEntry) -> dict[str, Any]:
    info = gpu.info
    attrs: dict[str, Any] = {
        names.ATTR_TYPE: _str(names.DEVICE_TYPE_GPU),
        names.ATTR_UUID: _str(info.uuid),
        names.ATTR_PRODUCT_NAME: _str(info.product_name),
        names.ATTR_BRAND: _str(info.brand),
        names.ATTR_ARCHITECTURE: _str(info.architecture),
        names.ATTR_CUDA_CC: {"version": semver(info.cuda_compute_capability)},
        names.ATTR_DRIVER_VERSION: {"version": semver(info.driver_version)},
        names.ATTR_CUDA_DRIVER_VERSION: {"version": semver(info.cuda_driver_version)},
        names.ATTR_NVLINK_DOMAIN: _str(gpu.nvlink_domain),
        names.ATTR_MINOR: {"int": info.minor},
        names.ATTR_MIG_CAPABLE: {"bool": info.mig_capable},
        names.ATTR_PCI_BUS_ID: _str(info.pci_bus_id),
    }
    if info.pcie_root:
        attrs[names.ATTR_PCIE_ROOT] = _str(info.pcie_root)
    return attrs


def whole_gpu_device(gpu: GpuEntry, taints: Sequence[DeviceTaint] = ()) -> dict[str, Any]:
    # A whole GPU may be shared by several claims (MPS tiers, time-slicing): it allows multiple
    # allocations and the scheduler accounts each claim's sharePercent (a claim that asks for no
    # share consumes all 100 %, i.e. holds the GPU exclusively; a share is a whole 1..100).
    # Memory and SMs are only counted when a claim requests them.
    device: dict[str, Any] = {
        "name": gpu.name,
        "attributes": _gpu_attributes(gpu),
        "allowMultipleAllocations": True,
        "capacity": {
            names.CAP_MEMORY: {"value": str(gpu.info.memory_bytes), "requestPolicy": {"default": "0"}},
            names.CAP_MULTIPROCESSORS: {
                "value": str(gpu.info.multiprocessors),
                "requestPolicy": {"default": "0"},
            },
            # Whole percentages 1..100: the scheduler rounds a smaller request up to 1 and refuses more
            # than 100, so no claim can hold a GPU while consuming none of it ("0").
            names.CAP_SHARE_PERCENT: {
                "value": "100",
                "requestPolicy": {"default": "100", "validRange": {"min": "1", "max": "100", "step": "1"}},
            },
        },
    }
    if gpu.offer_dynamic_mig:
        full = counter_set(gpu)
        device["consumesCounters"] = [{"counterSet": full["name"], "counters": full["counters"]}]
    if taints:
        device["taints"] = [_taint(t) for t in taints]
    return device


def mig_device(gpu: GpuEntry, slot: MigSlot, taints: Sequence[DeviceTaint] = ()) -> dict[str, Any]:
    info = gpu.info
    p = slot.profile
    attrs: dict[str, Any] = {
        names.ATTR_TYPE: _str(names.DEVICE_TYPE_MIG),
        names.ATTR_MIG_PROFILE: _str(p.name),
        names.ATTR_MIG_PLACEMENT: {"int": slot.start},
        names.ATTR_PARENT_UUID: _str(info.uuid),
        names.ATTR_PARENT_MINOR: {"int": info.minor},
        names.ATTR_PRODUCT_NAME: _str(info.product_name),
        names.ATTR_BRAND: _str(info.brand),
        names.ATTR_ARCHITECTURE: _str(info.architecture),
        names.ATTR_CUDA_CC: {"version": semver(info.cuda_compute_capability)},
        names.ATTR_DRIVER_VERSION: {"version": semver(info.driver_version)},
        names.ATTR_NVLINK_DOMAIN: _str(gpu.nvlink_domain),
        names.ATTR_MIG_STATIC: {"bool": slot.static_instance is not None},
        names.ATTR_PCI_BUS_ID: _str(info.pci_bus_id),
    }
    if slot.static_instance is not None and slot.static_instance.mig_uuid:
        attrs[names.ATTR_UUID] = _str(slot.static_instance.mig_uuid)
    device: dict[str, Any] = {
        "name": slot.name,
        "attributes": attrs,
        "capacity": {
            names.CAP_MEMORY: {"value": str(p.memory_bytes)},
            names.CAP_MULTIPROCESSORS: {"value": str(p.multiprocessors)},
        },
    }
    if gpu.offer_dynamic_mig:
        device["consumesCounters"] = [_slot_consumption(gpu, slot)]
    if taints:
        device["taints"] = [_taint(t) for t in taints]
    return device


def _taint(t: DeviceTaint) -> dict[str, Any]:
    out: dict[str, Any] = {"key": t.key, "value": t.value, "effect": t.effect}
    if t.time_added:
        out["timeAdded"] = t.time_added
    return out


def build_pool(
    inventory: Inventory,
    driver_name: str = names.DRIVER_NAME,
    taints: Mapping[str, Sequence[DeviceTaint]] | None = None,
    counter_sets_per_slice: int = MAX_COUNTER_SETS,
) -> PoolContent:
    """Desired slice specs for this node's pool. ``taints`` maps GPU device name -> taints.

    ``counter_sets_per_slice`` (1..8) is how many GPUs' counter sets share a counter slice: 8 (the
    API's limit) in production; 1 is the layout before counter sets were packed, kept for the
    fleet benchmark's before/after.
    """
    if not 1 <= counter_sets_per_slice <= MAX_COUNTER_SETS:
        raise ValueError(f"counter_sets_per_slice must be 1..{MAX_COUNTER_SETS}, not {counter_sets_per_slice}")
    taints = taints or {}
    node = inventory.node_name
    base = {"driver": driver_name, "nodeName": node}
    specs: list[dict[str, Any]] = []
    counter_gpus = [g for g in inventory.gpus if g.offer_dynamic_mig]
    # As few counter slices as the limit allows (8 counter sets each: one slice on an 8-GPU node):
    # 2.3x fewer slice objects in the API and etcd, and 10-17 % less kube-scheduler CPU per DRA pod
    # on a 76-node fleet (docs/benchmarks.md, "Fleet scale").
    for i in range(0, len(counter_gpus), counter_sets_per_slice):
        chunk = counter_gpus[i : i + counter_sets_per_slice]
        specs.append({**base, "sharedCounters": [counter_set(g) for g in chunk]})
    device_slices: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    for gpu in inventory.gpus:
        gpu_taints = taints.get(gpu.name, ())
        group: list[dict[str, Any]] = []
        if gpu.offer_whole:
            group.append(whole_gpu_device(gpu, gpu_taints))
        group.extend(mig_device(gpu, slot, gpu_taints) for slot in gpu.mig_slots)
        if not group:
            continue
        if len(current) + len(group) > MAX_DEVICES_ADVANCED and current:
            device_slices.append(current)
            current = []
        current.extend(group)
    if current:
        device_slices.append(current)
    specs.extend({**base, "devices": devices} for devices in device_slices)
    if not specs:
        # An empty pool is still published so that consumers see the node has no GPUs.
        specs.append({**base, "devices": []})
    return PoolContent(pool=node, slice_specs=tuple(specs))


def slice_name(node_name: str, index: int) -> str:
    base = f"{node_name}-gpuplane-{index}"
    if len(base) <= 253:
        return base
    digest = hashlib.sha256(node_name.encode()).hexdigest()[:10]
    return f"{node_name[:200]}-{digest}-gpuplane-{index}"


def render_slices(content: PoolContent, generation: int, driver_name: str = names.DRIVER_NAME) -> list[dict[str, Any]]:
    """Full ResourceSlice objects for the pool at a generation."""
    count = len(content.slice_specs)
    out: list[dict[str, Any]] = []
    for index, spec in enumerate(content.slice_specs):
        out.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {
                    "name": slice_name(content.pool, index),
                    "labels": {
                        "app.kubernetes.io/managed-by": "gpuplane-driver",
                        "gpuplane.dev/node": content.pool,
                    }
                    if len(content.pool) <= 63
                    else {"app.kubernetes.io/managed-by": "gpuplane-driver"},
                },
                "spec": {
                    **spec,
                    "pool": {"name": content.pool, "generation": generation, "resourceSliceCount": count},
                },
            }
        )
    return out


class SliceLimitError(ValueError):
    """A slice would break an API validation rule."""


def validate_slice(obj: Mapping[str, Any]) -> None:
    """Check every limit the API server enforces that our slices could hit (1.36 rules)."""
    spec = obj["spec"]
    problems: list[str] = []
    driver = spec.get("driver", "")
    if len(driver) > 63 or not _DNS_SUBDOMAIN.match(driver):
        problems.append(f"driver name {driver!r} is not a DNS subdomain of <= 63 chars")
    pool = spec["pool"]["name"]
    if len(pool) > 253:
        problems.append("pool name longer than 253")
    devices = spec.get("devices") or []
    counter_sets = spec.get("sharedCounters") or []
    if devices and counter_sets:
        problems.append("a slice carries either devices or sharedCounters, never both (1.35+)")
    if len(counter_sets) > MAX_COUNTER_SETS:
        problems.append(f"{len(counter_sets)} counter sets > {MAX_COUNTER_SETS}")
    for cs in counter_sets:
        if not _DNS_LABEL.match(cs["name"]):
            problems.append(f"counter set name {cs['name']!r} is not a DNS label")
        if len(cs["counters"]) > MAX_COUNTERS_PER_SET:
            problems.append(f"counter set {cs['name']} has {len(cs['counters'])} counters > {MAX_COUNTERS_PER_SET}")
        problems.extend(f"counter name {n!r} not a DNS label" for n in cs["counters"] if not _DNS_LABEL.match(n))
    advanced = any(d.get("consumesCounters") or d.get("taints") for d in devices)
    limit = MAX_DEVICES_ADVANCED if advanced else MAX_DEVICES
    if len(devices) > limit:
        problems.append(f"{len(devices)} devices > {limit}")
    seen: set[str] = set()
    for d in devices:
        name = d["name"]
        if not _DNS_LABEL.match(name):
            problems.append(f"device name {name!r} is not a DNS label")
        if name in seen:
            problems.append(f"duplicate device {name}")
        seen.add(name)
        attrs = d.get("attributes", {})
        caps = d.get("capacity", {})
        if len(attrs) + len(caps) > MAX_ATTRS_AND_CAPS:
            problems.append(f"{name}: {len(attrs) + len(caps)} attributes+capacities > {MAX_ATTRS_AND_CAPS}")
        for key, value in {**attrs, **caps}.items():
            domain, _, ident = key.rpartition("/")
            if not _C_IDENT.match(ident) or (domain and (len(domain) > 63 or not _DNS_SUBDOMAIN.match(domain))):
                problems.append(f"{name}: bad attribute/capacity name {key!r}")
            if key in attrs:
                if len(value) != 1:
                    problems.append(f"{name}: attribute {key} must have exactly one value type")
                for kind, v in value.items():
                    if kind in ("string", "version") and len(str(v)) > MAX_ATTR_VALUE:
                        problems.append(f"{name}: attribute {key} longer than {MAX_ATTR_VALUE}")
        consumes = d.get("consumesCounters", [])
        if len(consumes) > MAX_CONSUMPTIONS:
            problems.append(f"{name}: {len(consumes)} counter consumptions > {MAX_CONSUMPTIONS}")
        problems.extend(
            f"{name}: consumes {len(c['counters'])} counters > {MAX_COUNTERS_PER_SET}"
            for c in consumes
            if len(c["counters"]) > MAX_COUNTERS_PER_SET
        )
        if len(d.get("taints", [])) > MAX_TAINTS:
            problems.append(f"{name}: more than {MAX_TAINTS} taints")
    if problems:
        raise SliceLimitError(f"slice {obj['metadata']['name']}: " + "; ".join(problems))


def validate_pool(slices: Sequence[Mapping[str, Any]]) -> None:
    """Per-slice limits plus pool-wide rules (unique device and counter-set names, references resolve)."""
    device_names: set[str] = set()
    counter_sets: dict[str, set[str]] = {}
    for obj in slices:
        validate_slice(obj)
        for cs in obj["spec"].get("sharedCounters") or []:
            if cs["name"] in counter_sets:
                raise SliceLimitError(f"counter set {cs['name']} defined twice in the pool")
            counter_sets[cs["name"]] = set(cs["counters"])
    for obj in slices:
        for d in obj["spec"].get("devices") or []:
            if d["name"] in device_names:
                raise SliceLimitError(f"device {d['name']} appears twice in the pool")
            device_names.add(d["name"])
            for c in d.get("consumesCounters", []):
                known = counter_sets.get(c["counterSet"])
                if known is None:
                    raise SliceLimitError(f"device {d['name']} consumes unknown counter set {c['counterSet']}")
                unknown = set(c["counters"]) - known
                if unknown:
                    raise SliceLimitError(f"device {d['name']} consumes unknown counters {sorted(unknown)}")
    counts = {obj["spec"]["pool"]["resourceSliceCount"] for obj in slices}
    if counts and counts != {len(slices)}:
        raise SliceLimitError(f"resourceSliceCount {counts} does not match {len(slices)} slices")


def mig_profile_by_name(gpu: GpuEntry, profile_name: str) -> MigProfile | None:
    return next((p for p in gpu.profiles if p.name == profile_name), None)
