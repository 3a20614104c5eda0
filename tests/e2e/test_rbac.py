"""Least privilege, proven with the identities the manifests define, against the real API server.

The driver authenticates with a TokenRequest token bound to a pod on its node
(as the kubelet-projected token of a DaemonSet pod is), so the API server sees
``system:serviceaccount:gpuplane-system:gpuplane-driver`` with the node's name
in its extra. The controller authenticates with its own service account.

- ``test_*_access_matrix``: SubjectAccessReviews over every verb and resource
  the components touch (and some they must not), compared with the intended matrix.
- ``test_driver_*``: real writes under the driver's token: its own node's
  ResourceSlices succeed; another node's are refused on create, update, delete,
  and moving a slice between nodes; a token without a node writes nothing.
- ``test_controller_cannot_read_secrets``: real reads under the controller's token.
"""

from __future__ import annotations

import json
import re
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.cluster import handle as cluster
from e2e.plane import identity
from e2e.plane.access_review import access, matrix
from tests.rbackit import (
    controller_fixture,  # noqa: F401  (fixture controller)
    driver_a_fixture,  # noqa: F401  (fixture driver_a)
    installed_fixture,  # noqa: F401  (fixture installed)
    two_nodes_fixture,  # noqa: F401  (fixture two_nodes)
)

pytestmark = pytest.mark.e2e

DRIVER = "gpu.gpuplane.dev"
POLICY = "gpuplane-driver-own-node-slices"

# (verb, group, resource, subresource) -> allowed, per identity.
DRIVER_MATRIX: dict[tuple[str, str, str, str], bool] = {
    ("list", "resource.k8s.io", "resourceslices", ""): True,
    ("watch", "resource.k8s.io", "resourceslices", ""): True,
    ("create", "resource.k8s.io", "resourceslices", ""): True,  # own node only: the admission policy
    ("update", "resource.k8s.io", "resourceslices", ""): True,  # own node only: the admission policy
    ("delete", "resource.k8s.io", "resourceslices", ""): True,  # own node only: the admission policy
    ("deletecollection", "resource.k8s.io", "resourceslices", ""): False,
    ("get", "resource.k8s.io", "resourceclaims", ""): True,
    ("list", "resource.k8s.io", "resourceclaims", ""): True,
    ("create", "resource.k8s.io", "resourceclaims", ""): False,
    ("update", "resource.k8s.io", "resourceclaims", "status"): False,
    ("create", "", "events", ""): True,
    ("get", "", "pods", ""): False,  # in "default"; its own namespace: DRIVER_PODS
    ("create", "", "pods", ""): False,
    ("patch", "", "nodes", ""): False,
    ("get", "", "secrets", ""): False,
    ("list", "", "secrets", ""): False,
    ("create", "resource.k8s.io", "deviceclasses", ""): False,
    ("patch", "gpuplane.dev", "gpugangs", ""): False,
}
# The MPS daemon pods (--mps-daemons=pod): pods in gpuplane-system only, no update, no subresources;
# which pods (own node, daemon labels, no token, host paths) is the policy's (test_rbac_writes.py).
# (verb, subresource, namespace) -> allowed
DRIVER_PODS: dict[tuple[str, str, str], bool] = {
    **{(verb, "", "gpuplane-system"): True for verb in ("get", "list", "watch", "create", "delete")},
    ("update", "", "gpuplane-system"): False,
    ("patch", "", "gpuplane-system"): False,
    ("deletecollection", "", "gpuplane-system"): False,
    ("create", "exec", "gpuplane-system"): False,
    ("create", "attach", "gpuplane-system"): False,
    ("patch", "ephemeralcontainers", "gpuplane-system"): False,
    ("patch", "status", "gpuplane-system"): False,
    ("create", "eviction", "gpuplane-system"): False,
    **{(verb, "", ns): False for verb in ("get", "list", "create", "delete") for ns in ("default", "kube-system")},
    ("list", "", ""): False,  # all namespaces
}
CONTROLLER_MATRIX: dict[tuple[str, str, str, str], bool] = {
    ("watch", "gpuplane.dev", "gpugangs", ""): True,
    ("patch", "gpuplane.dev", "gpugangs", ""): True,
    ("patch", "gpuplane.dev", "gpugangs", "status"): True,
    ("delete", "gpuplane.dev", "gpugangs", ""): False,
    ("create", "resource.k8s.io", "resourceclaims", ""): True,
    ("patch", "resource.k8s.io", "resourceclaims", ""): True,
    ("delete", "resource.k8s.io", "resourceclaims", ""): True,
    ("update", "resource.k8s.io", "resourceclaims", "status"): False,
    ("watch", "resource.k8s.io", "resourceslices", ""): True,
    ("create", "resource.k8s.io", "resourceslices", ""): False,
    ("delete", "resource.k8s.io", "resourceslices", ""): False,
    ("watch", "resource.k8s.io", "deviceclasses", ""): True,
    ("patch", "", "pods", ""): True,
    ("delete", "", "pods", ""): True,
    ("patch", "", "pods", "status"): True,
    ("create", "", "pods", ""): False,
    ("patch", "", "nodes", ""): True,
    ("delete", "", "nodes", ""): False,
    ("create", "", "events", ""): True,
    ("list", "apiextensions.k8s.io", "customresourcedefinitions", ""): True,
    ("create", "apiextensions.k8s.io", "customresourcedefinitions", ""): False,
    ("patch", "kopf.dev", "clusterkopfpeerings", ""): False,
    ("get", "", "secrets", ""): False,
    ("list", "", "secrets", ""): False,
    ("watch", "", "secrets", ""): False,
    ("get", "", "configmaps", ""): False,
    ("create", "coordination.k8s.io", "leases", ""): False,  # in "default": only its own namespace
}
# Leader election: the Lease gpuplane-system/gpuplane-controller only.
# (verb, namespace, name) -> allowed
CONTROLLER_LEASES: dict[tuple[str, str, str], bool] = {
    ("create", "gpuplane-system", ""): True,
    ("get", "gpuplane-system", "gpuplane-controller"): True,
    ("update", "gpuplane-system", "gpuplane-controller"): True,
    ("update", "gpuplane-system", "someone-elses-lease"): False,
    ("delete", "gpuplane-system", "gpuplane-controller"): False,
    ("create", "kube-system", ""): False,
    ("update", "kube-system", "kube-controller-manager"): False,
}


