"""Objects the bounded decoder quarantined (nested too deeply to read): refused with an Event, never processed.

:mod:`gpuplane.informer.client` hands such an object to the handlers cut and marked
with :data:`gpuplane.api.boundedjson.REJECTED`. The indexes leave it out (no
decision ever sees it). For a ResourceClaim that uses one of this driver's classes (its
requests are shallow, so they survive the cut) the leader records one Warning Event and
the ``gpuplane.dev/config-error`` annotation, and fails its pending pods (the node driver
refuses it too, per claim); another driver's claim is only logged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

import structlog

from gpuplane.api import boundedjson
from gpuplane.controller import events, names
from gpuplane.controller.claim import checks as claims
from gpuplane.controller.claim import failfast
from gpuplane.controller.deviceclass import ClassView

log = structlog.get_logger(__name__)


def rejected(body: Mapping[str, Any]) -> bool:
    """Whether kopf delivered a quarantined stub instead of the object."""
    return boundedjson.rejection(body) is not None


async def refuse_claim(
    rt: Any, body: Mapping[str, Any], classes: Mapping[str, ClassView], consumers: Iterable[str] = ()
) -> None:
    """Record, once per claim, why a quarantined claim of ours is ignored, and fail its pending pods (leader)."""
    reason = boundedjson.rejection(body)
    if reason is None or not rt.leading():
        return
    if not claims.is_ours(body, classes):
        meta = body.get("metadata") or {}
        log.info("a ResourceClaim of another driver is nested too deeply to read", claim=meta.get("name"))
        return
    await failfast.fail_pending_consumers(rt, body, consumers, reason)
    meta = body.get("metadata") or {}
    if (meta.get("annotations") or {}).get(names.ANNOTATION_CONFIG_ERROR) == reason[:250]:
        return
    ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    log.warning("refusing a ResourceClaim nested too deeply", claim=f"{ns}/{name}", reason=reason)
    rt.metrics.claim_findings.labels(finding="rejected").inc()
    ref = events.ObjectRef.of(body, "resource.k8s.io/v1", "ResourceClaim")
    await asyncio.to_thread(rt.writer.event, ref, "Warning", events.OBJECT_REJECTED, reason)
    await asyncio.to_thread(rt.writer.annotate_claim, ns, name, {names.ANNOTATION_CONFIG_ERROR: reason[:250]})
