"""Issue 32, defect 6: the controller's rights RBAC grants too broadly, narrowed by admission policy, each proven by
a refused write under the controller's own token (the nodes' side, defects 5 and 7: test_rbac_narrow_nodes.py).

- ``gpuplane-controller-scoped-writes`` (defect 6): the controller's DeviceTaintRules only the ones it labels,
  naming one device of its driver, taint gpuplane.dev/moved-noisy-neighbour NoSchedule (never an empty selector,
  never NoExecute); no eviction in a system namespace; ResourceClaimTemplates created and deleted only when a
  GpuRequest owns them; Jobs patched only to suspend them.

Requests are server-side dry runs (``dryRun=All``: authorization and every admission step run, nothing is
stored) unless a real object is needed for an UPDATE or DELETE.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.cluster import handle as cluster
from e2e.cluster import releases
from e2e.plane import identity
from gpuplane.controller.rebalance import moves
from gpuplane.controller.rightsize import template as rs_template
from tests.daemonpods import refused_by
from tests.rbackit import (
    controller_fixture,  # noqa: F401  (fixture controller)
    installed_fixture,  # noqa: F401  (fixture installed)
    two_nodes_fixture,  # noqa: F401  (fixture two_nodes)
)

pytestmark = pytest.mark.e2e

SCOPED = "gpuplane-controller-scoped-writes"
DRY: dict[str, Any] = {"dry_run": "All"}
GROUP = "resource.k8s.io"
RULES_VERSION = releases.RUNNING.device_taint_rule_api.split("/")[1]


def admitted(call: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """The call goes through (a refusal fails the test with the API's message)."""
    try:
        return call(*args, **kw)
    except ApiException as exc:
        raise AssertionError(f"refused ({exc.status}): {exc.body}") from exc


def namespace(installed: cluster.Cluster, prefix: str, labels: dict[str, str] | None = None) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:5]}"
    meta = client.V1ObjectMeta(name=name, labels=labels)
    client.CoreV1Api(installed.api).create_namespace(client.V1Namespace(metadata=meta))
    return name


