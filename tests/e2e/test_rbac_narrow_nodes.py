"""Issue 32, defects 5, 6 and 7, the nodes' side: rights narrowed by admission policy, each proven by a refused write
under the writer's own token (the controller's writes: test_rbac_narrow.py).

- ``gpuplane-own-node-slices`` (defect 5): every writer, administrators included, publishes a slice of
  gpu.gpuplane.dev only with its own node's pool; a token bound to a pod on node A (any ServiceAccount, not only
  the driver's) writes only node A's slices.
- ``gpuplane-driver-own-node-pods`` (defect 7): the driver's MPS daemon pods are pinned to what
  ``gpuplane.driver.sharing.mps_pods`` makes: the DaemonSet's image repository, a claim directory as the only
  host path, no more privilege than the driver's container, no hostIPC, the DaemonSet's priority class.
- The controller's Deployment stays off GPU nodes (defect 6: its node affinity, scheduled by the real
  kube-scheduler).
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.cluster import handle as cluster
from e2e.plane import identity, install
from tests.daemonpods import DRIVER_IMAGE, DRIVER_PODS_POLICY, daemon_pod, refused_by
from tests.e2e.conftest import eventually
from tests.e2e.test_rbac_narrow import DRY, GROUP, admitted, namespace, parked_pod
from tests.rbackit import (
    driver_a_fixture,  # noqa: F401  (fixture driver_a)
    installed_fixture,  # noqa: F401  (fixture installed)
    two_nodes_fixture,  # noqa: F401  (fixture two_nodes)
)

pytestmark = pytest.mark.e2e

SLICES = "gpuplane-own-node-slices"
REPO = DRIVER_IMAGE.rsplit(":", 1)[0]  # the installed DaemonSet's image repository


# --- ResourceSlices: every writer ------------------------------------------------------------------------


def slice_body(name: str, node: str, pool: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "driver": "gpu.gpuplane.dev",
        "nodeName": node,
        "pool": {"name": pool if pool is not None else node, "generation": 1, "resourceSliceCount": 1},
        "devices": [{"name": "gpu-0"}],
    }
    return {"apiVersion": f"{GROUP}/v1", "kind": "ResourceSlice", "metadata": {"name": name}, "spec": spec}


def test_every_writer_publishes_only_its_own_nodes_pool(
    installed: cluster.Cluster, two_nodes: tuple[str, str], tmp_path: Path
) -> None:
    node_a, node_b = two_nodes
    admin = client.CustomObjectsApi(installed.api)

    def create(api: client.CustomObjectsApi, body: dict[str, Any], **kw: Any) -> Any:
        return api.create_cluster_custom_object(GROUP, "v1", "resourceslices", body, **kw)

    # An administrator (no exemption): node A's slice naming node B's pool, a pool of no node.
    admitted(create, admin, slice_body(f"{node_a}-ok", node_a, None), **DRY)
    msg = refused_by(SLICES, create, admin, slice_body(f"{node_a}-forged", node_a, node_b), **DRY)
    assert f"spec.pool.name must be '{node_a}', not '{node_b}'" in msg
    assert "publishes its own node's pool" in refused_by(
        SLICES, create, admin, slice_body("x", node_a, "pool-x"), **DRY
    )
    other = {**slice_body("other-driver", node_a, node_b)}
    other["spec"] = {**other["spec"], "driver": "gpu.example.com"}
    admitted(create, admin, other, **DRY)  # another driver's slices are not this policy's

    # Any ServiceAccount token bound to a pod on node A (not the driver's): granted slices by RBAC here, it still
    # writes only node A's slices of this driver.
    ns = namespace(installed, "slicer")
    sa = "slicer"
    core = client.CoreV1Api(installed.api)
    core.create_namespaced_service_account(ns, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=sa)))
    rbac = client.RbacAuthorizationV1Api(installed.api)
    role = f"slicer-{uuid.uuid4().hex[:5]}"
    rule = {"apiGroups": [GROUP], "resources": ["resourceslices"], "verbs": ["create", "delete", "get"]}
    rbac.create_cluster_role({"metadata": {"name": role}, "rules": [rule]})
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role}
    subject = {"kind": "ServiceAccount", "name": sa, "namespace": ns}
    rbac.create_cluster_role_binding({"metadata": {"name": role}, "roleRef": ref, "subjects": [subject]})
    try:
        pod = identity.stand_in_pod(installed.api, ns, sa, node_a)
        token = identity.request_token(installed.api, ns, sa, bound_pod=pod)
        kubeconfig = identity.write_token_kubeconfig(
            tmp_path / "slicer.kubeconfig", installed.kubeconfig, token, identity.username(ns, sa)
        )
        api = identity.new_client(kubeconfig)
        try:
            slicer = client.CustomObjectsApi(api)
            eventually(
                lambda: _admitted_or_rbac(create, slicer, slice_body(f"{node_a}-own", node_a, None), **DRY),
                30,
                "RBAC to grant the slicer resourceslices",
            )
            msg = refused_by(SLICES, create, slicer, slice_body(f"{node_b}-theirs", node_b, None), **DRY)
            assert f"node '{node_a}' may write only its own node's ResourceSlices" in msg
            admin.create_cluster_custom_object(
                GROUP, "v1", "resourceslices", slice_body(f"{node_b}-real", node_b, None)
            )
            try:
                msg = refused_by(
                    SLICES, slicer.delete_cluster_custom_object, GROUP, "v1", "resourceslices", f"{node_b}-real", **DRY
                )
                assert f"of node '{node_b}'" in msg
            finally:
                admin.delete_cluster_custom_object(GROUP, "v1", "resourceslices", f"{node_b}-real")
        finally:
            api.close()
    finally:
        rbac.delete_cluster_role_binding(role)
        rbac.delete_cluster_role(role)
        _force_delete(core, ns, f"{sa}-identity-{node_a}")
        core.delete_namespace(ns)


def _admitted_or_rbac(call: Callable[..., Any], *args: Any, **kw: Any) -> bool:
    """True once the call is admitted; False while RBAC (not yet synced) refuses it."""
    try:
        call(*args, **kw)
    except ApiException as exc:
        if exc.status == 403 and "ValidatingAdmissionPolicy" not in str(exc.body):
            return False
        raise
    return True


# --- MPS daemon pods, pinned to what the driver makes ------------------------------------------------------


def test_driver_daemon_pods_are_pinned_to_what_the_driver_makes(
    installed: cluster.Cluster, two_nodes: tuple[str, str], driver_a: identity.Identity
) -> None:
    node_a, _ = two_nodes
    ds = next(o for o in install.render(installed) if o["kind"] == "DaemonSet")
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == DRIVER_IMAGE  # what daemon_pod() copies
    api = driver_a.api_client()
    core = client.CoreV1Api(api)
    ns = identity.NAMESPACE

    def refused(change: Callable[[dict[str, Any]], Any]) -> str:
        body = daemon_pod(f"gpuplane-mps-{uuid.uuid4().hex[:8]}", node_a)
        change(body)
        return refused_by(DRIVER_PODS_POLICY, core.create_namespaced_pod, ns, body, **DRY)

    def container(b: dict[str, Any]) -> dict[str, Any]:
        c: dict[str, Any] = b["spec"]["containers"][0]
        return c

    try:
        admitted(core.create_namespaced_pod, ns, daemon_pod("gpuplane-mps-pinned", node_a), **DRY)
        digest = "@sha256:" + "0" * 64
        admitted(
            core.create_namespaced_pod,
            ns,
            _with(daemon_pod("gpuplane-mps-tag", node_a), lambda b: container(b).update(image=f"{REPO}:v9")),
            **DRY,
        )
        admitted(
            core.create_namespaced_pod,
            ns,
            _with(daemon_pod("gpuplane-mps-dig", node_a), lambda b: container(b).update(image=REPO + digest)),
            **DRY,
        )
        # Another image (any tool a stolen token would like to run privileged on the node).
        for image in ("busybox", f"evil/{REPO}:dev", f"{REPO}-x:dev", f"{REPO}/x:dev", "gpuplane-driver:5000/evil:dev"):
            msg = refused(lambda b, i=image: container(b).update(image=i))
            assert f"one container of the driver's own image ({REPO}, any tag)" in msg, image
        extra = {"name": "side", "image": DRIVER_IMAGE}
        assert "no init containers" in refused(lambda b: b["spec"].update(initContainers=[extra]))
        assert "one container" in refused(lambda b: b["spec"]["containers"].append(extra))
        # Host paths other than a claim directory.
        for path in (
            "/",
            "/etc",
            "/var/lib/kubelet",
            "/var/lib/kubelet/plugins/gpu.gpuplane.dev",
            "/etc/gpu.gpuplane.dev/mps/x",
        ):
            msg = refused(lambda b, p=path: b["spec"]["volumes"].append({"name": "h", "hostPath": {"path": p}}))
            assert "mount only a claim's directory" in msg and f"'{path}'" in msg
        # More privilege than the driver's container, or another kind of it.
        msg = refused(lambda b: container(b)["securityContext"].update(capabilities={"add": ["SYS_ADMIN"]}))
        assert "no more privileged than the driver's own container" in msg
        assert "no more privileged" in refused(lambda b: container(b)["securityContext"].update(runAsUser=0))
        assert "no more privileged" in refused(lambda b: b["spec"].update(securityContext={"runAsUser": 0}))
        assert "not its IPC" in refused(lambda b: b["spec"].update(hostIPC=True))
        msg = refused(lambda b: b["spec"].update(priorityClassName="system-cluster-critical"))
        assert "the driver's priority class 'system-node-critical'" in msg
        assert "priority class" in refused(lambda b: b["spec"].pop("priorityClassName"))
    finally:
        api.close()


def _with(body: dict[str, Any], change: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    out = copy.deepcopy(body)
    change(out)
    return out


# --- the controller's Deployment: off GPU nodes ----------------------------------------------------------


def test_controller_is_scheduled_off_gpu_nodes(installed: cluster.Cluster, two_nodes: tuple[str, str]) -> None:
    """The Deployment's pod template, as rendered, with one node labelled a GPU node: the scheduler binds it to
    the other; with both labelled it stays Pending (a compromised driver pod never shares a node with it)."""
    node_a, node_b = two_nodes
    deploy = next(o for o in install.render(installed) if o["kind"] == "Deployment")
    spec = copy.deepcopy(deploy["spec"]["template"]["spec"])
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [
        {
            "matchExpressions": [
                {"key": "nvidia.com/gpu.present", "operator": "NotIn", "values": ["true"]},
                {"key": "gpu.gpuplane.dev/present", "operator": "NotIn", "values": ["true"]},
            ]
        }
    ]
    core = client.CoreV1Api(installed.api)
    ns = namespace(installed, "ctl-place")
    # only the two test nodes, and only the affinity under test: the rest of the template needs the cluster's
    # real nodes, images and ServiceAccount, none of which decides where it may go
    affinity = {"nodeAffinity": spec["affinity"]["nodeAffinity"]}
    pick = {"key": "gpuplane.dev/e2e-placement", "operator": "In", "values": [ns]}
    affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
        "matchExpressions"
    ].append(pick)
    labelled: list[str] = []
    scheduling = client.SchedulingV1Api(installed.api)
    first_in_queue = f"{ns}-first"
    scheduling.create_priority_class(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": first_in_queue},
            "value": 900_000_000,
            "preemptionPolicy": "Never",
        }
    )

    def place(name: str) -> dict[str, Any]:
        body = parked_pod(name)
        body["spec"] = {
            "affinity": affinity,
            # ahead of whatever other modules left Pending: the scheduler's queue sorts by priority, then age,
            # and every node label below moves all unschedulable pods back to its active queue
            "priorityClassName": first_in_queue,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "c", "image": identity.STAND_IN_IMAGE}],
        }
        return body

    try:
        for node in (node_a, node_b):
            core.patch_node(node, {"metadata": {"labels": {"gpuplane.dev/e2e-placement": ns}}})
            labelled.append(node)
        core.patch_node(node_a, {"metadata": {"labels": {"gpu.gpuplane.dev/present": "true"}}})
        core.create_namespaced_pod(ns, place("one"))
        eventually(lambda: core.read_namespaced_pod("one", ns).spec.node_name == node_b, 60, "the pod bound to node B")
        core.patch_node(node_b, {"metadata": {"labels": {"nvidia.com/gpu.present": "true"}}})
        core.create_namespaced_pod(ns, place("two"))
        try:
            eventually(
                lambda: any(
                    c.type == "PodScheduled" and c.status == "False"
                    for c in (core.read_namespaced_pod("two", ns).status.conditions or [])
                ),
                120,
                "the scheduler to find no node for the second pod",
            )
        except AssertionError as exc:
            two = core.read_namespaced_pod("two", ns)
            raise AssertionError(f"{exc}: node {two.spec.node_name!r}, conditions {two.status.conditions}") from exc
        assert core.read_namespaced_pod("two", ns).spec.node_name is None
    finally:
        for node in labelled:
            core.patch_node(
                node,
                {
                    "metadata": {
                        "labels": {
                            k: None
                            for k in (
                                "gpu.gpuplane.dev/present",
                                "nvidia.com/gpu.present",
                                "gpuplane.dev/e2e-placement",
                            )
                        }
                    }
                },
            )
        for name in ("one", "two"):
            _force_delete(core, ns, name)
        core.delete_namespace(ns)
        scheduling.delete_priority_class(first_in_queue)


def _force_delete(core: client.CoreV1Api, ns: str, name: str) -> None:
    """Delete a pod at once (one bound to a test node has no kubelet to confirm a graceful delete)."""
    try:
        core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
    except ApiException as exc:
        if exc.status != 404:
            raise
