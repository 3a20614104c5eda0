"""From a need to the devices that meet it, smallest first: the right-sizing rule. Pure.

Candidates, each meeting the need's memory and compute share:

* **MIG** (hard and soft): per GPU model, the smallest published profile whose memory is at least
  the need and whose SMs are at least ``compute`` % of the model's SMs. The full-GPU profile (7g)
  is left out: a whole GPU gives the same without turning MIG mode on.
* **MPS** (soft only): a ``sharePercent`` of ``compute`` and ``memory`` of the need on a whole GPU
  with at least that much memory, behind the claim's own MPS daemon limited to that SM
  percentage and pinned memory. With a tier, through the tier's class, which must allow both
  (its quota is a ceiling a claim may only tighten); without one, through the plain GPU class.
* **whole GPU**: any GPU with at least the need's memory; always the last resort.

Order: by the fraction of one GPU the candidate holds (its dominant share: the larger of its
memory share and its SM share; an MPS share counts against the smallest GPU it could land on),
the stronger isolation first on a tie (MIG before MPS), then the one holding less memory (a
3g.40gb before a 3g.90gb), the whole GPU last. "The smallest
isolation that meets the need" is the smallest allocation; a soft need therefore gets an MPS
share before a MIG profile that would round it up, and a MIG profile first where it fits
exactly. DRA caps a ``firstAvailable`` list at 8 entries: the 7 smallest candidates and the
whole GPU are kept, and what was dropped is said.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gpuplane.api import names
from gpuplane.controller.rightsize import fleet
from gpuplane.controller.rightsize.need import Need, NeedError, gib

MAX_ALTERNATIVES = 8  # resource.k8s.io FirstAvailableDeviceRequestMaxSize
FULL_PROFILE_SHARE = 0.99
GPU_CLASS = "gpu.gpuplane.dev"
MIG_CLASS = "mig.gpuplane.dev"
Kind = Literal["MIG", "MPS", "GPU"]
_RANK: dict[str, int] = {"MIG": 0, "MPS": 1, "GPU": 2}


@dataclass(frozen=True)
class Alternative:
    """One subrequest of the generated claim."""

    name: str
    kind: Kind
    device_class: str
    selectors: tuple[str, ...]
    held: float  # fraction of one GPU this alternative holds (dominant share)
    model: str | None = None
    profile: str | None = None
    share_percent: int | None = None
    memory_bytes: int | None = None  # MIG: the profile's memory; MPS: the capacity request; GPU: the minimum
    config: Mapping[str, Any] | None = field(default=None, compare=False)

    def describe(self) -> str:
        """One line for the GpuRequest's status."""
        held = f"holds {100 * self.held:.0f}% of a GPU"
        if self.kind == "MIG":
            return f"MIG {self.profile} on {self.model} ({held})"
        if self.kind == "MPS":
            via = fleet.tier_of_class(self.device_class)
            tier = f" tier {via}" if via else ""
            return f"MPS{tier} share {self.share_percent}% with {gib(self.memory_bytes or 0)} ({held})"
        return f"whole GPU with >= {gib(self.memory_bytes or 0)}"


@dataclass(frozen=True)
class Plan:
    """The alternatives in order, and why any option was left out."""

    alternatives: tuple[Alternative, ...]
    notes: tuple[str, ...] = ()


