"""A ResourceClaimTemplate as the controller reads it: parsed once, at the informer, into a frozen view. Pure.

The template index (:mod:`gpuplane.controller.caches`) keeps a :class:`TemplateView`, not the object.
Steering places a pod's claim from its template's claim spec (``spec.spec``), kept as written: any field of
it reaches the placement shape, and every pod of the template shares it read-only. Right-sizing reads which
object controls a template it made (the controller owner references: kind and uid) and which plan it was
made for (gpuplane's own annotations; no other annotation or label is kept). Total on any body: a field of
the wrong type reads as absent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpuplane.api.boundedjson import EMPTY, empty, mapping, mappings, text

OURS = "gpuplane.dev/"  # the annotation prefix kept


@dataclass(frozen=True, slots=True)
class TemplateView:
    """A ResourceClaimTemplate: what steering and right-sizing read of it; read-only."""

    namespace: str
    name: str
    claim_spec: Mapping[str, Any] = field(default_factory=empty)  # spec.spec, as written
    annotations: Mapping[str, str] = field(default_factory=empty)  # gpuplane.dev/ annotations only
    controllers: frozenset[tuple[str, str]] = frozenset()  # (kind, uid) of controller owner references

    @property
    def key(self) -> str:
        """``namespace/name``, the index key."""
        return f"{self.namespace}/{self.name}"


def view(body: Mapping[str, Any]) -> TemplateView:
    """The indexed form of a ResourceClaimTemplate (or of one this replica just created)."""
    meta, spec = mapping(body.get("metadata")), mapping(body.get("spec"))
    annotations = {
        k: v for k, v in mapping(meta.get("annotations")).items() if k.startswith(OURS) and isinstance(v, str)
    }
    return TemplateView(
        namespace=text(meta.get("namespace")),
        name=text(meta.get("name")),
        claim_spec=mapping(spec.get("spec")) or EMPTY,
        annotations=MappingProxyType(annotations) if annotations else EMPTY,
        controllers=frozenset(
            (text(r.get("kind")), text(r.get("uid")))
            for r in mappings(meta.get("ownerReferences"))
            if r.get("controller") is True and text(r.get("uid"))
        ),
    )
