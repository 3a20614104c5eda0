"""gpuplane installed on real nodes by ``kubectl apply -k`` (DaemonSet and Deployment as pods), for the install tests.

``installed_cluster(plane, spec)`` adds real nodes (a real kubelet and containerd
each, ``e2e.plane.realnode``) to a control plane of the module's own (nothing of
gpuplane on it yet: no host driver, no host controller), builds N's images from this
tree's Dockerfiles and imports them into every node's containerd, and installs this
tree's ``manifests/overlays/local`` through ``e2e.plane.realinstall`` (the generated
kustomization; ``kubectl apply -k``). It returns when the driver DaemonSet has a
Running, Ready pod on every real node, each registered by kubelet and publishing, and
the controller Deployment's two pods are available (they alone hold the leader Lease:
the cluster runs no other controller). :meth:`Install.install` puts another version
(an earlier commit's tree and images, ``e2e.images.previous``) in place the same way.
On exit the real nodes are taken off the machine; anything of them left fails.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from e2e.cluster import build as k8sbuild
from e2e.cluster import handle as cluster
from e2e.cluster import releases
from e2e.images import build as images
from e2e.plane import identity, nodes, realinstall, realinstall_compat, simnodes
from e2e.plane.realnode import nodes as realnodes
from e2e.plane.realnode import readiness, teardown
from e2e.plane.realnode.plan import RealNode
from tests.e2e.conftest import GpuCluster
from tests.e2e.realfixtures import DRIVER_ENV, RealCluster, skip_or_fail_without_real_nodes

REPO = Path(__file__).resolve().parents[2]
NS = realinstall.NAMESPACE
ROLLOUT_TIMEOUT_S = 420


def image_map(built: Sequence[images.BuiltImage]) -> dict[str, str]:
    """The overlay's image names -> the pinned names of ``built``."""
    return {f"{images.REGISTRY}/{b.name}": b.pinned_ref for b in built}


@dataclasses.dataclass
class Install:
    """The cluster, its real nodes and the version installed on them."""

    real: RealCluster
    layout: realinstall.Layout
    installed: str = ""
    built: dict[str, list[images.BuiltImage]] = dataclasses.field(default_factory=dict)
    trees: dict[str, Path] = dataclasses.field(default_factory=dict)
    log: list[str] = dataclasses.field(default_factory=list)
    patches: dict[str, Callable[[str], Sequence[Mapping[str, Any]]]] = dataclasses.field(default_factory=dict)
    """label -> more patches for that version's install (``e2e.plane.realinstall_compat``)."""

    @property
    def nodes(self) -> list[RealNode]:
        """The real nodes."""
        return self.real.nodes

    def kubectl(self, *args: str, check: bool = True, timeout: float = 60) -> str:
        """kubectl as the cluster admin."""
        return self.real.kubectl(*args, check=check, timeout=timeout)

    def say(self, line: str) -> None:
        """Print and keep a line of the run's record."""
        print(line, flush=True)
        self.log.append(line)

    def import_images(self, built: Sequence[images.BuiltImage]) -> None:
        """Import ``built`` into every real node's containerd (timed)."""
        state_dir = self.real.real.state_dir
        for image in built:
            began = time.monotonic()
            realnodes.import_archive(state_dir, image.archive, out=lambda _: None)
            self.say(
                f"imported {image.pinned_ref} ({image.sizes.compressed / 1e6:.0f} MB compressed) into "
                f"{len(self.nodes)} containerd(s) in {time.monotonic() - began:.1f}s"
            )

    def install(self, label: str, tree: Path, built: Sequence[images.BuiltImage]) -> float:
        """``kubectl apply -k`` of ``tree``'s local overlay with ``built``'s images; the seconds until rolled out."""
        dest = self.real.real.state_dir / "install" / label
        extra = self.patches.get(label, lambda _: ())
        realinstall.write_install(
            self.kubectl, tree, self.layout, images=image_map(built), dest=dest, patches=extra, out=self.say
        )
        began = time.monotonic()
        self.say(f"$ kubectl apply -k {dest}")
        self.say(self.kubectl("apply", "-k", str(dest), timeout=180).strip())
        for node in self.nodes:  # after the apply: the session's overlays/e2e must never land on a real node
            labels = [f"{k}={v}" for k, v in realinstall.NODE_LABELS.items()]
            self.kubectl("label", "node", node.name, "--overwrite", *labels)
        self.wait_rolled_out()
        seconds = time.monotonic() - began
        self.installed = label
        self.say(f"{label}: rolled out on {len(self.nodes)} real node(s) in {seconds:.1f}s")
        return seconds

    def wait_rolled_out(self, timeout: float = ROLLOUT_TIMEOUT_S) -> None:
        """DaemonSet and Deployment rolled out; every node's driver registered and publishing."""
        for workload in (f"daemonset/{realinstall.DAEMONSET}", f"deployment/{realinstall.DEPLOYMENT}"):
            self.kubectl("rollout", "status", "-n", NS, workload, f"--timeout={int(timeout)}s", timeout=timeout + 30)
        deadline = time.monotonic() + timeout
        with contextlib.closing(identity.new_client(self.real.gpu.cluster.kubeconfig)) as api:
            for node in self.nodes:
                while (problem := readiness.pool_problem(api, node.name)) is not None:
                    if time.monotonic() > deadline:
                        raise AssertionError(f"{node.name}: {problem}")
                    time.sleep(1)

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
        data: dict[str, Any] = json.loads(
            self.kubectl("get", "daemonset", "-n", NS, realinstall.DAEMONSET, "-o", "json")
        )
        return data


