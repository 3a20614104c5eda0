"""``--real-nodes`` of ``python -m e2e up``/``demo``: what it means (``e2e.plane.podinstall`` starts them).

``--real-nodes PROFILE[:COUNT],...`` asks for real nodes (an error names what the
machine lacks); ``auto`` (the default of ``demo``, the main job) means one real
``hgx-h100`` node where this machine can run one, and otherwise a one-line reason
and simulated nodes only; ``''`` (the default of ``up``) means none.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from e2e.cluster import handle as cluster
from e2e.cluster.realnode import binaries, host
from e2e.plane import components, identity, nodes
from e2e.plane.realnode import plan
from e2e.plane.realnode.nodes import RealNodes, stop_nodes
from e2e.plane.realnode.plan import RealNode

Printer = Callable[[str], None]

AUTO = "auto"
DEFAULT_SPEC = "hgx-h100:1"
HELP = (
    f"real nodes (kubelet + containerd), PROFILE[:COUNT],...; '{AUTO}': {DEFAULT_SPEC} where this machine "
    "can run one (root, cgroups, Debian's runc and CNI plugins), else none; '' for none"
)


def resolve(spec: str, out: Printer) -> tuple[nodes.NodeGroup, ...]:
    """The real-node groups ``spec`` asks for; ``auto`` falls back to none with a one-line reason."""
    if spec.strip() != AUTO:
        return nodes.parse_node_spec(spec)
    found = host.problems()
    if found:
        out(f"real nodes: none, simulated nodes only ({'; '.join(found)})")
        return ()
    return nodes.parse_node_spec(DEFAULT_SPEC)


def driver_credentials(handle: cluster.Cluster, state_dir: Path, seconds: int) -> Callable[[RealNode], Path]:
    """A real node's driver runs as the gpuplane-driver ServiceAccount, its token bound to a pod on the node."""
    directory = components.identities_dir(state_dir)

    def credentials(node: RealNode) -> Path:
        return identity.driver_identity(handle, node.name, directory, seconds=seconds).kubeconfig

    return credentials


def ensure_binaries(out: Printer) -> binaries.NodeBinaries:
    """kubelet, containerd, ctr, the runc shim and pause, built into the cache if missing."""
    return binaries.ensure_node_binaries(out=out)


def process_names(state_dir: Path, *, host_driver: bool = True) -> list[tuple[str, ...]]:
    """The pidfile names of each real node's processes (driver, kubelet, containerd; no driver where it is a pod)."""
    return [node.processes[0 if host_driver else 1 :] for node in plan.load(state_dir)]


def running(state_dir: Path, handle: cluster.Cluster, *, host_driver: bool = True) -> bool:
    """Whether every real node recorded in ``state_dir`` runs (containerd, kubelet and, ``host_driver``, driver)."""
    real = RealNodes(state_dir, handle.kubeconfig, driver_credentials=lambda node: handle.kubeconfig)
    return real.all_running(host_driver=host_driver)


__all__ = [
    "AUTO",
    "DEFAULT_SPEC",
    "HELP",
    "ensure_binaries",
    "process_names",
    "resolve",
    "running",
    "stop_nodes",
]
