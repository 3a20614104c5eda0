"""gpuplane on real nodes as an operator runs it: the DaemonSet and the Deployment as pods, from the built images.

One flow, used by ``python -m e2e up --real-nodes`` / ``demo`` (the main job) and by the install,
rollout and upgrade tests (``tests/e2e/installkit``):

1. the images built from ``Dockerfile.driver`` / ``Dockerfile.controller`` (``e2e.images``, cached by
   content) imported into every real node's containerd (no registry: ``imagePullPolicy: Never``);
2. ``manifests/overlays/local`` rendered, with this machine's layout added
   (``e2e.plane.realinstall``: host root, pinned image names, the controller's replicas), written as
   ``<state>/install/<label>/kustomization.yaml`` and installed with ``kubectl apply -k``;
3. the real nodes labelled for the workloads (``realinstall.NODE_LABELS``), then waited for: the
   DaemonSet and the Deployment rolled out, every real node's driver registered by kubelet and its
   ResourceSlice pool complete.

:class:`PodInstall` holds one such install; :meth:`PodInstall.install` puts a version in place (N, or an
earlier commit's tree and images) and is also how ``up`` upgrades a running cluster: re-applying the
install of the current tree (a no-op when nothing changed). :func:`start_up` is ``up``'s step: real
nodes without a host driver, then the install; it records ``<state>/install.json`` so that a later
``up``, ``status`` and ``down`` know that the real nodes' driver and the controllers are pods.
Simulated nodes cannot run containers: their drivers stay host processes (``e2e.plane.simnodes``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from e2e.cluster import build as k8sbuild
from e2e.cluster import handle as cluster
from e2e.cluster.realnode import binaries, containerd
from e2e.images import build as images
from e2e.plane import identity, nodes, realinstall
from e2e.plane.realnode import nodes as realnodes
from e2e.plane.realnode import plan, readiness
from e2e.plane.realnode.plan import RealNode

Printer = Callable[[str], None]
Kubectl = Callable[..., str]

REPO = Path(__file__).resolve().parents[2]
NS = realinstall.NAMESPACE
ROLLOUT_TIMEOUT_S = 420
RECORD = "install.json"


def image_map(built: Sequence[images.BuiltImage]) -> dict[str, str]:
    """The overlay's image names -> the pinned names of ``built``."""
    return {f"{images.REGISTRY}/{b.name}": b.pinned_ref for b in built}


def apiserver_port(kubeconfig: Path) -> int:
    """The port of the kubeconfig's server (kube-apiserver on 127.0.0.1)."""
    server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    port = urlparse(str(server)).port
    if port is None:
        raise ValueError(f"{kubeconfig}: server {server!r} names no port")
    return int(port)


def ensure_images(out: Printer) -> list[images.BuiltImage]:
    """The driver and controller images, built from the Dockerfiles where the cache has no copy (timed)."""
    began = time.monotonic()
    built = images.ensure_images(cache=k8sbuild.cache_root(dict(os.environ)), out=out)
    for image in built:
        out(
            f"image {image.pinned_ref}: {'cache hit' if image.cached else f'built in {image.seconds:.0f}s'}, "
            f"{image.sizes.uncompressed / 1e6:.0f} MB unpacked, {image.sizes.compressed / 1e6:.0f} MB compressed"
        )
    out(f"images ready in {time.monotonic() - began:.1f}s")
    return built


