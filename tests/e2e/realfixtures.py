"""Fixtures for tests on real nodes: a real kubelet v1.36 and containerd 2.x per node (``e2e.plane.realnode``).

``real_cluster`` (module) adds ``REAL_NODES`` real nodes to the session's
``gpu_cluster`` (same control plane, gpuplane installed, the controllers
running) with gpuplane's driver as operators run it: the driver DaemonSet's pod on each
(``e2e.plane.podinstall.PodInstall.install_driver``: the image built from ``Dockerfile.driver``,
this tree's ``manifests/overlays/local`` DaemonSet; the session's controllers stay host processes,
as they serve every module's simulated nodes; the Deployment is tested on clusters of its own,
``tests/e2e/installkit``). A module that needs the driver as a host process on purpose (it
restarts the process in place, or reads its call log from the first call across restarts) sets
``HOST_DRIVER = True`` and gets ``gpuplane-driver`` as a host process under its ServiceAccount. At the end
of the module takes them off the machine (and out of the API) and fails if
anything of them is left (process, mount, cgroup, bridge, iptables rule, CNI
cache entry, directory). Module scope keeps the other modules' clusters as they
were: their scenarios never land on a real node.
``only_real_nodes`` (module) cordons the session's simulated nodes for the
module, so the real scheduler can place the examples (as written) only on the
real nodes.

Where the machine cannot run real nodes (not root, Debian packages missing)
the tests are skipped with the reason, unless ``GPUPLANE_REAL_NODES=required``
(``.ci/run`` sets it), where that is a failure.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import pytest

from e2e.cluster.realnode import host
from e2e.plane import components, identity, nodes, podinstall, realinstall
from e2e.plane.realnode import cli, teardown
from e2e.plane.realnode.nodes import RealNodes
from e2e.plane.realnode.plan import RealNode
from gpuplane.driver.prepare import checkpoint

if TYPE_CHECKING:  # conftest imports this module: no import back at run time
    from tests.e2e.conftest import GpuCluster

REAL_NODES = "hgx-h100:1,gb200-nvl72:2"
HOST_DRIVER = "HOST_DRIVER"
"""A module that sets ``HOST_DRIVER = True`` gets the driver as a host process instead of the DaemonSet's pod."""
REQUIRED_ENV = "GPUPLANE_REAL_NODES"
DRIVER_ENV = {"GPUPLANE_TAINT_CLEAR_AFTER": "3", "GPUPLANE_HEALTH_POLL_INTERVAL": "0.5"}
"""Short health timings (as tests/e2e/test_health.py uses): a taint clears 3 s after recovery."""


