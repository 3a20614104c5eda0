"""IMEX channel devices at the hardware boundary: the majors from /proc/devices, real and simulated.

A real node's IMEX channel major is dynamic: the NVIDIA driver registers ``nvidia-caps-imex-channels``
in ``/proc/devices`` and nobody makes ``/dev/nvidia-caps-imex-channels/channel<N>`` until someone needs
it. The simulator writes the same file into its state dir, with the majors it fixes, and makes no
channel node (as a real node after boot).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gpuplane.driver.hw import caps, sim_devnodes
from gpuplane.driver.hw.sim import SimConfig, Simulator
from gpuplane.driver.prepare import imex_channel

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


# --- the driver's side: a claim's channel node and CDI edits ------------------------------------------


def _proc(tmp: Path, text: str = REAL_LOOKING) -> Path:
    path = tmp / "devices"
    path.write_text(text)
    return path


def test_a_missing_channel_node_is_made_with_the_nodes_major(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    path = imex_channel.ensure_node(dev, _proc(tmp_path), 7)
    assert path == dev / "nvidia-caps-imex-channels" / "channel7"
    info = path.lstat()
    if stat.S_ISCHR(info.st_mode):  # as root (CAP_MKNOD), as the driver's privileged pod runs
        assert (os.major(info.st_rdev), os.minor(info.st_rdev)) == (235, 7)
        assert stat.S_IMODE(info.st_mode) == 0o666
    assert imex_channel.ensure_node(dev, _proc(tmp_path), 7) == path  # there and right: left alone


def test_a_wrong_or_foreign_node_is_refused_with_what_to_do(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    imex_channel.ensure_node(dev, _proc(tmp_path), 3)
    other_major = REAL_LOOKING.replace("235 nvidia-caps-imex-channels", "240 nvidia-caps-imex-channels")
    if stat.S_ISCHR(imex_channel.node_path(dev, 3).lstat().st_mode):
        with pytest.raises(imex_channel.ChannelError, match=r"is the device 235:3, not 240:3 .* remove it"):
            imex_channel.ensure_node(dev, _proc(tmp_path, other_major), 3)
    plain = imex_channel.node_path(dev, 4)
    plain.write_text("")
    with pytest.raises(imex_channel.ChannelError, match="not a character device; remove it"):
        imex_channel.ensure_node(dev, _proc(tmp_path), 4)
    assert imex_channel.ensure_node(dev, _proc(tmp_path), 4, placeholder_ok=True) == plain


def test_channel_zero_out_of_range_and_a_driver_without_channels_are_refused(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    for index in (0, 2048, -1):
        with pytest.raises(imex_channel.ChannelError, match="out of range"):
            imex_channel.ensure_node(dev, _proc(tmp_path), index)
    old = _proc(tmp_path, "Character devices:\n195 nvidia-frontend\n")
    with pytest.raises(imex_channel.ChannelError, match=r"no IMEX channels .* R550"):
        imex_channel.ensure_node(dev, old, 1)
    with pytest.raises(imex_channel.ChannelError, match="cannot read"):
        imex_channel.ensure_node(dev, tmp_path / "missing", 1)
    assert not (dev / "nvidia-caps-imex-channels").exists()


def test_the_container_gets_its_channel_alone_with_the_environment(tmp_path: Path) -> None:
    nodes, env = imex_channel.edits(imex_channel.Channel(5, "imex-g1"), tmp_path / "dev")
    assert [n.render() for n in nodes] == [
        {
            "path": "/dev/nvidia-caps-imex-channels/channel5",
            "hostPath": str(tmp_path / "dev" / "nvidia-caps-imex-channels" / "channel5"),
        }
    ]
    assert env == ("GPUPLANE_IMEX_CHANNEL=5", "GPUPLANE_IMEX_DOMAIN=imex-g1")
    std, _ = imex_channel.edits(imex_channel.Channel(5, "imex-g1"), Path("/dev"))
    assert std[0].render() == {"path": "/dev/nvidia-caps-imex-channels/channel5"}
