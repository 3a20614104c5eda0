"""Upgrades an operator can trust, on a real node: N-1 -> N (seamless), N -> N, N -> N-1, with live claims.

N-1 is a real earlier version: the pinned commit ``PREVIOUS`` of this repository,
exported with ``git archive`` and built from its own Dockerfiles, installed from its
own ``manifests/overlays/local`` (``e2e.images.previous``, ``tests/e2e/installkit.py``).
On one real ``hgx-h100`` node (a real kubelet v1.36 and containerd):

1. N-1 is installed; three steady pods run with a whole-GPU, a MIG 1g.10gb and an MPS
   claim.
2. N is applied (``kubectl apply -k``) while pods with claims of each kind keep being
   created and deleted (``rolloutkit.Churn``). N's DaemonSet rolls with ``maxSurge: 1,
   maxUnavailable: 0``: the new pod registers beside the old one (the registry dir holds
   both sockets at once: N's carries its pod UID) before the old one stops. Figures:
   claims prepared during the rollout, failed prepares (must be 0), disrupted steady pods
   (must be 0), rollout time. Then no MIG instance, MPS daemon or CDI spec is left that
   no steady claim owns, and each steady claim keeps the same devices.
3. N -> N (``kubectl rollout restart``): the seamless path of N itself, both pods with
   UID sockets; the same figures and checks.
4. N -> N-1 (rollback, ``kubectl apply -k`` of N-1's overlay): N-1's own strategy
   (maxSurge 0) stops the node's plugin before the old version starts, so prepares in
   that gap wait for it (kubelet retries; the figures say how many tried); the steady
   claims stay prepared with the same devices, no steady pod is disrupted, nothing leaks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from e2e.images import previous
from e2e.plane import realinstall
from tests.e2e import rolloutkit
from tests.e2e.conftest import GpuCluster, eventually
from tests.e2e.installkit import REPO, Install, installed_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2400)]

PREVIOUS = "aacd0c679ae3fa4a2a283aa6f0515cfd8f1e11d6"
"""N-1: the commit that brought real nodes (issue 11) to main, before the seamless rolling update."""
NODES = "hgx-h100:1"
SOAK_S = 20.0
"""Churn goes on this long after a rollout completes (prepares through the new pod alone)."""


@pytest.fixture(scope="module")
def rolling(gpu_cluster: GpuCluster) -> Iterator[Install]:
    tree, built = previous.previous_images(REPO, PREVIOUS, out=print)
    for image in built:
        print(f"N-1 image {image.pinned_ref}: {'cache hit' if image.cached else f'built in {image.seconds:.0f}s'}")
    with installed_cluster(gpu_cluster, NODES, first=("N-1", tree, built)) as install:
        install.kubectl("create", "namespace", rolloutkit.NS)
        yield install


def _roll(
    install: Install, what: str, apply: Callable[[], object], steady: list[rolloutkit.SteadyPod]
) -> rolloutkit.Figures:
    """Churn during ``apply()`` and ``SOAK_S`` after it; print and return the figures."""
    node = install.nodes[0]
    overlap: list[int] = [0]
    sampling = threading.Event()

    def sample() -> None:  # how many plugin instances kubelet can see at once during the rollout
        while not sampling.is_set():
            overlap[0] = max(overlap[0], len(realinstall.registration_sockets(node)))
            time.sleep(0.2)

    before = {p["metadata"]["uid"] for p in install.driver_pods()}
    sampler = threading.Thread(target=sample, daemon=True)
    with rolloutkit.Churn(install, tag=what.replace(" ", "").replace(">", "").lower()) as churn:
        time.sleep(5)
        sampler.start()
        began = time.monotonic()
        apply()
        while True:
            pods = install.driver_pods()
            status = install.daemonset()["status"]
            desired = status.get("desiredNumberScheduled", 0)
            if (
                not {p["metadata"]["uid"] for p in pods} & before
                and status.get("updatedNumberScheduled") == desired
                and status.get("numberAvailable") == desired
                and len(pods) == desired
                and len(realinstall.registration_sockets(node)) == 1
            ):
                break
            assert time.monotonic() - began < 420, f"{what}: rollout did not finish: {status}"
            time.sleep(0.5)
        install.wait_rolled_out()
        seconds = time.monotonic() - began
        time.sleep(SOAK_S)
        figures = churn.stop()
        sampling.set()
        assert churn.errors == [], churn.errors
    disrupted = rolloutkit.disruptions(install, steady)
    install.say(
        f"{what}: rollout {seconds:.1f}s, at most {overlap[0]} plugin registration sockets at once; "
        f"{figures.line()}; disrupted steady pods {len(disrupted)}"
    )
    for line in figures.failed_events + disrupted:
        install.say(f"  {line}")
    assert disrupted == [], disrupted
    eventually(lambda: rolloutkit.leaks(install, steady) == [], 120, f"{what}: churn state cleaned up")
    return figures


def test_rolling_upgrade_and_rollback_with_live_claims(rolling: Install) -> None:
    install = rolling
    steady = rolloutkit.steady(install, "steady")
    install.say(f"steady claims on N-1: {[(p.name, p.devices) for p in steady]}")
    tree = install.trees["N-1"]

    figures = _roll(install, "N-1 -> N", lambda: install.install("N", REPO, install.built["N"]), steady)
    assert figures.prepared > 0 and figures.not_running == [] and figures.failed_events == []
    pods = install.driver_pods()
    uid = pods[0]["metadata"]["uid"]
    assert realinstall.registration_sockets(install.nodes[0]) == [f"gpu.gpuplane.dev-{uid}-reg.sock"]

    def restart() -> str:
        return install.kubectl("rollout", "restart", "-n", realinstall.NAMESPACE, "daemonset/gpuplane-driver")

    figures = _roll(install, "N -> N", restart, steady)
    assert figures.prepared > 0 and figures.not_running == [] and figures.failed_events == []

    figures = _roll(install, "N -> N-1", lambda: install.install("N-1", tree, install.built["N-1"]), steady)
    assert figures.not_running == [], figures.not_running
    assert realinstall.registration_sockets(install.nodes[0]) == ["gpu.gpuplane.dev-reg.sock"]

    for pod in steady:
        install.kubectl("delete", "pod,resourceclaim", "-n", rolloutkit.NS, pod.name, "--wait=true", timeout=180)
    install.real.wait_clean(120)
    print("\n".join(install.log))
