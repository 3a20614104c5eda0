"""Objects the bounded decoder quarantined (nested too deeply to read): refused with an Event, never processed.

:mod:`gpuplane.controller.kopf_decoding` hands such an object to the handlers as a stub
(metadata and :data:`gpuplane.driver.api.boundedjson.REJECTED`). The indexes leave it out
(no decision ever sees it), and for a ResourceClaim the leader records one
Warning Event and the ``gpuplane.dev/config-error`` annotation, so the user
sees why the claim is ignored (the node driver refuses it too, per claim).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

import structlog

from gpuplane.controller import events, failfast, names
from gpuplane.driver.api import boundedjson

log = structlog.get_logger(__name__)


def rejected(body: Mapping[str, Any]) -> bool:
    """Whether kopf delivered a quarantined stub instead of the object."""
    return boundedjson.rejection(body) is not None


async def refuse_claim(rt: Any, body: Mapping[str, Any], consumers: Iterable[str] = ()) -> None:
    """Record, once per claim, why a quarantined ResourceClaim is ignored, and fail its pending pods (leader)."""
    reason = boundedjson.rejection(body)
    if reason is None or not rt.leading():
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
