"""Per-tenant usage and cost: what each namespace holds now, in GPUs, by how it is shared and by tier.

Pure, over the fleet map's model (:mod:`gpuplane.cli.fleetmap`): every allocation of gpuplane's devices is
charged the fraction of its physical GPU that docs/cost.md charges (the driver's cost ledger uses the
same rules): a whole GPU held exclusively 1, a MIG device its memory slices / 8, an MPS or other share
its ``sharePercent`` / 100, a time-sliced GPU 1 / the number of claims time-slicing it. Summed per
namespace (the tenant), this is the GPUs the tenant holds now; with a price per GPU-hour, what that
costs per hour. History (GPU-hours used over a day) is the driver's ledger and the
``gpuplane_gpu_seconds_total`` counter, not the API: ``usage`` is the present.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gpuplane.api import names
from gpuplane.cli.fleetmap import Fleet, Gpu, Use

KINDS = ("whole", "mig", "mps", "timeslice", "shared")


@dataclass
class Tenant:
    """One namespace's holdings, in GPUs (fractions of physical GPUs)."""

    namespace: str
    claims: set[str] = field(default_factory=set)
    by_kind: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))
    by_tier: dict[str, float] = field(default_factory=dict)
    nodes: set[str] = field(default_factory=set)

    @property
    def gpus(self) -> float:
        """The GPUs it holds, all kinds together."""
        return sum(self.by_kind.values())


def fraction(gpu: Gpu, use: Use) -> tuple[str, float]:
    """(kind, fraction of the physical GPU) one allocation is charged (docs/cost.md)."""
    device = next((d for d in gpu.devices if d.name == use.device), None)
    if device is not None and device.kind == names.DEVICE_TYPE_MIG:
        return "mig", (len(device.cells) / gpu.cells) if device.cells and gpu.cells else 1.0
    if use.sharing == "timeslice":
        slicing = sum(1 for u in gpu.uses if u.sharing == "timeslice")
        return "timeslice", 1.0 / max(1, slicing)
    if use.sharing in ("mps", "shared"):
        return use.sharing, use.share / 100
    return "whole", 1.0


def tally(fleet: Fleet) -> list[Tenant]:
    """Each namespace with an allocation on the fleet, most GPUs first."""
    tenants: dict[str, Tenant] = {}
    for node, gpus in fleet.nodes.items():
        for gpu in gpus.values():
            for use in gpu.uses:
                tenant = tenants.setdefault(use.namespace, Tenant(use.namespace))
                kind, share = fraction(gpu, use)
                tenant.claims.add(use.claim)
                tenant.by_kind[kind] += share
                tier = use.tier or "-"
                tenant.by_tier[tier] = tenant.by_tier.get(tier, 0.0) + share
                tenant.nodes.add(node)
    return sorted(tenants.values(), key=lambda t: (-t.gpus, t.namespace))


def _n(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".") if value else "0"


def render(fleet: Fleet, price_per_gpu_hour: float | None = None) -> list[str]:
    """A table, one line per namespace, then the fleet's total and what RBAC hid."""
    tenants = tally(fleet)
    total_gpus = sum(len(g) for g in fleet.nodes.values())
    head = f"{'NAMESPACE':<28} {'CLAIMS':>6} {'GPUS':>6} " + " ".join(f"{k.upper():>9}" for k in KINDS)
    head += f"  {'BY TIER':<28}" + ("  COST/HOUR" if price_per_gpu_hour is not None else "")
    lines = [head]
    for t in tenants:
        tiers = ", ".join(f"{tier} {_n(v)}" for tier, v in sorted(t.by_tier.items()) if tier != "-")
        line = f"{t.namespace:<28} {len(t.claims):>6} {_n(t.gpus):>6} "
        line += " ".join(f"{_n(t.by_kind[k]):>9}" for k in KINDS) + f"  {tiers or '-':<28}"
        if price_per_gpu_hour is not None:
            line += f"  {t.gpus * price_per_gpu_hour:>9.2f}"
        lines.append(line.rstrip())
    held = sum(t.gpus for t in tenants)
    share = f" ({100 * held / total_gpus:.0f} %)" if total_gpus else ""
    footer = f"{len(tenants)} namespaces hold {_n(held)} of {total_gpus} GPUs{share}"
    if price_per_gpu_hour is not None:
        footer += f": {held * price_per_gpu_hour:.2f} per hour at {price_per_gpu_hour:g} per GPU-hour"
    lines.append(footer)
    lines += [f"hidden: {h}" for h in fleet.hidden]
    return lines


def as_json(fleet: Fleet, price_per_gpu_hour: float | None = None) -> dict[str, object]:
    """The same figures for scripts (``-o json``)."""
    rows: list[dict[str, object]] = []
    for t in tally(fleet):
        row: dict[str, object] = {
            "namespace": t.namespace,
            "claims": sorted(t.claims),
            "gpus": round(t.gpus, 4),
            "byKind": {k: round(v, 4) for k, v in t.by_kind.items()},
            "byTier": {k: round(v, 4) for k, v in sorted(t.by_tier.items())},
            "nodes": sorted(t.nodes),
        }
        if price_per_gpu_hour is not None:
            row["costPerHour"] = round(t.gpus * price_per_gpu_hour, 4)
        rows.append(row)
    hidden: Sequence[str] = fleet.hidden
    return {"tenants": rows, "fleetGpus": sum(len(g) for g in fleet.nodes.values()), "hidden": list(hidden)}
