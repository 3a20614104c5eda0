"""gpuplane installed on real nodes as an operator installs it: images in each containerd, ``kubectl apply -k``.

The object set is a tree's own ``manifests/overlays/local`` (this working tree for N,
an exported earlier commit for N-1, ``e2e.images.previous``), rendered by kustomize.
What this machine's layout needs beyond it is one listed delta, made in a generated
kustomization (``<state>/install/<label>/``) that ``kubectl apply -k`` installs:

* the overlay's host root ``/var/lib/gpuplane-local`` is this cluster's real-node
  directory (``<state>/realnodes``: each node's ``sim.yaml``, ``cdi/``, ``sim/``), and
  the nodes' short runtime root (their kubelet roots, ``e2e.plane.realnode.plan``) is
  mounted too, at the same path: the driver writes host paths into CDI specs;
* the images are the pinned names of the build being installed (N-1 and N can sit in
  one containerd side by side; ``:dev`` names only the newest).

:func:`prepare_node` gives each node the names the overlay expects:
``<node dir>/kubelet`` (a link to the node's kubelet root; the driver resolves it, so
socket paths stay short), ``<node dir>/sim.yaml`` (profile and NVLink identity) and
``<plugin dir>/sim`` (a link to ``<node dir>/sim``: a driver without
``--sim-state-dir``, as the overlay runs it, keeps the simulator's state there, so every
version sees the same simulated hardware). :func:`route_api` lets the pods reach
kube-apiserver, which listens on 127.0.0.1 only: the service address ``10.0.0.1:443``
that in-cluster clients use is DNATed to it on each node's bridge (what kube-proxy would
do; the rule names the bridge, so the node's teardown removes it).
"""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import yaml

from gpuplane.api import names

Printer = Callable[[str], None]
Kubectl = Callable[..., str]

LOCAL_ROOT = "/var/lib/gpuplane-local"
OVERLAY = Path("manifests") / "overlays" / "local"
NAMESPACE = "gpuplane-system"
DAEMONSET = "gpuplane-driver"
DEPLOYMENT = "gpuplane-controller"
SERVICE_IP = "10.0.0.1"
SERVICE_PORT = 443
NODE_LABELS = {"gpuplane.dev/containerized": "true", "gpu.gpuplane.dev/present": "true"}
"""What the DaemonSet's node affinity and the overlay's nodeSelector ask of a node."""


class Node(Protocol):
    """The parts of a real node (``e2e.plane.realnode.plan.RealNode``) an install needs."""

    @property
    def name(self) -> str: ...
    @property
    def profile(self) -> str: ...
    @property
    def node_dir(self) -> Path: ...
    @property
    def kubelet_root(self) -> Path: ...
    @property
    def plugin_dir(self) -> Path: ...
    @property
    def sim_state_dir(self) -> Path: ...
    @property
    def bridge(self) -> str: ...
    @property
    def sim_config(self) -> Mapping[str, Any]: ...


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where this cluster's real nodes keep their files on the machine."""

    nodes_root: Path  # <state>/realnodes: one <node name>/ each
    runtime_root: Path  # the short root of the kubelet dirs


def layout_of(nodes: Sequence[Node]) -> Layout:
    """The common roots of ``nodes`` (every node of one cluster shares both)."""
    roots = {n.node_dir.parent for n in nodes}
    runtime = {n.kubelet_root.parent.parent for n in nodes}
    if len(roots) != 1 or len(runtime) != 1:
        raise ValueError(f"nodes of more than one cluster: {sorted(map(str, roots | runtime))}")
    return Layout(roots.pop(), runtime.pop())


def _link(path: Path, target: Path) -> None:
    if path.is_symlink() and path.readlink() == target:
        return
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        raise FileExistsError(f"{path} exists and is not a link to {target}: remove it or start the node again")
    path.symlink_to(target)


def prepare_node(node: Node) -> None:
    """The per-node names the local overlay expects (see the module docstring)."""
    node.node_dir.mkdir(parents=True, exist_ok=True)
    node.sim_state_dir.mkdir(parents=True, exist_ok=True)
    _link(node.node_dir / "kubelet", node.kubelet_root)
    node.plugin_dir.mkdir(parents=True, exist_ok=True)
    _link(node.plugin_dir / "sim", node.sim_state_dir)
    config = {"profile": node.profile, **dict(node.sim_config)}
    (node.node_dir / "sim.yaml").write_text(yaml.safe_dump(config, sort_keys=True))


def substitute_root(rendered: str, layout: Layout) -> str:
    """The rendered overlay with its host root replaced by this cluster's; ValueError if the overlay has none."""
    if LOCAL_ROOT not in rendered:
        raise ValueError(f"the overlay names no {LOCAL_ROOT}: not manifests/overlays/local?")
    return rendered.replace(LOCAL_ROOT, str(layout.nodes_root))


def _repository(ref: str) -> tuple[str, str]:
    name, _, tag = ref.rpartition(":")
    if not name or "/" in tag:
        raise ValueError(f"image reference {ref!r} has no tag")
    return name, tag