def cel_string(text: str) -> str:
    """A CEL string literal of ``text`` (double-quoted; backslash and quote escaped; no control chars)."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        raise NeedError(f"published name {text!r} contains control characters; it cannot be selected")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _attr(name: str) -> str:
    return f'device.attributes["{names.DRIVER_NAME}"].{name}'


def _memory_at_least(n: int) -> str:
    return f'device.capacity["{names.DRIVER_NAME}"].{names.CAP_MEMORY}.compareTo(quantity("{n}")) >= 0'


def _slug(product: str) -> str:
    words = re.sub(r"[^a-z0-9]+", "-", product.lower()).strip("-")
    words = words.removeprefix("nvidia-")
    return words[:40].strip("-") or "gpu"


def _sm_ok(sms: int, total: int, percent: int) -> bool:
    return sms * 100 >= percent * total


def _mig_for(need: Need, m: fleet.GpuModel) -> Alternative | None:
    best: tuple[float, str, fleet.MigOption] | None = None
    for opt in m.mig:
        if opt.memory_bytes < need.memory_bytes or not _sm_ok(
            opt.multiprocessors, m.multiprocessors, need.compute_percent
        ):
            continue
        held = max(opt.memory_bytes / m.memory_bytes, opt.multiprocessors / m.multiprocessors)
        if held >= FULL_PROFILE_SHARE:
            continue
        key = (held, opt.profile, opt)
        if best is None or key[:2] < best[:2]:
            best = key
    if best is None:
        return None
    held, _, opt = best
    return Alternative(
        name=f"mig-{_slug(m.product)}",
        kind="MIG",
        device_class=MIG_CLASS,
        selectors=(
            f"{_attr(names.ATTR_MIG_PROFILE)} == {cel_string(opt.profile)} && "
            f"{_attr(names.ATTR_PRODUCT_NAME)} == {cel_string(m.product)}",
        ),
        held=min(1.0, held),
        model=m.product,
        profile=opt.profile,
        memory_bytes=opt.memory_bytes,
    )


def _mps_config(need: Need) -> dict[str, Any]:
    return {
        "apiVersion": names.CONFIG_API_VERSION,
        "kind": "GpuConfig",
        "sharing": {
            "strategy": "MPS",
            "mps": {
                "defaultActiveThreadPercentage": need.compute_percent,
                "defaultPinnedDeviceMemoryLimit": f"{max(1, need.memory_bytes // 2**20)}Mi",
            },
        },
    }


def _mps_for(
    need: Need, eligible: Sequence[fleet.GpuModel], tiers: Mapping[str, fleet.TierLimits], notes: list[str]
) -> Alternative | None:
    if not need.soft:
        return None
    device_class = GPU_CLASS
    if need.tier is not None:
        limits = tiers.get(need.tier)
        if limits is None:
            known = ", ".join(sorted(tiers)) or "none"
            raise NeedError(
                f"spec.tier: no DeviceClass {fleet.tier_class(need.tier)} for tier {need.tier!r} (tiers here: {known})"
            )
        device_class = limits.device_class
        if limits.thread_percent is not None and need.compute_percent > limits.thread_percent:
            notes.append(
                f"no MPS share: tier {need.tier} caps MPS clients at {limits.thread_percent}% of the SMs, "
                f"the need is {need.compute_percent}%"
            )
            return None
        if limits.memory_bytes is not None and need.memory_bytes > limits.memory_bytes:
            notes.append(
                f"no MPS share: tier {need.tier} caps pinned memory at {gib(limits.memory_bytes)}, "
                f"the need is {gib(need.memory_bytes)}"
            )
            return None
    smallest = min(m.memory_bytes for m in eligible)
    held = max(need.compute_percent / 100, need.memory_bytes / smallest)
    return Alternative(
        name="mps",
        kind="MPS",
        device_class=device_class,
        selectors=(f'{_attr(names.ATTR_TYPE)} == "{names.DEVICE_TYPE_GPU}"', _memory_at_least(need.memory_bytes)),
        held=min(1.0, held),
        share_percent=need.compute_percent,
        memory_bytes=need.memory_bytes,
        config=_mps_config(need),
    )


def plan(need: Need, models: Sequence[fleet.GpuModel], tiers: Mapping[str, fleet.TierLimits]) -> Plan:
    """The alternatives for ``need`` on this fleet; NeedError when no GPU here can hold it."""
    if not models:
        raise NeedError("no gpuplane GPU is published in the cluster yet; the request is checked again when one is")
    eligible = [m for m in models if m.memory_bytes >= need.memory_bytes]
    if not eligible:
        largest = max(models, key=lambda m: m.memory_bytes)
        raise NeedError(
            f"spec.memory: {gib(need.memory_bytes)} is more than any GPU in the cluster has "
            f"(the largest, {largest.product}, has {gib(largest.memory_bytes)}); "
            "ask for less memory or use several GPUs (a GpuGang)"
        )
    notes: list[str] = []
    candidates: list[Alternative] = []
    seen: set[str] = set()
    for m in eligible:
        alt = _mig_for(need, m)
        if alt is None:
            continue
        name = alt.name if alt.name not in seen else f"{alt.name[:58]}-{len(seen)}"
        seen.add(name)
        candidates.append(dataclasses.replace(alt, name=name))
    if not candidates:
        notes.append(
            "no MIG profile: no published profile has "
            f"{gib(need.memory_bytes)} and {need.compute_percent}% of the SMs below a full GPU"
        )
    mps = _mps_for(need, eligible, tiers, notes)
    if mps is not None:
        candidates.append(mps)
    candidates.sort(key=lambda a: (round(a.held, 6), _RANK[a.kind], a.memory_bytes or 0, a.name))
    if len(candidates) > MAX_ALTERNATIVES - 1:
        dropped = candidates[MAX_ALTERNATIVES - 1 :]
        candidates = candidates[: MAX_ALTERNATIVES - 1]
        notes.append(f"left out (DRA allows 8 alternatives): {', '.join(a.describe() for a in dropped)}")
    whole = Alternative(
        name="gpu",
        kind="GPU",
        device_class=GPU_CLASS,
        selectors=(_memory_at_least(need.memory_bytes),),
        held=1.0,
        memory_bytes=need.memory_bytes,
    )
    return Plan(tuple([*candidates, whole]), tuple(notes))
