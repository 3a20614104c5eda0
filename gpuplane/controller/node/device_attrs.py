"""What a published device says, read from its ResourceSlice entry: qualified attributes, quantities, and a MIG
device's counter footprint and geometry profile (so no hardware table is restated). Pure.

Every reader is total: a field of the wrong type, or a value out of bounds, reads as absent (None, 0,
an empty mapping), never as an exception, since a slice another node wrote is hostile input.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from gpuplane.api import quantity
from gpuplane.api.boundedjson import mapping
from gpuplane.mig.geometry import MigGeometry

SHORT = 64  # strings up to this length are interned (the API's limit for an attribute's string value)
_MAX_SLICE_INDEX = 1 << 16  # a memory-slice counter's number beyond any GPU's


def attr_value(raw: Any) -> Any:
    """The value of one attribute, whatever its type (None: no value, or not an attribute)."""
    raw = mapping(raw)
    for kind in ("string", "int", "bool", "version"):
        if kind in raw:
            value = raw[kind]
            return sys.intern(value) if isinstance(value, str) and len(value) <= SHORT else value
    return None


def qualified_attributes(device: Mapping[str, Any], driver: str) -> dict[str, Any]:
    """A device's attributes keyed by qualified name (unqualified names belong to the driver's domain)."""
    out: dict[str, Any] = {}
    for key, raw in mapping(device.get("attributes")).items():
        if not isinstance(key, str):
            continue
        qual = key if "/" in key else f"{driver}/{key}"
        out[sys.intern(qual) if len(qual) <= 2 * SHORT else qual] = attr_value(raw)
    return out


def attribute(attrs: Mapping[str, Any], name: str, driver: str, kind: str) -> Any:
    """The ``kind`` value ("string", "int") of attribute ``name``, written qualified or not (None: absent)."""
    raw = mapping(attrs.get(name) or attrs.get(f"{driver}/{name}"))
    return raw.get(kind)


def quantity_bytes(raw: Any) -> int:
    """A quantity's value (0: not a quantity, or out of bounds)."""
    if not isinstance(raw, str | int) or isinstance(raw, bool):
        return 0
    try:
        return quantity.parse_quantity(raw)
    except ValueError:
        return 0


def capacity(device: Mapping[str, Any], name: str) -> int:
    """The value of capacity ``name`` of a device (0: absent)."""
    return quantity_bytes(mapping(mapping(device.get("capacity")).get(name)).get("value", "0"))


def mig_counters(device: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """(first memory slice, memory slices, compute slices) a MIG device consumes, from its counters."""
    consumes = device.get("consumesCounters")
    if not isinstance(consumes, list) or not consumes:
        return None
    counters = mapping(mapping(consumes[0]).get("counters"))
    slices: list[int] = []
    for key in counters:
        tail = key.removeprefix("memory-slice-") if isinstance(key, str) else ""
        if tail != key and tail.isascii() and tail.isdigit() and len(tail) <= 5 and int(tail) < _MAX_SLICE_INDEX:
            slices.append(int(tail))
    compute = quantity_bytes(mapping(counters.get("compute-slices")).get("value", "0"))
    if not slices or not compute:
        return None
    slices.sort()
    return slices[0], len(slices), compute


def geometry_name(driver_profile: str, memory_slices: int, compute: int, geo: MigGeometry) -> str | None:
    """The geometry profile of a MIG device that consumes ``memory_slices`` and ``compute`` slices."""
    exclusive = "+me" in driver_profile
    for p in geo.profiles:
        if p.compute == compute and p.memory == memory_slices and p.exclusive == exclusive:
            return p.name
    return None
