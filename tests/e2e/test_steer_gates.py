"""The controller lifts only its own scheduling gates (issue 32, defect 6): proven under its own token.

RBAC lets the controller patch pods cluster-wide; the admission policy ``gpuplane-controller-writes``
narrows that to gang members and steering-gated pods, and (this test) to removing only
``gpuplane.dev/steer`` and ``gpuplane.dev/gang`` from their gates: another system's gate, Kueue's
``kueue.x-k8s.io/admission`` for example, stays where it is, so a stolen controller token cannot start
a workload that Kueue (or any other admission system) still holds.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.cluster import handle as cluster
from e2e.plane import identity
from tests.e2e.conftest import eventually
from tests.rbackit import (
    controller_fixture,  # noqa: F401  (fixture controller)
    installed_fixture,  # noqa: F401  (fixture installed)
)

pytestmark = pytest.mark.e2e

CONTROLLER_POLICY = "gpuplane-controller-writes"
KUEUE = "kueue.x-k8s.io/admission"
JSON_PATCH = "application/json-patch+json"


def _pod(name: str, labels: dict[str, str], gates: list[str]) -> dict[str, Any]:
    spec = {
        "schedulingGates": [{"name": g} for g in gates],
        "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": spec}


def _gates(names: list[str]) -> list[dict[str, Any]]:
    return [{"op": "replace", "path": "/spec/schedulingGates", "value": [{"name": g} for g in names]}]


def test_the_controller_never_lifts_another_systems_gate(
    installed: cluster.Cluster, controller: identity.Identity
) -> None:
    ns = f"steer-gates-{uuid.uuid4().hex[:5]}"
    admin = client.CoreV1Api(installed.api)
    admin.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    api = controller.api_client()
    core = client.CoreV1Api(api)
    try:
        admin.create_namespaced_pod(ns, _pod("steered", {"app": "web"}, [KUEUE, "gpuplane.dev/steer"]))
        admin.create_namespaced_pod(ns, _pod("member", {"gpuplane.dev/gang": "g"}, ["gpuplane.dev/gang", KUEUE]))

        # A ValidatingAdmissionPolicy is in force only once the API server has loaded it (a second or two
        # after the install): wait on dry runs, which admission sees but which change nothing.
        def refused() -> bool:
            try:
                core.patch_namespaced_pod("steered", ns, _gates([]), _content_type=JSON_PATCH, dry_run="All")
            except ApiException as exc:
                return exc.status == 403
            return False

        eventually(refused, 60, f"{CONTROLLER_POLICY} in force")
        for name, attempt in (
            ("steered", []),  # every gate at once
            ("steered", ["gpuplane.dev/steer"]),  # Kueue's alone
            ("member", []),
            ("member", ["gpuplane.dev/gang"]),
        ):
            with pytest.raises(ApiException) as err:
                core.patch_namespaced_pod(name, ns, _gates(attempt), _content_type=JSON_PATCH)
            body = str(err.value.body)
            assert err.value.status == 403 and CONTROLLER_POLICY in body, body
            assert "lifts only its own scheduling gates" in body, body
            print(f"refused: controller lifting {KUEUE} from {name} -> {err.value.status} {body[:300]}")

        # What the controller does: lift its own gate, the other system's stays.
        core.patch_namespaced_pod("steered", ns, _gates([KUEUE]), _content_type=JSON_PATCH)
        core.patch_namespaced_pod("member", ns, _gates([KUEUE]), _content_type=JSON_PATCH)
        for name in ("steered", "member"):
            gates = [g.name for g in admin.read_namespaced_pod(name, ns).spec.scheduling_gates or []]
            assert gates == [KUEUE], (name, gates)
    finally:
        api.close()
        installed.kubectl("delete", "namespace", ns, "--wait=false")
