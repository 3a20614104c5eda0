"""Pods of a claim the node driver is sure to refuse fail at once, so their devices are released.

The scheduler allocates and reserves a claim's devices without reading its opaque
config; the driver reads it at prepare and refuses, and kubelet retries forever
while the devices stay reserved (26 such claims held all 24 GPUs of a test
cluster). The admission policy ``manifests/policies/claim-configs.yaml`` refuses
at creation what a config gets wrong on its own; what needs the DeviceClass (a
MIG config on a whole-GPU class, a claim looser than its MPS tier), a claim
written before the policy, or one nested too deeply to read is found here.

For such a claim the leader sets every *Pending* consumer pod to phase ``Failed``
(reason ``InvalidDeviceConfig``, the problem as the message) with one JSON patch
that first tests the phase, so a pod that started meanwhile is never touched.
kubelet keeps a phase the API server reports as terminal, stops the pod and
unprepares; the resourceclaim controller then drops the reservation and the
devices are free. Consumers are the pods naming the claim (the controller's
index), the pods it is reserved for, and the pod owning a claim made from a
template. ``--fail-invalid-pods=false`` turns this off (the claim keeps its
Event and annotation only).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

import structlog

from gpuplane.controller import events
from gpuplane.informer.client import ApiError

log = structlog.get_logger(__name__)

REASON = "InvalidDeviceConfig"


def consumers_of(claim: Mapping[str, Any], named_by: Iterable[str]) -> list[str]:
    """Pod names that use the claim: by name (index), by reservation, by ownership (template claims)."""
    status = claim.get("status") or {}
    meta = claim.get("metadata") or {}
    found = list(named_by)
    found += [str(r.get("name")) for r in status.get("reservedFor") or [] if r.get("resource") == "pods"]
    found += [str(o.get("name")) for o in meta.get("ownerReferences") or [] if o.get("kind") == "Pod"]
    return sorted({n for n in found if n and n != "None"})


def message(claim_name: str, problem: str) -> str:
    """The failed pod's status message (what is wrong and what to do)."""
    text = (
        f"ResourceClaim {claim_name} has a device config the gpuplane driver refuses: {problem}. "
        "Fix the claim (or its template) and create the pod again"
    )
    return text if len(text) <= 1000 else text[:999] + "…"


async def fail_pending_consumers(rt: Any, claim: Mapping[str, Any], named_by: Iterable[str], problem: str) -> list[str]:
    """Fail the claim's Pending consumer pods (leader only); returns the pods failed now."""
    if not rt.leading() or not rt.cfg.fail_invalid_pods:
        return []
    meta = claim.get("metadata") or {}
    ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    text = message(name, problem)
    failed: list[str] = []
    for pod in consumers_of(claim, named_by):
        try:
            done = await asyncio.to_thread(rt.writer.fail_pending_pod, ns, pod, REASON, text)
        except ApiError as exc:
            log.info("could not fail a consumer pod", pod=f"{ns}/{pod}", status=exc.status, reason=exc.reason)
            continue
        if not done:
            continue
        failed.append(pod)
        ref = events.ObjectRef(api_version="v1", kind="Pod", name=pod, namespace=ns, uid="")
        await asyncio.to_thread(rt.writer.event, ref, "Warning", REASON, text)
    if failed:
        rt.metrics.claim_findings.labels(finding="pod-failed").inc(len(failed))
        log.warning("failed the pending pods of an invalid claim", claim=f"{ns}/{name}", pods=failed)
    return failed