def kustomization(
    layout: Layout,
    images: Mapping[str, str],
    patches: Sequence[Mapping[str, Any]] = (),
    replicas: int | None = None,
) -> dict[str, Any]:
    """``kustomization.yaml`` over ``rendered.yaml``: the pinned images, the runtime root's volume, ``patches``.

    ``replicas``: the controller Deployment's (None keeps the overlay's).
    """
    runtime = str(layout.runtime_root)
    volume = {"name": "real-node-runtime", "hostPath": {"path": runtime, "type": "Directory"}}
    mount = {"name": "real-node-runtime", "mountPath": runtime}
    patch = [
        {"op": "add", "path": "/spec/template/spec/volumes/-", "value": volume},
        {"op": "add", "path": "/spec/template/spec/containers/0/volumeMounts/-", "value": mount},
    ]
    entries = []
    for current, ref in sorted(images.items()):
        name, tag = _repository(ref)
        entries.append({"name": current, "newName": name, "newTag": tag})
    written: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["rendered.yaml"],
        "images": entries,
        "patches": [
            {"target": {"kind": "DaemonSet", "name": DAEMONSET}, "patch": yaml.safe_dump(patch)},
            *(dict(p) for p in patches),
        ],
    }
    if replicas is not None:
        if replicas < 0:
            raise ValueError(f"controller replicas must be 0 or more, not {replicas}")
        written["replicas"] = [{"name": DEPLOYMENT, "count": replicas}]
    return written


def rendered(kubectl: Kubectl, tree: Path) -> str:
    """``kubectl kustomize`` of ``tree``'s local overlay, as written there."""
    return kubectl("kustomize", str(tree / OVERLAY), timeout=120)


def write_install(
    kubectl: Kubectl,
    tree: Path,
    layout: Layout,
    *,
    images: Mapping[str, str],
    dest: Path,
    patches: Callable[[str], Sequence[Mapping[str, Any]]] = lambda _: (),
    replicas: int | None = None,
    out: Printer = print,
) -> Path:
    """Render ``tree``'s local overlay and write the install kustomization to ``dest``; return ``dest``.

    ``patches``: more kustomize patches, made from the rendered overlay (``e2e.plane.realinstall_compat``);
    ``replicas``: the controller Deployment's (None: the overlay's).
    """
    dest.mkdir(parents=True, exist_ok=True)
    text = substitute_root(rendered(kubectl, tree), layout)
    (dest / "rendered.yaml").write_text(text)
    written = kustomization(layout, images, patches(text), replicas)
    (dest / "kustomization.yaml").write_text(yaml.safe_dump(written, sort_keys=False))
    out(f"install of {tree}: {dest}/kustomization.yaml (images {', '.join(sorted(images.values()))})")
    return dest


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False)


def api_rule(bridge: str, apiserver_port: int) -> list[str]:
    """The nat PREROUTING rule (``iptables -A`` arguments) taking the service address to kube-apiserver."""
    return [
        "PREROUTING",
        "-i",
        bridge,
        "-d",
        f"{SERVICE_IP}/32",
        "-p",
        "tcp",
        "--dport",
        str(SERVICE_PORT),
        "-m",
        "comment",
        "--comment",
        f"gpuplane {bridge} kube-apiserver",
        "-j",
        "DNAT",
        "--to-destination",
        f"127.0.0.1:{apiserver_port}",
    ]


def route_api(bridge: str, apiserver_port: int) -> None:
    """Let pods on ``bridge`` reach kube-apiserver at the service address (idempotent)."""
    sysctl = Path("/proc/sys/net/ipv4/conf") / bridge / "route_localnet"
    sysctl.write_text("1\n")
    rule = api_rule(bridge, apiserver_port)
    if _run("iptables", "-w", "-t", "nat", "-C", *rule).returncode == 0:
        return
    done = _run("iptables", "-w", "-t", "nat", "-A", *rule)
    if done.returncode != 0:
        raise RuntimeError(f"iptables could not add the kube-apiserver route for {bridge}: {done.stderr.strip()}")


def unroute_api(bridge: str, apiserver_port: int) -> None:
    """Remove :func:`route_api`'s rule (the node's teardown removes it too)."""
    _run("iptables", "-w", "-t", "nat", "-D", *api_rule(bridge, apiserver_port))


def driver_pods(kubectl: Kubectl) -> list[dict[str, Any]]:
    """The driver DaemonSet's pods."""
    listed = kubectl("get", "pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/name={DAEMONSET}", "-o", "json")
    items: list[dict[str, Any]] = yaml.safe_load(listed)["items"]
    return items


def registration_sockets(node: Node) -> list[str]:
    """The driver's registration sockets in the node's kubelet registry dir (one per plugin pod)."""
    registry = node.kubelet_root / "plugins_registry"
    return sorted(p.name for p in registry.glob(f"{names.DRIVER_NAME}-*reg.sock"))
