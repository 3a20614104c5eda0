"""What this machine must offer before a real node can run on it, and how to get it.

A real node runs kubelet, containerd and runc, which manage cgroups, mounts,
network namespaces and a bridge: that needs root with ``CAP_SYS_ADMIN``,
``CAP_NET_ADMIN`` and ``CAP_MKNOD`` (the simulator's placeholder device nodes),
the cgroup controllers kubelet uses, overlayfs, and Debian's ``runc``,
``containernetworking-plugins`` (bridge, host-local, loopback, portmap),
``busybox-static``, ``iproute2`` and ``iptables`` (``scripts/setup-realnodes.sh``
installs them with apt). ``problems()`` lists what is missing, each item naming
the fix.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable
from pathlib import Path

Printer = Callable[[str], None]

CNI_BIN_DIR = Path("/usr/lib/cni")
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")
RUNC_CANDIDATES = (Path("/usr/sbin/runc"), Path("/usr/bin/runc"))
CGROUP_V1_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "pids")
# Capability bits (linux/capability.h).
CAPABILITIES = {"CAP_MKNOD": 27, "CAP_NET_ADMIN": 12, "CAP_SYS_ADMIN": 21}
SETUP_SCRIPT = "scripts/setup-realnodes.sh"


class HostError(RuntimeError):
    """The machine cannot run a real node; the message says what is missing and what to do."""


@dataclasses.dataclass(frozen=True)
class CgroupLayout:
    """Where the cgroup hierarchies are mounted."""

    v1: dict[str, Path]  # controller (or "name=systemd") -> mount point
    unified: Path | None  # the cgroup2 mount, if any

    @property
    def is_v2(self) -> bool:
        """Pure cgroup v2 (no v1 controllers mounted)."""
        return not self.v1 and self.unified is not None


def cgroup_layout(mountinfo: Path = Path("/proc/self/mountinfo")) -> CgroupLayout:
    """Read the cgroup mounts from ``/proc/self/mountinfo``."""
    v1: dict[str, Path] = {}
    unified: Path | None = None
    for line in mountinfo.read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        point = Path(fields[4])
        if tail[0] == "cgroup2":
            unified = unified or point
        elif tail[0] == "cgroup":
            for option in tail[2].split(","):
                if option in CGROUP_V1_CONTROLLERS or option.startswith("name=") or option in ("blkio", "hugetlb"):
                    v1.setdefault(option, point)
    return CgroupLayout(v1=v1, unified=unified)


def runc_path() -> Path | None:
    """Debian's runc, if installed."""
    for candidate in RUNC_CANDIDATES:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("runc")
    return Path(found) if found else None


def effective_capabilities(status: Path = Path("/proc/self/status")) -> int:
    """This process's effective capability mask."""
    for line in status.read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def problems() -> list[str]:
    """Everything that keeps a real node from running here, each with its fix (empty: all is there)."""
    found: list[str] = []
    if os.geteuid() != 0:
        return [
            "not root: kubelet, containerd and runc need root (cgroups, mounts, network namespaces); "
            "run as root, or ask for no real nodes (--real-nodes '')"
        ]
    caps = effective_capabilities()
    lacking = [name for name, bit in CAPABILITIES.items() if not caps & (1 << bit)]
    if lacking:
        found.append(f"capabilities missing: {', '.join(lacking)} (a container without them cannot run real nodes)")
    missing_packages = []
    if runc_path() is None:
        missing_packages.append("runc")
    absent = [p for p in CNI_PLUGINS if not (CNI_BIN_DIR / p).is_file()]
    if absent:
        missing_packages.append(f"containernetworking-plugins ({', '.join(absent)} not in {CNI_BIN_DIR})")
    if not Path("/bin/busybox").is_file():
        missing_packages.append("busybox-static")
    for tool, package in (("ip", "iproute2"), ("iptables", "iptables")):
        if shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None:
            missing_packages.append(package)
    if missing_packages:
        found.append(f"Debian packages missing: {'; '.join(missing_packages)} (run {SETUP_SCRIPT} as root)")
    layout = cgroup_layout()
    if not layout.is_v2:
        absent_controllers = [c for c in CGROUP_V1_CONTROLLERS if c not in layout.v1]
        if absent_controllers:
            found.append(f"cgroup v1 controllers not mounted: {', '.join(absent_controllers)}")
    try:
        filesystems = Path("/proc/filesystems").read_text()
    except OSError:
        filesystems = ""
    if "overlay" not in filesystems:
        found.append("the kernel offers no overlayfs (containerd's snapshotter needs it; try `modprobe overlay`)")
    return found


def require() -> None:
    """Raise HostError naming every problem, or return when a real node can run here."""
    found = problems()
    if found:
        raise HostError("this machine cannot run a real node: " + "; ".join(found))
