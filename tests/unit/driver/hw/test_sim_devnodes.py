"""The simulator's device nodes and the CDI specs that point containers at them.

On the simulator every GPU, control and MIG capability node exists as a
character device with a real driver's numbers under ``<sim state>/dev``; the
CDI spec's ``deviceNodes`` say ``/dev/...`` for the container and ``hostPath``
for that placeholder. A backend whose nodes are the standard /dev ones (NVML)
gets specs without ``hostPath``, as before.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from gpuplane.driver.hw import caps, sim_devnodes
from gpuplane.driver.prepare import cdi
from testing.driverkit import driver_env, make_claim, ref

needs_mknod = pytest.mark.skipif(os.geteuid() != 0, reason="making character devices needs CAP_MKNOD (root)")


def numbers(path: Path) -> tuple[int, int]:
    info = path.stat()
    assert stat.S_ISCHR(info.st_mode), f"{path} is not a character device"
    return os.major(info.st_rdev), os.minor(info.st_rdev)


@needs_mknod
def test_gpu_and_control_nodes_carry_the_real_drivers_numbers() -> None:
    with driver_env("hgx-h100") as drv:
        dev = drv.sim.device_node_dir()
        assert dev == drv.root / "sim" / "dev"
        assert [numbers(dev / f"nvidia{m}") for m in range(8)] == [(195, m) for m in range(8)]
        assert numbers(dev / "nvidiactl") == (195, 255)
        assert numbers(dev / "nvidia-uvm") == (sim_devnodes.UVM_MAJOR, 0)
        assert numbers(dev / "nvidia-uvm-tools") == (sim_devnodes.UVM_MAJOR, 1)
        caps = sorted(p.name for p in (dev / "nvidia-caps").iterdir())
        assert caps == ["nvidia-cap1", "nvidia-cap2"]
        assert stat.S_IMODE((dev / "nvidia0").stat().st_mode) == 0o666


@needs_mknod
def test_mig_capability_nodes_follow_the_instances() -> None:
    with driver_env("hgx-h100") as drv:
        uuid = drv.sim.uuid_of_minor(3)
        drv.sim.set_mig_mode(uuid, True)
        profile = next(p for p in drv.sim.mig_profiles(uuid) if p.name == "1g.10gb")
        gi = drv.sim.create_gpu_instance(uuid, profile.profile_id, profile.placements[0])
        gi = drv.sim.create_compute_instance(uuid, gi.gi_id)
        assert gi.gi_caps_minor is not None and gi.ci_caps_minor is not None
        assert (gi.gi_caps_minor, gi.ci_caps_minor) == caps.caps_minors(3, gi.gi_id, 0)
        caps_dir = drv.sim.device_node_dir() / "nvidia-caps"
        for minor in (gi.gi_caps_minor, gi.ci_caps_minor):
            assert numbers(caps_dir / f"nvidia-cap{minor}") == (sim_devnodes.CAPS_MAJOR, minor)
        drv.sim.destroy_compute_instance(uuid, gi.gi_id, 0)
        assert not (caps_dir / f"nvidia-cap{gi.ci_caps_minor}").exists()
        drv.sim.destroy_gpu_instance(uuid, gi.gi_id)
        assert sorted(p.name for p in caps_dir.iterdir()) == ["nvidia-cap1", "nvidia-cap2"]


def test_placeholders_fall_back_to_files_without_mknod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "mknod", refuse)
    nodes = sim_devnodes.DeviceNodes(tmp_path / "dev")
    nodes.sync(sim_devnodes.wanted_nodes([0, 1], [30]))
    assert nodes.files_only
    assert sorted(nodes.present()) == sorted(sim_devnodes.wanted_nodes([0, 1], [30]))
    nodes.sync(sim_devnodes.wanted_nodes([0], []))  # a removed GPU and instance lose their nodes
    assert sorted(nodes.present()) == sorted(sim_devnodes.wanted_nodes([0], []))


def test_cdi_spec_points_the_containers_dev_at_the_simulators_nodes() -> None:
    with driver_env("hgx-h100") as drv:
        claim = make_claim("c", drv.node, ["gpu-2"])
        drv.claims.add(claim)
        result = drv.state.prepare([ref(claim)])[claim["metadata"]["uid"]]
        assert result.error == ""
        doc = json.loads(cdi.spec_path(drv.cdi_root, claim["metadata"]["uid"]).read_text())
        dev = drv.sim.device_node_dir()
        (device,) = doc["devices"]
        assert device["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia2", "hostPath": str(dev / "nvidia2")}]
        assert doc["containerEdits"]["deviceNodes"] == [
            {"path": f"/dev/{n}", "hostPath": str(dev / n)} for n in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
        ]


def test_standard_dev_nodes_need_no_host_path() -> None:
    node = cdi.DeviceNode(path="/dev/nvidia0", host_path="/dev/nvidia0")
    assert node.render() == {"path": "/dev/nvidia0"}
    elsewhere = cdi.DeviceNode(path="/dev/nvidia0", host_path="/sim/dev/nvidia0")
    assert elsewhere.render() == {"path": "/dev/nvidia0", "hostPath": "/sim/dev/nvidia0"}
