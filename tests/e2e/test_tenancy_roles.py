"""Tenant roles on the real control plane (issue 32): a namespace's editors may use GpuGangs and GpuRequests
there, through the built-in roles the installed ClusterRoles aggregate into, and nothing more.

Each answer is the API server's own authorization (a SubjectAccessReview for the tenant's ServiceAccount,
bound to ``edit`` or ``view`` in its namespace only, the way an administrator grants a team a namespace),
after the kube-controller-manager's aggregation controller filled the built-in roles.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from e2e.cluster import handle as cluster
from e2e.plane import access_review, identity
from tests.e2e.conftest import eventually
from tests.rbackit import installed_fixture  # noqa: F401  (fixture installed)

pytestmark = pytest.mark.e2e

G = "gpuplane.dev"


@pytest.fixture(scope="module")
def tenants(installed: cluster.Cluster) -> Iterator[tuple[str, str]]:
    """Namespaces (team, other); in team a ServiceAccount 'dev' with edit and 'auditor' with view."""
    suffix = uuid.uuid4().hex[:5]
    core, rbac = client.CoreV1Api(installed.api), client.RbacAuthorizationV1Api(installed.api)
    team, other = f"team-{suffix}", f"other-{suffix}"
    for ns in (team, other):
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    try:
        for sa, role in (("dev", "edit"), ("auditor", "view")):
            identity.ensure_service_account(installed.api, team, sa)
            rbac.create_namespaced_role_binding(
                team,
                client.V1RoleBinding(
                    metadata=client.V1ObjectMeta(name=f"{sa}-{role}"),
                    role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=role),
                    subjects=[client.RbacV1Subject(kind="ServiceAccount", name=sa, namespace=team)],
                ),
            )
        yield team, other
    finally:
        for ns in (team, other):
            core.delete_namespace(ns)


def test_editors_use_gangs_and_requests_in_their_namespace_and_nothing_more(
    installed: cluster.Cluster, tenants: tuple[str, str]
) -> None:
    team, other = tenants
    dev = identity.username(team, "dev")
    auditor = identity.username(team, "auditor")

    def may(user: str, verb: str, resource: str, namespace: str, sub: str = "") -> bool:
        return access_review.access(installed.api, user, (verb, G, resource, sub), namespace=namespace)

    # The aggregation controller fills edit and view from the installed ClusterRoles (seconds).
    eventually(lambda: may(dev, "create", "gpugangs", team), 60, "edit to aggregate gpuplane-tenant-edit")
    eventually(lambda: may(auditor, "list", "gpugangs", team), 60, "view to aggregate gpuplane-tenant-view")
    want = {
        (dev, "create", "gpugangs", team, ""): True,
        (dev, "delete", "gpugangs", team, ""): True,
        (dev, "create", "gpurequests", team, ""): True,
        (dev, "patch", "gpugangs", team, "status"): False,  # the controller's record, never the tenant's
        (dev, "patch", "gpurequests", team, "status"): False,
        (dev, "create", "gpugangs", other, ""): False,  # another namespace
        (dev, "list", "gpugangs", other, ""): False,
        (auditor, "list", "gpurequests", team, ""): True,
        (auditor, "create", "gpugangs", team, ""): False,
    }
    got = {key: may(key[0], key[1], key[2], key[3], key[4]) for key in want}
    wrong = {key: answer for key, answer in got.items() if answer != want[key]}
    assert wrong == {}, f"unexpected answers (user, verb, resource, namespace, subresource): {wrong}"


def test_the_administrators_tenancy_objects_apply(installed: cluster.Cluster) -> None:
    """manifests/tenancy (what docs/tenancy.md tells an administrator to apply) is accepted as written, and the
    classes its quotas name are gpuplane's; its AdmissionConfiguration limits the same classes as the e2e's."""
    import yaml

    from e2e.cluster import flags

    root = Path(__file__).resolve().parents[2]
    tenancy = root / "manifests" / "tenancy"
    config = yaml.safe_load((tenancy / "admission-configuration.yaml").read_text())
    (scope,) = config["plugins"][0]["configuration"]["limitedResources"][0]["matchScopes"]
    assert tuple(scope["values"]) == flags.ENTITLED_PRIORITY_CLASSES
    classes = {
        yaml.safe_load(p.read_text())["metadata"]["name"] for p in (root / "manifests" / "deviceclasses").glob("*.yaml")
    }
    for doc in yaml.safe_load_all((tenancy / "team-a.yaml").read_text()):
        for key in (doc.get("spec") or {}).get("hard") or {}:
            if key.endswith(".deviceclass.resource.k8s.io/devices"):
                assert key.removesuffix(".deviceclass.resource.k8s.io/devices") in classes, key
    try:
        installed.kubectl("apply", "-k", str(tenancy))
        quotas = installed.kubectl("get", "resourcequota", "-n", "team-a", "-o", "name")
        assert "gpuplane-high" in quotas and "gpuplane-tiers" in quotas
    finally:
        installed.kubectl("delete", "-k", str(tenancy), "--ignore-not-found", "--wait=false", timeout=120)