def test_driver_access_matrix(installed: cluster.Cluster) -> None:
    user = identity.username(identity.NAMESPACE, identity.DRIVER_SA)
    table = matrix(installed.api, user, DRIVER_MATRIX)
    for (verb, sub, namespace), expected in DRIVER_PODS.items():
        got = access(installed.api, user, (verb, "", "pods", sub), namespace)
        name = f"pods/{sub}" if sub else "pods"
        row = f"{'ALLOW' if got else 'deny ':5} {verb:16} {'core':28} {name} in {namespace or '(all namespaces)'}"
        table += "\n" + row + ("" if got == expected else "   <-- UNEXPECTED")
    print("\n" + table)
    assert "UNEXPECTED" not in table, table


def test_controller_access_matrix(installed: cluster.Cluster) -> None:
    user = identity.username(identity.NAMESPACE, identity.CONTROLLER_SA)
    table = matrix(installed.api, user, CONTROLLER_MATRIX)
    for (verb, namespace, name), expected in CONTROLLER_LEASES.items():
        got = access(installed.api, user, (verb, "coordination.k8s.io", "leases", ""), namespace, name)
        row = f"{'ALLOW' if got else 'deny ':5} {verb:16} {'coordination.k8s.io':28} leases {namespace}/{name or '*'}"
        table += "\n" + row + ("" if got == expected else "   <-- UNEXPECTED")
    print("\n" + table)
    assert "UNEXPECTED" not in table, table


def test_driver_token_carries_its_node(driver_a: identity.Identity) -> None:
    api = driver_a.api_client()
    try:
        me = identity.whoami(api)
    finally:
        api.close()
    assert me["username"] == "system:serviceaccount:gpuplane-system:gpuplane-driver"
    assert me["extra"][identity.NODE_NAME_EXTRA] == [driver_a.node_name]


def slice_body(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}],
        },
    }


def refused(call: Any, *args: Any, statuses: tuple[int, ...] = (403,)) -> ApiException:
    with pytest.raises(ApiException) as err:
        call(*args)
    assert err.value.status in statuses, err.value.body
    return err.value


