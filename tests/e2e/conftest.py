"""Fixtures for end-to-end tests: one real control plane per test session, simulated GPU nodes on it.

``control_plane`` builds the binaries if they are not cached (run
``python -m e2e build`` beforehand: a cold build takes far longer than a test
timeout), starts etcd, kube-apiserver, kube-controller-manager and
kube-scheduler in a temporary state directory, yields an ``e2e.cluster.handle.Cluster``
(``kubeconfig``, ``kubectl(*args)``, ``api``), and stops every process at the end.
SIGTERM to pytest becomes KeyboardInterrupt so teardown still runs, and the
components die with the pytest process if it is killed outright.

``workload_controllers`` builds (once, cached) and starts the JobSet and
LeaderWorkerSet managers on that control plane (``e2e.cluster.addons``).

``gpu_cluster`` installs gpuplane on that control plane as ``python -m e2e up``
does (``e2e.plane.components``: ``kubectl apply -k manifests/overlays/e2e``), adds
simulated GPU nodes (``GPU_NODES``: each a real ``gpuplane-driver`` under the
``gpuplane-driver`` ServiceAccount, bound to its node, and a kubelet stand-in,
see ``e2e.plane.simnodes``) and ``CONTROLLER_REPLICAS`` real ``gpuplane-controller``
processes under the ``gpuplane-controller`` ServiceAccount; it yields a
``GpuCluster`` and, at the end, stops the controllers and the nodes and asserts
that none of their processes (drivers, stand-ins, MPS daemons, controllers) is left.
It lasts the whole session; ``running_plane`` is the same for a module of its own
(one whose processes must be gone before a later module runs).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar, cast

import pytest

from e2e.cluster import addon_build, addons, build, controlplane
from e2e.cluster import handle as cluster
from e2e.plane import components, nodes, simnodes
from e2e.plane.realnode import teardown
from gpuplane.driver.prepare import checkpoint

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "manifests" / "examples"
GPU_NODES = "hgx-h100:2,gb200-nvl72:2"
CONTROLLER_REPLICAS = 2
GROUP, VERSION = "resource.k8s.io", "v1"
T = TypeVar("T")


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def own_control_plane(tmp_path_factory: pytest.TempPathFactory, label: str) -> Iterator[cluster.Cluster]:
    """A control plane of its own (etcd, apiserver, scheduler, controller-manager), stopped on exit."""
    bins = build.ensure_binaries()
    state_dir = tmp_path_factory.mktemp(label)
    plane = controlplane.ControlPlane(state_dir, bins, die_with_parent=True)
    try:
        handle = cluster.Cluster.connect(plane.start(), bins, state_dir=state_dir)
        try:
            yield handle
        finally:
            handle.close()
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cluster.Cluster]:
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with own_control_plane(tmp_path_factory, "control-plane") as handle:
            yield handle
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.fixture(scope="session")
def workload_controllers(control_plane: cluster.Cluster) -> Iterator[dict[str, addons.Addon]]:
    """JobSet and LeaderWorkerSet managers (built from their Go modules) on the session's control plane."""
    started: dict[str, addons.Addon] = {}
    try:
        for name in addon_build.RECIPES:
            addon = addons.Addon(
                control_plane, addon_build.ensure_addon(name), die_with_parent=True, out=lambda _: None
            )
            addon.start()
            started[name] = addon
        yield started
    finally:
        for addon in started.values():
            addon.stop()


def eventually(probe: Callable[[], T | None], timeout: float = 60.0, what: str = "condition", step: float = 0.5) -> T:
    """Poll ``probe`` until it returns something truthy; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(step)


def claim(name: str, class_name: str, selector: str | None = None, share: int | None = None) -> dict[str, Any]:
    """A ResourceClaim for one device of ``class_name`` (request ``gpu``), optionally selected and shared."""
    exactly: dict[str, Any] = {"deviceClassName": class_name, "allocationMode": "ExactCount", "count": 1}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    if share is not None:
        exactly["capacity"] = {"requests": {"sharePercent": str(share)}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def pod(name: str, claim_name: str) -> dict[str, Any]:
    """A pause pod using ``claim_name`` as its claim ``gpu``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
            "containers": [
                {"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "gpu"}]}}
            ],
        },
    }


