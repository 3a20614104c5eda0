"""The values of per-claim MPS: what a daemon must look like, where it lives, what containers get.

- :class:`MpsSpec`: what one claim's daemon must look like (devices, thread percentage, pinned
  memory limits, client priority), with :func:`check_spec`, the checks made before anything is created;
- :class:`DaemonPaths`: the claim's directories under the MPS root (``daemon.json``, ``pipe/``,
  ``log/``, ``shm/``), from a claim uid that cannot escape the root;
- :class:`MpsDaemon` and :class:`Mount`: a daemon as found, and the environment and bind mounts
  its claim's containers need.

Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CONTAINER_PIPE_DIR = "/run/gpuplane/mps/pipe"
"""Where the claim's pipe dir appears inside its containers."""
CONTAINER_SHM_DIR = "/dev/shm"
"""Where the claim's shm dir appears inside its containers."""

RECORD_FILE = "daemon.json"
PID_FILE = "nvidia-cuda-mps-control.pid"
CONTROL_SOCKET = "control"
MAX_SOCKET_PATH = 107  # bytes in sockaddr_un.sun_path, less the terminating NUL
MIB = 1024 * 1024
CLIENT_PRIORITY_ENV = "CUDA_MPS_CLIENT_PRIORITY"
CLIENT_PRIORITIES = (0, 1)  # NVIDIA MPS guide: "Allowed values are 0 [NORMAL] and 1 [BELOW NORMAL]"

CLAIM_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_BIND_OPTIONS = ("rw", "nosuid", "nodev", "bind")


class MpsError(Exception):
    """An MPS daemon could not be started, configured or stopped."""


@dataclasses.dataclass(frozen=True)
class MpsSpec:
    """What one claim's MPS daemon must look like.

    ``device_uuids`` are GPU or MIG UUIDs in CUDA device order: they become
    CUDA_VISIBLE_DEVICES, and ordinal i in the pinned-memory commands is
    ``device_uuids[i]``. ``pinned_memory_limits`` maps some of those UUIDs to
    a per-client limit in bytes (sent in whole MiB, rounded down).
    ``owner_uid``, if set, owns the pipe and shm dirs (a non-root workload
    must be able to reach the control socket). ``client_priority`` is the
    default scheduling priority of the claim's clients (0 normal, 1 below normal).
    """

    claim_uid: str
    device_uuids: tuple[str, ...]
    active_thread_percentage: int | None
    pinned_memory_limits: Mapping[str, int]
    owner_uid: int | None = None
    client_priority: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "claim_uid": self.claim_uid,
            "device_uuids": list(self.device_uuids),
            "active_thread_percentage": self.active_thread_percentage,
            "pinned_memory_limits": dict(sorted(self.pinned_memory_limits.items())),
            "owner_uid": self.owner_uid,
            "client_priority": self.client_priority,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MpsSpec:
        pct = data.get("active_thread_percentage")
        owner = data.get("owner_uid")
        priority = data.get("client_priority")
        return cls(
            claim_uid=str(data["claim_uid"]),
            device_uuids=tuple(str(u) for u in data["device_uuids"]),
            active_thread_percentage=None if pct is None else int(pct),
            pinned_memory_limits={str(k): int(v) for k, v in dict(data["pinned_memory_limits"]).items()},
            owner_uid=None if owner is None else int(owner),
            client_priority=None if priority is None else int(priority),
        )


@dataclasses.dataclass(frozen=True)
class Mount:
    """A bind mount for a container: host path → container path (CDI-shaped)."""

    host_path: Path
    container_path: str
    options: tuple[str, ...] = _BIND_OPTIONS


