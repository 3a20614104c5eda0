"""A GpuRequest's need, parsed and checked: GPU memory, a compute share, the isolation, a tier.

The CRD's schema already refuses most bad input at ``kubectl apply`` (compute outside 1..100,
an isolation other than hard/soft, a memory that is not a quantity); :func:`parse_need` checks
the same again, field by field, because an object written before a CRD change, or through an
older CRD, reaches the controller unchecked. Every error names the field, the value and what
is allowed. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gpuplane.api import boundedjson, quantity

Isolation = Literal["hard", "soft"]
ISOLATIONS: tuple[Isolation, ...] = ("hard", "soft")
MAX_MEMORY = 2**50  # 1 PiB: any larger number is a typo, not a GPU
_TIER = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")
GIB = 2**30


class NeedError(ValueError):
    """The need cannot be met or is malformed; the message says which field and what to do."""


@dataclass(frozen=True)
class Need:
    """What a workload needs of one GPU.

    ``compute_percent`` is the share of one GPU's streaming multiprocessors (1..100);
    ``isolation`` ``hard`` allows only MIG or a whole GPU, ``soft`` also an MPS share;
    ``tier`` names the MPS tier class (``mps-<tier>.gpu.gpuplane.dev``) an MPS share uses.
    """

    memory_bytes: int
    compute_percent: int
    isolation: Isolation = "hard"
    tier: str | None = None

    @property
    def soft(self) -> bool:
        """Whether an MPS share is acceptable."""
        return self.isolation == "soft"

    def describe(self) -> str:
        """The need in one phrase, as users wrote it."""
        tier = f", tier {self.tier}" if self.tier else ""
        memory = gib(self.memory_bytes)
        return f"{memory} of GPU memory, {self.compute_percent}% of a GPU's SMs, {self.isolation} isolation{tier}"


def gib(n: int) -> str:
    """Bytes as GiB for messages: whole when exact (16Gi), else one decimal (79.6Gi)."""
    if n % GIB == 0:
        return f"{n // GIB}Gi"
    return f"{n / GIB:.1f}Gi"


def parse_need(spec: Mapping[str, Any] | None) -> Need:
    """The need a GpuRequest's ``spec`` states; NeedError naming the field when it is wrong."""
    if not isinstance(spec, Mapping):
        raise NeedError("spec: must be an object with memory and compute")
    unknown = sorted(set(spec) - {"memory", "compute", "isolation", "tier"})
    if unknown:
        raise NeedError(f"spec: unknown field(s) {unknown}; allowed: memory, compute, isolation, tier")
    raw_memory = spec.get("memory")
    if raw_memory is None:
        raise NeedError("spec.memory: required (GPU memory the workload needs, e.g. 12Gi)")
    if not isinstance(raw_memory, str | int) or isinstance(raw_memory, bool):
        raise NeedError(f"spec.memory: must be a quantity such as 12Gi (got {raw_memory!r})")
    try:
        memory = quantity.parse_quantity(raw_memory)
    except ValueError as exc:
        raise NeedError(f"spec.memory: {exc}") from None
    if memory <= 0:
        raise NeedError(f"spec.memory: must be more than zero (got {raw_memory!r})")
    if memory > MAX_MEMORY:
        raise NeedError(f"spec.memory: {raw_memory!r} is more than 1Pi; no GPU has that much memory")
    compute = spec.get("compute")
    if compute is None:
        raise NeedError("spec.compute: required (percent of one GPU's SMs, 1..100)")
    if not isinstance(compute, int) or isinstance(compute, bool):
        raise NeedError(f"spec.compute: must be a whole percentage 1..100 (got {compute!r})")
    if not 1 <= compute <= 100:
        raise NeedError(
            f"spec.compute: {compute} is outside 1..100 (percent of ONE GPU's SMs); "
            "for more than one GPU use a GpuGang or a ResourceClaim with a count"
        )
    isolation = spec.get("isolation", "hard")
    if isolation not in ISOLATIONS:
        raise NeedError(
            f"spec.isolation: must be 'hard' (MIG or a whole GPU) or 'soft' (an MPS share is acceptable); "
            f"got {isolation!r}"
        )
    tier = spec.get("tier")
    if tier is not None and (not isinstance(tier, str) or not _TIER.match(tier)):
        raise NeedError(f"spec.tier: must be a tier name such as gold, silver or bronze (got {tier!r})")
    return Need(memory_bytes=memory, compute_percent=compute, isolation=isolation, tier=tier)


@dataclass(frozen=True, slots=True)
class RequestView:
    """A GpuRequest as right-sizing reads it, parsed once from the handler's body; read-only.

    The spec stays as written (:func:`parse_need` checks it field by field and says what is wrong); the
    status is the controller's own record, read back as written and compared field by field."""

    namespace: str
    name: str
    uid: str
    generation: int | None
    spec: Any
    status: Mapping[str, Any]

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"


def request_view(body: Mapping[str, Any]) -> RequestView:
    """The :class:`RequestView` of a GpuRequest body; total on any body (a field of the wrong type reads as absent)."""
    meta = boundedjson.mapping(body.get("metadata"))
    generation = meta.get("generation")
    return RequestView(
        namespace=boundedjson.text(meta.get("namespace")),
        name=boundedjson.text(meta.get("name")),
        uid=boundedjson.text(meta.get("uid")),
        generation=generation if isinstance(generation, int) and not isinstance(generation, bool) else None,
        spec=body.get("spec"),
        status=boundedjson.mapping(body.get("status")) or boundedjson.EMPTY,
    )
