"""The simulator's device nodes: what a real NVIDIA driver makes in /dev, made in the simulator's state dir.

A real container runtime injects a CDI device by making the container's node
from a node on the host (``deviceNodes[].hostPath``) and allowing its
major:minor in the container's devices cgroup. So that a real runtime can do
that for simulated GPUs, the simulator keeps placeholder character devices with
the numbers a real driver uses, under ``<state_dir>/dev``:

* ``nvidia<minor>``: ``195:<minor>``, one per GPU present (a GPU that fell off the
  bus keeps its node, as with the real driver until it is reloaded);
* ``nvidiactl``: ``195:255``;
* ``nvidia-uvm`` and ``nvidia-uvm-tools``: ``UVM_MAJOR:0`` and ``:1``;
* ``nvidia-caps/nvidia-cap1`` and ``-cap2`` (MIG config and monitor), and
  ``nvidia-caps/nvidia-cap<N>`` for every GPU and compute instance that exists, at
  the minors of ``gpuplane.driver.hw.caps.caps_minors`` (made when the instance is created,
  removed when it is destroyed, as nvidia-modprobe does), ``CAPS_MAJOR:<N>``.

The uvm, caps and IMEX channel majors are dynamic on a real machine (``/proc/devices``); the
simulator fixes them and writes its own ``<state_dir>/proc/devices`` (:func:`proc_devices_text`) with
the lines the NVIDIA driver adds. IMEX channel nodes
(``nvidia-caps-imex-channels/channel<N>``, ``IMEX_CHANNELS_MAJOR:<N>``) are not made: on a real
machine an administrator (or the component that hands a channel out) makes them from that major,
and they are gone after a reboot. Opening a placeholder gives ENXIO (no driver behind it),
which is what proves a container's devices cgroup let it through. Without
``CAP_MKNOD`` the placeholders are empty regular files: enough for the kubelet
stand-in, refused by a real runtime.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path

import structlog

from gpuplane.driver.hw import caps

log = structlog.get_logger(__name__)

NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255
UVM_MAJOR = 510
CAPS_MAJOR = 511
CAPS_DIR = "nvidia-caps"
IMEX_CHANNELS_MAJOR = 512
IMEX_CHANNELS_NAME = caps.IMEX_CHANNELS
"""Its ``/proc/devices`` name, and the directory of the channel nodes under /dev."""
MIG_CONFIG_CAP, MIG_MONITOR_CAP = 1, 2


def wanted_nodes(gpu_minors: Iterable[int], caps_minors: Iterable[int]) -> dict[str, tuple[int, int]]:
    """Relative path -> (major, minor) of every node the hardware has."""
    nodes = {f"nvidia{m}": (NVIDIA_MAJOR, m) for m in gpu_minors}
    nodes["nvidiactl"] = (NVIDIA_MAJOR, NVIDIACTL_MINOR)
    nodes["nvidia-uvm"] = (UVM_MAJOR, 0)
    nodes["nvidia-uvm-tools"] = (UVM_MAJOR, 1)
    for cap in {MIG_CONFIG_CAP, MIG_MONITOR_CAP, *caps_minors}:
        nodes[f"{CAPS_DIR}/nvidia-cap{cap}"] = (CAPS_MAJOR, cap)
    return nodes


def proc_devices_text() -> str:
    """``/proc/devices`` of a node with the NVIDIA driver loaded (the character devices it registers)."""
    lines = [
        "Character devices:",
        "  1 mem",
        "  4 /dev/vc/0",
        "  5 /dev/tty",
        f"{NVIDIA_MAJOR} nvidia-frontend",
        f"{UVM_MAJOR} nvidia-uvm",
        f"{CAPS_MAJOR} nvidia-caps",
        f"{IMEX_CHANNELS_MAJOR} {IMEX_CHANNELS_NAME}",
        "",
        "Block devices:",
        "  7 loop",
        "259 blkext",
    ]
    return "\n".join(lines) + "\n"


class DeviceNodes:
    """Keeps ``directory`` holding exactly the wanted nodes."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.files_only = False
        """True once mknod was refused (no CAP_MKNOD): the placeholders are regular files."""

    def present(self) -> dict[str, tuple[int, int] | None]:
        """Relative path -> (major, minor) of what is there (None for a regular file)."""
        found: dict[str, tuple[int, int] | None] = {}
        for sub in (self.directory, self.directory / CAPS_DIR):
            with contextlib.suppress(FileNotFoundError):
                for entry in os.scandir(sub):
                    info = entry.stat(follow_symlinks=False)
                    rel = str(Path(entry.path).relative_to(self.directory))
                    if stat.S_ISCHR(info.st_mode):
                        found[rel] = (os.major(info.st_rdev), os.minor(info.st_rdev))
                    elif stat.S_ISREG(info.st_mode):
                        found[rel] = None
        return found

    def sync(self, wanted: Mapping[str, tuple[int, int]]) -> None:
        """Make the missing nodes and remove the ones no longer wanted."""
        (self.directory / CAPS_DIR).mkdir(parents=True, exist_ok=True)
        present = self.present()
        for rel in present.keys() - wanted.keys():
            (self.directory / rel).unlink(missing_ok=True)
        for rel, numbers in wanted.items():
            have = present.get(rel, "missing")
            if have == numbers or (have is None and self.files_only):
                continue
            path = self.directory / rel
            path.unlink(missing_ok=True)
            self._make(path, numbers)

    def _make(self, path: Path, numbers: tuple[int, int]) -> None:
        if not self.files_only:
            try:
                os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(*numbers))
                os.chmod(path, 0o666)  # mknod's mode is masked by the umask
                return
            except PermissionError:
                self.files_only = True
                log.warning(
                    "cannot make character devices (no CAP_MKNOD): simulated device nodes are plain files, "
                    "which a real container runtime refuses; run the driver as root for real nodes",
                    directory=str(self.directory),
                )
        path.touch(mode=0o666)
