"""Best-fit baseline: the tightest GPU, then the tightest node, then the tightest domain.

MIG: the GPU with the fewest free compute slices after placement, lowest start
slot (the order NVML lists placements in). Whole GPUs and TP groups: the nodes
with the fewest empty GPUs that fit, then the domain with the fewest empty GPUs
left. Same NVLink-domain rule as every policy.
"""

from __future__ import annotations

from gpuplane.placement import geometry, snapshot
from gpuplane.placement.policies import base


class BestFit:
    """Least capacity left wins."""

    name = "best-fit"

    def mig_partial(self, slots: geometry.Slots, state: int, profile: str) -> tuple[base.Key, int] | None:
        starts = slots.starts(state, profile)
        if not starts:
            return None
        after = slots.add(state, profile, starts[0])
        return (float(slots.free_compute(after)), 0.0, 0.0), starts[0]

    def mig_empty(
        self, slots: geometry.Slots, profile: str, sig: snapshot.Signature, node_gpus: int
    ) -> tuple[base.Key, int, int | None] | None:
        starts = slots.starts(geometry.EMPTY, profile)
        counts = [c for c in sig if c > 0]
        if not starts or not counts:
            return None
        after = slots.add(geometry.EMPTY, profile, starts[0])
        c = min(counts)
        return (float(slots.free_compute(after)), float(c), float(sum(sig))), starts[0], c

    def group(
        self, slots: geometry.Slots, sig: snapshot.Signature, gpus_per_member: int, members: int, node_gpus: int
    ) -> tuple[base.Key, tuple[int, ...] | None] | None:
        if not base.group_fits(sig, gpus_per_member, members):
            return None
        cur = sig
        chosen: list[int] = []
        for _ in range(members):
            c = min(c for c in cur if c >= gpus_per_member)
            chosen.append(c)
            cur = base.take(cur, c, gpus_per_member)
        left = float(sum(c - gpus_per_member for c in chosen))
        return (left, float(sum(cur))), tuple(chosen)
