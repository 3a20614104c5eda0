"""manifests/overlays/local: the production overlay plus a small, listed delta for the local cluster.

Rendered with the kubectl built with the control plane (``kubectl kustomize``, as
``kubectl apply -k`` runs it); skipped only when that binary is not built yet.
Every difference from the production overlay must be one of the changes listed
in docs/operations.md, and those changes must say what the real nodes need.
"""

from __future__ import annotations

import re
from pathlib import Path

from e2e.images import build as images
from e2e.plane import objectsets
from tests.e2e.test_manifests import KUSTOMIZATIONS, by_kind, container, render

REPO = Path(__file__).resolve().parents[2]
DS = "('DaemonSet', 'gpuplane-system', 'gpuplane-driver')"
DEPLOY = "('Deployment', 'gpuplane-system', 'gpuplane-controller')"
POD = ".spec.template.spec"
# The whole delta: each difference line must start with one of these.
ALLOWED = (
    f"{DS}: {POD}.containers[0].image: ",
    f"{DS}: {POD}.containers[0].imagePullPolicy: ",
    f"{DS}: {POD}.containers[0].args",
    f"{DS}: {POD}.containers[0].volumeMounts",
    f"{DS}: {POD}.volumes",
    f"{DS}: {POD}.nodeSelector: only in the second",
    f"{DEPLOY}: {POD}.containers[0].image: ",
    f"{DEPLOY}: {POD}.containers[0].imagePullPolicy: ",
    f"{DEPLOY}: {POD}.nodeSelector: only in the second",
    f"{DEPLOY}: {POD}.affinity.nodeAffinity: only in the first",
)
LOCAL_ROOT = "/var/lib/gpuplane-local"


def test_local_differs_from_production_only_by_the_listed_delta() -> None:
    production, local = render(KUSTOMIZATIONS["production"]), render(KUSTOMIZATIONS["local"])
    delta = objectsets.differences(production, local)
    assert delta, "the local overlay changes nothing?"
    unexpected = [line for line in delta if not line.startswith(ALLOWED)]
    assert unexpected == [], "\n".join(unexpected)


def test_local_runs_the_images_built_here_and_never_pulls() -> None:
    local = render(KUSTOMIZATIONS["local"])
    for kind, name in (("DaemonSet", "gpuplane-driver"), ("Deployment", "gpuplane-controller")):
        c = container(local, kind, name)
        assert c["image"] == f"{images.REGISTRY}/{name}:{images.DEV_TAG}"
        assert c["imagePullPolicy"] == "Never"
        assert by_kind(local, kind)[name]["spec"]["template"]["spec"]["nodeSelector"] == {
            "gpuplane.dev/containerized": "true"
        }


def test_local_driver_runs_the_simulator_with_its_host_paths() -> None:
    local = render(KUSTOMIZATIONS["local"])
    ds = by_kind(local, "DaemonSet")["gpuplane-driver"]["spec"]["template"]["spec"]
    c = ds["containers"][0]
    args = dict(a.removeprefix("--").split("=", 1) for a in c["args"])
    assert args["backend"] == "sim"
    assert args["mps-control-binary"] == "/opt/gpuplane/sim/bin/nvidia-cuda-mps-control"
    assert args["imex-daemons"] == "pod"  # IMEX daemons in pods of their own, from the image's stand-ins
    assert args["imex-binary"] == "/opt/gpuplane/sim/bin/nvidia-imex"
    assert args["imex-ctl-binary"] == "/opt/gpuplane/sim/bin/nvidia-imex-ctl"
    node_dir = f"{LOCAL_ROOT}/$(NODE_NAME)"
    assert args["sim-config"] == f"{node_dir}/sim.yaml"
    assert args["registry-dir"] == f"{node_dir}/kubelet/plugins_registry"
    assert args["plugin-dir"] == f"{node_dir}/kubelet/plugins/gpu.gpuplane.dev"
    assert args["cdi-root"] == f"{node_dir}/cdi"
    # $(NODE_NAME) expands from the container's env (kubelet does it); it must be defined there.
    assert c["env"][0]["name"] == "NODE_NAME" and c["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    paths = {k: v for k, v in args.items() if k not in ("metrics-address", "health-address")}
    assert {re.sub(r"\$\(NODE_NAME\).*", "", v) for v in paths.values() if "$(" in v} == {f"{LOCAL_ROOT}/"}
    # Metrics on the pod's own IP (downward API), as in the production overlay, never 0.0.0.0.
    assert args["metrics-address"] == "$(POD_IP):9400"
    assert args["health-address"] == "$(POD_IP):9402"  # the probes' plain port (metrics want a token)
    assert any(e["name"] == "POD_IP" and e["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP" for e in c["env"])
    # Paths the driver writes into CDI specs must be the host's: mounted at the same path.
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    host = {v["name"]: v["hostPath"]["path"] for v in ds["volumes"]}
    assert mounts["local-nodes"] == host["local-nodes"] == LOCAL_ROOT
    assert set(mounts) == set(host)


def test_operations_doc_lists_the_delta() -> None:
    doc = (REPO / "docs" / "operations.md").read_text()
    section = doc[doc.index("overlays/local") :]
    words = ("imagePullPolicy: Never", "--backend=sim", "--mps-control-binary", "--imex-daemons=pod", LOCAL_ROOT)
    for word in (*words, "containerized"):
        assert word in section, word
