"""The controller's cluster-wide write rights, narrowed by admission policy to the writes it makes (issue 18, defect 8).

RBAC cannot say "only this label" or "only gated gang members", so the controller keeps
``pods patch/delete``, ``pods/status patch``, ``nodes patch`` and ``resourceclaims patch/delete``
cluster-wide and the ValidatingAdmissionPolicy ``gpuplane-controller-writes`` refuses, under the
controller's own token, every write the controller does not make (a stolen token's writes).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.cluster import handle as cluster
from e2e.plane import identity
from tests.rbackit import (
    controller_fixture,  # noqa: F401  (fixture controller)
    installed_fixture,  # noqa: F401  (fixture installed)
    two_nodes_fixture,  # noqa: F401  (fixture two_nodes)
)

pytestmark = pytest.mark.e2e

CONTROLLER_POLICY = "gpuplane-controller-writes"


def test_controller_writes_are_narrowed_to_its_own(
    installed: cluster.Cluster, two_nodes: tuple[str, str], controller: identity.Identity
) -> None:
    """RBAC grants pods patch/delete, pods/status patch, nodes patch and claims delete cluster-wide; the
    admission policy lets the controller's token make only the writes the controller makes."""
    node_a, _ = two_nodes
    ns = f"rbac-ctl-{uuid.uuid4().hex[:5]}"
    admin = client.CoreV1Api(installed.api)
    admin_custom = client.CustomObjectsApi(installed.api)
    admin.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))

    def pod(name: str, labels: dict[str, str], gated: bool) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "nodeSelector": {"rbac-test": "nowhere"},  # stays Pending
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
        }
        if gated:
            spec["schedulingGates"] = [{"name": "gpuplane.dev/gang"}]
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": spec}

    api = controller.api_client()
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    json_patch = "application/json-patch+json"
    try:
        for name, labels, gated in (("victim", {"app": "web"}, False), ("member", {"gpuplane.dev/gang": "g"}, True)):
            admin.create_namespaced_pod(ns, pod(name, labels, gated))
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "someones"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpuplane.dev"}}]}},
        }
        admin_custom.create_namespaced_custom_object("resource.k8s.io", "v1", ns, "resourceclaims", claim)

        def denied(call: Any, *args: Any, **kw: Any) -> str:
            with pytest.raises(ApiException) as err:
                call(*args, **kw)
            assert err.value.status == 403 and CONTROLLER_POLICY in str(err.value.body), err.value.body
            return str(err.value.body)

        # What a stolen controller token could do with RBAC alone, and may not any more.
        denied(core.patch_namespaced_pod, "victim", ns, {"metadata": {"labels": {"app": "evil"}}})
        denied(core.patch_namespaced_pod, "victim", ns, {"spec": {"containers": [{"name": "c", "image": "evil/x"}]}})
        denied(core.delete_namespaced_pod, "victim", ns)
        running = [{"op": "replace", "path": "/status/phase", "value": "Running"}]
        denied(core.patch_namespaced_pod_status, "victim", ns, running, _content_type=json_patch)
        ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
        denied(core.patch_namespaced_pod_status, "victim", ns, ready)
        taint = {"spec": {"taints": [{"key": "evil", "effect": "NoSchedule"}]}}
        denied(core.patch_node, node_a, taint)
        denied(core.patch_node, node_a, {"metadata": {"labels": {"evil": "yes"}}})
        denied(core.patch_namespaced_pod, "member", ns, {"spec": {"containers": [{"name": "c", "image": "evil/x"}]}})
        denied(custom.delete_namespaced_custom_object, "resource.k8s.io", "v1", ns, "resourceclaims", "someones")
        denied(
            custom.patch_namespaced_custom_object,
            "resource.k8s.io",
            "v1",
            ns,
            "resourceclaims",
            "someones",
            {"metadata": {"labels": {"x": "y"}}},
        )

        # What the controller does: allowed.
        core.patch_node(node_a, {"metadata": {"labels": {"gpuplane.dev/nvlink-domain": f"{node_a}.nvl0"}}})
        custom.patch_namespaced_custom_object(
            "resource.k8s.io",
            "v1",
            ns,
            "resourceclaims",
            "someones",
            {"metadata": {"annotations": {"gpuplane.dev/config-error": "x"}}},
        )
        affinity = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node_a]}]}
                    ]
                }
            }
        }
        core.patch_namespaced_pod(
            "member", ns, [{"op": "add", "path": "/spec/affinity", "value": affinity}], _content_type=json_patch
        )
        core.patch_namespaced_pod(
            "member", ns, [{"op": "replace", "path": "/spec/schedulingGates", "value": []}], _content_type=json_patch
        )
        condition = {"status": {"conditions": [{"type": "gpuplane.dev/ClaimConfigValid", "status": "False"}]}}
        core.patch_namespaced_pod_status("victim", ns, condition)
        failed = [
            {"op": "test", "path": "/status/phase", "value": "Pending"},
            {"op": "replace", "path": "/status/phase", "value": "Failed"},
        ]
        core.patch_namespaced_pod_status("victim", ns, failed, _content_type=json_patch)
        core.delete_namespaced_pod("member", ns)
        # A failed pod is never made Running again (the API server's own rule, 422, or the policy, 403).
        with pytest.raises(ApiException) as again:
            core.patch_namespaced_pod_status("victim", ns, running, _content_type=json_patch)
        assert again.value.status in (403, 422)
    finally:
        api.close()
        admin.patch_node(node_a, {"metadata": {"labels": {"gpuplane.dev/nvlink-domain": None}}})
        installed.kubectl("delete", "namespace", ns, "--wait=false")