def node_processes(markers: list[str]) -> list[str]:
    """Processes of this user whose command line or environment mentions one of ``markers``."""
    return [
        f"{pid}: {cmdline[:200]}"
        for pid, cmdline, environ in teardown.live_processes(environ=True)
        if any(m in cmdline or m in environ for m in markers)
    ]


@dataclasses.dataclass
class GpuCluster:
    """The control plane plus simulated GPU nodes, with helpers the scenario tests share."""

    cluster: cluster.Cluster
    sim: simnodes.SimNodes
    controllers: components.Controllers | None = None

    @property
    def nodes(self) -> list[simnodes.SimNode]:
        """The simulated nodes of this fixture (other modules may have had their own on the same control plane)."""
        return self.sim.started

    def node(self, name: str) -> simnodes.SimNode:
        """The node called ``name`` (one of ours: a pod bound elsewhere fails here)."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise AssertionError(f"{name} is not one of this session's simulated nodes {[n.name for n in self.nodes]}")

    def of_profile(self, profile: str) -> list[simnodes.SimNode]:
        """Our nodes of one hardware profile."""
        return [n for n in self.nodes if n.profile == profile]

    def kubectl_json(self, *args: str) -> dict[str, Any]:
        """``kubectl ... -o json``."""
        return cast(dict[str, Any], json.loads(self.cluster.kubectl(*args, "-o", "json")))

    def apply_example(self, name: str) -> None:
        """``kubectl apply -f manifests/examples/<name>/`` exactly as the README says."""
        self.cluster.kubectl("apply", "-f", str(EXAMPLES / name))

    def delete_example(self, name: str) -> None:
        """``kubectl delete -f manifests/examples/<name>/`` and wait until everything is gone."""
        self.cluster.kubectl(
            "delete", "-f", str(EXAMPLES / name), "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150
        )

    @contextlib.contextmanager
    def example_applied(self, name: str, clean_within: float = 60) -> Iterator[str]:
        """Apply an example for a test; delete it afterwards and wait until every node is clean again."""
        self.apply_example(name)
        try:
            yield name
        finally:
            self.delete_example(name)
            eventually(self.nodes_are_clean, clean_within, "nodes to be clean after deleting the example")

    def nodes_are_clean(self) -> bool:
        """:meth:`assert_nodes_clean` as a condition."""
        try:
            self.assert_nodes_clean()
        except AssertionError:
            return False
        return True

    def pods(self, namespace: str) -> list[dict[str, Any]]:
        """Pods of a namespace."""
        return list(self.kubectl_json("get", "pods", "-n", namespace).get("items", []))

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        """One pod."""
        return self.kubectl_json("get", "pod", "-n", namespace, name)

    def running_pods(self, namespace: str, count: int, timeout: float = 90.0) -> list[dict[str, Any]]:
        """Wait until ``count`` pods of the namespace run; return them."""

        def probe() -> list[dict[str, Any]] | None:
            pods = [p for p in self.pods(namespace) if (p.get("status") or {}).get("phase") == "Running"]
            return pods if len(pods) >= count else None

        return eventually(probe, timeout, f"{count} running pods in {namespace}")

    def claim(self, namespace: str, name: str) -> dict[str, Any]:
        """One ResourceClaim."""
        return self.kubectl_json("get", "resourceclaim", "-n", namespace, name)

    def slice_devices(self) -> dict[tuple[str, str], dict[str, Any]]:
        """(pool, device) -> the published device."""
        out = {}
        for item in self.kubectl_json("get", "resourceslices").get("items", []):
            for device in item["spec"].get("devices") or []:
                out[(item["spec"]["pool"]["name"], device["name"])] = device
        return out

    def checkpoint(self, node: simnodes.SimNode) -> checkpoint.Checkpoint:
        """The node driver's checkpoint (decoded and integrity-checked)."""
        if not node.checkpoint.exists():
            return checkpoint.Checkpoint()
        return checkpoint.decode(node.checkpoint.read_bytes())

    def sim_state(self, node: simnodes.SimNode) -> dict[str, Any]:
        """``python -m gpuplane.driver.hw.sim_cli --state-dir <node sim> show``."""
        done = subprocess.run(node.sim_cli("show"), capture_output=True, text=True, check=True, timeout=60)
        return cast(dict[str, Any], json.loads(done.stdout))

    def assert_nodes_clean(self) -> None:
        """No claim prepared, no CDI spec, no MIG instance left on any node."""
        for node in self.nodes:
            assert self.checkpoint(node).claims == {}, f"{node.name}: claims still prepared"
            assert list(node.cdi_root.glob("*.json")) == [], f"{node.name}: CDI specs left"
            gis = {u: g["gis"] for u, g in self.sim_state(node)["gpus"].items() if g["gis"]}
            assert gis == {}, f"{node.name}: MIG instances left: {gis}"