@dataclasses.dataclass(kw_only=True)
class PodInstall:
    """The version of gpuplane installed on a cluster's real nodes, and how to install another."""

    admin: Kubectl
    """kubectl as the cluster admin (``Cluster.kubectl``)."""
    kubeconfig: Path
    state_dir: Path
    nodes: list[RealNode]
    replicas: int | None = None
    """The controller Deployment's replicas (None: the overlay's two)."""
    out: Printer = print
    installed: str = ""
    built: dict[str, list[images.BuiltImage]] = dataclasses.field(default_factory=dict)
    trees: dict[str, Path] = dataclasses.field(default_factory=dict)
    log: list[str] = dataclasses.field(default_factory=list)
    patches: dict[str, Callable[[str], Sequence[Mapping[str, Any]]]] = dataclasses.field(default_factory=dict)
    """label -> more patches for that version's install (``e2e.plane.realinstall_compat``)."""

    @property
    def layout(self) -> realinstall.Layout:
        """Where the real nodes keep their files (the overlay's host root is replaced by it)."""
        return realinstall.layout_of(self.nodes)

    def kubectl(self, *args: str, check: bool = True, timeout: float = 60) -> str:
        """kubectl as the cluster admin."""
        return self.admin(*args, check=check, timeout=timeout)

    def say(self, line: str) -> None:
        """Print and keep a line of the run's record."""
        self.out(line)
        self.log.append(line)

    def prepare_nodes(self) -> None:
        """Each node's names for the overlay, and the service address routed to kube-apiserver."""
        port = apiserver_port(self.kubeconfig)
        for node in self.nodes:
            realinstall.prepare_node(node)
            realinstall.route_api(node.bridge, port)

    def import_images(self, built: Sequence[images.BuiltImage]) -> None:
        """Import ``built`` into every real node's containerd (timed)."""
        for image in built:
            began = time.monotonic()
            realnodes.import_archive(self.state_dir, image.archive, out=lambda _: None)
            self.say(
                f"imported {image.pinned_ref} ({image.sizes.compressed / 1e6:.0f} MB compressed) into "
                f"{len(self.nodes)} containerd(s) in {time.monotonic() - began:.1f}s"
            )

    def label_nodes(self) -> None:
        """Give every real node the labels the workloads' node selectors ask for (``realinstall.NODE_LABELS``)."""
        labels = [f"{k}={v}" for k, v in realinstall.NODE_LABELS.items()]
        for node in self.nodes:
            self.kubectl("label", "node", node.name, "--overwrite", *labels)

    def install(self, label: str, tree: Path, built: Sequence[images.BuiltImage]) -> float:
        """``kubectl apply -k`` of ``tree``'s local overlay with ``built``'s images; the seconds until rolled out."""
        dest = self.state_dir / "install" / label
        extra = self.patches.get(label, lambda _: ())
        realinstall.write_install(
            self.kubectl,
            tree,
            self.layout,
            images=image_map(built),
            dest=dest,
            patches=extra,
            replicas=self.replicas,
            out=self.say,
        )
        began = time.monotonic()
        self.say(f"$ kubectl apply -k {dest}")
        self.say(self.kubectl("apply", "-k", str(dest), timeout=180).strip())
        self.label_nodes()  # after the apply: an e2e overlay's pinned workloads must never land on a real node
        self.say(f"waiting for the driver DaemonSet on {len(self.nodes)} real node(s) and the controller Deployment")
        self.wait_rolled_out()
        seconds = time.monotonic() - began
        self.installed = label
        self.built[label] = list(built)
        self.say(f"{label}: rolled out on {len(self.nodes)} real node(s) in {seconds:.1f}s")
        return seconds

    def wait_rolled_out(
        self,
        timeout: float = ROLLOUT_TIMEOUT_S,
        workloads: Sequence[str] = (f"daemonset/{realinstall.DAEMONSET}", f"deployment/{realinstall.DEPLOYMENT}"),
    ) -> None:
        """DaemonSet and Deployment rolled out; every node's driver registered and publishing."""
        for workload in workloads:
            self.kubectl("rollout", "status", "-n", NS, workload, f"--timeout={int(timeout)}s", timeout=timeout + 30)
        deadline = time.monotonic() + timeout
        with contextlib.closing(identity.new_client(self.kubeconfig)) as api:
            for node in self.nodes:
                while (problem := readiness.pool_problem(api, node.name)) is not None:
                    if time.monotonic() > deadline:
                        raise AssertionError(
                            f"{node.name}: {problem} {timeout:.0f}s after the install; see `kubectl logs -n {NS} "
                            f"-l app.kubernetes.io/name={realinstall.DAEMONSET}` and the node's kubelet log"
                        )
                    time.sleep(1)

    def install_driver(self, built: Sequence[images.BuiltImage], env: Mapping[str, str] | None = None) -> float:
        """Only the driver DaemonSet of this tree's install (plus ``env``), for a cluster whose controllers run
        elsewhere.

        For a shared test cluster: its CRDs, RBAC and policies came from ``manifests/overlays/e2e`` (the same
        base), its controllers are the session's host processes, and its e2e DaemonSet (pinned to a label no
        node had) is replaced by this one; ``manifests/overlays/e2e`` applied again puts it back. Returns the
        seconds until every real node's driver pod runs and its pool is published.
        """
        dest = self.state_dir / "install" / "driver"
        added = [
            {"op": "add", "path": "/spec/template/spec/containers/0/env/-", "value": {"name": k, "value": v}}
            for k, v in sorted((env or {}).items())
        ]
        patch = {"target": {"kind": "DaemonSet", "name": realinstall.DAEMONSET}, "patch": yaml.safe_dump(added)}
        realinstall.write_install(
            self.kubectl,
            REPO,
            self.layout,
            images=image_map(built),
            dest=dest,
            patches=lambda _: [patch] if added else [],
            out=self.say,
        )
        objects = yaml.safe_load_all(self.kubectl("kustomize", str(dest), timeout=120))
        (daemonset,) = [o for o in objects if o and o.get("kind") == "DaemonSet"]
        began = time.monotonic()
        self.say(f"$ kubectl apply (the DaemonSet {realinstall.DAEMONSET} of {dest})")
        self.admin("apply", "-f", "-", input_text=json.dumps(daemonset), timeout=120)
        self.label_nodes()
        self.wait_rolled_out(workloads=(f"daemonset/{realinstall.DAEMONSET}",))
        self.installed, self.built["driver"] = "driver", list(built)
        seconds = time.monotonic() - began
        self.say(f"driver DaemonSet: a pod on each of {len(self.nodes)} real node(s), publishing, in {seconds:.1f}s")
        return seconds

    def kubectl_json(self, *args: str) -> dict[str, Any]:
        """``kubectl get ... -o json``."""
        data: dict[str, Any] = json.loads(self.kubectl(*args, "-o", "json"))
        return data

    def pods_wide(self) -> str:
        """``kubectl get pods -n gpuplane-system -o wide``."""
        return self.kubectl("get", "pods", "-n", NS, "-o", "wide")

    def driver_pods(self) -> list[dict[str, Any]]:
        """The driver DaemonSet's pods (JSON)."""
        return realinstall.driver_pods(self.kubectl)

    def daemonset(self) -> dict[str, Any]:
        """The driver DaemonSet (JSON)."""
        return self.kubectl_json("get", "daemonset", "-n", NS, realinstall.DAEMONSET)

    def save_record(self) -> None:
        """``<state>/install.json``: what ``up``, ``status`` and ``down`` read back."""
        images_of = {label: [b.pinned_ref for b in built] for label, built in self.built.items()}
        record = {
            "installed": self.installed,
            "kustomization": str(self.state_dir / "install" / self.installed),
            "images": images_of.get(self.installed, []),
            "real_nodes": [n.name for n in self.nodes],
            "replicas": self.replicas,
        }
        (self.state_dir / RECORD).write_text(json.dumps(record, indent=2) + "\n")


