"""The plan of the simulated nodes: one :class:`SimNode` per node, its directories, sockets, addresses and ports.

:func:`plan_nodes` names the nodes of each ``NodeGroup`` (``<profile>-<i>``), gives each its own
directories and loopback address, and puts the nodes of all ``gb200-nvl72`` groups in racks of up
to 18 that share a fabric cluster UUID and clique id. The unix sockets live under
``state_dir/s/<index>/``, or under ``/tmp/gpuplane-<hash>/`` when the state directory's path is too
long for AF_UNIX's 107 bytes (:func:`socket_root`). The plan is kept in ``state_dir/nodes.json``
(:func:`save_nodes`, :func:`load_nodes`); the rest is pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from e2e.cluster import controlplane
from e2e.plane import nodes, plan_files
from e2e.plane.plan_files import GB200_PROFILE, GB200_RACK_NODES, PROFILE_LABEL
from gpuplane.driver.hw import sim_profiles

# The longest socket path under a node's socket dir: p/mps/<claim uid>/pipe/control.
_LONGEST_SOCKET_SUFFIX = len("/p/mps/") + 36 + len("/pipe/control")


@dataclasses.dataclass(frozen=True)
class SimNode(plan_files.NodeFiles):
    """One simulated node: its name, hardware, directories and ports."""

    name: str
    profile: str
    index: int
    node_dir: Path
    socket_dir: Path
    host_ip: str
    metrics_port: int
    sim_config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    imex_port: int = 0  # the IMEX daemons' peer port (one per cluster, GB200 trays only); 0: no daemons

    @property
    def imex_control_dir(self) -> Path:
        """The IMEX stand-in's control directory (``GPUPLANE_IMEX_STANDIN_CONTROL``: slow, crash, drop)."""
        return self.node_dir / "imex-standin"

    @property
    def registry_dir(self) -> Path:
        """Where the driver puts its registration socket (kubelet's plugins_registry)."""
        return self.socket_dir / "r"

    @property
    def plugin_dir(self) -> Path:
        """The driver's plugin dir: DRA socket, checkpoint, lock, MPS pipes."""
        return self.socket_dir / "p"

    @property
    def kubelet_kubeconfig(self) -> Path:
        """The stand-in's credentials (system:node:<name>)."""
        return self.node_dir / "kubelet.kubeconfig"

    @property
    def kubelet_status(self) -> Path:
        """The stand-in's status file."""
        return self.node_dir / "kubelet.json"

    @property
    def driver_process(self) -> str:
        """Process (pidfile) name of the driver."""
        return f"driver-{self.name}"

    @property
    def kubelet_process(self) -> str:
        """Process (pidfile) name of the kubelet stand-in."""
        return f"kubelet-{self.name}"

    @property
    def labels(self) -> dict[str, str]:
        """Labels the stand-in gives the Node."""
        return {PROFILE_LABEL: self.profile}

    def to_json(self) -> dict[str, Any]:
        """For ``nodes.json``."""
        return {
            "name": self.name,
            "profile": self.profile,
            "index": self.index,
            "node_dir": str(self.node_dir),
            "socket_dir": str(self.socket_dir),
            "host_ip": self.host_ip,
            "metrics_port": self.metrics_port,
            "sim_config": dict(self.sim_config),
            "imex_port": self.imex_port,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SimNode:
        """From ``nodes.json``."""
        return cls(
            name=str(data["name"]),
            profile=str(data["profile"]),
            index=int(data["index"]),
            node_dir=Path(data["node_dir"]),
            socket_dir=Path(data["socket_dir"]),
            host_ip=str(data["host_ip"]),
            metrics_port=int(data["metrics_port"]),
            sim_config=dict(data.get("sim_config") or {}),
            imex_port=int(data.get("imex_port") or 0),
        )


@dataclasses.dataclass(frozen=True)
class ClusterAccess:
    """What node processes need to reach the control plane."""

    admin_kubeconfig: Path
    server: str
    ca_cert: Path
    pki_dir: Path

    @classmethod
    def from_state_dir(cls, state_dir: Path, kubeconfig: Path) -> ClusterAccess:
        """Read the server from the admin kubeconfig; the CA lives in ``state_dir/pki``."""
        data = yaml.safe_load(kubeconfig.read_text())
        server = str(data["clusters"][0]["cluster"]["server"])
        pki_dir = state_dir / "pki"
        return cls(admin_kubeconfig=kubeconfig, server=server, ca_cert=pki_dir / "ca.crt", pki_dir=pki_dir)


DriverCredentials = Callable[[SimNode, ClusterAccess], Path]
"""Returns the kubeconfig a node's driver runs with."""


def admin_credentials(node: SimNode, access: ClusterAccess) -> Path:
    """The admin kubeconfig (for clusters without gpuplane's RBAC installed)."""
    del node
    return access.admin_kubeconfig


def socket_root(state_dir: Path) -> Path:
    """``state_dir/s``, or a short directory in /tmp when socket paths under it would be too long."""
    return plan_files.short_root(state_dir / "s", state_dir, _LONGEST_SOCKET_SUFFIX, "gpuplane-", 10)


def plan_nodes(
    state_dir: Path,
    groups: Sequence[nodes.NodeGroup],
    *,
    existing: Sequence[SimNode] = (),
    rack_nodes: int = GB200_RACK_NODES,
) -> list[SimNode]:
    """Names, directories, addresses, ports and simulator configs for ``groups`` (after ``existing`` nodes).

    ``rack_nodes``: GB200 trays per rack (one NVLink domain each rack); smaller than a real NVL72's 18
    only for benchmarks that need several multi-node domains on a small machine.
    """
    for group in groups:
        sim_profiles.node_profile(group.profile)  # ValueError names the known profiles
    sockets = socket_root(state_dir)
    planned: list[SimNode] = []
    ports: set[int] = set()
    index = max((n.index + 1 for n in existing), default=0)
    taken = {n.name for n in existing}
    per_profile: dict[str, int] = {}
    gb200_seen = sum(1 for n in existing if n.profile == GB200_PROFILE)
    # One IMEX peer port for the cluster's trays (every daemon of a domain binds it, each on its node's loopback
    # address), chosen free at plan time: a second cluster on the machine plans its own.
    imex_port = next((n.imex_port for n in existing if n.imex_port), 0)
    for group in groups:
        for _ in range(group.count):
            number = per_profile.get(group.profile, 0)
            while f"{group.profile}-{number}" in taken:
                number += 1
            per_profile[group.profile] = number + 1
            name = f"{group.profile}-{number}"
            sim_config: dict[str, Any] = {}
            if group.profile == GB200_PROFILE:
                rack = gb200_seen // rack_nodes
                gb200_seen += 1
                sim_config = plan_files.gb200_rack_config(state_dir, rack)
                imex_port = imex_port or controlplane.free_port(ports)
            if index > 250:
                raise ValueError("at most 250 simulated nodes (one loopback address each)")
            planned.append(
                SimNode(
                    name=name,
                    profile=group.profile,
                    index=index,
                    node_dir=state_dir / "nodes" / name,
                    socket_dir=sockets / str(index),
                    host_ip=f"127.0.0.{index + 2}",
                    metrics_port=controlplane.free_port(ports),
                    sim_config=sim_config,
                    imex_port=imex_port if group.profile == GB200_PROFILE else 0,
                )
            )
            index += 1
    return planned


def nodes_file(state_dir: Path) -> Path:
    """Where the node plan is kept."""
    return state_dir / "nodes.json"


def load_nodes(state_dir: Path) -> list[SimNode]:
    """The nodes recorded for ``state_dir`` (empty if none)."""
    return plan_files.load_records(nodes_file(state_dir), SimNode.from_json)


def save_nodes(state_dir: Path, planned: Iterable[SimNode]) -> None:
    """Record the node plan."""
    plan_files.save_records(nodes_file(state_dir), (n.to_json() for n in planned))