@contextlib.contextmanager
def running_plane(control_plane: cluster.Cluster, node_spec: str = GPU_NODES) -> Iterator[GpuCluster]:
    """gpuplane installed, the nodes of ``node_spec`` and the controller replicas, as ``python -m e2e up`` runs them.

    Stops the controllers (they release the Lease) and the nodes (removed from the API) on exit, and
    fails if any of their processes is left.
    """
    assert control_plane.state_dir is not None
    state_dir = control_plane.state_dir
    identities = components.identities_dir(state_dir.resolve())
    components.install(control_plane, out=lambda _: None)
    credentials = components.driver_credentials(control_plane, identities)
    sim = simnodes.SimNodes(
        state_dir, control_plane.kubeconfig, driver_credentials=credentials, die_with_parent=True, out=lambda _: None
    )
    controllers = components.Controllers(
        state_dir, control_plane, replicas=CONTROLLER_REPLICAS, die_with_parent=True, out=lambda _: None
    )
    markers = [
        str(simnodes.socket_root(state_dir.resolve())) + "/",
        str(state_dir.resolve() / "nodes") + "/",
        str(identities) + "/",
    ]
    try:
        sim.start(nodes.parse_node_spec(node_spec))
        controllers.start()
        yield GpuCluster(cluster=control_plane, sim=sim, controllers=controllers)
    finally:
        controllers.stop()
        sim.stop()
    try:
        eventually(lambda: not node_processes(markers), 15, "node processes to exit")
    except AssertionError:
        pytest.fail(f"processes left behind: {node_processes(markers)}")


# Modules that start nodes or controllers of their own on the session's control plane. They must run
# before the session's ``gpu_cluster`` exists: its nodes and its controllers (which hold the leader Lease)
# would otherwise add capacity, NVLink domains and a second leader to theirs (test_rbac's controller must
# take the Lease itself), and the base installs of test_manifests, test_metrics, test_rbac, test_rbac_writes
# and test_upgrade (the Deployment with two replicas and no nodeSelector) would find the session's nodes to
# run the controller's pods on (test_scenarios counts the pods on its nodes; the session's e2e overlay, applied
# after them, scales the Deployment to 0 and pins it to containerized nodes).
# tests/unit/repo/harness/test_e2e_order.py fails when a module installs the base on the session's plane and is not
# here.
OWN_PLANE_MODULES = (
    "test_alerts.py",
    "test_bind_timeout.py",
    "test_claim_device_status.py",
    "test_cluster_upgrade.py",
    "test_gangs.py",
    "test_health.py",
    "test_manifests.py",
    "test_metrics.py",
    "test_metrics_auth.py",
    "test_probes.py",
    "test_rbac.py",
    "test_rbac_imex_pods.py",
    "test_rbac_narrow.py",
    "test_rbac_narrow_nodes.py",
    "test_rbac_writes.py",
    "test_realnode_install.py",
    "test_realnode_rollout.py",
    "test_steer_gates.py",
    "test_tenancy_roles.py",
    "test_upgrade.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Move the own-plane modules to just before the first test that uses the session's ``gpu_cluster``."""
    own = [i for i in items if i.path.name in OWN_PLANE_MODULES]
    rest = [i for i in items if i.path.name not in OWN_PLANE_MODULES]
    first = next((n for n, i in enumerate(rest) if "gpu_cluster" in getattr(i, "fixturenames", ())), len(rest))
    items[:] = rest[:first] + own + rest[first:]


@pytest.fixture(scope="session")
def gpu_cluster(control_plane: cluster.Cluster) -> Iterator[GpuCluster]:
    with running_plane(control_plane) as plane:
        yield plane


# Real-node fixtures (a real kubelet and containerd per node) live in their own module; imported here
# so that pytest knows them once for the whole session.
from tests.e2e.realfixtures import only_real_nodes, real_cluster  # noqa: E402, F401