@dataclasses.dataclass
class RealCluster:
    """The session's cluster with its real nodes."""

    gpu: GpuCluster
    real: RealNodes

    @property
    def nodes(self) -> list[RealNode]:
        """The real nodes of this session."""
        return self.real.started

    def node(self, name: str) -> RealNode:
        """One of them by name (a pod bound elsewhere fails here)."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise AssertionError(f"{name} is not a real node of this session ({[n.name for n in self.nodes]})")

    def of_profile(self, profile: str) -> list[RealNode]:
        """The real nodes of one profile."""
        return [n for n in self.nodes if n.profile == profile]

    def kubectl(self, *args: str, check: bool = True, timeout: float = 60) -> str:
        """kubectl on the cluster."""
        return self.gpu.cluster.kubectl(*args, check=check, timeout=timeout)

    def kubectl_json(self, *args: str) -> dict[str, Any]:
        """``kubectl ... -o json``."""
        return self.gpu.kubectl_json(*args)

    def exec(self, namespace: str, pod: str, *command: str, container: str | None = None) -> str:
        """``kubectl exec`` (through kube-apiserver, the real kubelet and containerd's streaming server)."""
        which = ["-c", container] if container else []
        return self.kubectl("exec", "-n", namespace, pod, *which, "--", *command, timeout=60)

    def checkpoint(self, node: RealNode) -> checkpoint.Checkpoint:
        """The node driver's checkpoint."""
        if not node.checkpoint.exists():
            return checkpoint.Checkpoint()
        return checkpoint.decode(node.checkpoint.read_bytes())

    def sim_state(self, node: RealNode) -> dict[str, Any]:
        """The node's simulated hardware (``sim_cli show``)."""
        done = subprocess.run(node.sim_cli("show"), capture_output=True, text=True, check=True, timeout=60)
        return cast(dict[str, Any], json.loads(done.stdout))

    def assert_clean(self) -> None:
        """No claim prepared, no CDI spec, no MIG instance, no MPS daemon on any real node."""
        for node in self.nodes:
            assert self.checkpoint(node).claims == {}, f"{node.name}: claims still prepared"
            assert list(node.cdi_root.glob("*.json")) == [], f"{node.name}: CDI specs left"
            gis = {u: g["gis"] for u, g in self.sim_state(node)["gpus"].items() if g["gis"]}
            assert gis == {}, f"{node.name}: MIG instances left: {gis}"
            daemons = list(node.mps_root.iterdir()) if node.mps_root.is_dir() else []
            assert daemons == [], f"{node.name}: MPS daemon dirs left: {daemons}"

    def wait_clean(self, timeout: float = 90.0) -> None:
        """Wait until every real node is clean (kubelet unprepares after the containers stop)."""

        from tests.e2e.conftest import eventually

        def clean() -> bool:
            try:
                self.assert_clean()
            except AssertionError:
                return False
            return True

        try:
            eventually(clean, timeout, "real nodes to be clean")
        except AssertionError:
            self.assert_clean()
            raise


def skip_or_fail_without_real_nodes() -> None:
    """Skip (or, with GPUPLANE_REAL_NODES=required, fail) where this machine cannot run real nodes."""
    found = host.problems()
    if not found:
        return
    reason = "real nodes cannot run here: " + "; ".join(found)
    if os.environ.get(REQUIRED_ENV) == "required":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def real_cluster(request: pytest.FixtureRequest, gpu_cluster: GpuCluster) -> Iterator[RealCluster]:
    skip_or_fail_without_real_nodes()
    handle = gpu_cluster.cluster
    assert handle.state_dir is not None
    state_dir = handle.state_dir.resolve()
    host_driver = bool(getattr(request.module, HOST_DRIVER, False))
    built = [] if host_driver else podinstall.ensure_images(out=print)
    real = RealNodes(
        state_dir,
        handle.kubeconfig,
        driver_credentials=cli.driver_credentials(handle, state_dir, identity.TOKEN_SECONDS),
        driver_env=DRIVER_ENV,
        die_with_parent=True,
        out=lambda _: None,
    )
    started: list[RealNode] = []
    port = podinstall.apiserver_port(handle.kubeconfig)
    try:
        started = real.start(nodes.parse_node_spec(REAL_NODES), host_driver=host_driver)
        if not host_driver:
            pods = podinstall.PodInstall(
                admin=handle.kubectl,
                kubeconfig=handle.kubeconfig,
                state_dir=state_dir,
                nodes=started,
                out=lambda line: print(line, flush=True),
            )
            pods.prepare_nodes()
            pods.import_images(built)  # the nodes were just started: they hold none of them
            pods.install_driver(built, DRIVER_ENV)
        yield RealCluster(gpu=gpu_cluster, real=real)
    finally:
        if not host_driver:
            for node in started:
                realinstall.unroute_api(node.bridge, port)
        left = real.stop()
        if not host_driver:  # the session's e2e DaemonSet back (pinned off every node)
            components.install(handle, out=lambda _: None)
    leftovers = {n.name: teardown.leftovers(n) for n in started}
    assert not left and not any(leftovers.values()), f"real nodes left behind: {left} {leftovers}"


@pytest.fixture(scope="module")
def only_real_nodes(real_cluster: RealCluster) -> Iterator[RealCluster]:
    names = [n.name for n in real_cluster.gpu.nodes]
    for name in names:
        real_cluster.kubectl("cordon", name)
    try:
        yield real_cluster
    finally:
        for name in names:
            real_cluster.kubectl("uncordon", name, check=False)
