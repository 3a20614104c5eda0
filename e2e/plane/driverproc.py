"""One real node-driver process (``python -m gpuplane.driver.main``) on the simulator, for e2e tests.

``DriverProcess(node, kubeconfig, root)`` lays out a node's host paths under
``root`` (plugin registry, plugin dir, CDI dir, simulator state), starts the
driver with the given kubeconfig (the driver's own service-account identity,
see ``e2e.plane.identity``), and offers what the tests need around it: waiting for
its ResourceSlices, a kubelet-side gRPC client (``connect``), a ``/metrics``
scrape, and a clean stop. ``stop`` then ``start`` again is a driver restart on
the same node: the simulator's state and the checkpoint survive it, as a
DaemonSet pod restart keeps its host paths.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

from kubernetes import client

from e2e.cluster import procs
from e2e.cluster.controlplane import free_port
from e2e.cluster.handle import Cluster
from e2e.plane import identity, nodes
from gpuplane.api import names
from gpuplane.driver.plugin.kubelet_client import KubeletPluginClient

REPO = Path(__file__).resolve().parents[2]
STANDIN_MPS = REPO / "tests" / "fakes" / "nvidia-cuda-mps-control"


@dataclasses.dataclass
class DriverProcess:
    """A driver process for one simulated node."""

    node_name: str
    kubeconfig: Path
    root: Path
    profile: str = "hgx-h100"
    extra_args: tuple[str, ...] = ()
    metrics_port: int = 0
    metrics_auth: str = "none"  # "kubernetes": HTTPS behind a token review, as the DaemonSet serves it
    _proc: subprocess.Popen[bytes] | None = None
    _record: procs.ProcessRecord | None = None
    starts: int = 0

    def __post_init__(self) -> None:
        if not self.metrics_port:
            self.metrics_port = free_port(set())

    # Host paths ------------------------------------------------------------------
    @property
    def registry_dir(self) -> Path:
        return self.root / "plugins_registry"

    @property
    def plugin_dir(self) -> Path:
        return self.root / "plugins" / names.DRIVER_NAME

    @property
    def cdi_root(self) -> Path:
        return self.root / "cdi"

    @property
    def checkpoint_path(self) -> Path:
        return self.plugin_dir / "checkpoint.json"

    @property
    def registration_socket(self) -> Path:
        return self.registry_dir / f"{names.DRIVER_NAME}-reg.sock"

    @property
    def log(self) -> Path:
        return self.root / "driver.log"

    # Lifecycle -------------------------------------------------------------------
    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "gpuplane.driver.main",
            f"--node-name={self.node_name}",
            f"--kubeconfig={self.kubeconfig}",
            "--backend=sim",
            f"--sim-profile={self.profile}",
            f"--registry-dir={self.registry_dir}",
            f"--plugin-dir={self.plugin_dir}",
            f"--cdi-root={self.cdi_root}",
            f"--boot-id-file={self.root / 'boot_id'}",
            f"--mps-control-binary={STANDIN_MPS}",
            f"--metrics-address=127.0.0.1:{self.metrics_port}",
            f"--metrics-auth={self.metrics_auth}",  # none: loopback plain HTTP (development); scrape() reads it
            "--log-format=json",
            "--republish-interval=5",
            *self.extra_args,
        ]

    def start(self, timeout: float = 60.0) -> None:
        """Start the driver and wait until its registration socket answers and /metrics serves."""
        if self.running():
            raise RuntimeError(f"driver for {self.node_name} already running")
        for path in (self.registry_dir, self.plugin_dir, self.cdi_root):
            path.mkdir(parents=True, exist_ok=True)
        self.registration_socket.unlink(missing_ok=True)
        self._proc, self._record = procs.spawn(
            f"driver-{self.node_name}",
            self.argv(),
            log=self.log,
            pid_dir=self.root / "pids",
            cwd=REPO,
            die_with_parent=True,
        )
        self.starts += 1
        deadline = time.monotonic() + timeout
        while True:
            code = self._proc.poll()
            if code is not None:
                raise procs.ComponentError(f"driver-{self.node_name}", f"exited with code {code}", self.log)
            if self.registration_socket.exists():
                try:
                    if self.metrics_auth == "none":
                        self.scrape(timeout=1.0)
                    else:  # HTTPS wanting a token: that it accepts connections is enough
                        socket.create_connection(("127.0.0.1", self.metrics_port), timeout=1.0).close()
                    return
                except OSError:
                    pass
            if time.monotonic() > deadline:
                raise procs.ComponentError(f"driver-{self.node_name}", f"not ready after {timeout:.0f}s", self.log)
            time.sleep(0.1)

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self) -> None:
        """SIGTERM, wait, then SIGKILL if needed (procs.stop)."""
        if self._proc is not None and self._record is not None:
            procs.stop(self._record, self._proc)
            procs.pidfile(self.root / "pids", self._record.name).unlink(missing_ok=True)
        self._proc = None
        self._record = None

    def restart(self) -> None:
        self.stop()
        self.start()

    # What tests look at ----------------------------------------------------------
    def connect(self) -> KubeletPluginClient:
        """Register with the driver as kubelet does and return the DRA client (close it)."""
        return KubeletPluginClient.discover(str(self.registration_socket), timeout=45.0)

    def scrape(self, timeout: float = 5.0) -> str:
        """The text of GET /metrics."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body: bytes = resp.read()
        return body.decode()

    def slices(self, api: client.ApiClient) -> list[dict[str, Any]]:
        """This node's ResourceSlices of the driver (read with ``api``)."""
        listing = cast(
            dict[str, Any],
            client.CustomObjectsApi(api).list_cluster_custom_object(
                "resource.k8s.io", "v1", "resourceslices", field_selector=f"spec.nodeName={self.node_name}"
            ),
        )
        items: list[dict[str, Any]] = listing.get("items", [])
        return [s for s in items if s["spec"].get("driver") == names.DRIVER_NAME]

    def wait_published(self, api: client.ApiClient, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Wait until the node's pool is complete (every slice of the newest generation present)."""
        deadline = time.monotonic() + timeout
        while True:
            items = self.slices(api)
            if items:
                newest = max(s["spec"]["pool"]["generation"] for s in items)
                current = [s for s in items if s["spec"]["pool"]["generation"] == newest]
                if len(current) == current[0]["spec"]["pool"]["resourceSliceCount"]:
                    return current
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"driver on {self.node_name} published no complete pool in {timeout:.0f}s; "
                    + procs.describe_log(self.log)
                )
            time.sleep(0.2)


