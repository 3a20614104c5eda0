"""charts/gpuplane: with default values it renders the objects of the kustomize production overlay.

Helm is the real binary built from its Go module (``e2e.plane.helm.ensure_helm``,
cached; ``scripts/test.sh`` builds it before the tests), kustomize is kubectl's
(``kubectl kustomize``). The comparison is object by object, every field, after
the normalisation of :mod:`e2e.plane.objectsets` (only the labels each tool sets for
itself and CEL whitespace). Then each value the chart offers is rendered and
checked to do what values.yaml says.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.plane import helm, objectsets
from tests.e2e.test_manifests import KUSTOMIZATIONS, by_kind, container, render

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "gpuplane"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


@pytest.fixture(scope="module")
def helm_bin() -> Path:
    return helm.ensure_helm()


def template(helm_bin: Path, *set_values: str) -> list[dict[str, Any]]:
    return helm.render(helm_bin, CHART, set_values=set_values)


def test_default_values_render_the_production_overlay(helm_bin: Path) -> None:
    kustomized = render(KUSTOMIZATIONS["production"])
    charted = template(helm_bin)
    assert sorted(objectsets.index(charted)) == sorted(objectsets.index(kustomized))
    assert objectsets.differences(kustomized, charted) == []
    assert {o["metadata"].get("labels", {}).get("app.kubernetes.io/managed-by") for o in charted} >= {"Helm"}


def test_chart_lints_strictly(helm_bin: Path) -> None:
    assert "0 chart(s) failed" in helm.lint(helm_bin, CHART)


def test_chart_version_and_crds_follow_the_package() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == VERSION
    for crd in sorted((REPO / "crds").glob("*.yaml")):
        copy = CHART / "crds" / crd.name
        assert copy.is_file() and copy.read_bytes() == crd.read_bytes(), f"cp crds/{crd.name} charts/gpuplane/crds/"


def test_image_values(helm_bin: Path) -> None:
    objects = template(
        helm_bin,
        "image.registry=registry.example/gp",
        "image.driver.tag=1.2.3",
        "image.pullPolicy=IfNotPresent",
    )
    driver = container(objects, "DaemonSet", "gpuplane-driver")
    assert driver["image"] == "registry.example/gp/gpuplane-driver:1.2.3"
    assert driver["imagePullPolicy"] == "IfNotPresent"
    assert container(objects, "Deployment", "gpuplane-controller")["image"] == (
        f"registry.example/gp/gpuplane-controller:{VERSION}"
    )


def test_tolerations_and_node_selector(helm_bin: Path) -> None:
    objects = template(
        helm_bin,
        "driver.nodeSelector.pool=gpu",
        "driver.tolerations[0].key=dedicated",
        "driver.tolerations[0].operator=Exists",
        "controller.nodeSelector.pool=system",
    )
    ds = by_kind(objects, "DaemonSet")["gpuplane-driver"]["spec"]["template"]["spec"]
    assert ds["nodeSelector"] == {"pool": "gpu"}
    assert ds["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    deploy = by_kind(objects, "Deployment")["gpuplane-controller"]["spec"]["template"]["spec"]
    assert deploy["nodeSelector"] == {"pool": "system"}


def test_tiers_make_one_deviceclass_each(helm_bin: Path) -> None:
    objects = template(
        helm_bin,
        "tiers.platinum.activeThreadPercentage=80",
        "tiers.platinum.pinnedDeviceMemoryLimit=64Gi",
    )
    classes = by_kind(objects, "DeviceClass")
    platinum = classes["mps-platinum.gpu.gpuplane.dev"]
    mps = platinum["spec"]["config"][0]["opaque"]["parameters"]["sharing"]["mps"]
    assert mps == {"defaultActiveThreadPercentage": 80, "defaultPinnedDeviceMemoryLimit": "64Gi"}
    assert 'quantity("64Gi")' in platinum["spec"]["selectors"][0]["cel"]["expression"]
    assert platinum["metadata"]["labels"]["gpu.gpuplane.dev/sharing-tier"] == "platinum"
    assert {"mps-gold.gpu.gpuplane.dev", "mps-silver.gpu.gpuplane.dev", "mps-bronze.gpu.gpuplane.dev"} <= set(classes)


def test_feature_switches(helm_bin: Path) -> None:
    objects = template(
        helm_bin,
        "features.controller=false",
        "features.ownNodeSlicePolicy=false",
        "features.ownNodePodPolicy=false",
        "features.claimConfigPolicy=false",
        "features.mig=false",
        "features.mps=false",
        "features.nvidiaGpuExtendedResource=false",
        "features.timeSlicing=false",
    )
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert not any("controller" in name for _, name in kinds)
    assert ("ValidatingAdmissionPolicy", "gpuplane-driver-own-node-slices") not in kinds
    assert ("ValidatingAdmissionPolicy", "gpuplane-driver-own-node-pods") not in kinds
    only_pods = {(o["kind"], o["metadata"]["name"]) for o in template(helm_bin, "features.ownNodeSlicePolicy=false")}
    assert ("ValidatingAdmissionPolicy", "gpuplane-driver-own-node-slices") not in only_pods
    assert ("ValidatingAdmissionPolicyBinding", "gpuplane-driver-own-node-pods") in only_pods
    defaults = {(o["kind"], o["metadata"]["name"]) for o in template(helm_bin)}
    assert ("MutatingAdmissionPolicy", "gpuplane-steer-gate") in defaults
    assert ("MutatingAdmissionPolicy", "gpuplane-steer-gate") not in kinds  # off with the controller
    no_gate = {(o["kind"], o["metadata"]["name"]) for o in template(helm_bin, "features.steeringGate=false")}
    assert ("MutatingAdmissionPolicy", "gpuplane-steer-gate") not in no_gate
    assert ("ValidatingAdmissionPolicy", "gpuplane-claim-configs") not in kinds
    assert {
        ("ValidatingAdmissionPolicy", n) for n in ("gpuplane-claim-configs", "gpuplane-controller-writes")
    } <= defaults
    no_writes = {
        (o["kind"], o["metadata"]["name"]) for o in template(helm_bin, "features.controllerWritesPolicy=false")
    }
    assert ("ValidatingAdmissionPolicy", "gpuplane-controller-writes") not in no_writes
    assert {name for kind, name in kinds if kind == "DeviceClass"} == {"gpu.gpuplane.dev"}
    assert ("DaemonSet", "gpuplane-driver") in kinds
    default = {o["metadata"]["name"]: o for o in template(helm_bin) if o["kind"] == "DeviceClass"}
    assert default["nvidia-gpu.gpuplane.dev"]["spec"]["extendedResourceName"] == "nvidia.com/gpu"


def test_driver_backend_and_kubelet_root(helm_bin: Path) -> None:
    objects = template(helm_bin, "driver.backend=sim", "driver.simProfile=hgx-h100", "driver.kubeletRoot=/data/kubelet")
    c = container(objects, "DaemonSet", "gpuplane-driver")
    assert c["args"][:2] == ["--backend=sim", "--sim-profile=hgx-h100"]
    assert "--registry-dir=/data/kubelet/plugins_registry" in c["args"]
    assert {m["mountPath"] for m in c["volumeMounts"]} >= {
        "/data/kubelet/plugins_registry",
        "/data/kubelet/plugins/gpu.gpuplane.dev",
    }


def test_namespace_follows_the_release(helm_bin: Path) -> None:
    objects = helm.render(helm_bin, CHART, namespace="gpu-ops")
    assert by_kind(objects, "Namespace").keys() == {"gpu-ops"}
    for name in ("gpuplane-driver-own-node-slices", "gpuplane-driver-own-node-pods", "gpuplane-driver-own-imex-status"):
        policy = by_kind(objects, "ValidatingAdmissionPolicy")[name]
        assert "system:serviceaccount:gpu-ops:gpuplane-driver" in policy["spec"]["matchConditions"][0]["expression"]
    role = by_kind(objects, "RoleBinding")["gpuplane-driver-mps-daemons"]
    assert role["metadata"]["namespace"] == "gpu-ops" and role["subjects"][0]["namespace"] == "gpu-ops"
    writes = by_kind(objects, "ValidatingAdmissionPolicy")["gpuplane-controller-writes"]
    assert "system:serviceaccount:gpu-ops:gpuplane-controller" in writes["spec"]["matchConditions"][0]["expression"]
    assert {o["metadata"]["namespace"] for o in objects if "namespace" in o["metadata"]} == {"gpu-ops"}
