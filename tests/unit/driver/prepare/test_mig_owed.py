"""MIG instances on a GPU that fell off the bus are owed, not forgotten (issue 18, defect 7, first item).

Production code on the simulator backend (the one hardware boundary): the driver's own
DeviceState prepares a MIG claim, the GPU falls off the bus (Xid 79), kubelet unprepares. The
unprepare lets the pod go, but the instance is recorded as owed in the checkpoint, logged and
told on the claim; when the GPU answers again the instance is destroyed before the GPU offers
any device again. Before this, the unprepare reported success with no log line, and a GPU back
on the bus published the leaked instance as an administrator's fixed MIG device.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog

from gpuplane.driver.hw.interface import HealthEventKind
from gpuplane.driver.hw.sim_controls import XID_FALLEN_OFF_BUS
from gpuplane.driver.inventory import Inventory, mig_device_name
from gpuplane.driver.metrics import DriverMetrics
from gpuplane.driver.prepare import owed
from gpuplane.driver.prepare.checkpoint import CheckpointStore
from testing.driverkit import DriverUnderTest, build_driver, driver_env, make_claim, ref

MIG = mig_device_name(0, "1g.10gb", 0)


@pytest.fixture(name="drv")
def drv_fixture() -> Iterator[DriverUnderTest]:
    with driver_env("hgx-h100", prefix="ow", durable=False) as drv:
        yield drv


def _prepared_then_lost(drv: DriverUnderTest) -> tuple[dict[str, object], str]:
    claim = make_claim("mig-a", drv.node, [MIG])
    drv.claims.add(claim)
    uid = str(claim["metadata"]["uid"])  # type: ignore[index]
    assert drv.state.prepare([ref(claim)])[uid].error == ""
    gpu = drv.state.inventory().gpu("gpu-0")
    assert gpu is not None
    (gi,) = drv.sim.gpu_instances(gpu.info.uuid)
    assert drv.state.snapshot().claims[uid].devices[0].mig.gi_id == gi.gi_id  # type: ignore[union-attr]
    drv.sim.inject_event(gpu.info.uuid, HealthEventKind.XID, xid=XID_FALLEN_OFF_BUS)
    return claim, gpu.info.uuid


def _stored(drv: DriverUnderTest) -> CheckpointStore:
    return CheckpointStore(drv.state.settings.checkpoint_path, drv.sim.boot_id())


def test_unprepare_on_a_lost_gpu_owes_the_instance_and_says_so(drv: DriverUnderTest) -> None:
    claim, uuid = _prepared_then_lost(drv)
    gi_id = drv.state.snapshot().claims[str(claim["metadata"]["uid"])].devices[0].mig.gi_id  # type: ignore[index,union-attr]
    with structlog.testing.capture_logs() as logs:
        result = drv.state.unprepare([ref(claim)])
    assert result[str(claim["metadata"]["uid"])].error == ""  # type: ignore[index]  # kubelet may let the pod go
    cp = _stored(drv).load().checkpoint  # persisted, as a restarted driver reads it
    assert not cp.claims
    assert [(o.parent_uuid, o.gi_id, o.profile_name, o.start) for o in cp.owed_mig] == [(uuid, gi_id, "1g.10gb", 0)]
    assert "default/mig-a" in cp.owed_mig[0].claim
    warned = [e for e in logs if e["event"] == "MIG instance owed: its GPU does not answer"]
    assert warned and warned[0]["log_level"] == "warning" and warned[0]["gpu"] == uuid
    assert [(n, r) for n, r, _ in drv.claims.events] == [("mig-a", owed.EVENT_REASON)]
    assert "does not answer (fell off the bus)" in drv.claims.events[0][2]


def test_the_owed_instance_is_destroyed_before_the_gpu_is_offered_again(drv: DriverUnderTest) -> None:
    claim, uuid = _prepared_then_lost(drv)
    drv.state.unprepare([ref(claim)])
    lost = drv.state.rediscover()  # while lost: owed kept, no MIG device offered on gpu-0
    gpu0 = lost.gpu("gpu-0")
    assert gpu0 is not None and not gpu0.mig_slots
    assert len(_stored(drv).load().checkpoint.owed_mig) == 1
    assert drv.state.owing  # the driver's main loop re-reads the hardware before every publish meanwhile

    seen: list[tuple[Inventory, int]] = []
    drv.state.on_inventory_change = lambda inv: seen.append((inv, len(drv.sim.gpu_instances(uuid))))
    drv.sim.back_on_bus(uuid)
    assert len(drv.sim.gpu_instances(uuid)) == 1, "the simulator keeps the instance across the bus recovery"
    with structlog.testing.capture_logs() as logs:
        back = drv.state.rediscover()
    assert seen, "the inventory offering gpu-0's MIG devices again was published"
    published, instances_then = seen[-1]
    assert instances_then == 0, "the owed instance still existed when the GPU was offered again"
    gpu0 = published.gpu("gpu-0")
    assert gpu0 is not None and gpu0.offer_whole and MIG in {s.name for s in gpu0.mig_slots}
    assert all(s.static_instance is None for s in gpu0.mig_slots), "the leaked instance published as an admin's"
    assert back.gpu("gpu-0") == gpu0
    assert not _stored(drv).load().checkpoint.owed_mig and not drv.state.owing
    assert any(e["event"].startswith("owed MIG instance settled") for e in logs)
    again = make_claim("mig-b", drv.node, [MIG])
    drv.claims.add(again)
    assert drv.state.prepare([ref(again)])[str(again["metadata"]["uid"])].error == ""  # type: ignore[index]


def test_a_reset_while_lost_settles_what_was_owed(drv: DriverUnderTest) -> None:
    claim, uuid = _prepared_then_lost(drv)
    drv.state.unprepare([ref(claim)])
    drv.sim.reset_gpu(uuid)  # a reset wipes MIG instances and brings the GPU back
    drv.state.rediscover()
    assert not _stored(drv).load().checkpoint.owed_mig
    assert not drv.sim.gpu_instances(uuid)


def test_a_restarted_driver_destroys_what_the_last_one_owed(drv: DriverUnderTest) -> None:
    claim, uuid = _prepared_then_lost(drv)
    drv.state.unprepare([ref(claim)])
    drv.sim.back_on_bus(uuid)
    fresh = build_driver(drv.root, "hgx-h100", drv.node, claims=drv.claims, sim_overrides={"durable": False})
    fresh.state.recover()
    assert len(fresh.sim.gpu_instances(uuid)) == 0
    assert not _stored(fresh).load().checkpoint.owed_mig


def test_the_owed_gauge_counts_them_until_they_are_settled(drv: DriverUnderTest) -> None:
    meter = DriverMetrics()
    drv.state.observer = meter

    def gauges() -> tuple[float | None, float | None]:
        get = meter.registry.get_sample_value
        return get("gpuplane_driver_mig_instances_owed"), get("gpuplane_driver_mig_instances")

    claim, uuid = _prepared_then_lost(drv)
    assert gauges() == (0, 1)
    drv.state.unprepare([ref(claim)])
    assert gauges() == (1, 1), "owed: still on the hardware, no claim holds it"
    drv.state.rediscover()  # still lost: still owed
    assert gauges() == (1, 1)
    restarted = build_driver(drv.root, "hgx-h100", drv.node, claims=drv.claims, sim_overrides={"durable": False})
    restarted.state.observer = again = DriverMetrics()
    restarted.state.recover()  # a restarted driver reads the debt from its checkpoint
    assert again.registry.get_sample_value("gpuplane_driver_mig_instances_owed") == 1
    drv.sim.back_on_bus(uuid)
    drv.state.rediscover()  # settled before the GPU is offered again
    assert gauges() == (0, 0)
