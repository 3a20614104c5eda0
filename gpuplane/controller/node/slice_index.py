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

Strings that repeat (attribute names, product names, device names) are interned. Nothing here
talks to the API; the interner is the only state, and it holds values, never decisions.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpuplane.driver.api import names as dn
from gpuplane.driver.api import noisy_taint, quantity


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


class Interner:
    """One shared object per distinct value (MIG devices, strings); kept for the controller's lifetime."""

    def __init__(self) -> None:
        self._mig: dict[MigDevice, MigDevice] = {}

    def mig(self, device: MigDevice) -> MigDevice:
        """The shared copy of ``device``."""
        return self._mig.setdefault(device, device)

    def __len__(self) -> int:
        return len(self._mig)


def _s(value: str) -> str:
    return sys.intern(value)


def attr_value(raw: Mapping[str, Any]) -> Any:
    """The value of one attribute, whatever its type."""
    for kind in ("string", "int", "bool", "version"):
        if kind in raw:
            value = raw[kind]
            return _s(value) if isinstance(value, str) and len(value) <= 64 else value
    return None


def qualified_attributes(device: Mapping[str, Any], driver: str) -> dict[str, Any]:
    """A device's attributes keyed by qualified name (unqualified names belong to the driver's domain)."""
    out: dict[str, Any] = {}
    for key, raw in (device.get("attributes") or {}).items():
        qual = key if "/" in key else f"{driver}/{key}"
        out[_s(qual)] = attr_value(raw or {})
    return out


def _quantity(raw: Any) -> int:
    try:
        return quantity.parse_quantity(str(raw))
    except ValueError:
        return 0


def _mig_device(device: Mapping[str, Any], driver: str) -> MigDevice | None:
    consumes = device.get("consumesCounters") or []
    if not consumes:
        return None
    counters = consumes[0].get("counters") or {}
    taken = sorted(int(k.rsplit("-", 1)[1]) for k in counters if k.startswith("memory-slice-"))
    compute = _quantity((counters.get("compute-slices") or {}).get("value", "0"))
    if not taken or not compute:
        return None
    attrs = device.get("attributes") or {}
    caps = device.get("capacity") or {}
    product = (attrs.get(dn.ATTR_PRODUCT_NAME) or attrs.get(f"{driver}/{dn.ATTR_PRODUCT_NAME}") or {}).get("string")
    minor = (attrs.get(dn.ATTR_PARENT_MINOR) or attrs.get(f"{driver}/{dn.ATTR_PARENT_MINOR}") or {}).get("int")
    profile = (attrs.get(dn.ATTR_MIG_PROFILE) or attrs.get(f"{driver}/{dn.ATTR_MIG_PROFILE}") or {}).get("string")
    return MigDevice(
        name=_s(str(device["name"])),
        parent_minor=int(minor) if minor is not None else None,
        driver_profile=_s(str(profile or "")),
        first_slice=taken[0],
        memory_slices=len(taken),
        compute=compute,
        product=_s(str(product or "")),
        memory_bytes=_quantity((caps.get(dn.CAP_MEMORY) or {}).get("value", "0")),
        multiprocessors=_quantity((caps.get(dn.CAP_MULTIPROCESSORS) or {}).get("value", "0")),
    )


def digest(
    name: str, spec: Mapping[str, Any], interner: Interner | None = None, driver: str = dn.DRIVER_NAME
) -> SliceDigest | None:
    """The controller's view of one slice (None: another driver's)."""
    if spec.get("driver") != driver:
        return None
    interner = Interner() if interner is None else interner  # an empty one is falsy (it has a length)
    pool = spec.get("pool") or {}
    node = str(spec.get("nodeName") or "")
    gpus: list[GpuInfo] = []
    mig: dict[str, MigDevice] = {}
    noisy: list[tuple[str, Mapping[str, Any]]] = []
    for device in spec.get("devices") or []:
        noisy.extend(_noisy(device))
        attrs = device.get("attributes") or {}
        kind = (attrs.get(dn.ATTR_TYPE) or attrs.get(f"{driver}/{dn.ATTR_TYPE}") or {}).get("string")
        if kind == dn.DEVICE_TYPE_GPU:
            qualified = qualified_attributes(device, driver)
            dev = _s(str(device["name"]))
            caps = device.get("capacity") or {}
            gpus.append(
                GpuInfo(
                    id=f"{node}/{dev}",
                    node=_s(node),
                    device=dev,
                    domain=str(qualified.get(f"{driver}/{dn.ATTR_NVLINK_DOMAIN}") or f"{node}.{dev}"),
                    attributes=MappingProxyType(qualified),
                    memory_bytes=_quantity((caps.get(dn.CAP_MEMORY) or {}).get("value", "0")),
                    product=str(qualified.get(f"{driver}/{dn.ATTR_PRODUCT_NAME}") or ""),
                    multiprocessors=_quantity((caps.get(dn.CAP_MULTIPROCESSORS) or {}).get("value", "0")),
                )
            )
        elif kind == dn.DEVICE_TYPE_MIG:
            got = _mig_device(device, driver)
            if got is not None:
                shared = interner.mig(got)
                mig[shared.name] = shared
    return SliceDigest(
        name=_s(name),
        driver=_s(driver),
        pool=_s(str(pool.get("name", ""))),
        generation=int(pool.get("generation", 0)),
        node=_s(node),
        gpus=tuple(gpus),
        mig=mig,
        noisy=tuple(noisy),
    )


def _noisy(device: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    name = device.get("name")
    if not isinstance(name, str):
        return []
    return [
        (name, MappingProxyType({k: t[k] for k in ("key", "value", "timeAdded", "effect") if k in t}))
        for t in device.get("taints") or []
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
    meta = obj.get("metadata") or {}
    return digest(str(meta.get("name", "")), obj.get("spec") or {}, None, driver)


def newest(digests: list[SliceDigest]) -> list[SliceDigest]:
    """The slices of each pool's newest generation (what the scheduler uses)."""
    top: dict[str, int] = {}
    for d in digests:
        top[d.pool] = max(top.get(d.pool, 0), d.generation)
    return [d for d in digests if d.generation == top.get(d.pool, 0)]
