"""The GpuGang spec as a frozen pydantic model, and its translation into a placement request.

The CRD's OpenAPI schema and CEL rules are the first line of validation (the
API server refuses a bad spec); this model is the second, for objects written
before a rule existed, and the one place that knows the defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from gpuplane.controller import names
from gpuplane.controller.placement import model


class GangSpec(BaseModel):
    """``spec`` of a GpuGang."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    members: int = Field(ge=1)
    gpusPerMember: int | None = Field(default=None, ge=1)
    migProfile: str | None = None
    tensorParallelSize: int = Field(default=1, ge=1)
    deviceClassName: str | None = None
    selectors: tuple[str, ...] = ()
    priority: int = 0
    timeoutSeconds: int | None = Field(default=None, ge=1)

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


def parse_gang_spec(spec: Mapping[str, Any]) -> GangSpec:
    """Validate a gang's ``spec``; SpecError names what is wrong."""
    try:
        return GangSpec.model_validate(dict(spec))
    except pydantic.ValidationError as exc:
        details = "; ".join(
            f"{'.'.join(str(p) for p in err.get('loc', ()))}: {err.get('msg')}".lstrip(": ") for err in exc.errors()
        )
        raise SpecError(details) from exc


def to_request(
    spec: GangSpec,
    request_id: str,
    namespace: str,
    created: float,
    geometry_profile: str | None = None,
) -> model.Request:
    """The placement request for the gang. ``geometry_profile`` is the MIG profile in the geometry's names."""
    try:
        return model.Request(
            id=request_id,
            namespace=namespace,
            priority=spec.priority,
            gpus_per_member=spec.gpusPerMember or 1,
            members=spec.members,
            tp_size=spec.tensorParallelSize,
            mig_profile=geometry_profile if spec.migProfile else None,
            created=created,
        )
    except ValueError as exc:
        raise SpecError(str(exc)) from exc
