"""The manifests: what they render to (always), and that the real API server accepts them (e2e).

Rendering uses the kubectl built with the control plane (its embedded
kustomize is what ``kubectl apply -k`` runs); those checks are skipped only
when that binary is not built yet. The e2e part applies the base with
``kubectl apply -k manifests/``, then every kustomization with
``kubectl apply --server-side --dry-run=server``, and checks what the API
server made of the CRDs (established, CEL rules enforced, printer columns) and
the DeviceClasses.
"""

from __future__ import annotations

import os
import subprocess
import tomllib
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.cluster import build
from e2e.cluster import handle as cluster
from e2e.plane import install

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
KUSTOMIZATIONS = {
    "base": MANIFESTS,
    "dev": MANIFESTS / "overlays" / "dev",
    "production": MANIFESTS / "overlays" / "production",
    "e2e": MANIFESTS / "overlays" / "e2e",
    "local": MANIFESTS / "overlays" / "local",
}
VERSION_LABEL = "app.kubernetes.io/version"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def _kubectl() -> Path:
    pins = build.read_pins(build.MODULE_DIR / "go.mod")
    return build.bin_paths(pins.version_key, build.cache_root(os.environ)).kubectl


def render(path: Path) -> list[dict[str, Any]]:
    kubectl = _kubectl()
    if not kubectl.exists():
        pytest.skip(f"kubectl not built yet ({kubectl}); run `python -m e2e build`")
    out = subprocess.run([str(kubectl), "kustomize", str(path)], capture_output=True, text=True, check=True)
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def container(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = by_kind(objects, kind)[name]["spec"]["template"]["spec"]
    first: dict[str, Any] = spec["containers"][0]
    return first


def env_of(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in c.get("env", [])}


# --- rendering (no cluster) --------------------------------------------------------


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_every_object_carries_the_version_label(name: str) -> None:
    objects = render(KUSTOMIZATIONS[name])
    assert len(objects) >= 15
    unlabelled = [
        f"{o['kind']}/{o['metadata']['name']}"
        for o in objects
        if o["metadata"].get("labels", {}).get(VERSION_LABEL) != VERSION
    ]
    assert not unlabelled, f"objects without {VERSION_LABEL}={VERSION}: {unlabelled}"
    for o in objects:
        template = o.get("spec", {}).get("template")
        if template is not None:
            assert template["metadata"]["labels"][VERSION_LABEL] == VERSION
            # Selectors are immutable: a version in them would make every upgrade a delete.
            assert VERSION_LABEL not in o["spec"]["selector"]["matchLabels"]
        if o["kind"] == "PodDisruptionBudget":
            assert VERSION_LABEL not in o["spec"]["selector"]["matchLabels"]


def test_base_renders_everything_the_issue_lists() -> None:
    objects = render(MANIFESTS)
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for expected in [
        ("Namespace", "gpuplane-system"),
        ("ServiceAccount", "gpuplane-driver"),
        ("ServiceAccount", "gpuplane-controller"),
        ("ClusterRole", "gpuplane-driver"),
        ("ClusterRoleBinding", "gpuplane-driver"),
        ("ClusterRole", "gpuplane-controller"),
        ("ClusterRoleBinding", "gpuplane-controller"),
        ("CustomResourceDefinition", "gpugangs.gpuplane.dev"),
        ("RoleBinding", "gpuplane-controller-leader-election"),
        ("DaemonSet", "gpuplane-driver"),
        ("Deployment", "gpuplane-controller"),
        ("PodDisruptionBudget", "gpuplane-controller"),
        ("ValidatingAdmissionPolicy", "gpuplane-driver-own-node-slices"),
        ("ValidatingAdmissionPolicyBinding", "gpuplane-driver-own-node-slices"),
        ("Role", "gpuplane-driver-mps-daemons"),
        ("RoleBinding", "gpuplane-driver-mps-daemons"),
        ("ValidatingAdmissionPolicy", "gpuplane-driver-own-node-pods"),
        ("ValidatingAdmissionPolicyBinding", "gpuplane-driver-own-node-pods"),
        ("ValidatingAdmissionPolicy", "gpuplane-driver-own-imex-status"),
        ("ValidatingAdmissionPolicyBinding", "gpuplane-driver-own-imex-status"),
    ]:
        assert expected in kinds, f"{expected} missing from the base"


def test_images_are_tagged_with_the_version() -> None:
    for name in ("base", "production"):
        objects = render(KUSTOMIZATIONS[name])
        assert (
            container(objects, "DaemonSet", "gpuplane-driver")["image"] == f"ghcr.io/gpuplane/gpuplane-driver:{VERSION}"
        )
        assert (
            container(objects, "Deployment", "gpuplane-controller")["image"]
            == f"ghcr.io/gpuplane/gpuplane-controller:{VERSION}"
        )


def test_every_deviceclass_file_is_in_the_base() -> None:
    files = sorted(p for p in (MANIFESTS / "deviceclasses").glob("*.yaml"))
    names = {yaml.safe_load(p.read_text())["metadata"]["name"] for p in files}
    assert names and names <= set(by_kind(render(MANIFESTS), "DeviceClass"))


def test_manifest_crds_are_copies_of_the_canonical_crds() -> None:
    canonical = sorted((REPO / "crds").glob("*.yaml"))
    if not canonical:
        pytest.skip("crds/ holds no CRD yet; manifests/crds/gpugangs.gpuplane.dev.yaml is the draft")
    for src in canonical:
        copy = MANIFESTS / "crds" / src.name
        assert copy.exists() and copy.read_bytes() == src.read_bytes(), (
            f"manifests/crds/{src.name} differs from crds/{src.name}: run `cp crds/*.yaml manifests/crds/` "
            "and list new files in manifests/crds/kustomization.yaml"
        )


def test_driver_daemonset_rolls_seamlessly() -> None:
    ds = by_kind(render(MANIFESTS), "DaemonSet")["gpuplane-driver"]["spec"]
    assert ds["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    env = {e["name"]: e for e in ds["template"]["spec"]["containers"][0]["env"]}
    assert env["POD_UID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    host_paths = {v["hostPath"]["path"] for v in ds["template"]["spec"]["volumes"] if "hostPath" in v}
    assert host_paths == {
        "/var/lib/kubelet/plugins_registry",
        "/var/lib/kubelet/plugins/gpu.gpuplane.dev",
        "/var/run/cdi",
        "/dev",
        "/proc/sys/kernel/random/boot_id",
    }
    args = ds["template"]["spec"]["containers"][0]["args"]
    assert "--boot-id-file=/host/boot_id" in args


def test_controller_has_two_replicas_and_a_pdb() -> None:
    for name in ("base", "production"):
        objects = render(KUSTOMIZATIONS[name])
        deploy = by_kind(objects, "Deployment")["gpuplane-controller"]
        assert deploy["spec"]["replicas"] == 2
        pdb = by_kind(objects, "PodDisruptionBudget")["gpuplane-controller"]
        assert pdb["spec"]["selector"]["matchLabels"] == deploy["spec"]["selector"]["matchLabels"]


def test_overlays_set_backend_log_format_and_replicas() -> None:
    dev, prod = render(KUSTOMIZATIONS["dev"]), render(KUSTOMIZATIONS["production"])
    dev_driver, prod_driver = (
        container(dev, "DaemonSet", "gpuplane-driver"),
        container(prod, "DaemonSet", "gpuplane-driver"),
    )
    assert "--backend=sim" in dev_driver["args"] and "--sim-profile=hgx-h100" in dev_driver["args"]
    assert "--backend=nvml" in prod_driver["args"]
    assert env_of(dev_driver)["GPUPLANE_LOG_FORMAT"] == "console"
    assert env_of(prod_driver)["GPUPLANE_LOG_FORMAT"] == "json"
    assert env_of(container(dev, "Deployment", "gpuplane-controller"))["GPUPLANE_LOG_FORMAT"] == "console"
    assert env_of(container(prod, "Deployment", "gpuplane-controller"))["GPUPLANE_LOG_FORMAT"] == "json"
    assert by_kind(dev, "Deployment")["gpuplane-controller"]["spec"]["replicas"] == 1
    assert dev_driver["image"] == "gpuplane-driver:dev"


def test_e2e_overlay_installs_everything_but_schedules_no_workload_pod() -> None:
    """The e2e nodes have no container runtime: no driver or controller pod may land on them."""
    dev, e2e = render(KUSTOMIZATIONS["dev"]), render(KUSTOMIZATIONS["e2e"])
    assert {(o["kind"], o["metadata"]["name"]) for o in e2e} == {(o["kind"], o["metadata"]["name"]) for o in dev}
    for kind, name in (("DaemonSet", "gpuplane-driver"), ("Deployment", "gpuplane-controller")):
        pod_spec = by_kind(e2e, kind)[name]["spec"]["template"]["spec"]
        assert pod_spec["nodeSelector"] == {"gpuplane.dev/containerized": "true"}, kind
    assert by_kind(e2e, "Deployment")["gpuplane-controller"]["spec"]["replicas"] == 0


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_admission_policy_names_the_driver_service_account(name: str) -> None:
    objects = render(KUSTOMIZATIONS[name])
    sa = by_kind(objects, "ServiceAccount")["gpuplane-driver"]
    user = f"system:serviceaccount:{sa['metadata']['namespace']}:gpuplane-driver"
    for policy_name in ("gpuplane-driver-own-node-slices", "gpuplane-driver-own-node-pods"):
        policy = by_kind(objects, "ValidatingAdmissionPolicy")[policy_name]
        assert user in policy["spec"]["matchConditions"][0]["expression"], policy_name


def test_controller_role_grants_no_secrets_and_no_wildcards() -> None:
    objects = render(MANIFESTS)
    for role in ("gpuplane-controller", "gpuplane-driver"):
        for rule in by_kind(objects, "ClusterRole")[role]["rules"]:
            assert "secrets" not in rule["resources"] and "configmaps" not in rule["resources"]
            assert "*" not in rule["resources"] + rule["verbs"] + rule["apiGroups"]
    # No one creates pods cluster-wide; the driver's pods rights are in its own namespace only (its MPS
    # daemon pods, narrowed by the policy gpuplane-driver-own-node-pods), without update or patch.
    for role in by_kind(objects, "ClusterRole").values():
        assert not any("pods" in r.get("resources", []) and "create" in r["verbs"] for r in role["rules"])
    # The metrics reader (for Prometheus) reads /metrics and nothing else (issue 32, defect 8).
    reader = by_kind(objects, "ClusterRole")["gpuplane-metrics-reader"]
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    assert not any("pods" in r["resources"] for r in by_kind(objects, "ClusterRole")["gpuplane-driver"]["rules"])
    roles = by_kind(objects, "Role")
    daemons = roles.pop("gpuplane-driver-mps-daemons")
    assert daemons["metadata"]["namespace"] == "gpuplane-system"
    assert daemons["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "delete"]}
    ]
    binding = by_kind(objects, "RoleBinding")["gpuplane-driver-mps-daemons"]
    sa = {"kind": "ServiceAccount", "name": "gpuplane-driver", "namespace": "gpuplane-system"}
    assert binding["subjects"] == [sa] and binding["roleRef"]["name"] == "gpuplane-driver-mps-daemons"
    # The IMEX plan (docs/imex.md): the controller writes ImexDomains in its namespace, the drivers read them
    # and patch their status; nothing else.
    assert roles.pop("gpuplane-controller-imex")["rules"] == [
        {
            "apiGroups": ["gpuplane.dev"],
            "resources": ["imexdomains"],
            "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
        }
    ]
    assert roles.pop("gpuplane-driver-imex")["rules"] == [
        {"apiGroups": ["gpuplane.dev"], "resources": ["imexdomains"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["gpuplane.dev"], "resources": ["imexdomains/status"], "verbs": ["patch"]},
    ]
    # The MIG offer (docs/mig-offer.md): one ConfigMap in gpuplane's namespace, written only by the controller
    # (create cannot be narrowed by name; every other verb names it), read only by the drivers, by name.
    offer = {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["gpuplane-mig-offer"]}
    assert roles.pop("gpuplane-controller-mig-offer")["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
        {**offer, "verbs": ["get", "update", "patch"]},
    ]
    assert roles.pop("gpuplane-driver-mig-offer")["rules"] == [{**offer, "verbs": ["get", "list", "watch"]}]
    # The other namespaced Roles: only the controller's leader-election Lease, get/update by name.
    for role in roles.values():
        assert role["metadata"]["namespace"] == "gpuplane-system"
        for rule in role["rules"]:
            assert rule["resources"] == ["leases"] and rule["apiGroups"] == ["coordination.k8s.io"]
            assert rule.get("resourceNames") == ["gpuplane-controller"] or rule["verbs"] == ["create"]


# --- the real API server -------------------------------------------------------------


@pytest.fixture(scope="module")
def installed(control_plane: cluster.Cluster) -> cluster.Cluster:
    install.apply(control_plane)
    install.wait_established(control_plane, install.crd_names(install.render(control_plane)))
    return control_plane


@pytest.mark.e2e
@pytest.mark.smoke
def test_apply_k_installs_and_server_side_dry_run_accepts_every_kustomization(installed: cluster.Cluster) -> None:
    for name, path in KUSTOMIZATIONS.items():
        out = installed.kubectl("apply", "--server-side", "--dry-run=server", "--force-conflicts", "-k", str(path))
        assert "serverside-applied (server dry run)" in out, f"{name}: {out}"
    # Applying the base again changes nothing (kubectl diff exits 0 when live == rendered).
    install.apply(installed)
    diff = subprocess.run(
        [str(installed.bins.kubectl), f"--kubeconfig={installed.kubeconfig}", "diff", "-k", str(MANIFESTS)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert diff.returncode == 0, diff.stdout + diff.stderr


@pytest.mark.e2e
def test_every_crd_is_established_and_every_deviceclass_accepted(installed: cluster.Cluster) -> None:
    objects = install.render(installed)
    ext = client.ApiextensionsV1Api(installed.api)
    for name in install.crd_names(objects):
        crd = ext.read_custom_resource_definition(name)
        assert crd.status is not None and crd.status.accepted_names is not None
        assert crd.metadata is not None and (crd.metadata.labels or {}).get(VERSION_LABEL) == VERSION
    custom = client.CustomObjectsApi(installed.api)
    for name in by_kind(objects, "DeviceClass"):
        live = custom.get_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", name)
        assert live["metadata"]["labels"][VERSION_LABEL] == VERSION


@pytest.mark.e2e
def test_live_objects_carry_the_version_label(installed: cluster.Cluster) -> None:
    objects = install.render(installed)
    for o in objects:
        ns = o["metadata"].get("namespace")
        group = o["apiVersion"].split("/")[0] if "/" in o["apiVersion"] else ""
        resource = o["kind"].lower() + (f".{group}" if group else "")
        args = ["get", resource, o["metadata"]["name"], "-o", "yaml", *(["-n", ns] if ns else [])]
        live = yaml.safe_load(installed.kubectl(*args))
        assert live["metadata"]["labels"][VERSION_LABEL] == VERSION, f"{o['kind']}/{o['metadata']['name']}"


def _gang(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "gpuplane.dev/v1alpha1", "kind": "GpuGang", "metadata": {"name": name}, "spec": spec}


@pytest.mark.e2e
def test_gpugang_crd_enforces_its_cel_rules_and_prints_columns(installed: cluster.Cluster) -> None:
    custom = client.CustomObjectsApi(installed.api)
    suffix = uuid.uuid4().hex[:6]
    bad_specs = {
        "both shapes": ({"members": 2, "gpusPerMember": 1, "migProfile": "1g.10gb"}, "exactly one of"),
        "no shape": ({"members": 2}, "exactly one of"),
        "mig with tp": ({"members": 2, "migProfile": "1g.10gb", "tensorParallelSize": 2}, "MIG gang"),
        "zero members": ({"members": 0, "gpusPerMember": 1}, "members"),
    }
    for what, (spec, message) in bad_specs.items():
        with pytest.raises(ApiException) as err:
            custom.create_namespaced_custom_object(
                "gpuplane.dev", "v1alpha1", "default", "gpugangs", _gang(f"bad-{suffix}", spec)
            )
        assert err.value.status == 422, what
        assert message in str(err.value.body), f"{what}: {err.value.body}"
    name = f"good-{suffix}"
    custom.create_namespaced_custom_object(
        "gpuplane.dev",
        "v1alpha1",
        "default",
        "gpugangs",
        _gang(name, {"members": 4, "gpusPerMember": 2, "tensorParallelSize": 8}),
    )
    try:
        table = installed.kubectl("get", "gpugangs", name, "-n", "default")
        header = table.splitlines()[0].split()
        assert header[:5] == ["NAME", "PHASE", "DOMAIN", "MEMBERS", "PLACED"], table
        # members is immutable (transition rule).
        with pytest.raises(ApiException) as err:
            custom.patch_namespaced_custom_object(
                "gpuplane.dev", "v1alpha1", "default", "gpugangs", name, {"spec": {"members": 5}}
            )
        assert err.value.status == 422 and "immutable" in str(err.value.body)
    finally:
        custom.delete_namespaced_custom_object("gpuplane.dev", "v1alpha1", "default", "gpugangs", name)