def metric_value(text: str, name: str, labels: dict[str, str] | None = None) -> float:
    """The sum of samples of ``name`` (with at least ``labels``) in Prometheus text; 0 if absent."""
    total = 0.0
    want = labels or {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        metric, _, value = line.rpartition(" ")
        base, _, label_text = metric.partition("{")
        if base != name:
            continue
        got = dict(
            (k, v.strip('"')) for k, _, v in (part.partition("=") for part in label_text.rstrip("}").split(",") if part)
        )
        if all(got.get(k) == v for k, v in want.items()):
            total += float(value)
    return total


def allocate_claim(
    api: client.ApiClient,
    node_name: str,
    name: str,
    exactly: dict[str, Any],
    *,
    namespace: str = "default",
    timeout: float = 60.0,
) -> dict[str, Any]:
    """Create ResourceClaim ``name`` (one request "gpu") and a pod on ``node_name`` using it; wait for allocation.

    The real kube-scheduler allocates the claim from the node's ResourceSlices and
    binds the pod; no kubelet runs it, so tests prepare the claim themselves.
    """
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }
    custom.create_namespaced_custom_object("resource.k8s.io", "v1", namespace, "resourceclaims", claim)
    pod: Any = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node_name},
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            "containers": [
                {"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "gpu"}]}}
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }
    core.create_namespaced_pod(namespace, pod)
    deadline = time.monotonic() + timeout
    while True:
        got = cast(
            dict[str, Any],
            custom.get_namespaced_custom_object("resource.k8s.io", "v1", namespace, "resourceclaims", name),
        )
        if got.get("status", {}).get("allocation"):
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"claim {namespace}/{name} not allocated after {timeout:.0f}s: {got.get('status')}")
        time.sleep(0.2)


def release_claim(api: client.ApiClient, name: str, namespace: str = "default") -> None:
    """Delete the pod and the claim ``allocate_claim`` made (missing ones are fine)."""
    from kubernetes.client.exceptions import ApiException

    try:
        client.CoreV1Api(api).delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    except ApiException as exc:
        if exc.status != 404:
            raise
    try:
        client.CustomObjectsApi(api).delete_namespaced_custom_object(
            "resource.k8s.io", "v1", namespace, "resourceclaims", name
        )
    except ApiException as exc:
        if exc.status != 404:
            raise


@contextlib.contextmanager
def published_driver(plane: Cluster, name: str, root_prefix: str, **options: Any) -> Iterator[DriverProcess]:
    """A node ``name`` kept alive by a heartbeat, its driver (``options``: :class:`DriverProcess`'s fields)
    running under its own ServiceAccount identity and published; stopped, its root and node removed after.

    The root is a short temporary directory (MPS pipe paths under it must fit AF_UNIX's 107 bytes).
    """
    root = Path(tempfile.mkdtemp(prefix=root_prefix))
    try:
        with nodes.NodeHeartbeat(name, plane.api, delete_on_stop=True) as beat:
            beat.wait_schedulable()
            who = identity.driver_identity(plane, name, root)
            driver = DriverProcess(name, who.kubeconfig, root, **options)
            driver.start()
            try:
                driver.wait_published(plane.api)
                yield driver
            finally:
                driver.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
