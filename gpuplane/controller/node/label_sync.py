"""The NVLink-domain label written on a node: the one I/O of the fleet view (the decision is :mod:`.labels`)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from gpuplane.controller import events, indexed, names, runtime
from gpuplane.controller.node import labels


async def sync_node_label(
    rt: runtime.Runtime, node: str, node_body: indexed.NodeView | None, slices: Iterable[Mapping[str, Any]]
) -> None:
    """Bring one node's NVLink-domain label in line with its published GPUs (leader only)."""
    if node_body is None or not rt.leading():
        return
    want = labels.desired(labels.domains_of_node(node, slices))
    patch = labels.patch_for(node_body.labels, node_body.nvlink_domains, want)
    if patch is None:
        return
    await asyncio.to_thread(rt.writer.patch_node, node, patch)
    msg = f"NVLink domain label {names.NODE_LABEL_NVLINK_DOMAIN}={want.label or '(none)'}"
    if want.annotation:
        msg += f"; GPUs in several domains: {want.annotation}"
    ref = events.ObjectRef(api_version="v1", kind="Node", name=node, namespace="", uid=node_body.uid)
    await asyncio.to_thread(rt.writer.event, ref, "Normal", events.NODE_DOMAIN_LABELLED, msg)
