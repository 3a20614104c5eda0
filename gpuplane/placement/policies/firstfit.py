"""First-fit baseline: the first GPU (domain, node, GPU order) that fits, lowest MIG start slot.

Every class gets the same key, so the position tie-break alone decides. The
NVLink-domain rule still holds: a TP group goes to the first domain that can
host all of it.
"""

from __future__ import annotations

from gpuplane.placement import geometry, snapshot
from gpuplane.placement.policies import base


class FirstFit:
    """Lowest position wins."""

    name = "first-fit"

    def mig_partial(self, slots: geometry.Slots, state: int, profile: str) -> tuple[base.Key, int] | None:
        starts = slots.starts(state, profile)
        return ((), starts[0]) if starts else None

    def mig_empty(
        self, slots: geometry.Slots, profile: str, sig: snapshot.Signature, node_gpus: int
    ) -> tuple[base.Key, int, int | None] | None:
        starts = slots.starts(geometry.EMPTY, profile)
        return ((), starts[0], None) if starts and sum(sig) else None

    def group(
        self, slots: geometry.Slots, sig: snapshot.Signature, gpus_per_member: int, members: int, node_gpus: int
    ) -> tuple[base.Key, tuple[int, ...] | None] | None:
        return ((), None) if base.group_fits(sig, gpus_per_member, members) else None
