"""Health policy (pure) and the health watcher on the file-backed simulator."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuplane.driver.hw.interface import DeviceSample, HealthEvent, HealthEventKind
from gpuplane.driver.hw.sim import SimConfig, Simulator
from gpuplane.driver.inventory import discover
from gpuplane.driver.observe import health
from gpuplane.driver.observe.health_board import HealthBoard
from gpuplane.driver.observe.health_watcher import HealthWatcher
from gpuplane.driver.publish import slices

U = "GPU-aaaa"
S = health.HealthSettings(clear_after_s=10.0)


def ev(kind: HealthEventKind, xid: int = 0, uuid: str = U) -> HealthEvent:
    return HealthEvent(uuid=uuid, kind=kind, xid=xid, message="m")


@pytest.mark.parametrize("xid", sorted(health.DEFAULT_FATAL_XIDS - {79}))
def test_fatal_xids_are_no_schedule(xid: int) -> None:
    obs = health.classify(ev(HealthEventKind.XID, xid), S)
    assert obs is not None
    assert (obs.key, obs.value, obs.severity.effect) == (health.KEY_XID, f"xid-{xid}", "NoSchedule")


def test_xid_79_is_unhealthy_and_benign_list_is_configurable() -> None:
    obs = health.classify(ev(HealthEventKind.XID, 79), S)
    assert obs is not None and (obs.key, obs.value, obs.severity) == (
        health.KEY_UNHEALTHY,
        "fallen-off-bus",
        health.Severity.FATAL,
    )
    for xid in health.DEFAULT_BENIGN_XIDS:
        assert health.classify(ev(HealthEventKind.XID, xid), S) is None
    # 13 no longer benign: unknown-to-be-fatal, so informational
    custom = health.HealthSettings(benign_xids=frozenset({31}))
    obs13 = health.classify(ev(HealthEventKind.XID, 13), custom)
    assert obs13 is not None and obs13.severity.effect == "None"
    assert health.classify(ev(HealthEventKind.XID, 31), custom) is None


def test_event_kinds() -> None:
    table = {
        HealthEventKind.ECC_DOUBLE_BIT: (health.KEY_ECC, "double-bit", "NoSchedule"),
        HealthEventKind.ECC_SINGLE_BIT: (health.KEY_ECC, "single-bit", "None"),
        HealthEventKind.GPU_LOST: (health.KEY_UNHEALTHY, "fallen-off-bus", "NoSchedule"),
        HealthEventKind.THERMAL: (health.KEY_THERMAL, "throttled", "None"),
        HealthEventKind.POWER: (health.KEY_POWER, "throttled", "None"),
    }
    for kind, want in table.items():
        obs = health.classify(ev(kind), S)
        assert obs is not None and (obs.key, obs.value, obs.severity.effect) == want
    assert health.classify(ev(HealthEventKind.CLEARED), S) is None


def test_fatal_needs_recovery_evidence_then_quiet_time() -> None:
    p = health.HealthPolicy(S)
    assert p.handle_event(ev(HealthEventKind.XID, 48), now=100.0)
    assert p.taints({U: "gpu-0"}) == {"gpu-0": (slices.DeviceTaint(health.KEY_XID, "xid-48", "NoSchedule"),)}
    assert not p.expire(now=10_000.0)  # silence alone never clears a fatal condition
    assert p.fatal(U)
    p.handle_event(ev(HealthEventKind.CLEARED), now=10_000.0)
    assert not p.expire(now=10_009.9)
    # a recurrence after recovery cancels it
    p.handle_event(ev(HealthEventKind.XID, 48), now=10_005.0)
    assert not p.expire(now=10_020.0)
    p.handle_event(ev(HealthEventKind.CLEARED), now=10_030.0)
    assert p.next_expiry() == 10_040.0
    assert p.expire(now=10_040.0)
    assert p.taints({U: "gpu-0"}) == {}


def test_informational_clears_after_no_repeat_and_fatal_is_not_downgraded() -> None:
    p = health.HealthPolicy(S)
    p.handle_event(ev(HealthEventKind.THERMAL), now=0.0)
    p.handle_event(ev(HealthEventKind.THERMAL), now=8.0)  # repeat: refresh
    assert not p.expire(now=17.9)
    assert p.expire(now=18.0)
    p.handle_event(ev(HealthEventKind.ECC_DOUBLE_BIT), now=20.0)
    assert not p.handle_event(ev(HealthEventKind.ECC_SINGLE_BIT), now=21.0)  # no visible change
    (t,) = p.taints({U: "gpu-0"})["gpu-0"]
    assert (t.value, t.effect) == ("double-bit", "NoSchedule")


def test_probe_observations() -> None:
    sample = DeviceSample(U, 0.0, 0, 0.0, 90.0, 300.0, health.THROTTLE_HW_THERMAL | 0x4, 0, 0)
    assert [o.key for o in health.observations_from_sample(sample)] == [health.KEY_THERMAL]
    p = health.HealthPolicy(S)
    p.observe(health.lost_observation(U, "gone"), now=0.0)
    p.probe_ok(U, now=5.0)
    assert not p.expire(now=14.0) and p.expire(now=15.0)


def test_views_mark_every_device_of_a_fatal_gpu_unhealthy() -> None:
    p = health.HealthPolicy(S)
    p.handle_event(ev(HealthEventKind.XID, 94), now=50.0)
    p.handle_event(ev(HealthEventKind.THERMAL, uuid="GPU-b"), now=50.0)
    gpus = [
        health.GpuDevices(U, "gpu-0", ("gpu-0", "gpu-0-mig-1g-10gb-0")),
        health.GpuDevices("GPU-b", "gpu-1", ("gpu-1",)),
        health.GpuDevices("GPU-c", "gpu-2", ("gpu-2",)),
    ]
    views = {v.device_name: v for v in p.views("node", gpus, now=60.0)}
    assert views["gpu-0"].healthy is False and views["gpu-0-mig-1g-10gb-0"].healthy is False
    assert "xid-94" in views["gpu-0"].message and views["gpu-0"].last_updated == 50
    assert views["gpu-1"].healthy is True and "thermal" in views["gpu-1"].message
    assert views["gpu-2"].healthy is True and views["gpu-2"].message == ""


# --- the watcher on the simulator -------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _watcher(tmp_path: Path, profile: str = "hgx-h100") -> tuple[Simulator, HealthWatcher, HealthBoard, Clock]:
    sim = Simulator(SimConfig(profile=profile, state_dir=tmp_path, node_name="n1", durable=False))
    sim.init()
    board = HealthBoard()
    clock = Clock()
    calls: list[int] = []
    inventory = discover("n1", sim)  # the driver hands the watcher its cached inventory too
    w = HealthWatcher(
        sim,
        health.HealthSettings(clear_after_s=30.0),
        board,
        lambda: inventory,
        "n1",
        on_change=lambda: calls.append(1),
        clock=clock,
    )
    return sim, w, board, clock


def test_watcher_taints_and_clears_through_the_simulator(tmp_path: Path) -> None:
    sim, w, board, clock = _watcher(tmp_path)
    w.refresh_board()
    assert all(v.healthy for v in board.snapshot().devices)
    u0 = sim.uuid_of_minor(0)
    sim.inject_event(u0, HealthEventKind.XID, xid=48)
    sim.inject_event(sim.uuid_of_minor(1), HealthEventKind.XID, xid=13)  # benign
    assert w.step(sim.wait_health_events(0.0))
    assert w.taints() == {"gpu-0": (slices.DeviceTaint(health.KEY_XID, "xid-48", "NoSchedule"),)}
    unhealthy = {v.device_name for v in board.snapshot().devices if v.healthy is False}
    assert "gpu-0" in unhealthy and all(n == "gpu-0" or n.startswith("gpu-0-mig-") for n in unhealthy)
    # thermal via the simulator: the probe keeps seeing the throttle bits
    sim.inject_event(sim.uuid_of_minor(2), HealthEventKind.THERMAL)
    w.step(sim.wait_health_events(0.0))
    clock.t += 100
    assert not w.step(())  # throttling still observed by the probe; xid needs recovery
    assert set(w.taints()) == {"gpu-0", "gpu-2"}
    sim.inject_event(sim.uuid_of_minor(2), HealthEventKind.CLEARED)
    sim.inject_event(u0, HealthEventKind.CLEARED)
    w.step(sim.wait_health_events(0.0))
    clock.t += 29
    assert not w.step(())
    clock.t += 1
    assert w.step(())
    assert w.taints() == {}
    assert all(v.healthy for v in board.snapshot().devices)


def test_watcher_gpu_lost_and_back(tmp_path: Path) -> None:
    sim, w, _board, clock = _watcher(tmp_path)
    u3 = sim.uuid_of_minor(3)
    sim.inject_event(u3, HealthEventKind.XID, xid=79)  # the simulator marks the GPU lost
    w.step(sim.wait_health_events(0.0))
    assert w.taints()["gpu-3"][0].key == health.KEY_UNHEALTHY
    clock.t += 1000
    assert not w.step(())  # probe: GPU_IS_LOST re-observes it
    sim.reset_gpu(u3)
    w.step(())  # probe answers: recovery evidence
    clock.t += 30
    assert w.step(()) and w.taints() == {}


def test_mig_devices_inherit_the_parent_taint(tmp_path: Path) -> None:
    sim, w, board, _clock = _watcher(tmp_path)
    u0 = sim.uuid_of_minor(0)
    sim.inject_event(u0, HealthEventKind.ECC_DOUBLE_BIT)
    w.step(sim.wait_health_events(0.0))
    inv = discover("n1", sim)
    pool = slices.build_pool(inv, taints=w.taints())
    devices = [d for spec in pool.slice_specs for d in spec.get("devices") or []]
    tainted = {d["name"] for d in devices if d.get("taints")}
    gpu0 = {d["name"] for d in devices if d["name"] == "gpu-0" or d["name"].startswith("gpu-0-")}
    assert len(gpu0) > 10 and tainted == gpu0
    assert all(
        d["taints"] == [{"key": health.KEY_ECC, "value": "double-bit", "effect": "NoSchedule"}]
        for d in devices
        if d["name"] in tainted
    )
    mig_views = [v for v in board.snapshot().devices if v.device_name.startswith("gpu-0-mig-")]
    assert mig_views and all(v.healthy is False for v in mig_views)


def test_fatal_condition_survives_a_driver_restart_and_a_reboot_starts_its_clock(tmp_path: Path) -> None:
    sim = Simulator(SimConfig(profile="hgx-h100", state_dir=tmp_path / "sim", node_name="n1", durable=False))
    sim.init()
    inventory = discover("n1", sim)
    state = tmp_path / "health.json"
    clock = Clock()

    def watcher(boot_id: str) -> HealthWatcher:
        return HealthWatcher(
            sim,
            health.HealthSettings(clear_after_s=30.0),
            HealthBoard(),
            lambda: inventory,
            "n1",
            clock=clock,
            state_file=state,
            boot_id=boot_id,
        )

    first = watcher("boot-1")
    sim.inject_event(sim.uuid_of_minor(0), HealthEventKind.XID, xid=48)
    assert first.step(sim.wait_health_events(0.0))
    expected = {"gpu-0": (slices.DeviceTaint(health.KEY_XID, "xid-48", "NoSchedule"),)}
    # The plugin restarts (same boot): the fatal taint is remembered and needs recovery evidence.
    clock.t += 3600
    second = watcher("boot-1")
    assert second.taints() == expected
    second.step(())  # no events, the GPU answers probes: a fatal Xid still needs a CLEARED signal
    assert second.taints() == expected
    # The node rebooted (GPUs reset): remembered conditions clear after the quiet time.
    third = watcher("boot-2")
    assert third.taints() == expected
    third.step(())
    assert third.taints() == expected
    clock.t += 31
    assert third.step(())
    assert third.taints() == {}
    # A damaged state file is survived, not fatal.
    state.write_text("{not json")
    assert watcher("boot-2").taints() == {}
