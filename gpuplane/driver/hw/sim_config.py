"""Configuration of one simulated node, and the deterministic UUIDs of its GPUs and MIG devices.

A :class:`SimConfig` names a node profile from :mod:`gpuplane.driver.hw.sim_profiles` and gives
the node's identity (name, NVLink fabric), its starting state (MIG modes, GPUs fallen off the bus)
and how the state is kept (directory, fsync). Loaded once at start (:meth:`SimConfig.from_file`);
pure apart from that read.
"""

from __future__ import annotations

import hashlib
import os
import uuid as uuidlib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpuplane.driver.hw import sim_profiles

_DEFAULT_CLUSTER_UUID = str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, "gpuplane-sim/default-nvl72-rack"))
_DEFAULT_CLIQUE_ID = 1


class SimConfig(BaseModel):
    """Configuration of one simulated node. Load with :meth:`from_file` or build from kwargs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: str
    state_dir: Path
    node_name: str = "sim-node"
    driver_version: str = "570.124.06"
    cuda_version: str = "12.8"
    # Multi-node NVLink identity (profiles that report fabric only); shared by the nodes of one rack.
    cluster_uuid: str | None = None
    clique_id: int | None = Field(default=None, ge=0)
    # Minors of GPUs that have fallen off the bus: not enumerated, later indexes shift.
    absent_minors: tuple[int, ...] = ()
    # MIG mode of a GPU (by minor) when the state file is first created.
    initial_mig_mode: dict[int, bool] = Field(default_factory=dict)
    # Artificial delay per MIG create/destroy operation.
    op_latency_s: float = Field(default=0.0, ge=0.0)
    # fsync state writes (turn off only in tests that do thousands of operations).
    durable: bool = True
    poll_interval_s: float = Field(default=0.05, gt=0.0)

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, v: str) -> str:
        sim_profiles.node_profile(v)
        return v

    @field_validator("cluster_uuid")
    @classmethod
    def _canonical_uuid(cls, v: str | None) -> str | None:
        return None if v is None else str(uuidlib.UUID(v))

    @model_validator(mode="after")
    def _check_minors(self) -> SimConfig:
        prof = sim_profiles.node_profile(self.profile)
        for m in (*self.absent_minors, *self.initial_mig_mode):
            if not 0 <= m < prof.gpu_count:
                raise ValueError(f"minor {m} out of range for {self.profile} ({prof.gpu_count} GPUs)")
        if any(self.initial_mig_mode.values()) and prof.gpu.mig_model is None:
            raise ValueError(f"{self.profile} GPUs are not MIG-capable")
        return self

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], **overrides: Any) -> SimConfig:
        """Load from a YAML or JSON file (JSON is YAML); ``overrides`` win over file values."""
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a mapping")
        data.update(overrides)
        return cls.model_validate(data)

    def fabric_identity(self) -> tuple[str, int]:
        clique = _DEFAULT_CLIQUE_ID if self.clique_id is None else self.clique_id
        return (self.cluster_uuid or _DEFAULT_CLUSTER_UUID, clique)


def _uuid_from(text: str) -> str:
    return str(uuidlib.UUID(bytes=hashlib.sha256(text.encode()).digest()[:16], version=4))


def gpu_uuid(node_name: str, minor: int) -> str:
    """Deterministic GPU UUID of a simulated GPU: same node name and minor, same UUID."""
    return f"GPU-{_uuid_from(f'gpuplane-sim/{node_name}/gpu/{minor}')}"


def mig_uuid(parent_uuid: str, gi_id: int, generation: int) -> str:
    return f"MIG-{_uuid_from(f'{parent_uuid}/gi/{gi_id}/gen/{generation}')}"
