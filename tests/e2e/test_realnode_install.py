"""The production install on real nodes: `kubectl apply -k` of overlays/local, the driver and controller as pods.

Real nodes (a real kubelet v1.36 and containerd 2.x each: one ``hgx-h100``, two
``gb200-nvl72`` trays of one rack) join a control plane of this module's own, with
nothing of gpuplane on it; the images built here from the Dockerfiles are imported
into their containerd and the overlay is applied (``tests/e2e/installkit.py``). Then:

* the driver DaemonSet has one Running, Ready pod per real node, in a real container,
  registered with the real kubelet under socket names carrying its pod UID, and each
  node's ResourceSlice pool is complete (published under the pod's ServiceAccount, the
  own-node admission policy enforced); the controller Deployment's two pods are
  available;
* every example scenario in manifests/examples, as written, runs on the real nodes
  with the containerized driver and controller: claims allocated on the pod's node,
  prepared (checkpoint, CDI spec whose ids resolve), each container sees its devices;
  deleting the example leaves the nodes clean.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from e2e.plane import realinstall
from e2e.plane.realnode import inspect
from tests.e2e import realchecks
from tests.e2e.conftest import eventually, own_control_plane
from tests.e2e.installkit import Install, installed_cluster
from tests.e2e.realfixtures import REAL_NODES
from tests.e2e.test_realnode_examples import RUNNING
from tests.e2e.test_scenarios import assert_prepared, results

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2400)]

# The examples run here with the containerized driver and controller: one of each thing the driver and the
# controller do in a pod (whole GPUs, MIG created and destroyed, an MPS daemon started, a gang placed across
# the two GB200 trays). test_realnode_examples runs every example (RUNNING) with the host driver; all of
# RUNNING (eight examples) passed here too, in one run of about 6.5 min (noted in commit 94c3b22), too long for
# CI on every run.
CONTAINERIZED = ("gang-tp8", "mig-two-profiles", "mps-tiers", "whole-gpu")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Install]:
    with own_control_plane(tmp_path_factory, "realinstall") as handle, installed_cluster(handle, REAL_NODES) as install:
        yield install


def test_driver_and_controller_run_as_pods_on_the_real_nodes(installed: Install) -> None:
    print(installed.pods_wide())
    pods = installed.driver_pods()
    by_node = {p["spec"]["nodeName"]: p for p in pods}
    assert sorted(by_node) == sorted(n.name for n in installed.nodes), "one driver pod per real node"
    for node in installed.nodes:
        pod = by_node[node.name]
        assert pod["status"]["phase"] == "Running"
        (status,) = pod["status"]["containerStatuses"]
        assert status["ready"] and status["containerID"].startswith("containerd://")
        assert status["image"].startswith("localhost/gpuplane-driver:")
        uid = pod["metadata"]["uid"]
        # Registered by the real kubelet through the socket of this pod (its UID in the name).
        assert realinstall.registration_sockets(node) == [f"gpu.gpuplane.dev-{uid}-reg.sock"]
        assert (node.plugin_dir / f"dra-{uid}.sock").is_socket()
    deploy = installed.kubectl_json("get", "deployment", "-n", realinstall.NAMESPACE, realinstall.DEPLOYMENT)
    assert deploy["status"].get("availableReplicas") == 2
    controllers = [
        p
        for p in installed.kubectl_json("get", "pods", "-n", realinstall.NAMESPACE)["items"]
        if p["metadata"]["labels"].get("app.kubernetes.io/name") == realinstall.DEPLOYMENT
    ]
    assert len(controllers) == 2 and all(p["status"]["phase"] == "Running" for p in controllers)
    assert {p["spec"]["nodeName"] for p in controllers} <= {n.name for n in installed.nodes}


@pytest.fixture
def applied(installed: Install, request: pytest.FixtureRequest) -> Iterator[str]:
    name = str(request.param)
    installed.real.gpu.apply_example(name)
    try:
        yield name
    finally:
        installed.real.gpu.delete_example(name)
        installed.real.wait_clean(120)


@pytest.mark.parametrize("applied", CONTAINERIZED, indirect=True)
def test_example_with_the_containerized_driver(installed: Install, applied: str) -> None:
    real = installed.real
    namespace = f"gpuplane-ex-{applied}"
    expected = RUNNING[applied]
    if expected == 0:
        events = eventually(
            lambda: [
                e
                for e in real.kubectl_json("get", "events", "-n", namespace)["items"]
                if e["reason"] == "FailedScheduling"
            ],
            60,
            "FailedScheduling events",
        )
        assert all("cannot allocate all claims" in e["message"] for e in events)
        return
    pods = real.gpu.running_pods(namespace, expected, timeout=240)
    for pod in pods:
        node = real.node(pod["spec"]["nodeName"])
        checkpoint = real.checkpoint(node)
        for container, entries in realchecks.claim_containers(pod).items():
            view = inspect.view(node, pod, container)
            for entry in entries:
                claim = real.gpu.claim(namespace, realchecks.pod_claim(pod, entry))
                assert {r["pool"] for r in results(claim)} == {node.name}
                assert_prepared(real.gpu, node, claim)
                realchecks.assert_sees_claim(view, checkpoint.claims[claim["metadata"]["uid"]], node)
                print(f"{namespace}/{pod['metadata']['name']}/{container} on {node.name}: {view.line()}")
    if applied == "gang-tp8":
        assert {p["spec"]["nodeName"] for p in pods} == {n.name for n in real.of_profile("gb200-nvl72")}
