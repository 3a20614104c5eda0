"""What the MIG rule tests share: the GPU models under test, the ``model`` fixture, prepare/unprepare and read-backs."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpuplane.driver.hw import interface as hw
from gpuplane.driver.inventory import mig_device_name
from gpuplane.driver.prepare import cdi
from gpuplane.mig import geometry, models
from testing.driverkit import DriverUnderTest, driver_env, make_claim, ref

GIB = 1024**3
S1, S1ME, S1D, S2, S3, S4, S7 = (
    geometry.GI_PROFILE_1_SLICE,
    geometry.GI_PROFILE_1_SLICE_REV1,
    geometry.GI_PROFILE_1_SLICE_REV2,
    geometry.GI_PROFILE_2_SLICE,
    geometry.GI_PROFILE_3_SLICE,
    geometry.GI_PROFILE_4_SLICE,
    geometry.GI_PROFILE_7_SLICE,
)


@dataclass(frozen=True)
class Model:
    id: str
    profile: str
    table: models.MigModel
    sim: Mapping[str, Any] = field(default_factory=dict)
    foreign_profile: str = ""  # a real profile name of another model: never published here


MODELS = (
    Model("A100-40GB", "a100-40gb", models.A100_40GB, {"initial_mig_mode": {0: True, 1: True}}, "1g.10gb+me"),
    Model("H100-80GB", "hgx-h100", models.H100_80GB, {}, "1g.18gb"),
    Model("H200-141GB", "hgx-h200", models.H200_141GB, {}, "1g.10gb"),
)
# The counter property is also checked (on the pure rules) for the other MIG-capable simulator profiles.
OTHER_MIG_PROFILES = ("h100-nvl-pcie", "gb200-nvl72")


def name_of(model: Model, profile_id: int, start: int, minor: int = 0) -> str:
    profile = model.table.profile(profile_id)
    assert profile is not None
    return mig_device_name(minor, profile.name, start)


def mig_driver(model: Model, **extra: Any) -> contextlib.AbstractContextManager[DriverUnderTest]:
    return driver_env(model.profile, "node-a", prefix="mr", **{"durable": False, **model.sim, **extra})


@pytest.fixture(name="model", params=MODELS, ids=lambda m: m.id)
def mig_model(request: pytest.FixtureRequest) -> Model:
    m: Model = request.param
    return m


def prepare(drv: DriverUnderTest, name: str, devices: Sequence[str], **kw: Any) -> tuple[dict[str, Any], str]:
    claim = make_claim(name, drv.node, list(devices), **kw)
    drv.claims.add(claim)
    uid = claim["metadata"]["uid"]
    return claim, drv.state.prepare([ref(claim)])[uid].error


def unprepare(drv: DriverUnderTest, *claims: Mapping[str, Any]) -> None:
    results = drv.state.unprepare([ref(c) for c in claims])
    assert all(r.error == "" for r in results.values()), results


def instances(drv: DriverUnderTest, minor: int = 0) -> list[hw.GpuInstance]:
    uuid = drv.sim.uuid_of_minor(minor)
    return list(drv.sim.gpu_instances(uuid)) if drv.sim.mig_mode(uuid).current else []


def layout(drv: DriverUnderTest, minor: int = 0) -> set[tuple[int, int]]:
    return {(gi.profile_id, gi.placement_start) for gi in instances(drv, minor)}


def assert_nothing_left(drv: DriverUnderTest, claim: Mapping[str, Any]) -> None:
    uid = claim["metadata"]["uid"]
    assert uid not in drv.state.snapshot().claims
    assert not cdi.spec_path(drv.cdi_root, uid).exists()
    assert drv.mps.list_daemons() == []


def cdi_doc(drv: DriverUnderTest, claim: Mapping[str, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(cdi.spec_path(drv.cdi_root, claim["metadata"]["uid"]).read_text())
    return doc