def test_driver_writes_only_its_own_nodes_slices(
    installed: cluster.Cluster, two_nodes: tuple[str, str], driver_a: identity.Identity
) -> None:
    node_a, node_b = two_nodes
    admin = client.CustomObjectsApi(installed.api)
    driver_api = driver_a.api_client()
    mine = client.CustomObjectsApi(driver_api)
    g, v, r = "resource.k8s.io", "v1", "resourceslices"
    own, other = f"{node_a}-slice", f"{node_b}-slice"
    try:
        # Own node: create, update, list, delete all work.
        created = mine.create_cluster_custom_object(g, v, r, slice_body(own, node_a))
        created["spec"]["pool"]["generation"] = 2
        updated = mine.replace_cluster_custom_object(g, v, r, own, created)
        listed = mine.list_cluster_custom_object(g, v, r, field_selector=f"spec.nodeName={node_a}")
        assert [s["metadata"]["name"] for s in listed["items"]] == [own]

        # Another node: create refused by the admission policy.
        err = refused(mine.create_cluster_custom_object, g, v, r, slice_body(other, node_b))
        # refused by the driver's policy or by gpuplane-own-node-slices (every writer); both name the node
        assert any(p in str(err.body) for p in (POLICY, "gpuplane-own-node-slices")), err.body
        assert f"node '{node_b}'" in str(err.body), err.body

        # Anything else in a slice that names another node (or another driver) is refused too.
        def spoof(name: str, change: Any) -> str:
            body = slice_body(name, node_a)
            change(body)
            return str(refused(mine.create_cluster_custom_object, g, v, r, body).body)

        pooled = spoof(f"{node_a}-pool", lambda b: b["spec"]["pool"].update(name=node_b))
        assert f"not pool '{node_b}'" in pooled or f"must be '{node_a}', not '{node_b}'" in pooled, pooled
        assert f"names its ResourceSlices '{node_a}-" in spoof(f"{node_b}-gpuplane-9", lambda b: None)
        assert "not 'gpu.example.com'" in spoof(f"{node_a}-drv", lambda b: b["spec"].update(driver="gpu.example.com"))
        assert "gpuplane.dev/node=" in spoof(
            f"{node_a}-lbl", lambda b: b["metadata"].setdefault("labels", {}).update({"gpuplane.dev/node": node_b})
        )
        # (Per-device nodeName/nodeSelector need perDeviceNodeSelection without spec.nodeName: the first rule.)

        # Another node's existing slice (written by the admin): update and delete refused.
        theirs = admin.create_cluster_custom_object(g, v, r, slice_body(other, node_b))
        theirs["spec"]["pool"]["generation"] = 2
        refused(mine.replace_cluster_custom_object, g, v, r, other, theirs)
        refused(mine.patch_cluster_custom_object, g, v, r, other, {"metadata": {"labels": {"x": "y"}}})
        refused(mine.delete_cluster_custom_object, g, v, r, other)
        # Adopting it (rewriting its nodeName to one's own), or giving one's own away: spec.nodeName
        # is immutable in 1.36 (422), and the policy's old-object check would refuse it (403) if not.
        theirs["spec"]["nodeName"] = node_a
        theirs["spec"]["pool"]["name"] = node_a
        refused(mine.replace_cluster_custom_object, g, v, r, other, theirs, statuses=(403, 422))
        updated["spec"]["nodeName"] = node_b
        refused(mine.replace_cluster_custom_object, g, v, r, own, updated, statuses=(403, 422))
        # Deletecollection is not granted at all.
        refused(mine.delete_collection_cluster_custom_object, g, v, r)

        mine.delete_cluster_custom_object(g, v, r, own)
        assert admin.get_cluster_custom_object(g, v, r, other)["spec"]["nodeName"] == node_b
    finally:
        driver_api.close()
        for name in (own, other):
            try:
                admin.delete_cluster_custom_object(g, v, r, name)
            except ApiException as exc:
                if exc.status != 404:
                    raise


def test_driver_token_without_a_node_writes_no_slices(
    installed: cluster.Cluster, two_nodes: tuple[str, str], tmp_path: Path
) -> None:
    token = identity.request_token(installed.api, identity.NAMESPACE, identity.DRIVER_SA)
    path = identity.write_token_kubeconfig(
        tmp_path / "unbound.kubeconfig", installed.kubeconfig, token, "gpuplane-driver-unbound"
    )
    api = identity.new_client(path)
    try:
        assert identity.NODE_NAME_EXTRA not in identity.whoami(api)["extra"]
        err = refused(
            client.CustomObjectsApi(api).create_cluster_custom_object,
            "resource.k8s.io",
            "v1",
            "resourceslices",
            slice_body(f"{two_nodes[0]}-unbound", two_nodes[0]),
        )
        assert "carries no node name" in str(err.body)
    finally:
        api.close()


