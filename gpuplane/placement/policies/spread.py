"""Spread baseline: the emptiest GPU, node and domain first (load balancing).

The opposite of best-fit: MIG instances open fresh GPUs, whole GPUs go to the
node and domain with the most empty GPUs. Kept to show what balancing costs.
"""

from __future__ import annotations

from gpuplane.placement import geometry, snapshot
from gpuplane.placement.policies import base


class Spread:
    """Most capacity left wins."""

    name = "spread"

    def mig_partial(self, slots: geometry.Slots, state: int, profile: str) -> tuple[base.Key, int] | None:
        starts = slots.starts(state, profile)
        if not starts:
            return None
        after = slots.add(state, profile, starts[0])
        return (-float(slots.free_compute(after)), 0.0, 0.0), starts[0]

    def mig_empty(
        self, slots: geometry.Slots, profile: str, sig: snapshot.Signature, node_gpus: int
    ) -> tuple[base.Key, int, int | None] | None:
        starts = slots.starts(geometry.EMPTY, profile)
        if not starts or not sum(sig):
            return None
        after = slots.add(geometry.EMPTY, profile, starts[0])
        c = max(sig)
        return (-float(slots.free_compute(after)), -float(c), -float(sum(sig))), starts[0], c

    def group(
        self, slots: geometry.Slots, sig: snapshot.Signature, gpus_per_member: int, members: int, node_gpus: int
    ) -> tuple[base.Key, tuple[int, ...] | None] | None:
        if not base.group_fits(sig, gpus_per_member, members):
            return None
        cur = sig
        chosen: list[int] = []
        for _ in range(members):
            c = max(cur)
            chosen.append(c)
            cur = base.take(cur, c, gpus_per_member)
        left = float(sum(c - gpus_per_member for c in chosen))
        return (-left, -float(sum(cur))), tuple(chosen)
