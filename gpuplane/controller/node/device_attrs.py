"""What a published device says, read from its ResourceSlice entry: qualified attributes, quantities, and a MIG
device's geometry profile and start from its counter consumption (so no hardware table is restated). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuplane.driver.api import quantity
from gpuplane.mig.geometry import MigGeometry


def attr_value(raw: Mapping[str, Any]) -> Any:
    for kind in ("string", "int", "bool", "version"):
        if kind in raw:
            return raw[kind]
    return None


def qualified_attributes(device: Mapping[str, Any], driver: str) -> dict[str, Any]:
    """A device's attributes keyed by qualified name (unqualified names belong to the driver's domain)."""
    out: dict[str, Any] = {}
    for key, raw in (device.get("attributes") or {}).items():
        qual = key if "/" in key else f"{driver}/{key}"
        out[qual] = attr_value(raw or {})
    return out


def quantity_bytes(raw: Any) -> int:
    try:
        return quantity.parse_quantity(str(raw))
    except ValueError:
        return 0


def mig_counters(device: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """(first memory slice, memory slices, compute slices) a MIG device consumes, from its counters."""
    consumes = device.get("consumesCounters") or []
    if not consumes:
        return None
    counters = consumes[0].get("counters") or {}
    slices = sorted(int(k.rsplit("-", 1)[1]) for k in counters if k.startswith("memory-slice-"))
    compute = quantity_bytes((counters.get("compute-slices") or {}).get("value", "0"))
    if not slices or not compute:
        return None
    return slices[0], len(slices), compute


def geometry_name(driver_profile: str, memory_slices: int, compute: int, geo: MigGeometry) -> str | None:
    """The geometry profile of a MIG device that consumes ``memory_slices`` and ``compute`` slices."""
    exclusive = "+me" in driver_profile
    for p in geo.profiles:
        if p.compute == compute and p.memory == memory_slices and p.exclusive == exclusive:
            return p.name
    return None
