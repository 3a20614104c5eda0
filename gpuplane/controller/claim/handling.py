"""What the operator does about one ResourceClaim: review it, and say why it stays unallocated.

:func:`check_claim` runs the review (:mod:`gpuplane.controller.claim.review`) and makes its writes
once per finding, failing the pending pods of a claim the driver is sure to refuse;
:func:`explain_claim` (called by :mod:`gpuplane.controller.claim.explainer`'s pass, with the claim
index's :class:`~gpuplane.controller.indexed.ClaimView`) posts why a claim waits, from the placement
view, once per distinct reason. Both are leader-only and delegate every decision to the pure modules
of this package.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from gpuplane.api import kubetime
from gpuplane.controller import config, events, indexed, names, runtime
from gpuplane.controller.claim import checks, failfast, review
from gpuplane.controller.deviceclass import ClassView
from gpuplane.controller.gang import run, world

EXPLAIN_VIEW_AGE_S = 5.0  # an unallocated claim's explanation may use a view this old (one per claim timer otherwise)
EXPLAINED_MAX = 250  # characters of the reason kept in the claim's annotation


@dataclass
class ClaimState:
    """The claim review's per-process state (``rt.state(ClaimState)``)."""

    notes: dict[str, dict[str, str | None]] = field(default_factory=dict)  # uid -> annotations written
    reasons: checks.ReasonCache = field(default_factory=checks.ReasonCache)  # unallocated claims' explanations

    @classmethod
    def create(cls, cfg: config.ControllerConfig) -> Self:
        """Nothing written yet."""
        return cls()

    def new_term(self) -> None:
        """An earlier term's writes are read back from the API."""
        self.notes.clear()


async def check_claim(
    rt: runtime.Runtime, claim: Mapping[str, Any], classes: Mapping[str, ClassView], consumers: Iterable[str]
) -> None:
    """Validate a claim's config and its NVLink-domain constraint; record findings once (annotations)."""
    if not rt.leading():
        return
    consumers = list(consumers)
    claim = review.with_notes(claim, rt.state(ClaimState).notes)  # what this replica wrote counts, if not seen yet
    found = review.decide(claim, classes, consumers, kubetime.rfc3339())
    if found is None:
        return
    for finding in found.findings:
        rt.metrics.claim_findings.labels(finding=finding).inc()
    await asyncio.to_thread(review.apply, rt.writer, found)
    review.remember(rt.state(ClaimState).notes, found, str((claim.get("metadata") or {}).get("uid") or ""))
    if found.error:
        await failfast.fail_pending_consumers(rt, claim, consumers, found.error)


_COUNTS = re.compile(r"\d+")


def same_reason(written: str | None, reason: str) -> bool:
    """Whether the explanation already written says what ``reason`` says, whatever the counts in it.

    The counts (free GPUs in the fleet, placements free on GPUs of a profile) change with every
    allocation anywhere; rewritten for them, every pending claim that does not fit took an annotation
    and an Event per explainer pass (7,200 such claims: 14,400 writes every 10 s). A claim is told
    again when what is wrong changes; its Events keep the counts of when it was told.
    """
    return written is not None and _COUNTS.sub("#", written) == _COUNTS.sub("#", reason)


def _gang_member_claim(claim: indexed.ClaimView, w: world.World) -> bool:
    """A claim made from a template for a gang member's pod: gated or finished, its GpuGang explains it."""
    return any(o.controller and o.uid in w.member_uids for o in claim.pod_owners)


async def explain_claim(
    rt: runtime.Runtime,
    claim: indexed.ClaimView,
    classes: Mapping[str, ClassView],
    w: world.World,
    now: float,
) -> None:
    """For a claim that stays unallocated, say why in an Event (once per distinct reason)."""
    if not rt.leading() or claim.allocated or not checks.ours_in(claim.requests, classes):
        return
    age = now - (kubetime.epoch(claim.created) or now)
    if age < rt.cfg.claim_explain_after_s or _gang_member_claim(claim, w):
        return
    _, view = run.plan_for(rt, w, now, max_age_s=EXPLAIN_VIEW_AGE_S)
    reason = rt.state(ClaimState).reasons.reason(claim, classes, view)
    said = reason[:EXPLAINED_MAX]  # as the annotation holds it
    if not reason or same_reason(claim.annotations.get(names.ANNOTATION_EXPLAINED), said):
        return
    rt.metrics.claim_findings.labels(finding="unallocated").inc()
    ref = events.ObjectRef("resource.k8s.io/v1", "ResourceClaim", claim.name, claim.namespace, claim.uid)
    await asyncio.to_thread(rt.writer.event, ref, "Warning", events.CLAIM_UNALLOCATED, reason)
    await asyncio.to_thread(rt.writer.annotate_claim, claim.namespace, claim.name, {names.ANNOTATION_EXPLAINED: said})