def test_driver_reads_claims_and_nothing_else(installed: cluster.Cluster, driver_a: identity.Identity) -> None:
    admin = client.CustomObjectsApi(installed.api)
    name = f"rbac-claim-{uuid.uuid4().hex[:5]}"
    admin.create_namespaced_custom_object(
        "resource.k8s.io",
        "v1",
        "default",
        "resourceclaims",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpuplane.dev"}}]}},
        },
    )
    api = driver_a.api_client()
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    try:
        got = custom.get_namespaced_custom_object("resource.k8s.io", "v1", "default", "resourceclaims", name)
        assert got["metadata"]["name"] == name
        assert any(
            c["metadata"]["name"] == name
            for c in custom.list_cluster_custom_object("resource.k8s.io", "v1", "resourceclaims")["items"]
        )
        refused(
            custom.patch_namespaced_custom_object,
            "resource.k8s.io",
            "v1",
            "default",
            "resourceclaims",
            name,
            {"metadata": {"labels": {"x": "y"}}},
        )
        refused(core.list_namespaced_pod, "default")
        refused(
            core.create_namespaced_pod,
            "default",
            client.V1Pod(
                metadata=client.V1ObjectMeta(name="x"),
                spec=client.V1PodSpec(containers=[client.V1Container(name="x", image="x")]),
            ),
        )
        refused(core.list_namespaced_secret, "gpuplane-system")
    finally:
        api.close()
        admin.delete_namespaced_custom_object("resource.k8s.io", "v1", "default", "resourceclaims", name)


def test_controller_cannot_read_secrets(installed: cluster.Cluster, controller: identity.Identity) -> None:
    core = client.CoreV1Api(installed.api)
    secret = f"rbac-secret-{uuid.uuid4().hex[:5]}"
    core.create_namespaced_secret(
        "gpuplane-system", client.V1Secret(metadata=client.V1ObjectMeta(name=secret), string_data={"k": "v"})
    )
    api = controller.api_client()
    mine = client.CoreV1Api(api)
    try:
        refused(mine.read_namespaced_secret, secret, "gpuplane-system")
        refused(mine.list_namespaced_secret, "gpuplane-system")
        refused(mine.list_secret_for_all_namespaces)
        # What its reconcilers do use works under the same token.
        client.CustomObjectsApi(api).list_cluster_custom_object("resource.k8s.io", "v1", "resourceslices")
        client.CustomObjectsApi(api).list_cluster_custom_object("gpuplane.dev", "v1alpha1", "gpugangs")
        mine.list_node()
        mine.list_pod_for_all_namespaces()
    finally:
        api.close()
        core.delete_namespaced_secret(secret, "gpuplane-system")


def test_controller_runs_under_its_own_identity(installed: cluster.Cluster, controller: identity.Identity) -> None:
    """The real controller process (kopf, Lease leader election) under its own token: leads, serves metrics, no 403."""
    from e2e.cluster import procs
    from e2e.cluster.controlplane import free_port
    from e2e.plane.driverproc import REPO

    taken: set[int] = set()
    metrics_port, health_port = free_port(taken), free_port(taken)
    log = controller.kubeconfig.parent / "controller.log"
    argv = [
        sys.executable,
        "-m",
        "gpuplane.controller.main",
        f"--kubeconfig={controller.kubeconfig}",
        "--identity=e2e-rbac-controller",
        "--lease-namespace=gpuplane-system",
        f"--metrics-port={metrics_port}",
        "--metrics-auth=none",
        f"--liveness=http://127.0.0.1:{health_port}/healthz",
        "--log-format=json",
    ]
    proc, record = procs.spawn("controller", argv, log=log, pid_dir=log.parent / "pids", cwd=REPO, die_with_parent=True)
    try:
        deadline = time.monotonic() + 60
        holder = ""
        coordination = client.CoordinationV1Api(installed.api)
        while time.monotonic() < deadline and holder != "e2e-rbac-controller":
            assert proc.poll() is None, procs.describe_log(log)
            try:
                lease = coordination.read_namespaced_lease("gpuplane-controller", "gpuplane-system")
                holder = (lease.spec.holder_identity if lease.spec else None) or ""
            except ApiException as exc:
                if exc.status != 404:
                    raise
            time.sleep(0.5)
        assert holder == "e2e-rbac-controller", f"the controller did not take the leader Lease: {holder!r}"
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as resp:
            assert "gpuplane_gang_queue_depth" in resp.read().decode()
        time.sleep(3)  # let the watches start; a missing permission shows as 403 in the log
        denied = [line for line in log.read_text().splitlines() if _mentions_forbidden(line)]
        assert not denied, procs.describe_log(log, 60)
    finally:
        procs.stop(record, proc)


def _mentions_forbidden(line: str) -> bool:
    """A log line reporting a 403 (timestamps, which can contain "403", are left out)."""
    try:
        record = json.loads(line)
    except ValueError:
        record = None
    if isinstance(record, dict):
        record.pop("timestamp", None)
        line = json.dumps(record)
    return re.search(r"(?<![\d.:])403(?!\d)|forbidden", line, re.IGNORECASE) is not None
