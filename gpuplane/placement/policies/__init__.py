"""Placement policies: gpuplane and the first-fit, best-fit and spread baselines.

All of them obey the same NVLink-domain rule (``place`` enforces it); they
differ only in how they rank candidates (see ``base.Policy``): ``gpuplane``
(fragmentation gradient over MIG slots, nodes and domains), ``firstfit``,
``bestfit`` (the tightest first) and ``spread`` (the emptiest first).
"""

from __future__ import annotations

from gpuplane.placement import fragmentation
from gpuplane.placement.policies import base, bestfit, firstfit, gpuplane, spread

NAMES = ("gpuplane", "best-fit", "first-fit", "spread")


def make(name: str, mix: fragmentation.SizeMix | None = None) -> base.Policy:
    """A fresh policy by name; ``mix`` only matters to gpuplane."""
    if name == "gpuplane":
        return gpuplane.GpuPlane(mix)
    if name == "best-fit":
        return bestfit.BestFit()
    if name == "first-fit":
        return firstfit.FirstFit()
    if name == "spread":
        return spread.Spread()
    raise KeyError(f"unknown policy {name!r}; known: {', '.join(NAMES)}")
