"""The plan of a cluster's real nodes: names, directories, ports, subnets, and the names of what they make.

Everything a real node makes on the machine is named from the cluster's *tag*
(six hex digits of the state directory's hash) and the node's index, so two
clusters on one machine (two engineers' test runs, pytest beside the demo) never
touch each other's bridge (``gp<tag>r<i>``), cgroup (``/gpuplane-<tag>-r<i>``)
or CNI network (``gpuplane-<tag>-r<i>``).

Directories of node ``<name>``:

* ``<state>/realnodes/<name>/``: configuration (``containerd.toml``,
  ``kubelet.yaml``, the kubelet's kubeconfig), the CNI config (``cni/``) and IPAM
  store (``ipam/``), the CDI spec dir (``cdi/``: the driver writes, containerd
  reads), the simulator's state (``sim/``);
* a short *base* dir (``<state>/rn/<i>``, or ``/tmp/gprn-<hash>/<i>`` when that
  would make socket paths too long for AF_UNIX): the kubelet root dir (``k/``,
  with ``plugins_registry/`` and ``plugins/gpu.gpuplane.dev/`` where the driver's
  sockets, checkpoint and MPS pipes live), containerd's root (``c/``), state
  (``s/``: runc state, shim sockets, network namespaces) and socket.

The plan is kept in ``<state>/realnodes.json`` so that ``python -m e2e down`` in
another process finds everything to stop and remove.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from e2e.cluster import controlplane
from e2e.cluster.realnode import network
from e2e.plane import nodes, plan_files
from e2e.plane.plan_files import GB200_PROFILE, GB200_RACK_NODES, PROFILE_LABEL
from gpuplane.api import names
from gpuplane.driver.hw import sim_profiles

# The longest socket path under a kubelet root: the MPS control socket of a claim.
_LONGEST_SOCKET_SUFFIX = len(f"/k/plugins/{names.DRIVER_NAME}/mps/") + 36 + len("/pipe/control")
REAL_NODE_LABEL = "gpuplane.dev/real-node"


def cluster_tag(state_dir: Path) -> str:
    """Six hex digits naming this cluster's bridges, cgroups and networks."""
    return hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:6]


def base_root(state_dir: Path) -> Path:
    """``<state>/rn``, or ``/tmp/gprn-<hash>`` when socket paths under it would be too long."""
    resolved = state_dir.resolve()
    return plan_files.short_root(resolved / "rn", resolved, _LONGEST_SOCKET_SUFFIX, "gprn-", 8)


@dataclasses.dataclass(frozen=True)
class RealNode(plan_files.NodeFiles):
    """One real node of the plan."""

    name: str
    profile: str
    index: int
    tag: str
    node_dir: Path
    base_dir: Path
    subnet: str
    kubelet_port: int
    healthz_port: int
    metrics_port: int
    sim_config: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    # Names of what the node makes on the machine ------------------------------------
    @property
    def bridge(self) -> str:
        """The pod bridge."""
        return f"gp{self.tag}r{self.index}"

    @property
    def network(self) -> str:
        """The CNI network name."""
        return f"gpuplane-{self.tag}-r{self.index}"

    @property
    def cgroup_root(self) -> str:
        """kubelet's cgroupRoot."""
        return f"/gpuplane-{self.tag}-r{self.index}"

    @property
    def ip_network(self) -> ipaddress.IPv4Network:
        """The pod subnet."""
        return ipaddress.IPv4Network(self.subnet)

    @property
    def node_ip(self) -> str:
        """The node's InternalIP: the bridge's address."""
        return str(network.gateway(self.ip_network))

    # Runtime directories (short paths) -------------------------------------------------
    @property
    def kubelet_root(self) -> Path:
        """kubelet's --root-dir."""
        return self.base_dir / "k"

    @property
    def registry_dir(self) -> Path:
        """kubelet's plugin registry (the driver's registration socket)."""
        return self.kubelet_root / "plugins_registry"

    @property
    def plugin_dir(self) -> Path:
        """The driver's plugin dir in kubelet's root: DRA socket, checkpoint, MPS pipes."""
        return self.kubelet_root / "plugins" / names.DRIVER_NAME

    @property
    def containerd_root(self) -> Path:
        """containerd's root (content, snapshots, metadata)."""
        return self.base_dir / "c"

    @property
    def containerd_state(self) -> Path:
        """containerd's state (runc state, shim sockets, network namespaces)."""
        return self.base_dir / "s"

    @property
    def containerd_socket(self) -> Path:
        """containerd's gRPC socket (kubelet's containerRuntimeEndpoint)."""
        return self.base_dir / "containerd.sock"

    # Configuration and data under the state directory ------------------------------------
    @property
    def cni_conf_dir(self) -> Path:
        """containerd's CNI conf_dir."""
        return self.node_dir / "cni"

    @property
    def ipam_dir(self) -> Path:
        """host-local's dataDir."""
        return self.node_dir / "ipam"

    @property
    def containerd_config(self) -> Path:
        """containerd's config file."""
        return self.node_dir / "containerd.toml"

    @property
    def kubelet_config(self) -> Path:
        """kubelet's config file."""
        return self.node_dir / "kubelet.yaml"

    @property
    def kubelet_kubeconfig(self) -> Path:
        """kubelet's credentials (system:node:<name>)."""
        return self.node_dir / "kubelet.kubeconfig"

    # Processes ---------------------------------------------------------------------------
    @property
    def processes(self) -> tuple[str, str, str]:
        """Pidfile names, in stop order: driver, kubelet, containerd."""
        return (f"driver-{self.name}", f"kubelet-{self.name}", f"containerd-{self.name}")

    @property
    def labels(self) -> dict[str, str]:
        """Labels kubelet gives its Node (all allowed by NodeRestriction)."""
        return {PROFILE_LABEL: self.profile, REAL_NODE_LABEL: "true"}

    def to_json(self) -> dict[str, Any]:
        """For ``realnodes.json``."""
        data = dataclasses.asdict(self)
        data["node_dir"], data["base_dir"] = str(self.node_dir), str(self.base_dir)
        data["sim_config"] = dict(self.sim_config)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RealNode:
        """From ``realnodes.json``."""
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields}
        values["node_dir"], values["base_dir"] = Path(data["node_dir"]), Path(data["base_dir"])
        return cls(**values)


