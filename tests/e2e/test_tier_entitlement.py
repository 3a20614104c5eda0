"""Issue 32, defect 4: a sharing tier is an entitlement an administrator grants a namespace.

On the real control plane with the installed manifests (the ValidatingAdmissionPolicy
``gpuplane-tier-entitlement``), as a tenant would: a ServiceAccount bound to the built-in ``edit``
ClusterRole in its own namespace only, a real token (TokenRequest), ``kubectl`` with that token.

- in its unlabelled namespace the tenant cannot create a claim of ``mps-gold`` (nor a claim template,
  nor a ``firstAvailable`` subrequest of ``timeslice-silver``): refused, with a message naming the class,
  the namespace, what it is entitled to and the ``kubectl label`` an administrator runs; ``mps-bronze``
  is admitted;
- it cannot grant itself the tier: labelling its own namespace is forbidden;
- once the administrator labels the namespace ``gpuplane.dev/max-tier=silver``, silver is admitted and gold
  still refused; with ``gold`` gold is admitted.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from e2e.plane import identity
from tests.e2e.conftest import GpuCluster, eventually

pytestmark = pytest.mark.e2e

LABEL = "gpuplane.dev/max-tier"


class Tenant:
    """kubectl as the tenant's ServiceAccount (edit in its own namespace only)."""

    def __init__(self, gc: GpuCluster, ns: str, kubeconfig: Path) -> None:
        self.gc, self.ns, self.kubeconfig = gc, ns, kubeconfig

    def kubectl(self, *args: str, input_text: str | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.gc.cluster.bins.kubectl), f"--kubeconfig={self.kubeconfig}", "-n", self.ns, *args]
        return subprocess.run(cmd, input=input_text, capture_output=True, text=True, timeout=60, check=False)

    def create(self, obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return self.kubectl("create", "-f", "-", input_text=json.dumps(obj))


@pytest.fixture
def tenant(gpu_cluster: GpuCluster, tmp_path: Path) -> Iterator[Tenant]:
    api = gpu_cluster.cluster.api
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    ns = f"tier-tenant-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    try:
        identity.ensure_service_account(api, ns, "tenant")
        identity.wait_service_account(api, ns, "tenant")
        rbac.create_namespaced_role_binding(
            ns,
            client.V1RoleBinding(
                metadata=client.V1ObjectMeta(name="tenant-edit"),
                role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="edit"),
                subjects=[client.RbacV1Subject(kind="ServiceAccount", name="tenant", namespace=ns)],
            ),
        )
        token = identity.request_token(api, ns, "tenant")
        kubeconfig = identity.write_token_kubeconfig(
            tmp_path / "tenant.kubeconfig", gpu_cluster.cluster.kubeconfig, token, identity.username(ns, "tenant")
        )
        yield Tenant(gpu_cluster, ns, kubeconfig)
    finally:
        gpu_cluster.cluster.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=120s", timeout=150)


def claim(name: str, device_class: str, *, first_available: list[str] | None = None) -> dict[str, Any]:
    if first_available:
        request: dict[str, Any] = {
            "name": "gpu",
            "firstAvailable": [{"name": f"alt{i}", "deviceClassName": c} for i, c in enumerate(first_available)],
        }
    else:
        request = {"name": "gpu", "exactly": {"deviceClassName": device_class}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [request]}},
    }


def template(name: str, device_class: str) -> dict[str, Any]:
    body = claim(name, device_class)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": body["spec"]},
    }


def refused(done: subprocess.CompletedProcess[str], device_class: str, ns: str, entitled: str) -> None:
    assert done.returncode != 0, f"admitted: {done.stdout}"
    err = done.stderr
    assert "gpuplane-tier-entitlement" in err, err
    assert f"DeviceClass {device_class} is a sharing tier above what namespace {ns} is entitled to ({entitled}" in err
    assert f"kubectl label namespace {ns} gpuplane.dev/max-tier=" in err, err


def admitted(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0, done.stderr


def test_a_tenant_gets_only_the_tier_its_namespace_was_granted(
    gpu_cluster: GpuCluster, tenant: Tenant, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = tenant.ns
    gold, silver = "mps-gold.gpu.gpuplane.dev", "mps-silver.gpu.gpuplane.dev"
    # Unlabelled: bronze only, for claims, templates and every firstAvailable subrequest.
    first = tenant.create(claim("gold", gold))
    refused(first, gold, ns, "bronze")
    with capsys.disabled():
        print(f"\n[e2e] tenant (edit in {ns}, unlabelled) creates an mps-gold claim: {first.stderr.strip()}")
    refused(tenant.create(template("gold-tpl", gold)), gold, ns, "bronze")
    ts_silver = "timeslice-silver.gpu.gpuplane.dev"
    refused(
        tenant.create(claim("fa", "", first_available=["mps-bronze.gpu.gpuplane.dev", ts_silver])),
        ts_silver,
        ns,
        "bronze",
    )
    admitted(tenant.create(claim("bronze", "mps-bronze.gpu.gpuplane.dev")))
    admitted(tenant.create(claim("whole", "gpu.gpuplane.dev")))  # not a tier class: untouched
    # The tenant cannot grant itself a tier: Namespaces are not its to write.
    own = tenant.kubectl("label", "namespace", ns, f"{LABEL}=gold")
    assert own.returncode != 0 and "forbidden" in own.stderr.lower(), own
    # The administrator grants silver: silver is admitted, gold is still refused.
    gpu_cluster.cluster.kubectl("label", "namespace", ns, f"{LABEL}=silver")
    eventually(lambda: tenant.create(claim("silver", silver)).returncode == 0, 30, "silver admitted once granted")
    refused(tenant.create(claim("gold", gold)), gold, ns, "silver")
    # And gold.
    gpu_cluster.cluster.kubectl("label", "namespace", ns, f"{LABEL}=gold", "--overwrite")
    eventually(lambda: tenant.create(claim("gold", gold)).returncode == 0, 30, "gold admitted once granted")
    admitted(tenant.create(template("gold-tpl", gold)))
    got = gpu_cluster.kubectl_json("get", "resourceclaim", "-n", ns, "gold")
    assert got["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == gold
