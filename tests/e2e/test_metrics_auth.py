"""Issue 32, defect 8: tenants cannot read gpuplane's metrics; Prometheus, bound to gpuplane-metrics-reader, can.

On the real control plane with the installed manifests, real tokens (TokenRequest), no stand-ins for the
API server's answers:

- the driver's metrics server (gpuplane.driver.probes.serve, the registry of a DriverMetrics) reviews tokens
  under the driver's own ServiceAccount token (so its ClusterRole must grant tokenreviews and
  subjectaccessreviews create); the real controller process does the same under the controller's token;
- a tenant (a ServiceAccount bound to the built-in ``edit`` ClusterRole in its own namespace, and one with
  ``admin`` there) gets 403; no token and a made-up token get 401; Prometheus's ServiceAccount, bound to
  ``gpuplane-metrics-reader``, gets 200 and the metrics; the probes answer without a token.
"""

from __future__ import annotations

import ssl
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry, Counter

from e2e.cluster import handle as cluster
from e2e.cluster import procs
from e2e.cluster.controlplane import free_port
from e2e.plane import identity
from e2e.plane.driverproc import REPO
from gpuplane.driver import probes
from gpuplane.driver.kube import ReviewRequests
from gpuplane.httpauth.review import RequestReviewer
from gpuplane.httpauth.settings import ServingSettings
from tests.e2e.conftest import eventually
from tests.rbackit import (
    controller_fixture,  # noqa: F401  (fixture controller)
    driver_a_fixture,  # noqa: F401  (fixture driver_a)
    installed_fixture,  # noqa: F401  (fixture installed)
    two_nodes_fixture,  # noqa: F401  (fixture two_nodes)
)

pytestmark = pytest.mark.e2e

READER_ROLE = "gpuplane-metrics-reader"


