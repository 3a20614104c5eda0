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
from collections.abc import Iterator, Sequence
from pathlib import Path

from e2e.cluster import handle as cluster
from e2e.cluster import releases
from e2e.images import build as images
from e2e.plane import nodes, podinstall, realinstall, realinstall_compat, simnodes
from e2e.plane.realnode import nodes as realnodes
from e2e.plane.realnode import teardown
from e2e.plane.realnode.plan import RealNode
from tests.e2e.conftest import GpuCluster
from tests.e2e.realfixtures import DRIVER_ENV, RealCluster, skip_or_fail_without_real_nodes

REPO = podinstall.REPO
NS = realinstall.NAMESPACE
image_map = podinstall.image_map


@dataclasses.dataclass(kw_only=True)
class Install(podinstall.PodInstall):
    """``e2e.plane.podinstall.PodInstall`` on the test's real nodes, with the cluster's test helpers."""

    real: RealCluster


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
    built = podinstall.ensure_images(out=print)
    real = realnodes.RealNodes(
        state_dir,
        handle.kubeconfig,
        driver_credentials=lambda node: handle.kubeconfig,  # no host driver: never called
        release=release,
        driver_env=DRIVER_ENV,
        die_with_parent=True,
        out=lambda _: None,
    )
    port = podinstall.apiserver_port(handle.kubeconfig)
    started: list[RealNode] = []
    try:
        started = real.start(nodes.parse_node_spec(spec), host_driver=False)
        cluster = RealCluster(gpu=gpu_cluster, real=real)
        install = Install(
            real=cluster,
            admin=handle.kubectl,
            kubeconfig=handle.kubeconfig,
            state_dir=state_dir,
            nodes=started,
            out=lambda line: print(line, flush=True),
        )
        install.prepare_nodes()
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
