"""A placement the scheduler does not follow: members still unbound long after the gates were lifted.

The controller places over its own view; the scheduler decides with the real allocator. When
they disagree for good (a MIG profile the chosen GPUs do not publish, a selector the
pre-filter could not evaluate, a device taken meanwhile), the gang's claims never allocate and
it sat at ``Placed / GatesLifted`` forever. :func:`overdue` says when a placement has waited
past the bind timeout; the reconciler then releases it like a preemption (member pods and
claims deleted; the pods' owner recreates them gated and the gang queues again), with a
Warning Event ``BindTimeout`` naming how many members were bound.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuplane.api import kubetime

REASON = "BindTimeout"


def overdue(prev: Mapping[str, Any], bound: int, members: int, now: float, timeout_s: float) -> str | None:
    """Why the placement is released now, or None while it may still be followed (or the check is off)."""
    placed_at = kubetime.epoch(prev.get("placedAt"))
    if timeout_s <= 0 or placed_at is None or bound >= members:
        return None
    waited = now - placed_at
    if waited <= timeout_s:
        return None
    return (
        f"placed {waited:.0f}s ago, {bound} of {members} members bound by the scheduler (bind timeout "
        f"{timeout_s:.0f}s): the placement is released (member pods and claims deleted) and the gang queues "
        "again when its pods are recreated; check the gang's selectors, MIG profile and the claims' events"
    )