def plan_file(state_dir: Path) -> Path:
    """Where the plan is kept."""
    return state_dir / "realnodes.json"


def load(state_dir: Path) -> list[RealNode]:
    """The real nodes recorded for ``state_dir``."""
    return plan_files.load_records(plan_file(state_dir), RealNode.from_json)


def save(state_dir: Path, planned: Iterable[RealNode]) -> None:
    """Record the plan (atomically)."""
    plan_files.save_records(plan_file(state_dir), (n.to_json() for n in planned))


def node_names(profile: str, count: int, taken: Iterable[str]) -> list[str]:
    """``<profile>-real-<n>`` names not yet taken."""
    used = set(taken)
    out: list[str] = []
    number = 0
    while len(out) < count:
        name = f"{profile}-real-{number}"
        if name not in used:
            out.append(name)
            used.add(name)
        number += 1
    return out


def subnets_of(planned: Sequence[RealNode]) -> list[ipaddress.IPv4Network]:
    """The subnets a plan holds."""
    return [n.ip_network for n in planned]


def plan_nodes(
    state_dir: Path,
    groups: Sequence[nodes.NodeGroup],
    existing: Sequence[RealNode],
    used: Sequence[ipaddress.IPv4Network],
) -> list[RealNode]:
    """Names, directories, ports and free subnets for ``groups`` after ``existing``."""
    tag = cluster_tag(state_dir)
    base = base_root(state_dir)
    seed = int(tag, 16)
    taken_subnets = subnets_of(existing)
    index = max((n.index + 1 for n in existing), default=0)
    ports: set[int] = set()
    planned: list[RealNode] = []
    gb200_seen = sum(1 for n in existing if n.profile == GB200_PROFILE)
    taken_names = [n.name for n in existing]
    for group in groups:
        sim_profiles.node_profile(group.profile)  # ValueError names the known profiles
        for name in node_names(group.profile, group.count, taken_names):
            taken_names.append(name)
            subnet = network.pick_subnet(seed, used, taken_subnets)
            taken_subnets.append(subnet)
            sim_config: dict[str, Any] = {}
            if group.profile == GB200_PROFILE:
                rack = gb200_seen // GB200_RACK_NODES
                gb200_seen += 1
                sim_config = plan_files.gb200_rack_config(state_dir, rack, kind="real-rack")
            planned.append(
                RealNode(
                    name=name,
                    profile=group.profile,
                    index=index,
                    tag=tag,
                    node_dir=state_dir / "realnodes" / name,
                    base_dir=base / str(index),
                    subnet=str(subnet),
                    kubelet_port=controlplane.free_port(ports),
                    healthz_port=controlplane.free_port(ports),
                    metrics_port=controlplane.free_port(ports),
                    sim_config=sim_config,
                )
            )
            index += 1
    return planned
