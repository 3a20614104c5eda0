"""The objects a placed gang needs: each member's ResourceClaim, and its pod's narrowed node affinity.

A member's claim keeps the gang's selectors, is pinned to the member's NVLink domain and
devices by CEL, and (for several devices) kept in one domain by ``matchAttribute``; it is owned
by the gang. A gated pod's required node affinity may only be narrowed, so the member's node is
added to every term. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuplane.api import names as dn
from gpuplane.controller import names
from gpuplane.controller.gang.placement_record import device_of
from gpuplane.controller.gang.spec import GangSpec
from gpuplane.placement import model

HOSTNAME_LABEL = "kubernetes.io/hostname"


@dataclass(frozen=True)
class GangRef:
    """Identity of a gang for owner references and names."""

    namespace: str
    name: str
    uid: str

    @property
    def key(self) -> str:
        """ "ns/name"."""
        return f"{self.namespace}/{self.name}"


def _minor(device: str) -> int | None:
    tail = device.rsplit("-", 1)[-1]
    return int(tail) if device.startswith("gpu-") and tail.isdigit() and device.count("-") == 1 else None


def claim_selectors(spec: GangSpec, placement: model.MemberPlacement, driver_profile: str | None) -> list[str]:
    """CEL selectors for a member's claim: the gang's, its NVLink domain, and the chosen devices."""
    attrs = f'device.attributes["{dn.DRIVER_NAME}"]'
    out = list(spec.selectors)
    out.append(f'{attrs}.{dn.ATTR_NVLINK_DOMAIN} == "{placement.domain}"')
    if placement.mig:
        slot = placement.mig[0]
        parent = _minor(device_of(slot.gpu))
        if driver_profile:
            out.append(f'{attrs}.{dn.ATTR_MIG_PROFILE} == "{driver_profile}"')
        if parent is not None:
            out.append(f"{attrs}.{dn.ATTR_PARENT_MINOR} == {parent} && {attrs}.{dn.ATTR_MIG_PLACEMENT} == {slot.start}")
    else:
        minors = [m for m in (_minor(device_of(g)) for g in placement.gpus) if m is not None]
        if minors and len(minors) == len(placement.gpus):
            out.append(f"{attrs}.{dn.ATTR_MINOR} in [{', '.join(str(m) for m in sorted(minors))}]")
    return out


def desired_claim(
    gang: GangRef,
    spec: GangSpec,
    placement: model.MemberPlacement,
    decision: str,
    driver_profile: str | None = None,
) -> dict[str, Any]:
    """The ResourceClaim for one member, pinned to its domain (CEL) and kept in one domain (matchAttribute)."""
    count = spec.devices_per_member
    exactly: dict[str, Any] = {
        "deviceClassName": spec.device_class,
        "allocationMode": "ExactCount",
        "count": count,
        "selectors": [{"cel": {"expression": e}} for e in claim_selectors(spec, placement, driver_profile)],
    }
    devices: dict[str, Any] = {"requests": [{"name": names.CLAIM_REQUEST, "exactly": exactly}]}
    if count > 1:
        devices["constraints"] = [{"requests": [names.CLAIM_REQUEST], "matchAttribute": names.MATCH_ATTRIBUTE_DOMAIN}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": names.claim_name(gang.name, placement.member),
            "namespace": gang.namespace,
            "labels": {names.LABEL_GANG: gang.name, names.LABEL_MEMBER_INDEX: str(placement.member)},
            "annotations": {names.ANNOTATION_DECISION: decision},
            "ownerReferences": [
                {
                    "apiVersion": names.GANG_API_VERSION,
                    "kind": names.GANG_KIND,
                    "name": gang.name,
                    "uid": gang.uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {"devices": devices},
    }


def _host_expr(node: str) -> dict[str, Any]:
    return {"key": HOSTNAME_LABEL, "operator": "In", "values": [node]}


def narrowed_affinity(affinity: Mapping[str, Any] | None, node: str) -> dict[str, Any] | None:
    """``affinity`` with every required node-selector term narrowed to ``node`` (None: already narrowed).

    Only narrowing is allowed on a gated pod: a term gains a matchExpression; an
    absent required section is created with one term.
    """
    aff = dict(affinity or {})
    na = dict(aff.get("nodeAffinity") or {})
    req = dict(na.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = [dict(t) for t in req.get("nodeSelectorTerms") or []]
    if not terms:
        terms = [{"matchExpressions": [_host_expr(node)]}]
    else:
        changed = False
        for t in terms:
            exprs = list(t.get("matchExpressions") or [])
            if _host_expr(node) not in exprs:
                exprs.append(_host_expr(node))
                changed = True
            t["matchExpressions"] = exprs
        if not changed:
            return None
    req["nodeSelectorTerms"] = terms
    na["requiredDuringSchedulingIgnoredDuringExecution"] = req
    aff["nodeAffinity"] = na
    return aff


def pinned_elsewhere(affinity: Mapping[str, Any] | None, node: str) -> str | None:
    """The node a pod's affinity already narrows it to, if that is not ``node`` (it cannot be widened)."""
    req = ((affinity or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    for t in req.get("nodeSelectorTerms") or []:
        for e in t.get("matchExpressions") or []:
            if e.get("key") == HOSTNAME_LABEL and e.get("operator") == "In" and node not in (e.get("values") or []):
                return ",".join(e.get("values") or [])
    return None
