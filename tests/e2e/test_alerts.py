"""A real Prometheus fires gpuplane's GPU alert when the simulator takes a GPU off the bus.

On the session's control plane with the manifests installed: a real ``gpuplane-driver`` process
(simulated HGX H100 node, its own ServiceAccount token) serves ``/metrics`` as the DaemonSet does,
HTTPS behind a token review; Debian's ``prometheus`` (started here on loopback with a generated
config) scrapes it with the token of a ServiceAccount bound to ``gpuplane-metrics-reader``, as the
scrape config of docs/operations.md does (``insecure_skip_verify`` for the self-signed certificate,
the ``node`` label added), and evaluates gpuplane's rules. The rules are a test copy of
``manifests/monitoring/prometheus/gpuplane.rules.yaml`` with the expressions as they are and every
``for:`` cut to a few seconds (the real ones wait minutes). The test injects Xid 79 on one GPU
through the simulator's controls (docs/health.md) and waits for ``GpuplaneGpuUnhealthy`` to be
firing in ``/api/v1/alerts`` for that GPU and node, and prints how long that took.

Before that, the real controller process (its own token, metrics behind the same review, the fleet
gauges every second) is scraped too: through Prometheus it reports itself the leader (so
``GpuplaneControllerNoLeader`` is quiet), the node's 8 free H100s as the largest free block, and a
claim as pending only once a pod waits for it.

Without the prometheus binary (``scripts/setup-monitoring.sh``) the test is skipped, except in CI
(``CI=true`` or ``GPUPLANE_REAL_NODES=required``), where that is a failure.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from e2e.cluster import handle as cluster
from e2e.cluster import procs
from e2e.cluster.controlplane import free_port
from e2e.plane import driverproc, identity, install
from gpuplane.driver.hw.sim import gpu_uuid
from tests import hosttools
from tests.e2e.conftest import claim, eventually, pod

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "manifests" / "monitoring" / "prometheus" / "gpuplane.rules.yaml"
FOR = "3s"  # every rule's for: in the test copy
INTERVAL = "1s"  # scrape and evaluation
READER_ROLE = "gpuplane-metrics-reader"


def prometheus_binary() -> str:
    return hosttools.required_tool(
        "prometheus", installer="scripts/setup-monitoring.sh", what="Debian's prometheus package"
    )


def short_rules(text: str) -> dict[str, Any]:
    """The rules with their expressions, labels and annotations as they are, each ``for:`` cut to FOR."""
    rules = yaml.safe_load(text)
    for group in rules["groups"]:
        group["interval"] = INTERVAL
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = FOR
    return dict(rules)


@dataclass
class Node:
    name: str
    driver: driverproc.DriverProcess

    def sim_cli(self, *args: str) -> Any:
        state = self.driver.plugin_dir / "sim"  # the driver's default simulator state (no --sim-state-dir)
        argv = [sys.executable, "-m", "gpuplane.driver.hw.sim_cli", "--state-dir", str(state), *args]
        return json.loads(subprocess.run(argv, capture_output=True, text=True, check=True, cwd=REPO).stdout)


@pytest.fixture(scope="module")
def node(control_plane: cluster.Cluster) -> Iterator[Node]:
    install.apply(control_plane)
    install.wait_established(control_plane, install.crd_names(install.render(control_plane)))
    name = f"alerts-{uuid.uuid4().hex[:5]}"
    with driverproc.published_driver(control_plane, name, "gpa-", metrics_auth="kubernetes") as driver:
        yield Node(name, driver)


@pytest.fixture(scope="module")
def reader_token(control_plane: cluster.Cluster) -> Iterator[str]:
    """A token of ServiceAccount prometheus in a monitoring namespace, bound to gpuplane-metrics-reader."""
    suffix = uuid.uuid4().hex[:5]
    ns, binding = f"monitoring-{suffix}", f"prometheus-gpuplane-metrics-{suffix}"
    core, rbac = client.CoreV1Api(control_plane.api), client.RbacAuthorizationV1Api(control_plane.api)
    core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=ns, labels={"gpuplane.dev/monitoring": "true"}))
    )
    try:
        identity.ensure_service_account(control_plane.api, ns, "prometheus")
        identity.wait_service_account(control_plane.api, ns, "prometheus")
        rbac.create_cluster_role_binding(
            client.V1ClusterRoleBinding(
                metadata=client.V1ObjectMeta(name=binding),
                role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=READER_ROLE),
                subjects=[client.RbacV1Subject(kind="ServiceAccount", name="prometheus", namespace=ns)],
            )
        )
        try:
            yield identity.request_token(control_plane.api, ns, "prometheus")
        finally:
            rbac.delete_cluster_role_binding(binding)
    finally:
        core.delete_namespace(ns)


@dataclass
class Controller:
    metrics_port: int


@pytest.fixture(scope="module")
def controller(control_plane: cluster.Cluster, node: Node) -> Iterator[Controller]:
    """The real controller process under its own token, --metrics-auth=kubernetes, fleet gauges every second."""
    root = Path(tempfile.mkdtemp(prefix="gpac-"))
    who = identity.controller_identity(control_plane, root)
    taken: set[int] = set()
    port, health = free_port(taken), free_port(taken)
    argv = [
        sys.executable,
        "-m",
        "gpuplane.controller.main",
        f"--kubeconfig={who.kubeconfig}",
        f"--identity=e2e-alerts-{uuid.uuid4().hex[:4]}",
        "--lease-namespace=gpuplane-system",
        f"--metrics-port={port}",
        "--metrics-auth=kubernetes",
        f"--liveness=http://127.0.0.1:{health}/healthz",
        "--fleet-gauges-interval=1",
        "--log-format=json",
    ]
    log = root / "controller.log"
    proc, record = procs.spawn(
        "controller-alerts", argv, log=log, pid_dir=root / "pids", cwd=REPO, die_with_parent=True
    )
    try:
        yield Controller(port)
    finally:
        procs.stop(record, proc)
        shutil.rmtree(root, ignore_errors=True)


class Prometheus:
    """Debian's prometheus on loopback, scraping one driver with the reader's token and evaluating the rules."""

    def __init__(self, binary: str, root: Path, node: Node, controller: Controller, token: str) -> None:
        self.port = free_port(set())
        self.root = root
        (root / "token").write_text(token)
        (root / "gpuplane.rules.yaml").write_text(yaml.safe_dump(short_rules(RULES.read_text()), sort_keys=False))
        config = {
            "global": {"scrape_interval": INTERVAL, "evaluation_interval": INTERVAL, "scrape_timeout": INTERVAL},
            "rule_files": [str(root / "gpuplane.rules.yaml")],
            "scrape_configs": [
                {
                    "job_name": "gpuplane",
                    "scheme": "https",
                    "authorization": {"credentials_file": str(root / "token")},
                    "tls_config": {"insecure_skip_verify": True},
                    "static_configs": [
                        {"targets": [f"127.0.0.1:{node.driver.metrics_port}"], "labels": {"node": node.name}},
                        {"targets": [f"127.0.0.1:{controller.metrics_port}"], "labels": {"pod": "controller"}},
                    ],
                }
            ],
        }
        (root / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        argv = [
            binary,
            f"--config.file={root / 'prometheus.yml'}",
            f"--storage.tsdb.path={root / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        self.log = root / "prometheus.log"
        self.proc, self.record = procs.spawn(
            "prometheus", argv, log=self.log, pid_dir=root / "pids", die_with_parent=True
        )

    def api(self, path: str, **params: str) -> Any:
        assert self.proc.poll() is None, procs.describe_log(self.log)
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/v1/{path}{query}", timeout=5) as resp:
            body = json.loads(resp.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, promql: str) -> dict[str, float]:
        """An instant query's samples, keyed by their labels' values joined with ','."""
        result = self.api("query", query=promql)["result"]
        return {",".join(r["metric"].values()): float(r["value"][1]) for r in result}

    def ready(self) -> bool:
        try:
            return len(self.query('up{job="gpuplane"} == 1')) == 2  # the driver and the controller
        except OSError:
            return False

    def alerts(self, name: str) -> list[dict[str, Any]]:
        return [a for a in self.api("alerts")["alerts"] if a["labels"].get("alertname") == name]

    def stop(self) -> None:
        procs.stop(self.record, self.proc)


@pytest.fixture(scope="module")
def prometheus(node: Node, controller: Controller, reader_token: str) -> Iterator[Prometheus]:
    binary = prometheus_binary()
    root = Path(tempfile.mkdtemp(prefix="gpprom-"))
    prom = Prometheus(binary, root, node, controller, reader_token)
    try:
        eventually(
            prom.ready, 90, "Prometheus scraping the driver and the controller with the reader's token", step=0.5
        )
        yield prom
    finally:
        prom.stop()
        shutil.rmtree(root, ignore_errors=True)


H100 = "NVIDIA H100 80GB HBM3"
NO_SUCH_GPU = 'device.attributes["gpu.gpuplane.dev"].productName == "NVIDIA B300"'


def test_the_controller_reports_the_leader_the_free_block_and_pending_claims(
    control_plane: cluster.Cluster, node: Node, prometheus: Prometheus
) -> None:
    eventually(lambda: prometheus.query("sum(gpuplane_controller_is_leader)") == {"": 1.0}, 30, "a leader")
    eventually(lambda: not prometheus.alerts("GpuplaneControllerNoLeader"), 30, "GpuplaneControllerNoLeader quiet")
    # The one node: 8 whole H100s in its own NVLink domain, none held.
    published = {d["name"] for s in node.driver.slices(control_plane.api) for d in s["spec"].get("devices") or []}
    assert {f"gpu-{k}" for k in range(8)} <= published

    def fleet(gauge: str) -> dict[str, float]:
        return prometheus.query(f'max by (product) (gpuplane_fleet_{gauge}{{product="{H100}"}})')

    eventually(lambda: fleet("largest_free_block_gpus") == {H100: 8.0}, 30, "the largest free block: 8 H100s")
    assert fleet("free_gpus") == {H100: 8.0}
    assert prometheus.query("max(gpuplane_claims_pending)") == {"": 0.0}

    custom, core = client.CustomObjectsApi(control_plane.api), client.CoreV1Api(control_plane.api)
    name = f"waits-{uuid.uuid4().hex[:5]}"
    custom.create_namespaced_custom_object(
        "resource.k8s.io", "v1", "default", "resourceclaims", claim(name, "gpu.gpuplane.dev", NO_SUCH_GPU)
    )
    try:
        time.sleep(4)  # several passes: a claim no pod uses waits for nothing
        assert prometheus.query("max(gpuplane_claims_pending)") == {"": 0.0}
        core.create_namespaced_pod("default", pod(name, name))
        eventually(lambda: prometheus.query("max(gpuplane_claims_pending)") == {"": 1.0}, 30, "the claim pending")
        oldest = prometheus.query("max(gpuplane_claim_pending_oldest_seconds)")[""]
        assert 4 <= oldest < 120, oldest
    finally:
        core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
        custom.delete_namespaced_custom_object("resource.k8s.io", "v1", "default", "resourceclaims", name)
    eventually(lambda: prometheus.query("max(gpuplane_claims_pending)") == {"": 0.0}, 30, "no claim pending")


def test_a_gpu_off_the_bus_fires_the_unhealthy_alert(node: Node, prometheus: Prometheus) -> None:
    minor = 6
    gpu = f"gpu-{minor}"
    assert prometheus.alerts("GpuplaneGpuUnhealthy") == [], "a healthy node fires nothing"
    started = time.monotonic()
    node.sim_cli("inject-xid", "--uuid", gpu_uuid(node.name, minor), "--xid", "79")

    seen: dict[str, float] = {}

    def state() -> dict[str, Any] | None:
        for alert in prometheus.alerts("GpuplaneGpuUnhealthy"):
            seen.setdefault(alert["state"], time.monotonic() - started)
            if alert["state"] == "firing":
                return dict(alert)
        return None

    alert = eventually(state, 90, "GpuplaneGpuUnhealthy firing", step=0.2)
    labels = alert["labels"]
    assert (labels["gpu"], labels["node"], labels["severity"]) == (gpu, node.name, "warning")
    taint = (labels["key"], labels["value"], labels["effect"])
    assert taint == ("gpu.gpuplane.dev/unhealthy", "fallen-off-bus", "NoSchedule")
    assert alert["annotations"]["summary"] == (
        f"GPU {gpu} on node {node.name} is out of scheduling: gpu.gpuplane.dev/unhealthy=fallen-off-bus"
    )
    assert alert["annotations"]["runbook"] == "docs/operations.md#gpuplanegpuunhealthy"
    pending = seen.get("pending")
    print(
        f"\nXid 79 on {gpu} of {node.name}: GpuplaneGpuUnhealthy pending after "
        f"{pending if pending is None else round(pending, 1)} s, firing after {seen['firing']:.1f} s "
        f"(scrape and evaluation every {INTERVAL}, for: {FOR} in the test copy; the real rule adds its 1m)"
    )
    # The other alerts of the driver stay quiet: nothing was prepared, nothing is owed.
    assert prometheus.alerts("GpuplanePrepareErrors") == [] and prometheus.alerts("GpuplaneMigInstancesOwed") == []
