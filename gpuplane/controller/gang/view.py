"""A GpuGang as the controller reads it: parsed once, at the informer, into a typed, frozen view. Pure.

The gang index (:mod:`gpuplane.controller.caches`) keeps a :class:`GangView`, not the object: its identity,
generation, creation time and deletion mark, its spec parsed once (:func:`~gpuplane.controller.gang.spec.
parse_gang_spec`; a spec that does not parse keeps why, and the reconcile marks the gang ``Invalid`` with
it), and its status. Every queue pass reads every gang's spec; parsing it once per event, not once per
reader per pass, is also what keeps a pass cheap.

The status stays in the API's shape, read-only: it is the controller's own record of the gang (phase,
placement, members, timestamps), which the reconcile reads back as it wrote it, diffs field by field and
writes as a JSON merge patch (:mod:`gpuplane.controller.gang.status`); the overlay of what this replica
wrote but has not seen come back is a new view with the fields merged (:meth:`GangView.with_status`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpuplane.api import kubetime
from gpuplane.api.boundedjson import empty, mapping
from gpuplane.controller import events, names
from gpuplane.controller.gang.spec import GangSpec, SpecError, parse_gang_spec


@dataclass(frozen=True, slots=True)
class GangView:
    """A GpuGang: identity, spec (parsed) and status (as written, read-only)."""

    name: str
    namespace: str = ""
    uid: str = ""
    generation: int | None = None
    created: float = 0.0  # creationTimestamp in epoch seconds (0 when unknown)
    deleting: bool = False  # deletionTimestamp is set (the release on deletion runs: gang.handlers)
    spec: GangSpec | None = None  # None: the spec does not parse, and ``invalid`` says why
    invalid: str = ""
    status: Mapping[str, Any] = field(default_factory=empty)

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    @property
    def phase(self) -> str:
        """``status.phase`` ("" before the controller wrote one)."""
        phase = self.status.get("phase")
        return phase if isinstance(phase, str) else ""

    @property
    def ref(self) -> events.ObjectRef:
        """The gang as an Event's involved object."""
        return events.ObjectRef(names.GANG_API_VERSION, names.GANG_KIND, self.name, self.namespace, self.uid)

    def with_status(self, fields: Mapping[str, Any]) -> GangView:
        """This gang with ``fields`` merged into its status (a field set to None is left as it is)."""
        merged = {**self.status, **{k: v for k, v in fields.items() if v is not None}}
        return dataclasses.replace(self, status=MappingProxyType(merged))


def view(body: Mapping[str, Any]) -> GangView:
    """The indexed form of a GpuGang (total on any body: a field of the wrong type reads as absent)."""
    meta = mapping(body.get("metadata"))
    spec: GangSpec | None = None
    invalid = ""
    try:
        spec = parse_gang_spec(body.get("spec") or {})
    except SpecError as exc:
        invalid = str(exc)
    generation = meta.get("generation")
    created = meta.get("creationTimestamp")
    return GangView(
        name=str(meta.get("name") or ""),
        namespace=str(meta.get("namespace") or ""),
        uid=str(meta.get("uid") or ""),
        generation=generation if isinstance(generation, int) and not isinstance(generation, bool) else None,
        created=(kubetime.epoch(created) or 0.0) if isinstance(created, str) else 0.0,
        deleting=bool(meta.get("deletionTimestamp")),
        spec=spec,
        invalid=invalid,
        status=MappingProxyType(dict(mapping(body.get("status")))),
    )
