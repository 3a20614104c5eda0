"""The ResourceClaimTemplate a GpuRequest becomes, and the GpuRequest's status. Pure.

The template has the GpuRequest's name and namespace, is owned by it (deleted with it by the
garbage collector) and carries one request, ``gpu``, with a ``firstAvailable`` list: the
alternatives of :mod:`gpuplane.controller.rightsize.alternatives` in order. The real
kube-scheduler allocates it: on each node it takes the first alternative that fits, and it
scores nodes higher where an earlier alternative fits (``DynamicResources.Score``). An MPS
alternative's limits travel as claim config for ``gpu/mps``, so they apply only when that
alternative is the one allocated.

A ResourceClaimTemplate's spec is immutable, so a changed plan (the need was edited, a GPU model
joined the fleet) replaces the template; the annotation :data:`ANNOTATION_HASH` says which plan a
template holds. Claims already made from the old template keep what they were allocated.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from gpuplane.api import names as dn
from gpuplane.controller import names
from gpuplane.controller.claimtemplate import TemplateView
from gpuplane.controller.rightsize.alternatives import Alternative, Plan
from gpuplane.controller.rightsize.need import Need, RequestView

KIND = "GpuRequest"
PLURAL = "gpurequests"
API_VERSION = f"{names.GROUP}/{names.VERSION}"
LABEL_REQUEST = "gpuplane.dev/gpu-request"
ANNOTATION_HASH = "gpuplane.dev/right-size-plan"
REQUEST_NAME = "gpu"


def _subrequest(alt: Alternative) -> dict[str, Any]:
    sub: dict[str, Any] = {
        "name": alt.name,
        "deviceClassName": alt.device_class,
        "selectors": [{"cel": {"expression": e}} for e in alt.selectors],
    }
    if alt.kind == "MPS":
        sub["capacity"] = {
            "requests": {
                dn.CAP_SHARE_PERCENT: str(alt.share_percent),
                dn.CAP_MEMORY: str(alt.memory_bytes),
            }
        }
    return sub


def claim_spec(plan: Plan) -> dict[str, Any]:
    """The ResourceClaim spec every claim made from the template gets."""
    devices: dict[str, Any] = {
        "requests": [{"name": REQUEST_NAME, "firstAvailable": [_subrequest(a) for a in plan.alternatives]}]
    }
    config = [
        {"requests": [f"{REQUEST_NAME}/{a.name}"], "opaque": {"driver": dn.DRIVER_NAME, "parameters": dict(a.config)}}
        for a in plan.alternatives
        if a.config is not None
    ]
    if config:
        devices["config"] = config
    return {"devices": devices}


def plan_hash(spec: Mapping[str, Any]) -> str:
    """A short digest of a template spec (what the annotation records)."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def desired(request: RequestView, plan: Plan) -> dict[str, Any]:
    """The ResourceClaimTemplate for a GpuRequest object and its plan."""
    name, namespace, uid = request.name, request.namespace, request.uid
    spec = {"metadata": {"labels": {LABEL_REQUEST: name}}, "spec": claim_spec(plan)}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {LABEL_REQUEST: name, "app.kubernetes.io/managed-by": names.COMPONENT},
            "annotations": {ANNOTATION_HASH: plan_hash(spec)},
            "ownerReferences": [
                {"apiVersion": API_VERSION, "kind": KIND, "name": name, "uid": uid, "controller": True}
            ],
        },
        "spec": spec,
    }


def owned_by(template: TemplateView, request: RequestView) -> bool:
    """Whether ``template`` is the one this controller made for ``request`` (its controller owner)."""
    return bool(request.uid) and (KIND, request.uid) in template.controllers


def ready_status(need: Need, plan: Plan, generation: int | None, template: str) -> dict[str, Any]:
    """Status of a GpuRequest whose template ``template`` is in place."""
    choices = [f"{i}. {a.describe()}" for i, a in enumerate(plan.alternatives, 1)]
    first = plan.alternatives[0]
    return {
        "phase": "Ready",
        "observedGeneration": generation,
        "claimTemplate": template,
        "need": need.describe(),
        "alternatives": choices,
        "notes": list(plan.notes),
        "preferred": first.describe(),
        "message": f"ResourceClaimTemplate ready; {len(choices)} alternatives, smallest first: {first.describe()}",
        "refusedPlan": None,
    }


def invalid_status(message: str, generation: int | None, phase: str = "Invalid") -> dict[str, Any]:
    """Status of a GpuRequest that cannot be met (or cannot be judged yet: phase Pending)."""
    return {
        "phase": phase,
        "observedGeneration": generation,
        "claimTemplate": None,
        "need": None,
        "alternatives": [],
        "notes": [],
        "preferred": None,
        "message": message,
        "refusedPlan": None,
    }
