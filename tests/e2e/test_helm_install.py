"""``helm install`` and ``helm upgrade`` of charts/gpuplane on a real control plane (v1.36, the e2e cluster's build).

On a control plane of its own (the session's cluster has gpuplane installed by
kustomize, whose objects Helm would refuse to adopt). The release is installed as
docs/operations.md says (the namespace first: Helm keeps its release record there),
then upgraded with changed values, then rolled back and uninstalled:

* install: every object the chart renders exists in the API with the release's
  ownership (``meta.helm.sh/release-name``), the GpuGang CRD is Established, the
  DaemonSet rolls with ``maxSurge: 1, maxUnavailable: 0`` and passes ``POD_UID``;
* upgrade (revision 2): a new image tag, a fourth MPS tier and ``features.mig=false``
  change exactly what values.yaml says: the DaemonSet's and Deployment's image, a new
  DeviceClass ``mps-platinum``, the MIG DeviceClass deleted; the DaemonSet's
  generation moves on;
* rollback to revision 1 restores them; uninstall leaves no object of the chart but
  the CRD (Helm keeps CRDs from ``crds/``, as it documents).

No node here runs containers, so the DaemonSet has no pods; the real-node test
(test_realnode_install) runs the pods.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import handle as cluster
from e2e.plane import helm
from tests.e2e.conftest import eventually, own_control_plane

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "gpuplane"
NS = "gpuplane-system"
RELEASE = "gpuplane"
WORKLOADS = (("daemonset", "gpuplane-driver"), ("deployment", "gpuplane-controller"))


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cluster.Cluster]:
    with own_control_plane(tmp_path_factory, "helm-plane") as handle:
        yield handle


@pytest.fixture(scope="module")
def helm_bin() -> Path:
    return helm.ensure_helm()


def _helm(helm_bin: Path, plane: cluster.Cluster, *args: str) -> str:
    out = helm.run(helm_bin, *args, f"--kubeconfig={plane.kubeconfig}", timeout=300)
    print(f"$ helm {' '.join(args)}\n{out.strip()}")
    return out


def _get(plane: cluster.Cluster, *args: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(plane.kubectl("get", *args, "-o", "json"))
    return data


def _image(plane: cluster.Cluster, kind: str, name: str) -> str:
    spec = _get(plane, kind, name, "-n", NS)["spec"]["template"]["spec"]
    image: str = spec["containers"][0]["image"]
    return image


def _deviceclasses(plane: cluster.Cluster) -> set[str]:
    return {i["metadata"]["name"] for i in _get(plane, "deviceclasses")["items"]}


def _history(helm_bin: Path, plane: cluster.Cluster) -> list[dict[str, Any]]:
    out = _helm(helm_bin, plane, "history", RELEASE, "-n", NS, "-o", "json")
    rows: list[dict[str, Any]] = json.loads(out)
    return rows


def test_install_upgrade_rollback_uninstall(helm_bin: Path, plane: cluster.Cluster) -> None:
    rendered = helm.render(helm_bin, CHART, set_values=["namespace.create=false"])
    # No --wait: no node here runs containers, so the controller's replicas never become available.
    plane.kubectl("create", "namespace", NS)
    plane.kubectl("label", "namespace", NS, "pod-security.kubernetes.io/enforce=privileged")
    _helm(helm_bin, plane, "install", RELEASE, str(CHART), "-n", NS, "--set=namespace.create=false")
    # Every rendered object is in the API, owned by the release (CRDs from crds/ are Helm's, unowned).
    owned = [o for o in rendered if o["kind"] != "CustomResourceDefinition"]
    assert len(owned) >= 15, [o["kind"] for o in rendered]
    for obj in owned:
        kind, meta = obj["kind"], obj["metadata"]
        where = ["-n", meta["namespace"]] if meta.get("namespace") else []
        group = obj["apiVersion"].rpartition("/")[0]
        live = _get(plane, f"{kind}.{group}" if group else kind, meta["name"], *where)
        annotations = live["metadata"].get("annotations", {})
        assert annotations.get("meta.helm.sh/release-name") == RELEASE, (kind, meta["name"])
    crd = _get(plane, "crd", "gpugangs.gpuplane.dev")
    assert {c["type"]: c["status"] for c in crd["status"]["conditions"]}["Established"] == "True"
    ds = _get(plane, "daemonset", "gpuplane-driver", "-n", NS)
    assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    env = {e["name"]: e for e in ds["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    before = {name: _image(plane, kind, name) for kind, name in WORKLOADS}
    classes_before = _deviceclasses(plane)
    assert "mig.gpuplane.dev" in classes_before and "mps-platinum.gpu.gpuplane.dev" not in classes_before
    generation = ds["metadata"]["generation"]

    _helm(
        helm_bin,
        plane,
        "upgrade",
        RELEASE,
        str(CHART),
        "-n",
        NS,
        "--set=image.driver.tag=9.9.9-upgrade",
        "--set=image.controller.tag=9.9.9-upgrade",
        "--set=tiers.platinum.activeThreadPercentage=80",
        "--set=tiers.platinum.pinnedDeviceMemoryLimit=64Gi",
        "--set=features.mig=false",
        "--set=namespace.create=false",
    )
    assert [r["revision"] for r in _history(helm_bin, plane)] == [1, 2]
    for kind, name in WORKLOADS:
        assert _image(plane, kind, name).endswith(":9.9.9-upgrade"), (kind, name)
    classes = _deviceclasses(plane)
    assert "mps-platinum.gpu.gpuplane.dev" in classes
    assert "mig.gpuplane.dev" not in classes, "features.mig=false must delete the MIG DeviceClass"
    assert _get(plane, "daemonset", "gpuplane-driver", "-n", NS)["metadata"]["generation"] > generation

    _helm(helm_bin, plane, "rollback", RELEASE, "1", "-n", NS)
    assert {name: _image(plane, kind, name) for kind, name in WORKLOADS} == before
    assert _deviceclasses(plane) == classes_before
    assert _history(helm_bin, plane)[-1]["status"] == "deployed"

    _helm(helm_bin, plane, "uninstall", RELEASE, "-n", NS, "--wait", "--timeout=2m")

    def gone() -> bool:
        left = plane.kubectl("get", "daemonset,deployment,deviceclass", "-A", "-o", "name", check=False)
        return not [line for line in left.splitlines() if "gpuplane" in line]

    eventually(gone, 120, "the release's objects to be deleted")
    assert _get(plane, "crd", "gpugangs.gpuplane.dev")["metadata"]["name"] == "gpugangs.gpuplane.dev"
