"""The MIG offer: which GPUs of which nodes publish their MIG placements (issue 36, docs/mig-offer.md).

The controller's leader writes it, the drivers read it: one ConfigMap, :data:`CONFIGMAP` in
:data:`NAMESPACE`, key :data:`DATA_KEY`, a JSON object ``{"version": 1, "nodes": {node: [gpu, ...]}}``.
Only the controller's ServiceAccount may write it (its Role names it); each driver may only read it.

:func:`parse` is strict and bounded (it is read by every node): anything malformed raises
:class:`OfferError` and the reader keeps the offer it had. :func:`render` is its inverse, sorted, so an
unchanged offer renders to the same text and is never rewritten.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuplane.api import boundedjson

NAMESPACE = "gpuplane-system"
CONFIGMAP = "gpuplane-mig-offer"
DATA_KEY = "offer.json"
VERSION = 1
MAX_TEXT = 900_000  # under the ConfigMap's 1 MiB
MAX_NODES = 20_000
MAX_GPUS_PER_NODE = 64
MAX_NODE_NAME = 253
_GPU = re.compile(r"^gpu-[0-9]{1,4}$")
# The controller labels every node the offer names (NODE_LABEL=NODE_LABEL_VALUE) and no other. A MIG pod
# that asks for it (nodeSelector) is filtered out of every other node by kube-scheduler's NodeAffinity,
# before its DRA allocator evaluates any device there (docs/mig-offer.md, "A MIG pod's scheduling cost").
NODE_LABEL = "gpuplane.dev/mig-offered"
NODE_LABEL_VALUE = "true"


class OfferError(ValueError):
    """The offer's text is not a valid offer."""


@dataclass(frozen=True)
class Offer:
    """Node name -> the GPU device names offered for MIG there (nodes absent: none)."""

    nodes: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def for_node(self, node: str) -> frozenset[str]:
        return self.nodes.get(node, frozenset())

    def gpu_count(self) -> int:
        return sum(len(g) for g in self.nodes.values())


def parse(text: str) -> Offer:
    """The offer in ``text``; :class:`OfferError` naming what is wrong."""
    if len(text) > MAX_TEXT:
        raise OfferError(f"offer is {len(text)} characters, more than {MAX_TEXT}")
    try:
        decoded = boundedjson.decode(text, max_depth=3)
    except boundedjson.DecodeError as exc:
        raise OfferError(f"offer is not JSON: {exc}") from None
    if decoded.pruned:
        raise OfferError("offer nests deeper than {version, nodes: {node: [gpu]}}")
    raw = decoded.value
    if not isinstance(raw, dict) or raw.get("version") != VERSION:
        raise OfferError(f"offer must be an object with version {VERSION}")
    nodes = raw.get("nodes")
    if not isinstance(nodes, dict) or len(nodes) > MAX_NODES:
        raise OfferError(f"offer.nodes must be an object of at most {MAX_NODES} nodes")
    out: dict[str, frozenset[str]] = {}
    for node, gpus in nodes.items():
        if not isinstance(node, str) or not 0 < len(node) <= MAX_NODE_NAME:
            raise OfferError("offer.nodes has a key that is not a node name")
        if not isinstance(gpus, list) or len(gpus) > MAX_GPUS_PER_NODE:
            raise OfferError(f"offer.nodes[{node!r}] must be a list of at most {MAX_GPUS_PER_NODE} GPUs")
        if not all(isinstance(g, str) and _GPU.match(g) for g in gpus):
            raise OfferError(f"offer.nodes[{node!r}] names something that is not a GPU device (gpu-<minor>)")
        if gpus:
            out[node] = frozenset(gpus)
    return Offer(out)


def render(offer: Offer) -> str:
    """The offer as the ConfigMap's text (sorted: the same offer is the same text)."""
    nodes = {n: sorted(g) for n, g in sorted(offer.nodes.items()) if g}
    return json.dumps({"version": VERSION, "nodes": nodes}, sort_keys=True, separators=(",", ":"))
