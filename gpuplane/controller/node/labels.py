"""Node -> NVLink-domain label, derived from the driver's ResourceSlices.

The label ``gpuplane.dev/nvlink-domain`` lets upstream topology-aware gang
scheduling (PodGroup topology constraints key on a node label) and users'
affinities use the domains the driver discovered. A node whose GPUs sit in
more than one domain (PCIe pairs) gets no label value, since one label cannot
hold two, and lists its domains in an annotation instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuplane.controller import names
from gpuplane.driver.api import names as dn


@dataclass(frozen=True)
class NodeDomains:
    """What a node's label and annotation should say (None: absent)."""

    label: str | None
    annotation: str | None


def domains_of_node(node: str, slices: Iterable[Mapping[str, Any]], driver: str = dn.DRIVER_NAME) -> set[str]:
    """NVLink domains of the GPUs published for ``node`` (newest pool generation only)."""
    mine = [
        s
        for s in slices
        if (s.get("spec") or {}).get("driver") == driver and (s.get("spec") or {}).get("nodeName") == node
    ]
    if not mine:
        return set()
    newest = max(int((s["spec"].get("pool") or {}).get("generation", 0)) for s in mine)
    out: set[str] = set()
    for s in mine:
        if int((s["spec"].get("pool") or {}).get("generation", 0)) != newest:
            continue
        for device in s["spec"].get("devices") or []:
            attrs = device.get("attributes") or {}
            if (attrs.get(dn.ATTR_TYPE) or {}).get("string") != dn.DEVICE_TYPE_GPU:
                continue
            domain = (attrs.get(dn.ATTR_NVLINK_DOMAIN) or {}).get("string")
            if domain:
                out.add(str(domain))
    return out


def desired(domains: set[str]) -> NodeDomains:
    """Label when there is exactly one domain; annotation when there are several."""
    if len(domains) == 1:
        return NodeDomains(label=next(iter(domains)), annotation=None)
    if not domains:
        return NodeDomains(label=None, annotation=None)
    return NodeDomains(label=None, annotation=",".join(sorted(domains)))


def patch_for(node: Mapping[str, Any], want: NodeDomains) -> dict[str, Any] | None:
    """A merge patch bringing the node's label and annotation to ``want`` (None: already right)."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    patch: dict[str, dict[str, str | None]] = {}
    if labels.get(names.NODE_LABEL_NVLINK_DOMAIN) != want.label:
        patch.setdefault("labels", {})[names.NODE_LABEL_NVLINK_DOMAIN] = want.label
    if annotations.get(names.ANNOTATION_NVLINK_DOMAINS) != want.annotation:
        patch.setdefault("annotations", {})[names.ANNOTATION_NVLINK_DOMAINS] = want.annotation
    return {"metadata": patch} if patch else None
