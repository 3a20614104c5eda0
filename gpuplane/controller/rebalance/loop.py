"""The rebalancing loop: a pass every ``--rebalance-interval`` seconds while this replica leads. Does I/O.

Started by a kopf startup handler as an asyncio task (kopf timers need an object to hang on, and
add a finalizer to it); it reads kopf's live indexes of ResourceSlices and ResourceClaims, so a
pass costs one API read (the DeviceTaintRules) when nothing is noisy. A pass that fails is logged
and the next one runs; a lost leadership ends a pass at its next write (NotLeader).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpuplane.controller import indexed, periodic
from gpuplane.controller.node import slice_index
from gpuplane.controller.rebalance.act import Rebalancer


def noisy_slices(slice_idx: Mapping[Any, Iterable[Any]]) -> list[dict[str, Any]]:
    """The slices with noisy-neighbour taints, from the controller's slice index (digests keyed by node)."""
    return slice_index.noisy_specs(slice_index.every(slice_idx))


async def run(
    rebalancer: Rebalancer,
    leading: Any,
    slice_idx: Mapping[Any, Iterable[Any]],
    claim_idx: Mapping[Any, Iterable[Any]],
    interval_s: float,
) -> None:
    """Forever: wait, then one pass if ``leading()`` (started once the informers synced)."""

    def one_pass() -> Any:
        return rebalancer.run_pass(noisy_slices(slice_idx), list(indexed.single(claim_idx).values()))

    await periodic.every(interval_s, leading, one_pass, "rebalancing")
