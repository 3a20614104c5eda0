"""What a gated pod asks for, as a placement request, or why steering leaves it to the scheduler.

Steered are pods with exactly one ResourceClaim (from a template or named)
holding one ``exactly`` request of a gpuplane class: either ``count`` whole
GPUs, or one MIG device whose selectors admit exactly one profile of the
placement geometry. The shape is found by evaluating the class's and the
request's selectors on every device the driver publishes (``node.selectors``,
the controller's CEL subset): a selector outside that subset, a capacity
request (a share of a GPU), ``firstAvailable``, admin access, several claims or
requests: all are left to the scheduler, with the reason, and the gate lifted.

Pure: the pod's and its claim's index entries (:class:`~gpuplane.controller.indexed.PodView`,
:class:`~gpuplane.controller.indexed.ClaimView`), the templates' and classes' views, and the
ClusterView in; a :class:`Shape` or a reason out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuplane.api import names as dn
from gpuplane.controller.claimtemplate import TemplateView
from gpuplane.controller.deviceclass import ClassView
from gpuplane.controller.indexed import ClaimView, PodView
from gpuplane.controller.node import selectors, snapshot_builder
from gpuplane.controller.node.selectors import class_selectors
from gpuplane.placement import model

NO_MATCH = "no published gpuplane device matches its selectors"


@dataclass(frozen=True)
class Shape:
    """A steerable request: the placement request and the GPUs (ids) its selectors admit."""

    request: model.Request
    gpus: frozenset[str]
    claim: str  # "template <name>" or "claim <name>", for messages


def claim_spec_of(
    pod: PodView,
    claims: Mapping[str, ClaimView],
    templates: Mapping[str, TemplateView],
) -> tuple[Mapping[str, Any], str] | str:
    """The pod's one claim spec and a label for it, or the reason there is not exactly one to steer."""
    ns = pod.namespace
    if len(pod.claims) != 1:
        return f"the pod has {len(pod.claims)} resource claims; steering handles pods with one"
    ref = pod.claims[0]
    if ref.template:
        name = ref.template
        tmpl = templates.get(f"{ns}/{name}")
        if tmpl is None:
            return f"ResourceClaimTemplate {ns}/{name} is not known (yet)"
        return tmpl.claim_spec, f"template {name}"
    name = ref.claim
    claim = claims.get(f"{ns}/{name}")
    if claim is None:
        return f"ResourceClaim {ns}/{name} is not known (yet)"
    if claim.allocated:
        return f"ResourceClaim {ns}/{name} is already allocated"
    return claim.spec(), f"claim {name}"


def _mig_attributes(view: snapshot_builder.ClusterView, info: snapshot_builder.MigInfo) -> dict[str, Any]:
    parent = view.by_id.get(info.parent)
    attrs = dict(parent.attributes) if parent is not None else {}
    attrs[f"{dn.DRIVER_NAME}/{dn.ATTR_TYPE}"] = dn.DEVICE_TYPE_MIG
    attrs[f"{dn.DRIVER_NAME}/{dn.ATTR_MIG_PROFILE}"] = info.driver_profile
    attrs[f"{dn.DRIVER_NAME}/{dn.ATTR_MIG_PLACEMENT}"] = info.start
    return attrs


def shape_of(
    pod: PodView,
    spec: Mapping[str, Any],
    label: str,
    classes: Mapping[str, ClassView],
    view: snapshot_builder.ClusterView,
) -> Shape | str:
    """The placement request for the pod's claim ``spec``, or why it is not steered."""
    devices = spec.get("devices") or {}
    requests = devices.get("requests") or []
    if len(requests) != 1:
        return f"{label} has {len(requests)} requests; steering handles one"
    req = requests[0]
    exactly = req.get("exactly")
    if not exactly:
        return f"{label}: request {req.get('name')} uses firstAvailable; the scheduler chooses among its options"
    if exactly.get("capacity") or exactly.get("adminAccess"):
        return f"{label}: request {req.get('name')} asks for a share of a device or admin access"
    if (exactly.get("allocationMode") or "ExactCount") != "ExactCount":
        return f"{label}: request {req.get('name')} asks for all matching devices"
    count = int(exactly.get("count") or 1)
    cls_name = str(exactly.get("deviceClassName") or "")
    cls = classes.get(cls_name)
    if cls is None:
        return f"{label}: DeviceClass {cls_name} is not known"
    exprs = [
        *class_selectors(cls),
        *(str((s.get("cel") or {}).get("expression", "")) for s in exactly.get("selectors") or []),
    ]
    compiled = selectors.compile_all(exprs)
    if compiled.unsupported:
        return f"{label}: selector {compiled.unsupported[0]!r} is outside what the controller evaluates"
    whole = {g.id for g in view.gpus if compiled.predicate(dn.DRIVER_NAME, g.attributes)}
    mig_profiles: dict[str, set[str]] = {}
    for info in view.mig.values():
        if compiled.predicate(dn.DRIVER_NAME, _mig_attributes(view, info)):
            mig_profiles.setdefault(info.profile, set()).add(info.parent)
    ident = f"{label} (class {cls_name})"
    if whole and not mig_profiles:
        return Shape(model.Request(id=pod.key, gpus_per_member=count, tp_size=count), frozenset(whole), ident)
    if mig_profiles and not whole:
        if len(mig_profiles) != 1:
            return f"{label}: its selectors admit MIG profiles {sorted(mig_profiles)}; steering needs exactly one"
        if count != 1:
            return f"{label}: {count} MIG devices in one request; steering handles one"
        ((profile, parents),) = mig_profiles.items()
        return Shape(model.Request(id=pod.key, mig_profile=profile), frozenset(parents), ident)
    if not whole and not mig_profiles:
        return f"{label}: {NO_MATCH}"
    return f"{label}: its selectors admit both whole GPUs and MIG devices"