def _insecure() -> ssl.SSLContext:
    """As Prometheus's insecure_skip_verify against the self-signed certificate (the token authenticates)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def get(url: str, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)
    context = _insecure() if url.startswith("https:") else None
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _bind(rbac: client.RbacAuthorizationV1Api, namespace: str, sa: str, cluster_role: str) -> None:
    rbac.create_namespaced_role_binding(
        namespace,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name=f"{sa}-{cluster_role}"),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=cluster_role),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name=sa, namespace=namespace)],
        ),
    )


class Scrapers:
    """Tokens of a tenant with edit, a tenant with admin (each in its own namespace), and Prometheus."""

    def __init__(self, editor: str, admin: str, prometheus: str) -> None:
        self.editor, self.admin, self.prometheus = editor, admin, prometheus


@pytest.fixture(scope="module")
def scrapers(installed: cluster.Cluster) -> Iterator[Scrapers]:
    suffix = uuid.uuid4().hex[:5]
    core = client.CoreV1Api(installed.api)
    rbac = client.RbacAuthorizationV1Api(installed.api)
    tenant_ns, other_ns, monitoring_ns = f"tenant-a-{suffix}", f"tenant-b-{suffix}", f"monitoring-{suffix}"
    binding = f"prometheus-gpuplane-metrics-{suffix}"
    for ns in (tenant_ns, other_ns, monitoring_ns):
        labels = {"gpuplane.dev/monitoring": "true"} if ns == monitoring_ns else {}
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns, labels=labels)))
    try:
        for ns, sa in ((tenant_ns, "tenant"), (other_ns, "owner"), (monitoring_ns, "prometheus")):
            identity.ensure_service_account(installed.api, ns, sa)
            identity.wait_service_account(installed.api, ns, sa)
        _bind(rbac, tenant_ns, "tenant", "edit")
        _bind(rbac, other_ns, "owner", "admin")
        rbac.create_cluster_role_binding(
            client.V1ClusterRoleBinding(
                metadata=client.V1ObjectMeta(name=binding),
                role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=READER_ROLE),
                subjects=[client.RbacV1Subject(kind="ServiceAccount", name="prometheus", namespace=monitoring_ns)],
            )
        )
        yield Scrapers(
            identity.request_token(installed.api, tenant_ns, "tenant"),
            identity.request_token(installed.api, other_ns, "owner"),
            identity.request_token(installed.api, monitoring_ns, "prometheus"),
        )
    finally:
        rbac.delete_cluster_role_binding(binding)
        for ns in (tenant_ns, other_ns, monitoring_ns):
            core.delete_namespace(ns)


def _assert_only_the_reader_reads(url: str, scrapers: Scrapers, secret: str) -> None:
    status, body = get(url)
    assert status == 401 and secret not in body, (status, body)
    status, body = get(url, "not-a-token")
    assert status == 401 and secret not in body, (status, body)
    for who, token in (("edit", scrapers.editor), ("admin", scrapers.admin)):
        status, body = get(url, token)
        assert status == 403 and secret not in body, (who, status, body)
    status, body = get(url, scrapers.prometheus)
    assert status == 200 and secret in body, (status, body[:500])
    # Plain HTTP on the HTTPS port: no metrics either.
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(url.replace("https:", "http:"), timeout=10).read()


def test_driver_metrics_are_refused_to_tenants(
    installed: cluster.Cluster, driver_a: identity.Identity, scrapers: Scrapers
) -> None:
    """The driver's server, its reviews made under the driver's own token: tenants 403, Prometheus 200."""
    registry = CollectorRegistry()
    Counter("gpuplane_driver_prepared_claims", "claims", ["namespace", "claim"], registry=registry).labels(
        "tenant-b", "secret-run"
    ).inc()
    checks = probes.Probes(stale_after_s=60)
    checks.watch(["main-loop"])
    api = driver_a.api_client()
    taken: set[int] = set()
    health, metrics = probes.serve(
        f"127.0.0.1:{free_port(taken)}",
        registry,
        checks,
        serving=ServingSettings(auth="kubernetes"),
        reviewer=lambda: RequestReviewer(ReviewRequests(api)),
        health_address=f"127.0.0.1:{free_port(taken)}",
    )
    try:
        _assert_only_the_reader_reads(f"https://127.0.0.1:{metrics.port}/metrics", scrapers, "secret-run")
        status, body = get(f"http://127.0.0.1:{health.port}/healthz")
        assert status == 200 and "tenant" not in body  # kubelet's probe: no token, no tenant names
        assert get(f"http://127.0.0.1:{health.port}/metrics", scrapers.prometheus)[0] == 404
    finally:
        health.stop()
        metrics.stop()
        api.close()  # type: ignore[no-untyped-call]


def test_controller_process_serves_metrics_only_to_the_reader(
    installed: cluster.Cluster, controller: identity.Identity, scrapers: Scrapers, tmp_path: Path
) -> None:
    """The real controller process under its own token, --metrics-auth=kubernetes (the Deployment's default)."""
    taken: set[int] = set()
    metrics_port, health_port = free_port(taken), free_port(taken)
    log = tmp_path / "controller.log"
    argv = [
        sys.executable,
        "-m",
        "gpuplane.controller.main",
        f"--kubeconfig={controller.kubeconfig}",
        f"--identity=e2e-metrics-auth-{uuid.uuid4().hex[:4]}",
        "--lease-namespace=gpuplane-system",
        f"--metrics-port={metrics_port}",
        "--metrics-auth=kubernetes",
        f"--liveness=http://127.0.0.1:{health_port}/healthz",
        "--log-format=json",
    ]
    proc, record = procs.spawn(
        "controller-metrics-auth", argv, log=log, pid_dir=tmp_path / "pids", cwd=REPO, die_with_parent=True
    )
    url = f"https://127.0.0.1:{metrics_port}/metrics"

    def serving() -> bool | None:
        assert proc.poll() is None, procs.describe_log(log)
        try:
            return get(url)[0] == 401 or None
        except OSError:
            time.sleep(0.2)
            return None

    try:
        eventually(serving, 90, "the controller's metrics server")
        _assert_only_the_reader_reads(url, scrapers, "gpuplane_gang_queue_depth")
    finally:
        procs.stop(record, proc)
