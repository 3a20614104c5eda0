"""Simulator state that behaves like hardware: persistence across restarts and processes, topology, faults."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpuplane.driver.hw import sim_cli
from gpuplane.driver.hw.interface import ErrorCode, HardwareError, HealthEventKind
from gpuplane.driver.hw.select import make_backend
from gpuplane.driver.hw.sim import SimConfig, Simulator, gpu_uuid
from gpuplane.mig import geometry

REPO = Path(__file__).resolve().parents[4]


def _cfg(state_dir: Path, profile: str, **kw: object) -> SimConfig:
    return SimConfig.model_validate({"profile": profile, "state_dir": state_dir, **kw})


def _raises(code: ErrorCode) -> pytest.RaisesContext[HardwareError]:
    return pytest.raises(HardwareError, match=f"^{code.value}:")


def test_mig_state_survives_a_new_simulator(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "hgx-h100", node_name="node-a")
    with Simulator(cfg) as first:
        u = first.gpus()[3].uuid
        first.set_mig_mode(u, True)
        gi = first.create_compute_instance(u, first.create_gpu_instance(u, geometry.GI_PROFILE_2_SLICE, 2).gi_id)
        first.set_timeslice(first.gpus()[4].uuid, "Long")
    # "SIGKILL": no shutdown of `first` needed for the state to be on disk
    with Simulator(cfg) as second:
        assert second.mig_mode(u).current is True
        (found,) = second.gpu_instances(u)
        assert found == gi
        assert second.timeslice(second.gpus()[4].uuid) == "Long"
        assert [g.uuid for g in second.gpus()] == [g.uuid for g in Simulator(cfg).__enter__().gpus()]


def test_uuids_are_deterministic_and_node_specific(tmp_path: Path) -> None:
    with Simulator(_cfg(tmp_path / "a", "hgx-h100", node_name="n1")) as a:
        ua = [g.uuid for g in a.gpus()]
    with Simulator(_cfg(tmp_path / "b", "hgx-h100", node_name="n2")) as b:
        ub = [g.uuid for g in b.gpus()]
    assert ua[0] == gpu_uuid("n1", 0) and len(set(ua) | set(ub)) == 16
    assert all(u.startswith("GPU-") and len(u) == 40 for u in ua)


def test_absent_gpu_keeps_minors_and_uuids(tmp_path: Path) -> None:
    full = Simulator(_cfg(tmp_path / "full", "hgx-h100", node_name="n"))
    gone = Simulator(_cfg(tmp_path / "gone", "hgx-h100", node_name="n", absent_minors=(2,)))
    with full, gone:
        fg, gg = full.gpus(), gone.gpus()
        assert len(gg) == 7 and 2 not in [g.minor for g in gg]
        by_minor = {g.minor: g for g in fg}
        for g in gg:
            assert g.uuid == by_minor[g.minor].uuid and g.pci_bus_id == by_minor[g.minor].pci_bus_id
        assert [g.index for g in gg] == list(range(7))
        assert gg[2].minor == 3  # index shifted, minor did not
        with _raises(ErrorCode.NOT_FOUND):
            gone.mig_mode(by_minor[2].uuid)


def test_a100_mig_toggle_needs_reset(tmp_path: Path) -> None:
    with Simulator(_cfg(tmp_path, "a100-40gb")) as sim:
        g = sim.gpus()[0]
        assert g.mig_toggle_needs_reset and g.multiprocessors == 108
        mode = sim.set_mig_mode(g.uuid, True)
        assert (mode.current, mode.pending) == (False, True)
        with _raises(ErrorCode.NOT_SUPPORTED):
            sim.create_gpu_instance(g.uuid, geometry.GI_PROFILE_7_SLICE, 0)
        sim.add_process(g.uuid, 4242, 1 << 30)
        with _raises(ErrorCode.IN_USE):
            sim.reset_gpu(g.uuid)
        sim.clear_processes(g.uuid)
        assert sim.reset_gpu(g.uuid).current is True
        sim.create_gpu_instance(g.uuid, geometry.GI_PROFILE_7_SLICE, 0)


def test_hopper_toggle_refused_while_processes_run(tmp_path: Path) -> None:
    with Simulator(_cfg(tmp_path, "hgx-h200")) as sim:
        u = sim.gpus()[1].uuid
        sim.add_process(u, 7, 123)
        assert [(p.pid, p.used_memory_bytes) for p in sim.processes(u)] == [(7, 123)]
        with _raises(ErrorCode.IN_USE):
            sim.set_mig_mode(u, True)
        sim.clear_processes()
        assert sim.set_mig_mode(u, True).current is True


def test_topologies(tmp_path: Path) -> None:
    with Simulator(_cfg(tmp_path / "nvl", "h100-nvl-pcie")) as nvl:
        u = [g.uuid for g in nvl.gpus()]
        assert nvl.gpus()[0].product_name == "NVIDIA H100 NVL"
        assert nvl.nvlink_p2p(u[0], u[1]) and nvl.nvlink_p2p(u[3], u[2])
        assert not nvl.nvlink_p2p(u[0], u[2]) and not nvl.nvlink_p2p(u[1], u[3])
        assert nvl.fabric_info(u[0]).state == 0
    with Simulator(_cfg(tmp_path / "hgx", "hgx-h100")) as hgx:
        u = [g.uuid for g in hgx.gpus()]
        assert all(hgx.nvlink_p2p(a, b) for a in u for b in u if a != b)
        assert hgx.gpus()[0].pci_bus_id == "0000:18:00.0"
    with Simulator(_cfg(tmp_path / "l4", "pcie-l4")) as l4:
        u = [g.uuid for g in l4.gpus()]
        assert not any(l4.nvlink_p2p(a, b) for a in u for b in u)


def test_gb200_fabric_shared_by_a_rack(tmp_path: Path) -> None:
    cluster = "7b6c2f0e-3f1a-4c55-9d0e-0123456789ab"
    infos = []
    for node in ("rack1-n1", "rack1-n2"):
        cfg = _cfg(tmp_path / node, "gb200-nvl72", node_name=node, cluster_uuid=cluster, clique_id=32766)
        with Simulator(cfg) as sim:
            g = sim.gpus()
            assert len(g) == 4 and g[0].architecture == "blackwell" and g[0].cuda_compute_capability == "10.0"
            assert all(sim.nvlink_p2p(a.uuid, b.uuid) for a in g for b in g if a != b)
            infos += [sim.fabric_info(x.uuid) for x in g]
    assert {(f.cluster_uuid, f.clique_id) for f in infos} == {(cluster, 32766)}
    assert all(f.completed for f in infos)


def test_l4_refuses_mig_and_accepts_timeslice(tmp_path: Path) -> None:
    with Simulator(_cfg(tmp_path, "pcie-l4")) as sim:
        g = sim.gpus()[0]
        assert not g.mig_capable and g.architecture == "ada" and g.multiprocessors == 58
        assert sim.mig_profiles(g.uuid) == () and sim.gpu_instances(g.uuid) == ()
        for call in (
            lambda: sim.mig_mode(g.uuid),
            lambda: sim.set_mig_mode(g.uuid, True),
            lambda: sim.create_gpu_instance(g.uuid, geometry.GI_PROFILE_1_SLICE, 0),
        ):
            with _raises(ErrorCode.NOT_SUPPORTED):
                call()
        sim.set_timeslice(g.uuid, "Short")
        with _raises(ErrorCode.INVALID_ARGUMENT):
            sim.set_timeslice(g.uuid, "VeryLong")
    with pytest.raises(ValueError, match="not MIG-capable"):
        _cfg(tmp_path, "pcie-l4", initial_mig_mode={0: True})


def test_timeslice_refused_in_mig_mode(tmp_path: Path) -> None:
    with Simulator(_cfg(tmp_path, "hgx-h100", initial_mig_mode={0: True})) as sim:
        u = sim.gpus()[0].uuid
        with _raises(ErrorCode.NOT_SUPPORTED):
            sim.set_timeslice(u, "Medium")


def test_health_events_from_another_thread(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "hgx-h100", durable=False)
    with Simulator(cfg) as sim, Simulator(cfg) as injector:
        u = sim.gpus()[5].uuid
        assert sim.wait_health_events(0.0) == ()
        t = threading.Timer(0.15, lambda: injector.inject_event(u, HealthEventKind.ECC_DOUBLE_BIT))
        t.start()
        (ev,) = sim.wait_health_events(30.0)  # woken by the injection (a timeout would return no event)
        assert ev.uuid == u and ev.kind is HealthEventKind.ECC_DOUBLE_BIT
        assert sim.wait_health_events(0.0) == ()  # consumed
        assert sim.sample(u).ecc_dbe_total == 1


def test_xid79_loses_the_gpu_until_reset(tmp_path: Path) -> None:
    with Simulator(_cfg(tmp_path, "hgx-h100", durable=False)) as sim:
        u = sim.gpus()[0].uuid
        sim.inject_event(u, HealthEventKind.XID, xid=79)
        (ev,) = sim.wait_health_events(0.0)
        assert ev.xid == 79
        with _raises(ErrorCode.GPU_IS_LOST):
            sim.sample(u)
        sim.reset_gpu(u)
        assert sim.sample(u).uuid == u


def test_telemetry_defaults_and_overrides(tmp_path: Path) -> None:
    with Simulator(_cfg(tmp_path, "hgx-h100", durable=False)) as sim:
        u = sim.gpus()[0].uuid
        idle = sim.sample(u)
        assert idle.sm_active == 0.0 and idle.throttle_reasons & 0x1 and 20 < idle.temperature_c < 50
        sim.set_telemetry(u, {"sm_active": 0.8, "temperature": 91, "per_process_bandwidth": {12: 0.25}})
        sim.inject_event(u, "thermal")
        s = sim.sample(u)
        assert (s.sm_active, s.temperature_c, s.per_process_bandwidth) == (0.8, 91.0, {12: 0.25})
        assert s.throttle_reasons & 0x40
        sim.inject_event(u, "cleared")
        assert not sim.sample(u).throttle_reasons & 0x40
        with _raises(ErrorCode.INVALID_ARGUMENT):
            sim.set_telemetry(u, {"bogus": 1})


def test_op_latency_is_counted(tmp_path: Path) -> None:
    with Simulator(_cfg(tmp_path, "hgx-h100", durable=False, op_latency_s=0.02, initial_mig_mode={0: True})) as s:
        u = s.gpus()[0].uuid
        before = s.sim_time_s
        s.destroy_gpu_instance(u, s.create_gpu_instance(u, geometry.GI_PROFILE_7_SLICE, 0).gi_id)
        assert s.sim_time_s - before >= 0.04


def test_reboot_drops_instances_keeps_mig_mode(tmp_path: Path) -> None:
    with Simulator(_cfg(tmp_path, "hgx-h100", initial_mig_mode={0: True})) as sim:
        u = sim.gpus()[0].uuid
        sim.create_gpu_instance(u, geometry.GI_PROFILE_7_SLICE, 0)
        boot = sim.boot_id()
        assert sim.reboot() != boot
        assert sim.gpu_instances(u) == () and sim.mig_mode(u).current


def test_config_from_yaml_file(tmp_path: Path) -> None:
    f = tmp_path / "sim.yaml"
    f.write_text(f"profile: gb200-nvl72\nstate_dir: {tmp_path}/s\nnode_name: x\nclique_id: 4\n")
    cfg = SimConfig.from_file(f, op_latency_s=0.5)
    assert (cfg.profile, cfg.clique_id, cfg.op_latency_s) == ("gb200-nvl72", 4, 0.5)
    with pytest.raises(ValueError):
        _cfg(tmp_path, "no-such-node")
    with pytest.raises(ValueError):
        _cfg(tmp_path, "hgx-h100", absent_minors=(8,))


def test_make_backend(tmp_path: Path) -> None:
    assert isinstance(make_backend("sim", _cfg(tmp_path, "hgx-h100")), Simulator)
    with pytest.raises(ValueError):
        make_backend("sim", None)


def test_cli_in_process(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "hgx-h100", initial_mig_mode={1: True})
    with Simulator(cfg) as sim:
        u = sim.gpus()[1].uuid
        d = str(tmp_path)
        gi = sim_cli.run(["--state-dir", d, "create-gi", "--uuid", u, "--profile", "3g.40gb", "--placement", "4"])
        assert gi["mig_uuid"].startswith("MIG-")
        assert [g.placement_start for g in sim.gpu_instances(u)] == [4]  # the driver's simulator sees it
        sim_cli.run(["--state-dir", d, "set-telemetry", "--uuid", u, "sm_active=0.5", "per_process_bandwidth=3:0.5"])
        assert sim.sample(u).per_process_bandwidth == {3: 0.5}
        sim_cli.run(["--state-dir", d, "inject-xid", "--uuid", u, "--xid", "48"])
        assert [e.xid for e in sim.wait_health_events(0.0)] == [48]
        sim_cli.run(["--state-dir", d, "destroy-gi", "--uuid", u, "--gi", str(gi["gi_id"])])
        assert sim.gpu_instances(u) == ()
        shown = sim_cli.run(["--state-dir", d, "show"])
        assert shown["gpus"][u]["mig_current"] is True


def test_cli_subprocess_writes_concurrently(tmp_path: Path) -> None:
    """Another process injects while this one creates MIG instances: no update is lost."""
    cfg = _cfg(tmp_path, "hgx-h100", initial_mig_mode={0: True})
    with Simulator(cfg) as sim:
        gpus = sim.gpus()
        u0, u1 = gpus[0].uuid, gpus[1].uuid
        script = (
            "import sys\n"
            "from gpuplane.driver.hw import sim_cli\n"
            f"for pid in range(100, 120):\n"
            f"    sim_cli.run(['--state-dir', {str(tmp_path)!r}, 'add-process', '--uuid', {u1!r},"
            " '--pid', str(pid), '--mem', '1'])\n"
        )
        proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO)
        while True:  # churn MIG state for as long as the other process writes
            for gi in sim.gpu_instances(u0):
                sim.destroy_gpu_instance(u0, gi.gi_id)
            for s in range(7):
                sim.create_gpu_instance(u0, geometry.GI_PROFILE_1_SLICE, s)
            if proc.poll() is not None:
                break
        assert proc.wait(timeout=60) == 0
        assert len(sim.gpu_instances(u0)) == 7
        assert sorted(p.pid for p in sim.processes(u1)) == list(range(100, 120))
    out = subprocess.run(
        [sys.executable, "-m", "gpuplane.driver.hw.sim_cli", "--state-dir", str(tmp_path), "show"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert len(json.loads(out.stdout)["gpus"][u0]["gis"]) == 7