def _apiserver_port(kubeconfig: Path) -> int:
    server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    port = urlparse(server).port
    assert port is not None, server
    return port


@contextlib.contextmanager
def installed_cluster(
    handle: cluster.Cluster,
    spec: str,
    first: tuple[str, Path, Sequence[images.BuiltImage]] | None = None,
    *,
    compat: bool = False,
    release: releases.Release = releases.RUNNING,
) -> Iterator[Install]:
    """Real nodes of ``spec`` with gpuplane installed by ``kubectl apply -k`` (see the module docstring).

    ``first``: (label, tree, images) of the version to install instead of N (this tree); its images are
    imported beside N's. ``compat``: that version predates the real-node fixes; its installs get
    ``e2e.plane.realinstall_compat``'s patches. ``release``: the Kubernetes release of the nodes' kubelets
    (default the running one; the control plane is the caller's).
    """
    skip_or_fail_without_real_nodes()
    assert handle.state_dir is not None
    state_dir = handle.state_dir.resolve()
    # No simulated node is started: the GpuCluster gives the example helpers; its node list stays empty.
    gpu_cluster = GpuCluster(cluster=handle, sim=simnodes.SimNodes(state_dir, handle.kubeconfig, out=lambda _: None))
    began = time.monotonic()
    built = images.ensure_images(cache=k8sbuild.cache_root(dict(os.environ)), out=print)
    for image in built:
        print(
            f"image {image.pinned_ref}: {'cache hit' if image.cached else f'built in {image.seconds:.0f}s'}, "
            f"{image.sizes.uncompressed / 1e6:.0f} MB unpacked, {image.sizes.compressed / 1e6:.0f} MB compressed"
        )
    print(f"images ready in {time.monotonic() - began:.1f}s")
    real = realnodes.RealNodes(
        state_dir,
        handle.kubeconfig,
        driver_credentials=lambda node: handle.kubeconfig,  # no host driver: never called
        release=release,
        driver_env=DRIVER_ENV,
        die_with_parent=True,
        out=lambda _: None,
    )
    port = _apiserver_port(handle.kubeconfig)
    started: list[RealNode] = []
    try:
        started = real.start(nodes.parse_node_spec(spec), host_driver=False)
        cluster = RealCluster(gpu=gpu_cluster, real=real)
        install = Install(cluster, realinstall.layout_of(started))
        for node in started:
            realinstall.prepare_node(node)
            realinstall.route_api(node.bridge, port)
        install.import_images(built)
        install.built["N"] = list(built)
        if first is None:
            install.install("N", REPO, built)
        else:
            label, tree, first_built = first
            if compat:
                install.patches[label] = lambda text: realinstall_compat.patches(text, install.layout, started)
                install.say(f"{label} predates {realinstall_compat.FIXED_IN[:12]}: its install gets the compat patches")
            install.import_images([b for b in first_built if b.pinned_ref not in {n.pinned_ref for n in built}])
            install.built[label] = list(first_built)
            install.trees[label] = tree
            install.install(label, tree, first_built)
        install.say("$ kubectl get pods -n gpuplane-system -o wide\n" + install.pods_wide())
        yield install
    finally:
        for node in started:
            realinstall.unroute_api(node.bridge, port)
        left = real.stop()
    leftovers = {n.name: teardown.leftovers(n) for n in started}
    assert not left and not any(leftovers.values()), f"real nodes left behind: {left} {leftovers}"
