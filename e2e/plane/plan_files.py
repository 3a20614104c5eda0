"""What the simulated-node and real-node plans share: labels, GB200 racks, short socket roots, the plan file.

Both plans (``e2e.plane.simnode_plan`` and ``e2e.plane.realnode.plan``) are pure functions of the
state directory and the node groups, kept as a JSON list in the state directory so that another
process (``python -m e2e down``) finds everything to stop. The pieces here are the ones they had
written twice.
"""

from __future__ import annotations

import hashlib
import json
import sys
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

PROFILE_LABEL = "gpuplane.dev/sim-profile"
GB200_PROFILE = "gb200-nvl72"
GB200_RACK_NODES = 18  # compute trays of 4 GPUs in one NVL72 rack
MAX_SOCKET_PATH = 107  # AF_UNIX sun_path, less its terminating NUL

T = TypeVar("T")


def short_root(preferred: Path, key: Path, longest_suffix: int, prefix: str, digits: int) -> Path:
    """``preferred``, or ``/tmp/<prefix><hash of key>`` when a socket under it (index up to 3 digits) is too long."""
    if len(str(preferred)) + 4 + longest_suffix <= MAX_SOCKET_PATH:
        return preferred
    return Path("/tmp") / f"{prefix}{hashlib.sha256(str(key).encode()).hexdigest()[:digits]}"


def gb200_rack_config(state_dir: Path, rack: int, kind: str = "rack") -> dict[str, Any]:
    """The simulator config of a tray in GB200 rack ``rack``: the rack's fabric cluster UUID and clique 1."""
    rack_id = uuid.uuid5(uuid.NAMESPACE_URL, f"gpuplane-e2e:{state_dir}:{kind}-{rack}")
    return {"cluster_uuid": str(rack_id), "clique_id": 1}


def load_records(path: Path, decode: Callable[[Mapping[str, Any]], T]) -> list[T]:
    """The records of a plan file (empty when there is none)."""
    if not path.is_file():
        return []
    return [decode(item) for item in json.loads(path.read_text())]


def save_records(path: Path, records: Iterable[Mapping[str, Any]]) -> None:
    """Write a plan file atomically (a reader sees the old list or the new one)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(list(records), indent=2) + "\n")
    tmp.replace(path)


class NodeFiles:
    """The files every planned node has, the same for simulated and real nodes.

    A node dataclass provides ``node_dir`` (configuration and data) and ``plugin_dir`` (the
    driver's plugin dir, short for AF_UNIX); the rest follows from them.
    """

    node_dir: Path

    @property
    def plugin_dir(self) -> Path:
        """The driver's plugin dir: DRA socket, checkpoint, MPS pipes."""
        raise NotImplementedError

    @property
    def checkpoint(self) -> Path:
        """The driver's checkpoint file."""
        return self.plugin_dir / "checkpoint.json"

    @property
    def mps_root(self) -> Path:
        """Per-claim MPS daemon directories."""
        return self.plugin_dir / "mps"

    @property
    def cdi_root(self) -> Path:
        """The node's CDI spec dir (its /var/run/cdi): the driver writes it, the runtime reads it."""
        return self.node_dir / "cdi"

    @property
    def sim_state_dir(self) -> Path:
        """The simulator's state (GPUs, MIG instances, placeholder device nodes)."""
        return self.node_dir / "sim"

    @property
    def sim_config_file(self) -> Path:
        """The driver's ``--sim-config``."""
        return self.node_dir / "sim.yaml"

    def sim_cli(self, *args: str) -> list[str]:
        """argv for ``python -m gpuplane.driver.hw.sim_cli`` on this node's simulator."""
        return [sys.executable, "-m", "gpuplane.driver.hw.sim_cli", "--state-dir", str(self.sim_state_dir), *args]
