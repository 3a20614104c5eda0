"""What the controller keeps of a ResourceSlice: only the fields it reads, shared between nodes where equal.

A 1,000-node fleet publishes ~190,000 devices; kept as the API's dicts they cost the controller
gigabytes. :func:`digest` reduces one slice to a :class:`SliceDigest`:

* the pool (name, generation), node and driver;
* every whole GPU as a :class:`GpuInfo` (its qualified attributes, which selectors are evaluated
  on; its NVLink domain, product and memory);
* every MIG device as a :class:`MigDevice`: its parent's minor, the driver's profile name and the
  memory slices and compute slices it consumes (read from its counter consumption, so no MIG
  table is repeated here). A MIG device is equal on every node that has the same GPU, so the
  :class:`Interner` keeps one object per distinct device for the whole fleet;
* what right-sizing reads of the fleet (each device's product, memory and multiprocessors);
* the driver's noisy-neighbour device taints (key, value, timeAdded), which rebalancing reads;
  :func:`noisy_specs` gives them back in the API's shape. Other taints are not kept: placement
  reads health from the driver's whole-GPU attributes, not from taints.

Every field is read as hostile (a node wrote it): :func:`digest` is total, reading fields of the
wrong type as absent (the readers of :mod:`gpuplane.controller.node.device_attrs`) and skipping
devices without a name; a slice with more devices than the API allows is not read. A slice of this
driver whose ``pool.name`` is not its ``nodeName`` (or that names no node) is not read either
(:func:`untrusted` says why): the driver publishes one pool per node, named after it, so such a slice
was written by someone else (a stolen node credential naming another node's pool), and its devices and
noisy taints (which name claims, and so pods to evict) must not reach placement, steering or
rebalancing. Strings that repeat (attribute names, product names, device names) are interned. Nothing here talks to the
API; the interner is the only state, and it holds values, never decisions.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpuplane.api import names as dn
from gpuplane.api import noisy_taint
from gpuplane.api.boundedjson import mapping
from gpuplane.controller.node import device_attrs

MAX_DEVICES = 128  # the API's limit on devices in one ResourceSlice (resource.k8s.io/v1)
MIG_MAPS = 4096  # distinct per-slice MIG mappings shared (nodes of one model publish equal ones)
MAX_NAME = 253  # a DNS subdomain: the longest node, pool or device name the API accepts
NO_NODE = "no-node"  # untrusted(): the slice names no node (a cluster-wide or node-selector pool)
POOL_NOT_NODE = "pool-not-node"  # untrusted(): spec.pool.name is not spec.nodeName
UNTRUSTED_REASONS = (NO_NODE, POOL_NOT_NODE)


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
    multiprocessors: int = 0


@dataclass(frozen=True)
class MigInfo:
    """One published MIG placement, mapped onto the geometry."""

    node: str
    device: str
    parent: str  # GpuInfo.id
    profile: str  # geometry name ("3g")
    start: int
    driver_profile: str  # the driver's name ("3g.71gb")


@dataclass(frozen=True, slots=True)
class MigDevice:
    """A MIG device as its counters describe it (node-independent, so shared across nodes)."""

    name: str
    parent_minor: int | None
    driver_profile: str
    first_slice: int
    memory_slices: int
    compute: int
    product: str = ""
    memory_bytes: int = 0
    multiprocessors: int = 0


@dataclass(frozen=True)
class SliceDigest:
    """The fields of one ResourceSlice the controller reads."""

    name: str
    driver: str
    pool: str
    generation: int
    node: str
    gpus: tuple[GpuInfo, ...] = ()
    mig: Mapping[str, MigDevice] = field(default_factory=dict)  # device name -> device
    noisy: tuple[tuple[str, Mapping[str, Any]], ...] = ()  # (device, noisy-neighbour taint as published)
    slice_count: int = 0  # the pool's resourceSliceCount (0: not said)


class Interner:
    """One shared object per distinct value (MIG devices, strings); kept for the controller's lifetime.

    A slice's whole name -> device mapping is shared too (nodes of one model publish the same MIG
    slices: 3,600 mappings of ~100 devices on an 800-node HGX fleet were 5.3 MB), for the last
    :data:`MIG_MAPS` distinct mappings; past that a slice keeps its own (nothing is shared wrongly).
    """

    def __init__(self) -> None:
        self._mig: dict[MigDevice, MigDevice] = {}
        self._maps: OrderedDict[tuple[MigDevice, ...], Mapping[str, MigDevice]] = OrderedDict()

    def mig(self, device: MigDevice) -> MigDevice:
        """The shared copy of ``device``."""
        return self._mig.setdefault(device, device)

    def mig_map(self, devices: dict[str, MigDevice]) -> Mapping[str, MigDevice]:
        """A read-only mapping equal to ``devices`` (of shared devices), shared with every equal one."""
        key = tuple(devices.values())  # the devices carry their names: equal keys, equal mappings
        got = self._maps.get(key)
        if got is None:
            got = self._maps[key] = MappingProxyType(devices)
            if len(self._maps) > MIG_MAPS:
                self._maps.popitem(last=False)
        else:
            self._maps.move_to_end(key)
        return got

    def __len__(self) -> int:
        return len(self._mig)


def _s(value: str) -> str:
    return sys.intern(value)


def _int(value: Any) -> int | None:
    """An API integer (int64), or None for anything else (a bool, a float, text, an int out of range)."""
    if isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63:
        return value
    return None


def _name(device: Mapping[str, Any]) -> str | None:
    name = device.get("name")
    return _s(name) if isinstance(name, str) and name and len(name) <= MAX_NAME else None


def _mig_device(device: Mapping[str, Any], name: str, driver: str) -> MigDevice | None:
    counters = device_attrs.mig_counters(device)
    if counters is None:
        return None
    attrs = mapping(device.get("attributes"))
    product = device_attrs.attribute(attrs, dn.ATTR_PRODUCT_NAME, driver, "string")
    profile = device_attrs.attribute(attrs, dn.ATTR_MIG_PROFILE, driver, "string")
    return MigDevice(
        name=name,
        parent_minor=_int(device_attrs.attribute(attrs, dn.ATTR_PARENT_MINOR, driver, "int")),
        driver_profile=_s(profile) if isinstance(profile, str) and len(profile) <= device_attrs.SHORT else "",
        first_slice=counters[0],
        memory_slices=counters[1],
        compute=counters[2],
        product=_s(product) if isinstance(product, str) and len(product) <= device_attrs.SHORT else "",
        memory_bytes=device_attrs.capacity(device, dn.CAP_MEMORY),
        multiprocessors=device_attrs.capacity(device, dn.CAP_MULTIPROCESSORS),
    )


def _gpu(device: Mapping[str, Any], dev: str, node: str, driver: str) -> GpuInfo:
    qualified = device_attrs.qualified_attributes(device, driver)
    domain = qualified.get(f"{driver}/{dn.ATTR_NVLINK_DOMAIN}")
    product = qualified.get(f"{driver}/{dn.ATTR_PRODUCT_NAME}")
    return GpuInfo(
        id=f"{node}/{dev}",
        node=node,
        device=dev,
        domain=domain if isinstance(domain, str) and domain else f"{node}.{dev}",
        attributes=MappingProxyType(qualified),
        memory_bytes=device_attrs.capacity(device, dn.CAP_MEMORY),
        product=product if isinstance(product, str) else "",
        multiprocessors=device_attrs.capacity(device, dn.CAP_MULTIPROCESSORS),
    )


def untrusted(spec: Any, driver: str = dn.DRIVER_NAME) -> str | None:
    """Why a slice of ``driver`` is not to be read (:data:`UNTRUSTED_REASONS`), or None.

    None as well for another driver's slice or a spec that is not a mapping (not this driver's: not
    read anyway). The driver publishes node-local pools only, each named after its node.
    """
    if not isinstance(spec, Mapping) or spec.get("driver") != driver:
        return None
    node = spec.get("nodeName")
    if not isinstance(node, str) or not node or len(node) > MAX_NAME:
        return NO_NODE
    if mapping(spec.get("pool")).get("name") != node:
        return POOL_NOT_NODE
    return None


def digest(
    name: str, spec: Mapping[str, Any], interner: Interner | None = None, driver: str = dn.DRIVER_NAME
) -> SliceDigest | None:
    """The controller's view of one slice (None: another driver's, or not a slice the API server serves).

    Total: whatever ``spec`` holds, this returns and never raises. Fields of the wrong type read as
    absent; a device without a name is skipped; a slice with more devices than the API allows in one
    (:data:`MAX_DEVICES`) is not read at all, since reading part of it would misstate the node; nor is
    a slice whose pool is not its node (:func:`untrusted`).
    """
    if not isinstance(spec, Mapping) or spec.get("driver") != driver or untrusted(spec, driver) is not None:
        return None
    devices = spec.get("devices")
    devices = devices if isinstance(devices, list) else []
    if len(devices) > MAX_DEVICES:
        return None
    interner = Interner() if interner is None else interner  # an empty one is falsy (it has a length)
    pool = mapping(spec.get("pool"))
    raw_node = spec.get("nodeName")
    node = _s(raw_node) if isinstance(raw_node, str) and len(raw_node) <= MAX_NAME else ""
    pool_name = pool.get("name")
    gpus: list[GpuInfo] = []
    mig: dict[str, MigDevice] = {}
    noisy: list[tuple[str, Mapping[str, Any]]] = []
    for device in devices:
        if not isinstance(device, Mapping) or (dev := _name(device)) is None:
            continue
        noisy.extend(_noisy(device))
        attrs = mapping(device.get("attributes"))
        kind = device_attrs.attribute(attrs, dn.ATTR_TYPE, driver, "string")
        if kind == dn.DEVICE_TYPE_GPU:
            gpus.append(_gpu(device, dev, node, driver))
        elif kind == dn.DEVICE_TYPE_MIG:
            got = _mig_device(device, dev, driver)
            if got is not None:
                shared = interner.mig(got)
                mig[shared.name] = shared
    return SliceDigest(
        name=_s(name) if isinstance(name, str) else "",
        driver=_s(driver),
        pool=_s(pool_name) if isinstance(pool_name, str) and len(pool_name) <= MAX_NAME else "",
        generation=_int(pool.get("generation")) or 0,
        node=node,
        gpus=tuple(gpus),
        mig=interner.mig_map(mig) if mig else mig,
        noisy=tuple(noisy),
        slice_count=max(0, _int(pool.get("resourceSliceCount")) or 0),
    )


def _noisy(device: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    name, taints = device.get("name"), device.get("taints")
    if not isinstance(name, str) or not isinstance(taints, list):
        return []
    return [
        (name, MappingProxyType({k: t[k] for k in ("key", "value", "timeAdded", "effect") if k in t}))
        for t in taints
        if isinstance(t, Mapping) and t.get("key") == noisy_taint.KEY
    ]


def noisy_specs(digests: list[SliceDigest]) -> list[dict[str, Any]]:
    """The slices that carry noisy-neighbour taints, as specs holding those devices and taints only."""
    out: list[dict[str, Any]] = []
    for d in digests:
        if not d.noisy:
            continue
        devices: dict[str, list[Mapping[str, Any]]] = {}
        for device, taint in d.noisy:
            devices.setdefault(device, []).append(dict(taint))
        out.append(
            {
                "driver": d.driver,
                "pool": {"name": d.pool, "generation": d.generation},
                "nodeName": d.node,
                "devices": [{"name": n, "taints": t} for n, t in devices.items()],
            }
        )
    return out


def every(index: Mapping[Any, Any]) -> list[Any]:
    """Every value of a kopf index whose keys may hold several (the slice index: by node)."""
    return [value for store in index.values() for value in store]


def as_digest(obj: SliceDigest | Mapping[str, Any], driver: str = dn.DRIVER_NAME) -> SliceDigest | None:
    """``obj`` itself, or the digest of a ResourceSlice given as the API's dict."""
    if isinstance(obj, SliceDigest):
        return obj if obj.driver == driver else None
    if not isinstance(obj, Mapping):
        return None
    name = mapping(obj.get("metadata")).get("name")
    return digest(name if isinstance(name, str) else "", mapping(obj.get("spec")), None, driver)


def incomplete(digests: list[SliceDigest]) -> frozenset[str]:
    """Nodes whose pool's newest generation has fewer slices than its ``resourceSliceCount`` says: its driver is
    writing it now, and kube-scheduler allocates nothing from such a pool until it is complete (its allocator
    marks it incomplete), whatever an older generation still holds."""
    count: dict[str, int] = {}
    want: dict[str, int] = {}
    node: dict[str, str] = {}
    for d in newest(digests):
        count[d.pool] = count.get(d.pool, 0) + 1
        want[d.pool] = max(want.get(d.pool, 0), d.slice_count)
        node[d.pool] = d.node
    return frozenset(node[p] for p, n in count.items() if n < want[p])


def newest(digests: list[SliceDigest]) -> list[SliceDigest]:
    """The slices of each pool's newest generation (what the scheduler uses)."""
    top: dict[str, int] = {}
    for d in digests:
        top[d.pool] = max(top.get(d.pool, 0), d.generation)
    return [d for d in digests if d.generation == top.get(d.pool, 0)]
