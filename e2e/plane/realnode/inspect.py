"""What a container on a real node actually got, read from the host: its environment, device nodes and mounts.

Works for any image (the examples run ``pause``, which has no shell to exec
into): containerd records the container's init pid in its task state
(``<state>/io.containerd.runtime.v2.task/k8s.io/<id>/init.pid``), and the
kernel shows that process's environment (``/proc/<pid>/environ``), its root
filesystem's ``/dev`` (``/proc/<pid>/root/dev``) and its mounts
(``/proc/<pid>/mountinfo``) exactly as the container sees them.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from e2e.plane.realnode.plan import RealNode

TASK_DIR = Path("io.containerd.runtime.v2.task") / "k8s.io"


class NotRunning(LookupError):
    """The container has no running task on the node."""


@dataclasses.dataclass(frozen=True)
class ContainerView:
    """A running container as it sees itself."""

    pid: int
    env: Mapping[str, str]
    devices: Mapping[str, tuple[int, int]]
    """``/dev/...`` path -> (major, minor) of every NVIDIA character device in the container."""
    mounts: Mapping[str, str]
    """Mount point in the container -> the mounted path of the host file system, for bind mounts."""

    def line(self) -> str:
        """One line of what it saw, for tables: NVIDIA_VISIBLE_DEVICES and its NVIDIA device nodes."""
        visible = self.env.get("NVIDIA_VISIBLE_DEVICES", "-")
        nodes = ",".join(sorted(p.removeprefix("/dev/") for p in self.devices if "nvidia-uvm" not in p))
        mps = " MPS" if "CUDA_MPS_PIPE_DIRECTORY" in self.env else ""
        return f"NVIDIA_VISIBLE_DEVICES={visible} dev={nodes or '-'}{mps}"


def container_id(pod: Mapping[str, Any], container: str) -> str:
    """The containerd id of a pod's container, from the pod's status (``containerd://<id>``)."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container and str(status.get("containerID", "")).startswith("containerd://"):
            return str(status["containerID"]).removeprefix("containerd://")
    raise NotRunning(f"pod {pod['metadata']['name']} has no containerd container {container!r} (not a real node?)")


def init_pid(node: RealNode, cid: str) -> int:
    """The host pid of the container's first process."""
    path = node.containerd_state / TASK_DIR / cid / "init.pid"
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError) as err:
        raise NotRunning(f"container {cid[:12]} has no running task on {node.name}") from err


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {key: value for key, _, value in pairs}


def _devices(pid: int) -> dict[str, tuple[int, int]]:
    root = Path(f"/proc/{pid}/root/dev")
    found: dict[str, tuple[int, int]] = {}
    for directory, _dirs, files in os.walk(root):
        for name in files:
            path = Path(directory) / name
            if not path.relative_to(root).parts[0].startswith("nvidia"):  # nvidia*, nvidia-caps*/...
                continue
            info = path.lstat()
            if stat.S_ISCHR(info.st_mode):
                found["/dev/" + str(path.relative_to(root))] = (os.major(info.st_rdev), os.minor(info.st_rdev))
    return found


def _mounts(pid: int) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[3] != "/":
            found[fields[4]] = fields[3]
    return found


def view(node: RealNode, pod: Mapping[str, Any], container: str) -> ContainerView:
    """What ``container`` of ``pod`` (running on ``node``) sees."""
    pid = init_pid(node, container_id(pod, container))
    try:
        return ContainerView(pid=pid, env=_environ(pid), devices=_devices(pid), mounts=_mounts(pid))
    except OSError as err:
        raise NotRunning(f"container of pod {pod['metadata']['name']} exited while being read: {err}") from err
