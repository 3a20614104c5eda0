"""IMEX channel devices at the hardware boundary: the majors from /proc/devices, real and simulated.

A real node's IMEX channel major is dynamic: the NVIDIA driver registers ``nvidia-caps-imex-channels``
in ``/proc/devices`` and nobody makes ``/dev/nvidia-caps-imex-channels/channel<N>`` until someone needs
it. The simulator writes the same file into its state dir, with the majors it fixes, and makes no
channel node (as a real node after boot).
"""

from __future__ import annotations

from pathlib import Path

from gpuplane.driver.hw import caps, sim_devnodes
from gpuplane.driver.hw.sim import SimConfig, Simulator

# The NVIDIA lines as NVIDIA's DRA driver's CPU-only CI mocks them (majors 235/236), among the usual ones.
REAL_LOOKING = """Character devices:
  1 mem
  4 /dev/vc/0
195 nvidia-frontend
235 nvidia-caps-imex-channels
236 nvidia-caps
508 nvidia-uvm

Block devices:
235 not-a-char-device
259 blkext
"""


def test_the_majors_are_read_from_the_character_section() -> None:
    majors = caps.parse_proc_devices(REAL_LOOKING)
    assert majors["nvidia-caps-imex-channels"] == 235 and majors["nvidia-caps"] == 236
    assert "not-a-char-device" not in majors and "blkext" not in majors
    assert caps.imex_channel_major(REAL_LOOKING) == 235


def test_a_driver_without_imex_channels_has_no_major() -> None:
    old = "Character devices:\n195 nvidia-frontend\n236 nvidia-caps\n"
    assert caps.imex_channel_major(old) is None
    assert caps.imex_channel_major("") is None


def test_the_simulator_writes_proc_devices_and_no_channel_node(tmp_path: Path) -> None:
    cfg = SimConfig(profile="gb200-nvl72", node_name="tray-0", state_dir=tmp_path)
    with Simulator(cfg) as sim:
        text = sim.proc_devices.read_text()
        assert sim.proc_devices == tmp_path / "proc" / "devices"
        assert caps.imex_channel_major(text) == sim_devnodes.IMEX_CHANNELS_MAJOR
        assert caps.parse_proc_devices(text)["nvidia-caps"] == sim_devnodes.CAPS_MAJOR
        assert not (sim.device_node_dir() / sim_devnodes.IMEX_CHANNELS_NAME).exists()
        assert "nvidia0" in {p.name for p in sim.device_node_dir().iterdir()}