@dataclasses.dataclass(frozen=True)
class MpsDaemon:
    """A claim's control daemon as found on disk; ``pid`` is None when it is not running."""

    claim_uid: str
    root: Path
    pipe_dir: Path
    log_dir: Path
    shm_dir: Path
    pid: int | None

    def container_env(self, client_priority: int | None = None) -> dict[str, str]:
        """Environment the claim's containers need: the daemon's pipe dir, and the clients' priority."""
        env = {"CUDA_MPS_PIPE_DIRECTORY": CONTAINER_PIPE_DIR}
        if client_priority is not None:
            env[CLIENT_PRIORITY_ENV] = str(client_priority)
        return env

    def container_mounts(self) -> list[Mount]:
        """The pipe dir (socket to the daemon) and the shared /dev/shm."""
        return [
            Mount(self.pipe_dir, CONTAINER_PIPE_DIR),
            Mount(self.shm_dir, CONTAINER_SHM_DIR),
        ]


@dataclasses.dataclass(frozen=True)
class DaemonPaths:
    """One claim's directories: ``<root_dir>/<claim_uid>/{daemon.json,pipe/,log/,shm/}``."""

    root: Path
    pipe: Path
    log: Path
    shm: Path

    @classmethod
    def of(cls, root_dir: Path, claim_uid: str) -> DaemonPaths:
        """The paths of ``claim_uid`` under ``root_dir``; MpsError for a uid that is not a plain name."""
        if not CLAIM_UID.match(claim_uid):
            raise MpsError(f"invalid claim uid {claim_uid!r}")
        root = root_dir / claim_uid
        return cls(root=root, pipe=root / "pipe", log=root / "log", shm=root / "shm")

    @property
    def claim_uid(self) -> str:
        return self.root.name

    @property
    def record(self) -> Path:
        return self.root / RECORD_FILE

    @property
    def pid_file(self) -> Path:
        return self.pipe / PID_FILE

    @property
    def control(self) -> Path:
        return self.pipe / CONTROL_SOCKET

    def daemon(self, pid: int | None) -> MpsDaemon:
        """The daemon value for these paths, with ``pid`` (None: not running)."""
        return MpsDaemon(
            claim_uid=self.claim_uid, root=self.root, pipe_dir=self.pipe, log_dir=self.log, shm_dir=self.shm, pid=pid
        )


def check_spec(spec: MpsSpec, paths: DaemonPaths) -> None:
    """MpsError for a spec no daemon can be started for (before anything is made)."""
    claim = spec.claim_uid
    if not spec.device_uuids:
        raise MpsError(f"claim {claim}: an MPS daemon needs at least one device")
    if len(set(spec.device_uuids)) != len(spec.device_uuids):
        raise MpsError(f"claim {claim}: duplicate device uuids {list(spec.device_uuids)}")
    for uuid in spec.device_uuids:
        if not uuid or "," in uuid or any(c.isspace() for c in uuid):
            raise MpsError(f"claim {claim}: invalid device uuid {uuid!r}")
    pct = spec.active_thread_percentage
    if pct is not None and not 1 <= pct <= 100:
        raise MpsError(f"claim {claim}: active thread percentage {pct} is outside 1..100")
    if spec.client_priority is not None and spec.client_priority not in CLIENT_PRIORITIES:
        raise MpsError(f"claim {claim}: client priority {spec.client_priority} is not 0 (normal) or 1 (below normal)")
    unknown = sorted(set(spec.pinned_memory_limits) - set(spec.device_uuids))
    if unknown:
        raise MpsError(f"claim {claim}: pinned memory limits for devices not in the claim: {unknown}")
    for uuid, limit in spec.pinned_memory_limits.items():
        if limit < MIB:
            raise MpsError(f"claim {claim}: pinned memory limit {limit} bytes for {uuid} is under 1 MiB")
    socket_path = len(os.fsencode(paths.control))
    if socket_path > MAX_SOCKET_PATH:
        raise MpsError(
            f"claim {claim}: control socket path {paths.control} is {socket_path} bytes, over the "
            f"{MAX_SOCKET_PATH}-byte AF_UNIX limit; use a shorter MPS root dir"
        )
