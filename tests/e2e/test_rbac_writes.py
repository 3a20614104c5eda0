"""Write rights RBAC cannot narrow enough, narrowed by admission policy, proven under the components' own tokens.

The controller (issue 18, defect 8): RBAC cannot say "only this label" or "only gated gang members", so
the controller keeps ``pods patch/delete``, ``pods/status patch``, ``nodes patch`` and ``resourceclaims
patch/delete`` cluster-wide and the ValidatingAdmissionPolicy ``gpuplane-controller-writes`` refuses, under
the controller's own token, every write the controller does not make (a stolen token's writes). RBAC's
``gpugangs patch`` (kopf's finalizer and progress annotations) is narrowed the same way: a tenant's gang's
spec, labels and owners are not the controller's to change.

The driver (issue 12, MPS daemons in pods of their own): RBAC grants pods get/list/watch/create/delete in
gpuplane-system, and ``gpuplane-driver-own-node-pods`` lets the driver's node-bound token create only
MPS control-daemon pods on its own node, with no service-account token and host paths only, and delete
only its own node's daemon pods. Creates and deletes are server-side dry runs (``dryRun=All``: authorization
and every admission step run, nothing is stored), plus real ones, the last through the driver's own
``gpuplane.driver.sharing.mps_pods`` with its pod template taken from the rendered DaemonSet.
"""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.cluster import handle as cluster
from e2e.plane import identity, install
from gpuplane.driver.kube import KubeApi
from gpuplane.driver.sharing import mps_pods, mps_spec
from tests.daemonpods import DAEMON_LABELS, DRIVER_PODS_POLICY, daemon_pod, policy_refusal, refused_by
from tests.e2e.conftest import eventually
from tests.rbackit import (
    controller_fixture,  # noqa: F401  (fixture controller)
    driver_a_fixture,  # noqa: F401  (fixture driver_a)
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

        def in_force() -> bool:  # a policy just applied is compiled by the API server in the background
            try:
                core.patch_namespaced_pod("victim", ns, {"metadata": {"labels": {"app": "x"}}}, dry_run="All")
            except ApiException as exc:
                return exc.status == 403 and CONTROLLER_POLICY in str(exc.body)
            return False

        eventually(in_force, 30, f"{CONTROLLER_POLICY} in force (a dry run refused)")

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

        # A tenant's GpuGang: the controller's token may not raise its priority, relabel it or pin it with a
        # finalizer of its own; kopf's finalizer and gpuplane.dev/ annotations (handler progress) it may.
        gang = {
            "apiVersion": "gpuplane.dev/v1alpha1",
            "kind": "GpuGang",
            "metadata": {"name": "tenants", "labels": {"team": "a"}},
            "spec": {"members": 1, "gpusPerMember": 1},
        }
        admin_custom.create_namespaced_custom_object("gpuplane.dev", "v1alpha1", ns, "gpugangs", gang)

        def patch_gang(body: dict[str, Any]) -> Any:
            return custom.patch_namespaced_custom_object("gpuplane.dev", "v1alpha1", ns, "gpugangs", "tenants", body)

        gang_refusal = denied(patch_gang, {"spec": {"priority": 1000}})
        assert "may only change a GpuGang's or GpuRequest's kopf finalizer" in gang_refusal, gang_refusal
        denied(patch_gang, {"metadata": {"labels": {"team": "b"}}})
        denied(patch_gang, {"metadata": {"annotations": {"example.com/x": "y"}}})
        denied(patch_gang, {"metadata": {"finalizers": ["example.com/hold"]}})

        # What the controller does: allowed.
        patch_gang({"metadata": {"annotations": {"gpuplane.dev/gang_release": "{}"}}})
        patch_gang({"metadata": {"finalizers": ["kopf.zalando.org/KopfFinalizerMarker"]}})
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


def test_driver_creates_only_own_node_daemon_pods(
    installed: cluster.Cluster, two_nodes: tuple[str, str], driver_a: identity.Identity
) -> None:
    """The driver's pods grant (create in gpuplane-system) lets its node-bound token make only its own
    node's MPS daemon pods: no other node, no token of any service account, host paths only."""
    node_a, node_b = two_nodes
    ns = identity.NAMESPACE
    api = driver_a.api_client()
    core = client.CoreV1Api(api)
    dry = {"dry_run": "All"}

    def refused(change: Any) -> str:
        body = daemon_pod(f"gpuplane-mps-{uuid.uuid4().hex[:8]}", node_a)
        change(body)
        return refused_by(DRIVER_PODS_POLICY, core.create_namespaced_pod, ns, body, **dry)

    try:
        # The daemon pod the driver makes: admitted (the ServiceAccount plugin named it "default" and,
        # automount being off, added no token volume).
        made = core.create_namespaced_pod(ns, daemon_pod("gpuplane-mps-dry", node_a), **dry)
        assert made.spec.node_name == node_a and made.spec.service_account_name == "default"
        assert [v.name for v in made.spec.volumes] == ["mps", "shm"]

        # Another node, or no node (the scheduler would place it anywhere).
        other = daemon_pod("gpuplane-mps-b", node_b)
        msg = refused_by(DRIVER_PODS_POLICY, core.create_namespaced_pod, ns, other, **dry)
        assert f"on node '{node_a}' may create pods only on its own node" in msg and f"on node '{node_b}'" in msg
        assert "unscheduled pod" in refused(lambda b: b["spec"].pop("nodeName"))
        # A token of another service account (the controller's: cluster-wide pod, node and claim writes),
        # or of its own: automountServiceAccountToken true, or left to its default (true).
        msg = refused(lambda b: b["spec"].update(serviceAccountName="gpuplane-controller"))
        assert "carry no service-account token" in msg and "service account 'gpuplane-controller'" in msg
        assert "automountServiceAccountToken must be false" in refused(
            lambda b: b["spec"].update(automountServiceAccountToken=True)
        )
        assert "a mounted token" in refused(lambda b: b["spec"].pop("automountServiceAccountToken"))
        # Volumes other than host paths: a projected token of any audience, a Secret, a ConfigMap.
        token = {"serviceAccountToken": {"path": "token", "audience": "evil"}}
        msg = refused(lambda b: b["spec"]["volumes"].append({"name": "tok", "projected": {"sources": [token]}}))
        assert "mount host paths only" in msg and "volume(s) 'tok'" in msg
        assert "volume(s) 'sec'" in refused(
            lambda b: b["spec"]["volumes"].append({"name": "sec", "secret": {"secretName": "x"}})
        )
        assert "volume(s) 'cm'" in refused(
            lambda b: b["spec"]["volumes"].append({"name": "cm", "configMap": {"name": "x"}})
        )
        # A Secret read through the environment, in a container or an init container.
        ref = {"name": "T", "valueFrom": {"secretKeyRef": {"name": "x", "key": "k"}}}
        assert "read no Secret or ConfigMap" in refused(lambda b: b["spec"]["containers"][0]["env"].append(ref))
        init = {"name": "i", "image": identity.STAND_IN_IMAGE, "envFrom": [{"secretRef": {"name": "x"}}]}
        assert "read no Secret or ConfigMap" in refused(lambda b: b["spec"].update(initContainers=[init]))
        # Not a daemon pod: no component label, or another node's label (a DaemonSet-adoptable name too).
        assert "creates only MPS control-daemon pods" in refused(
            lambda b: b["metadata"]["labels"].pop("app.kubernetes.io/component")
        )
        assert "creates only MPS control-daemon pods" in refused(
            lambda b: b["metadata"]["labels"].update({"gpuplane.dev/node": node_b})
        )
        assert "creates only MPS control-daemon pods" in refused(
            lambda b: b["metadata"]["labels"].update({"app.kubernetes.io/name": "gpuplane-driver"})
        )
        # Outside its namespace RBAC refuses before any policy.
        refused_by("", core.create_namespaced_pod, "default", daemon_pod("gpuplane-mps-x", node_a), **dry)
        refused_by("", core.create_namespaced_pod, "kube-system", daemon_pod("gpuplane-mps-x", node_a), **dry)
    finally:
        api.close()


def test_driver_token_without_a_node_creates_no_pods(
    installed: cluster.Cluster, two_nodes: tuple[str, str], tmp_path: Path
) -> None:
    token = identity.request_token(installed.api, identity.NAMESPACE, identity.DRIVER_SA)
    kubeconfig = identity.write_token_kubeconfig(
        tmp_path / "unbound.kubeconfig", installed.kubeconfig, token, "unbound"
    )
    api = identity.new_client(kubeconfig)
    try:
        body = daemon_pod("gpuplane-mps-unbound", two_nodes[0])
        core = client.CoreV1Api(api)
        msg = refused_by(DRIVER_PODS_POLICY, core.create_namespaced_pod, identity.NAMESPACE, body, dry_run="All")
        assert "carries no node name" in msg
    finally:
        api.close()


def test_driver_deletes_only_own_node_daemon_pods(
    installed: cluster.Cluster, two_nodes: tuple[str, str], driver_a: identity.Identity
) -> None:
    """Delete is granted in gpuplane-system; the policy lets the driver delete only its own node's daemon
    pods: not another node's daemon, not a pod without the daemon's component label (a DaemonSet pod, the
    pod its own token is bound to), and never update a pod. One real create, list, get and delete."""
    node_a, node_b = two_nodes
    ns = identity.NAMESPACE
    admin = client.CoreV1Api(installed.api)
    suffix = uuid.uuid4().hex[:5]
    mine, theirs, plain, real = (f"gpuplane-mps-{k}-{suffix}" for k in ("a", "b", "plain", "real"))
    admin.create_namespaced_pod(ns, daemon_pod(mine, node_a))
    admin.create_namespaced_pod(ns, daemon_pod(theirs, node_b))
    dummy = daemon_pod(plain, node_a)
    dummy["metadata"]["labels"] = {"app.kubernetes.io/component": "driver", "gpuplane.dev/node": node_a}
    admin.create_namespaced_pod(ns, dummy)
    api = driver_a.api_client()
    core = client.CoreV1Api(api)
    dry = {"dry_run": "All"}
    try:
        core.delete_namespaced_pod(mine, ns, **dry)
        msg = refused_by(DRIVER_PODS_POLICY, core.delete_namespaced_pod, theirs, ns, **dry)
        assert "may delete pods only on its own node" in msg and f"on node '{node_b}'" in msg
        msg = refused_by(DRIVER_PODS_POLICY, core.delete_namespaced_pod, plain, ns, **dry)
        assert "delete only its MPS control-daemon and IMEX daemon pods" in msg
        assert f"pod '{plain}' (component 'driver')" in msg
        stand_in = f"{identity.DRIVER_SA}-identity-{node_a}"
        msg = refused_by(DRIVER_PODS_POLICY, core.delete_namespaced_pod, stand_in, ns, **dry)
        assert f"pod '{stand_in}' (component '')" in msg
        # No update or patch (RBAC), no deletecollection (RBAC), nothing outside its namespace (RBAC).
        refused_by("", core.patch_namespaced_pod, mine, ns, {"metadata": {"labels": {"x": "y"}}})
        refused_by("", core.delete_collection_namespaced_pod, ns, label_selector="app.kubernetes.io/component")
        refused_by("", core.delete_namespaced_pod, "anything", "default", **dry)
        # Were patch granted (a Role added here for the test), the policy still refuses every update: a label
        # patch would otherwise make a DaemonSet pod a deletable "daemon".
        rbac = client.RbacAuthorizationV1Api(installed.api)
        rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch", "update"]}
        rbac.create_namespaced_role(ns, {"metadata": {"name": plain}, "rules": [rule]})
        subject = {"kind": "ServiceAccount", "name": identity.DRIVER_SA, "namespace": ns}
        ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": plain}
        rbac.create_namespaced_role_binding(ns, {"metadata": {"name": plain}, "roleRef": ref, "subjects": [subject]})
        relabel = {"metadata": {"labels": DAEMON_LABELS}}
        msg = eventually(
            lambda: policy_refusal(core.patch_namespaced_pod, plain, ns, relabel), 30, "RBAC to grant patch"
        )
        assert "does not update pods" in msg and f"refused UPDATE of pod '{plain}'" in msg

        # The real path: create, find by label, read, delete.
        core.create_namespaced_pod(ns, daemon_pod(real, node_a))
        found = core.list_namespaced_pod(
            ns, label_selector=f"gpuplane.dev/node={node_a},app.kubernetes.io/component=mps-control-daemon"
        )
        assert {p.metadata.name for p in found.items} == {mine, real}
        assert core.read_namespaced_pod(stand_in, ns).spec.node_name == node_a  # its own pod (POD_NAME)
        core.delete_namespaced_pod(real, ns, grace_period_seconds=0)
        assert admin.read_namespaced_pod(mine, ns).metadata.deletion_timestamp is None  # the dry run kept it
    finally:
        api.close()
        for kind in ("role", "role_binding"):
            try:
                getattr(client.RbacAuthorizationV1Api(installed.api), f"delete_namespaced_{kind}")(plain, ns)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        for name in (mine, theirs, plain, real):
            try:
                admin.delete_namespaced_pod(name, ns, grace_period_seconds=0)
            except ApiException as exc:
                if exc.status != 404:
                    raise


def test_the_drivers_own_daemon_pods_pass_the_policy(
    installed: cluster.Cluster, two_nodes: tuple[str, str], driver_a: identity.Identity
) -> None:
    """The production path: gpuplane.driver.sharing.mps_pods (template from the DaemonSet as rendered from the
    manifests, as the driver copies it from its own pod) under the driver's token: launch, find, remove on
    its own node; a template for another node is refused with the policy's reason in the driver's error."""
    node_a, node_b = two_nodes
    ds = next(o for o in install.render(installed) if o["kind"] == "DaemonSet")
    own_pod = {"metadata": {"namespace": identity.NAMESPACE}, "spec": {**ds["spec"]["template"]["spec"]}}
    own_pod["spec"]["nodeName"] = node_a
    mps_root = Path("/var/lib/kubelet/plugins/gpu.gpuplane.dev/mps")  # --plugin-dir + /mps, DriverConfig.mps_root
    template = mps_pods.PodTemplate.from_driver_pod(own_pod, mps_root)
    paths = mps_spec.DaemonPaths.of(mps_root, str(uuid.uuid4()))
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(paths.pipe), "CUDA_MPS_LOG_DIRECTORY": str(paths.log)}
    api = driver_a.api_client()
    pods = mps_pods.DaemonPods(KubeApi(api), template, "nvidia-cuda-mps-control", delete_timeout_s=30)
    try:
        pods.launch(paths, env)
        assert pods.claims() == {paths.claim_uid: mps_pods.pod_name(paths.claim_uid)}
        assert pods.failure(paths.claim_uid) is None  # bound to node A, not started (no kubelet): may still serve
        pods.remove(paths.claim_uid)
        assert pods.claims() == {}

        elsewhere = mps_pods.DaemonPods(KubeApi(api), dataclasses.replace(template, node_name=node_b), "x")
        with pytest.raises(mps_spec.MpsError) as err:
            elsewhere.launch(paths, env)
        print(f"refused: {err.value}")
        assert "cannot create MPS daemon pod" in str(err.value) and "403" in str(err.value)
        assert f"on node '{node_a}' may create pods only on its own node" in str(err.value)
    finally:
        api.close()
        try:
            client.CoreV1Api(installed.api).delete_namespaced_pod(
                mps_pods.pod_name(paths.claim_uid), identity.NAMESPACE, grace_period_seconds=0
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
