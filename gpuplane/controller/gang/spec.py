"""The GpuGang spec as a frozen pydantic model, and its translation into a placement request.

The CRD's OpenAPI schema and CEL rules are the first line of validation (the
API server refuses a bad spec); this model is the second, for objects written
before a rule existed, and the one place that knows the defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import pydantic
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from gpuplane.api import quantity
from gpuplane.controller import names
from gpuplane.placement import model


class GangSpec(BaseModel):
    """``spec`` of a GpuGang."""

    # Strict and bounded as the CRD schema is (no "4" for 4, no true for 1): an object stored before a
    # rule existed, or through a CRD someone loosened, is refused here with the same limits.
    model_config = ConfigDict(extra="ignore", frozen=True)

    members: StrictInt = Field(ge=1, le=4096)
    gpusPerMember: StrictInt | None = Field(default=None, ge=1, le=64)
    migProfile: StrictStr | None = Field(default=None, max_length=64)
    tensorParallelSize: StrictInt = Field(default=1, ge=1, le=1024)
    deviceClassName: StrictStr | None = Field(default=None, max_length=253)
    selectors: tuple[Annotated[StrictStr, Field(min_length=1, max_length=1024)], ...] = Field(default=(), max_length=16)
    # Accepted for objects written before issue 32 and otherwise ignored: a number the tenant picks is no
    # entitlement. A gang's priority is its member pods' (PriorityClass), see membership.Members.priority.
    priority: StrictInt = Field(default=0, ge=-1_000_000, le=1_000_000)
    timeoutSeconds: StrictInt | None = Field(default=None, ge=1, le=10**9)

    @pydantic.model_validator(mode="after")
    def _one_shape(self) -> GangSpec:
        if (self.gpusPerMember is None) == (self.migProfile is None):
            raise ValueError("exactly one of gpusPerMember or migProfile must be set")
        if self.migProfile is not None and self.tensorParallelSize != 1:
            raise ValueError("tensorParallelSize applies to whole GPUs; a MIG gang has tensorParallelSize 1")
        return self

    @property
    def device_class(self) -> str:
        """The DeviceClass of every member's claim (MIG gangs default to the MIG class)."""
        if self.deviceClassName:
            return self.deviceClassName
        return names.DEFAULT_MIG_DEVICE_CLASS if self.migProfile else names.DEFAULT_DEVICE_CLASS

    @property
    def devices_per_member(self) -> int:
        """Devices in each member's claim."""
        return self.gpusPerMember or 1


class SpecError(ValueError):
    """The gang's spec cannot be used; the message says why."""


def parse_gang_spec(spec: Any) -> GangSpec:
    """Validate a gang's ``spec``; SpecError names what is wrong (bounded: every field may be hostile)."""
    if not isinstance(spec, Mapping):
        raise SpecError(f"spec must be an object (got {quantity.shown(spec)})")
    try:
        parsed = GangSpec.model_validate(dict(spec))
    except pydantic.ValidationError as exc:
        details = "; ".join(
            f"{'.'.join(str(p)[:64] for p in err.get('loc', ()))}: {str(err.get('msg'))[:200]}".lstrip(": ")
            + ("" if err.get("type") == "missing" else f" (got {quantity.shown(err.get('input'))})")
            for err in exc.errors()[:10]
        )
        raise SpecError(details) from exc
    # The placement rules too (tensorParallelSize against the gang's GPUs): a spec the queue pass could not
    # turn into a request would fail every gang's pass, not only its own.
    to_request(parsed, "spec", "", 0.0, parsed.migProfile)
    return parsed


def to_request(
    spec: GangSpec,
    request_id: str,
    namespace: str,
    created: float,
    geometry_profile: str | None = None,
    *,
    priority: int = 0,
) -> model.Request:
    """The placement request for the gang. ``geometry_profile`` is the MIG profile in the geometry's names;
    ``priority`` the gang's Kubernetes priority (its pods' PriorityClass), never ``spec.priority``."""
    try:
        return model.Request(
            id=request_id,
            namespace=namespace,
            priority=priority,
            gpus_per_member=spec.gpusPerMember or 1,
            members=spec.members,
            tp_size=spec.tensorParallelSize,
            mig_profile=geometry_profile if spec.migProfile else None,
            created=created,
        )
    except ValueError as exc:
        raise SpecError(str(exc)) from exc