def missing_images(real_nodes: Sequence[RealNode], built: Sequence[images.BuiltImage]) -> list[images.BuiltImage]:
    """Those of ``built`` that some real node's containerd does not hold yet."""
    ctr = binaries.ensure_node_binaries(out=lambda _: None).ctr
    held = [set(containerd.image_names(ctr, node.containerd_socket)) for node in real_nodes]
    return [b for b in built if any(b.pinned_ref not in names for names in held)]


def recorded(state_dir: Path) -> dict[str, Any] | None:
    """The install ``up`` recorded in ``state_dir`` (None: gpuplane's programs there are host processes)."""
    path = state_dir / RECORD
    if not path.is_file():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def forget(state_dir: Path) -> None:
    """Drop the record (``down``: the real nodes and their pods are gone)."""
    (state_dir / RECORD).unlink(missing_ok=True)


def start_up(
    state_dir: Path,
    handle: cluster.Cluster,
    groups: Sequence[nodes.NodeGroup],
    *,
    replicas: int,
    out: Printer,
) -> PodInstall:
    """``up``'s step with real nodes: start them (no host driver), install gpuplane as pods, record it."""
    built = ensure_images(out)
    described = ", ".join(f"{g.count}x {g.profile}" for g in groups)
    out(f"real nodes: starting {described} (each: containerd and kubelet; gpuplane comes as pods next)")
    real = realnodes.RealNodes(
        state_dir,
        handle.kubeconfig,
        driver_credentials=lambda node: handle.kubeconfig,  # host_driver=False: never called
        out=out,
    )
    started = real.start(groups, host_driver=False)
    real.detach()
    return install_current(state_dir, handle, started, built, replicas=replicas, out=out)


def install_current(
    state_dir: Path,
    handle: cluster.Cluster,
    real_nodes: Sequence[RealNode],
    built: Sequence[images.BuiltImage],
    *,
    replicas: int,
    out: Printer,
) -> PodInstall:
    """Install (or re-apply: an upgrade when the tree changed) this tree's version on ``real_nodes``."""
    install = PodInstall(
        admin=handle.kubectl,
        kubeconfig=handle.kubeconfig,
        state_dir=state_dir,
        nodes=list(real_nodes),
        replicas=replicas,
        out=out,
    )
    install.prepare_nodes()
    fresh = missing_images(real_nodes, built)
    if fresh:
        install.import_images(fresh)
    else:
        out(f"images {', '.join(b.pinned_ref for b in built)} already in the nodes' containerd")
    install.install("N", REPO, built)
    install.save_record()
    install.say("$ kubectl get pods -n gpuplane-system -o wide\n" + install.pods_wide().rstrip())
    return install


def reinstall(state_dir: Path, handle: cluster.Cluster, *, replicas: int, out: Printer) -> PodInstall:
    """A running cluster's install applied again from this tree (``up`` reusing the cluster)."""
    return install_current(state_dir, handle, plan.load(state_dir), ensure_images(out), replicas=replicas, out=out)