def parked_pod(name: str) -> dict[str, Any]:
    """A pod that stays Pending (no node matches)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"rbac-test": "nowhere"},
            "containers": [{"name": "c", "image": identity.STAND_IN_IMAGE}],
        },
    }


@pytest.fixture(name="ctl")
def ctl_fixture(controller: identity.Identity) -> Iterator[client.ApiClient]:
    api = controller.api_client()
    yield api
    api.close()


# --- DeviceTaintRules ------------------------------------------------------------------------------------


def our_rule(node: str, device: str = "gpu-0") -> dict[str, Any]:
    """The DeviceTaintRule the rebalancer writes for a move (gpuplane.controller.rebalance.moves.rule)."""
    move = moves.Move(
        pool=node,
        node=node,
        device=device,
        hog_uid=str(uuid.uuid4()),
        namespace="t",
        claim="c",
        pod="p",
        tier="bronze",
        owner="ReplicaSet/r",
        owner_uid=str(uuid.uuid4()),
        fraction=1.0,
        evicted_at=0.0,
        figures="",
        victims="",
    )
    return moves.rule(move)


def test_controller_device_taint_rules_are_only_its_own(
    installed: cluster.Cluster, two_nodes: tuple[str, str], ctl: client.ApiClient
) -> None:
    custom = client.CustomObjectsApi(ctl)
    admin = client.CustomObjectsApi(installed.api)

    def create(body: dict[str, Any], **kw: Any) -> Any:
        return custom.create_cluster_custom_object(GROUP, RULES_VERSION, moves.PLURAL, body, **kw)

    def refused(change: Callable[[dict[str, Any]], Any]) -> str:
        body = our_rule(two_nodes[0])
        change(body)
        return refused_by(SCOPED, create, body, **DRY)

    admitted(create, our_rule(two_nodes[0]), **DRY)  # what the rebalancer writes
    # The attack: a NoExecute rule with an empty selector (every DRA pod in the cluster evicted).
    msg = refused(lambda b: b["spec"].update(deviceSelector={}, taint={"key": "x", "effect": "NoExecute"}))
    assert "name one device of its own driver" in msg
    assert "never NoExecute" in refused(lambda b: b["spec"]["taint"].update(effect="NoExecute"))
    assert "never NoExecute" in refused(lambda b: b["spec"]["taint"].update(key="node.kubernetes.io/unreachable"))
    assert "name one device" in refused(lambda b: b["spec"]["deviceSelector"].pop("device"))
    assert "name one device" in refused(lambda b: b["spec"]["deviceSelector"].update(driver="gpu.nvidia.com"))
    assert "name one device" in refused(lambda b: b["spec"]["deviceSelector"].pop("pool"))
    assert "only its own DeviceTaintRules" in refused(lambda b: b["metadata"]["labels"].pop(moves.LABEL))

    # UPDATE and DELETE: a real rule of its own (annotations only), and someone else's it may not touch.
    mine, theirs = our_rule(two_nodes[0], "gpu-1"), our_rule(two_nodes[0], "gpu-2")
    theirs["metadata"]["labels"] = {"team": "ops"}
    theirs["metadata"]["name"] = f"ops-{uuid.uuid4().hex[:5]}"
    for body in (mine, theirs):
        admin.create_cluster_custom_object(GROUP, RULES_VERSION, moves.PLURAL, body)
    name, other = mine["metadata"]["name"], theirs["metadata"]["name"]
    try:

        def patch(target: str, body: dict[str, Any], **kw: Any) -> Any:
            return custom.patch_cluster_custom_object(GROUP, RULES_VERSION, moves.PLURAL, target, body, **kw)

        admitted(patch, name, {"metadata": {"annotations": {moves.ANNOTATION: "{}"}}})
        assert "never NoExecute" in refused_by(SCOPED, patch, name, {"spec": {"taint": {"effect": "NoExecute"}}}, **DRY)
        moved = {"spec": {"deviceSelector": {"device": "gpu-7"}}}  # another GPU: a selector it did not write
        assert "changes only the annotations" in refused_by(SCOPED, patch, name, moved, **DRY)
        assert "changes only the annotations" in refused_by(
            SCOPED, patch, name, {"metadata": {"labels": {"app.kubernetes.io/managed-by": "me"}}}, **DRY
        )
        assert "only its own DeviceTaintRules" in refused_by(
            SCOPED, custom.delete_cluster_custom_object, GROUP, RULES_VERSION, moves.PLURAL, other, **DRY
        )
        admitted(custom.delete_cluster_custom_object, GROUP, RULES_VERSION, moves.PLURAL, name)
    finally:
        for n in (name, other):
            try:
                admin.delete_cluster_custom_object(GROUP, RULES_VERSION, moves.PLURAL, n)
            except ApiException as exc:
                if exc.status != 404:
                    raise


# --- evictions ---------------------------------------------------------------------------------------------


def test_controller_never_evicts_in_system_namespaces(installed: cluster.Cluster, ctl: client.ApiClient) -> None:
    admin = client.CoreV1Api(installed.api)
    core = client.CoreV1Api(ctl)
    tenant = namespace(installed, "evict-t")
    marked = namespace(installed, "evict-sys", {"gpuplane.dev/system": "true"})
    name = f"victim-{uuid.uuid4().hex[:5]}"
    spaces = (tenant, marked, "kube-system", "gpuplane-system")
    try:
        for ns in spaces:
            admin.create_namespaced_pod(ns, parked_pod(name))

        def evict(ns: str) -> Any:
            body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=ns))
            return core.create_namespaced_pod_eviction(name, ns, body, **DRY)

        admitted(evict, tenant)  # a tenant's pod: the Eviction API (PDBs apply) decides
        for ns in spaces[1:]:
            msg = refused_by(SCOPED, evict, ns)
            assert "never evicts in a system namespace" in msg and f"'{ns}/{name}'" in msg
        for ns in spaces:
            assert admin.read_namespaced_pod(name, ns).metadata.deletion_timestamp is None
    finally:
        for ns in spaces:
            try:
                admin.delete_namespaced_pod(name, ns, grace_period_seconds=0)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        for ns in (tenant, marked):
            admin.delete_namespace(ns)


# --- ResourceClaimTemplates --------------------------------------------------------------------------------


def test_controller_claim_templates_only_of_gpu_requests(installed: cluster.Cluster, ctl: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(ctl)
    admin = client.CustomObjectsApi(installed.api)
    ns = namespace(installed, "rct")

    def template(name: str, owner: str | None, label: str | None, owner_uid: str | None = None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "labels": {}}
        if label is not None:
            meta["labels"][rs_template.LABEL_REQUEST] = label
        if owner is not None:
            ref = {"apiVersion": rs_template.API_VERSION, "kind": rs_template.KIND, "name": owner}
            meta["ownerReferences"] = [{**ref, "uid": owner_uid or str(uuid.uuid4()), "controller": True}]
        request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.gpuplane.dev"}}
        return {
            "apiVersion": f"{GROUP}/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": meta,
            "spec": {"spec": {"devices": {"requests": [request]}}},
        }

    def create(body: dict[str, Any], **kw: Any) -> Any:
        return custom.create_namespaced_custom_object(GROUP, "v1", ns, "resourceclaimtemplates", body, **kw)

    def delete(name: str, **kw: Any) -> Any:
        return custom.delete_namespaced_custom_object(GROUP, "v1", ns, "resourceclaimtemplates", name, **kw)

    try:
        admitted(create, template("r1", "r1", "r1"), **DRY)  # right-sizing's template of GpuRequest r1
        expected = "creates and deletes only the ResourceClaimTemplate a GpuRequest owns"
        assert expected in refused_by(SCOPED, create, template("planted", None, None), **DRY)
        assert expected in refused_by(SCOPED, create, template("planted", None, "r1"), **DRY)
        assert expected in refused_by(SCOPED, create, template("planted", "r1", "r2"), **DRY)
        admin.create_namespaced_custom_object(GROUP, "v1", ns, "resourceclaimtemplates", template("users", None, None))
        assert expected in refused_by(SCOPED, delete, "users", **DRY)
        # owned by a GpuRequest that exists: the garbage collector deletes a template whose owner does not, and
        # the dry-run delete then meets a 404 before admission (it failed the whole suite once)
        owner = admin.create_namespaced_custom_object(
            *rs_template.API_VERSION.split("/"), ns, rs_template.PLURAL,
            {"apiVersion": rs_template.API_VERSION, "kind": rs_template.KIND, "metadata": {"name": "r3"},
             "spec": {"memory": "12Gi", "compute": 20}},
        )  # fmt: skip
        body = template("r3", "r3", "r3", owner_uid=owner["metadata"]["uid"])
        admin.create_namespaced_custom_object(GROUP, "v1", ns, "resourceclaimtemplates", body)
        admitted(delete, "r3", **DRY)
    finally:
        client.CoreV1Api(installed.api).delete_namespace(ns)


# --- Jobs --------------------------------------------------------------------------------------------------


def test_controller_only_suspends_jobs(installed: cluster.Cluster, ctl: client.ApiClient) -> None:
    ns = namespace(installed, "jobs")
    batch = client.BatchV1Api(ctl)
    pod = parked_pod("x")
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "labels": {"app": "train"}},
        "spec": {
            "suspend": False,
            "parallelism": 1,
            "template": {"spec": {**pod["spec"], "restartPolicy": "Never"}},
        },
    }
    client.BatchV1Api(installed.api).create_namespaced_job(ns, job)
    try:

        def patch(body: dict[str, Any]) -> Any:
            return batch.patch_namespaced_job("train", ns, body, **DRY)

        admitted(patch, {"spec": {"suspend": True}})  # a timed-out gang's Job is stopped
        expected = "only suspends a Job (spec.suspend: true)"
        assert expected in refused_by(SCOPED, patch, {"spec": {"suspend": True, "parallelism": 5}})
        assert expected in refused_by(SCOPED, patch, {"spec": {"parallelism": 5}})
        assert expected in refused_by(SCOPED, patch, {"metadata": {"labels": {"app": "x"}}, "spec": {"suspend": True}})
        assert expected in refused_by(SCOPED, patch, {"spec": {"suspend": True, "activeDeadlineSeconds": 1}})
        client.BatchV1Api(installed.api).patch_namespaced_job("train", ns, {"spec": {"suspend": True}})
        assert expected in refused_by(SCOPED, patch, {"spec": {"suspend": False}})  # never resumes one
    finally:
        client.CoreV1Api(installed.api).delete_namespace(ns)
