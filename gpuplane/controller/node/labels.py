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

from gpuplane.api import names as dn
from gpuplane.controller import names
from gpuplane.controller.node import slice_index


@dataclass(frozen=True)
class NodeDomains:
    """What a node's label and annotation should say (None: absent)."""

    label: str | None
    annotation: str | None


def domains_of_node(
    node: str,
    slices: Iterable[slice_index.SliceDigest | Mapping[str, Any]],
    driver: str = dn.DRIVER_NAME,
) -> set[str]:
    """NVLink domains of the GPUs published for ``node`` (newest pool generation only).

    ``slices`` may be every slice of the cluster or just the node's (the controller's index is
    keyed by node, so it passes the node's own).
    """
    mine = [d for d in (slice_index.as_digest(s, driver) for s in slices) if d is not None and d.node == node]
    out: set[str] = set()
    for d in slice_index.newest(mine):
        for gpu in d.gpus:
            domain = gpu.attributes.get(f"{driver}/{dn.ATTR_NVLINK_DOMAIN}")
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


def patch_for(labels: Mapping[str, str], annotation: str | None, want: NodeDomains) -> dict[str, Any] | None:
    """A merge patch bringing a node's label and annotation (``labels``, ``annotation`` now) to ``want``
    (None: already right)."""
    patch: dict[str, dict[str, str | None]] = {}
    if labels.get(names.NODE_LABEL_NVLINK_DOMAIN) != want.label:
        patch.setdefault("labels", {})[names.NODE_LABEL_NVLINK_DOMAIN] = want.label
    if annotation != want.annotation:
        patch.setdefault("annotations", {})[names.ANNOTATION_NVLINK_DOMAINS] = want.annotation
    return {"metadata": patch} if patch else None
