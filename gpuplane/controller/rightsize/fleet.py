"""What the fleet offers, read from gpuplane's ResourceSlices and DeviceClasses: GPU models, their MIG
profiles, and the MPS tiers' limits. Pure (plain dicts in, frozen values out).

A GPU model is a ``productName`` the driver publishes; its memory and SM count are the smallest
seen among whole-GPU devices of that name (two boards of one name may differ by a few MiB of
reserved memory); a model published only as MIG devices (MIG mode on where turning it off needs a
reset, e.g. an A100) takes them from its largest profile, so its shares are of what MIG can use.
A model's MIG options are the distinct profiles published as ``type == "mig"``
devices of that product, with the memory and SMs the driver publishes for them. Devices with a
malformed attribute or capacity are skipped: a slice is written by a node, and one bad node must
not stop every GpuRequest in the cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gpuplane.api import configs, names, quantity
from gpuplane.controller.deviceclass import ClassView
from gpuplane.controller.node import slice_index

TIER_CLASS_PREFIX = "mps-"
TIER_CLASS_SUFFIX = f".{names.DRIVER_NAME}"


@dataclass(frozen=True, order=True)
class MigOption:
    """One MIG profile of a model as published: name, memory in bytes, SMs."""

    profile: str
    memory_bytes: int
    multiprocessors: int


@dataclass(frozen=True)
class GpuModel:
    """A GPU model of the fleet: its product name, memory, SMs and MIG profiles (sorted by name)."""

    product: str
    memory_bytes: int
    multiprocessors: int
    mig: tuple[MigOption, ...] = ()


@dataclass(frozen=True)
class TierLimits:
    """An MPS tier class's ceilings: SM percentage and pinned memory per client (None: no ceiling)."""

    tier: str
    device_class: str
    thread_percent: int | None
    memory_bytes: int | None


def _attr(device: Mapping[str, Any], name: str) -> Any:
    attrs = device.get("attributes") or {}
    value = attrs.get(name) or attrs.get(f"{names.DRIVER_NAME}/{name}")
    if not isinstance(value, Mapping):
        return None
    for kind in ("string", "int", "bool", "version"):
        if kind in value:
            return value[kind]
    return None


def _capacity(device: Mapping[str, Any], name: str) -> int | None:
    entry = (device.get("capacity") or {}).get(name)
    if not isinstance(entry, Mapping):
        return None
    try:
        value = quantity.parse_quantity(str(entry.get("value")))
    except ValueError:
        return None
    return value if value > 0 else None


def _published(slices: Iterable[Any]) -> Iterator[tuple[str, Any, int | None, int | None, Any]]:
    """(product, type, memory, multiprocessors, MIG profile) of every device: API slices or the controller's digests."""
    for item in slices:
        if isinstance(item, slice_index.SliceDigest):
            if item.driver != names.DRIVER_NAME:
                continue
            for gpu in item.gpus:
                yield gpu.product, names.DEVICE_TYPE_GPU, gpu.memory_bytes or None, gpu.multiprocessors or None, None
            for dev in item.mig.values():
                mem, sms = dev.memory_bytes or None, dev.multiprocessors or None
                yield dev.product, names.DEVICE_TYPE_MIG, mem, sms, dev.driver_profile
            continue
        spec = item.get("spec") if "spec" in item else item
        if not isinstance(spec, Mapping) or spec.get("driver") != names.DRIVER_NAME:
            continue
        for device in spec.get("devices") or []:
            if not isinstance(device, Mapping):
                continue
            yield (
                _attr(device, names.ATTR_PRODUCT_NAME),
                _attr(device, names.ATTR_TYPE),
                _capacity(device, names.CAP_MEMORY),
                _capacity(device, names.CAP_MULTIPROCESSORS),
                _attr(device, names.ATTR_MIG_PROFILE),
            )


def models(slices: Iterable[Any]) -> tuple[GpuModel, ...]:
    """The GPU models gpuplane publishes, sorted by product name (from API slices or the controller's digests)."""
    whole: dict[str, tuple[int, int]] = {}
    mig: dict[str, dict[str, MigOption]] = {}
    for product, kind, memory, sms, profile in _published(slices):
        if not isinstance(product, str) or not product or memory is None or sms is None:
            continue
        if kind == names.DEVICE_TYPE_GPU:
            seen = whole.get(product)
            whole[product] = (memory, sms) if seen is None else (min(seen[0], memory), min(seen[1], sms))
        elif kind == names.DEVICE_TYPE_MIG and isinstance(profile, str) and profile:
            options = mig.setdefault(product, {})
            known = options.get(profile)
            if known is None or (memory, sms) < (known.memory_bytes, known.multiprocessors):
                options[profile] = MigOption(profile, memory, sms)
    for product, options in mig.items():
        if product not in whole:  # MIG mode on and no whole device published (e.g. an A100: toggling needs a reset)
            largest = max(options.values(), key=lambda o: (o.memory_bytes, o.multiprocessors))
            whole[product] = (largest.memory_bytes, largest.multiprocessors)
    return tuple(
        GpuModel(product, mem, sms, tuple(sorted((mig.get(product) or {}).values())))
        for product, (mem, sms) in sorted(whole.items())
    )


def tier_of_class(class_name: str) -> str | None:
    """``mps-gold.gpu.gpuplane.dev`` -> ``gold``; None for any other class name."""
    if class_name.startswith(TIER_CLASS_PREFIX) and class_name.endswith(TIER_CLASS_SUFFIX):
        tier = class_name[len(TIER_CLASS_PREFIX) : -len(TIER_CLASS_SUFFIX)]
        return tier or None
    return None


def tier_class(tier: str) -> str:
    """The DeviceClass of an MPS tier."""
    return f"{TIER_CLASS_PREFIX}{tier}{TIER_CLASS_SUFFIX}"


def tiers(classes: Mapping[str, ClassView]) -> dict[str, TierLimits]:
    """MPS tiers by name, from the DeviceClasses named ``mps-<tier>.gpu.gpuplane.dev``.

    A class whose MPS config does not parse has no usable limits and is left out (the claim
    checks report such a class on every claim that uses it).
    """
    out: dict[str, TierLimits] = {}
    for class_name, dclass in classes.items():
        tier = tier_of_class(class_name)
        if tier is None:
            continue
        pct: int | None = None
        mem: int | None = None
        ok = True
        for parameters in dclass.configs:  # this driver's config entries only
            try:
                parsed = configs.parse_config(parameters, f"DeviceClass {class_name}")
            except configs.ConfigError:
                ok = False
                break
            mps = parsed.sharing.mps if parsed.sharing.strategy == "MPS" else None
            if mps is not None:
                pct = mps.defaultActiveThreadPercentage if mps.defaultActiveThreadPercentage is not None else pct
                mem = mps.default_limit_bytes() if mps.defaultPinnedDeviceMemoryLimit is not None else mem
        if ok:
            out[tier] = TierLimits(tier, class_name, pct, mem)
    return out
