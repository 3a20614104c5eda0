"""Issue 32, defect 5, end to end: a ResourceSlice whose pool is not its node evicts nobody.

A stolen node credential (or anyone RBAC lets write ResourceSlices) publishes, from node "forger", a slice of
gpu.gpuplane.dev in the victim node's pool, with a noisy-neighbour taint naming a tenant's running claim on the
victim's node. Before: the controller read it like the driver's own alert and evicted that tenant's pod.

- With gpuplane's policies installed, the API server refuses the slice, even to an administrator
  (``gpuplane-own-node-slices``).
- Without that policy (a cluster that turned it off), the slice is stored, and the controller does not read it:
  the tenant's pod keeps running past the rebalancer's persistence window, no DeviceTaintRule is written, and the
  controller's log names the slice and why (``pool-not-node``).

The module's own simulated node and its gold and bronze MPS claims come from test_rebalance's fixtures.
"""

from __future__ import annotations

import datetime
import time
import uuid
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.plane import components, simnodes
from gpuplane.api import noisy_taint
from tests.daemonpods import refused_by
from tests.e2e.conftest import GpuCluster, eventually
from tests.e2e.test_rebalance import REPO, Scenario, node  # noqa: F401  (fixture node)

pytestmark = pytest.mark.e2e

POLICY = "gpuplane-own-node-slices"
SLICES_FILE = REPO / "manifests" / "policies" / "driver-own-node-slices.yaml"
PERSIST_S = 25  # the e2e controllers act on an alert after --noisy-persist=5 s; five times that


def forged_slice(forger: str, victim_node: str, device: str, hog_uid: str) -> dict[str, Any]:
    figures = noisy_taint.NoisyFigures(hog_uid, share_pct=80, threshold_pct=50, sustain_s=2)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    taint = {
        "key": noisy_taint.KEY,
        "value": noisy_taint.encode(figures),
        "effect": noisy_taint.EFFECT,
        "timeAdded": now,
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{forger}-gpuplane-0"},
        "spec": {
            "driver": "gpu.gpuplane.dev",
            "nodeName": forger,
            # generation 0: never newer than the victim's own pool, so the scheduler keeps using the real slices
            "pool": {"name": victim_node, "generation": 0, "resourceSliceCount": 1},
            "devices": [{"name": device, "taints": [taint]}],
        },
    }


def binding() -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(SLICES_FILE.read_text()) if d]
    return next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding" and d["metadata"]["name"] == POLICY)


def controller_log_lines(gpu: GpuCluster, needle: str) -> list[str]:
    assert gpu.cluster.state_dir is not None
    logs = gpu.cluster.state_dir / "logs"
    return [
        line
        for path in sorted(logs.glob(f"{components.CONTROLLER_PREFIX}*.log"))
        for line in path.read_text(errors="replace").splitlines()
        if needle in line
    ]


def test_a_slice_in_another_nodes_pool_evicts_nobody(
    node: tuple[GpuCluster, simnodes.SimNode],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    gpu, sim = node
    sc = Scenario(gpu, sim, f"forged-{uuid.uuid4().hex[:5]}")
    custom = client.CustomObjectsApi(gpu.cluster.api)
    admission = client.AdmissionregistrationV1Api(gpu.cluster.api)
    forger = f"forger-{uuid.uuid4().hex[:5]}"
    removed = False
    try:
        gold, bronze = sc.setup(0, (0, 1), pdb=False)
        bronze_claim = sc.claim_of(bronze)
        body = forged_slice(forger, sim.name, "gpu-0", bronze_claim["metadata"]["uid"])

        def create() -> Any:
            return custom.create_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", body)

        # 1. The policy refuses it, to the cluster's administrator too.
        msg = refused_by(POLICY, create)
        assert f"spec.pool.name must be '{forger}', not '{sim.name}'" in msg

        # 2. Without the policy the slice is stored; the controller does not read it.
        admission.delete_validating_admission_policy_binding(POLICY)
        removed = True

        def stored() -> bool:
            try:
                create()
            except ApiException as exc:
                if exc.status == 403 and POLICY in str(exc.body):
                    return False  # the API server has not seen the binding go yet
                raise
            return True

        eventually(stored, 30, "the forged slice stored once the binding is gone")
        logged = eventually(
            lambda: controller_log_lines(gpu, f"{forger}-gpuplane-0"), 30, "the controller's log line on the slice"
        )
        assert any("pool-not-node" in line for line in logged), logged
        time.sleep(PERSIST_S)  # an alert the rebalancer believed would have moved the bronze pod by now
        running = sc.running("bronze-")
        assert [p["metadata"]["uid"] for p in running] == [bronze["metadata"]["uid"]], running
        assert gpu.pod(sc.ns, "gold")["metadata"]["uid"] == gold["metadata"]["uid"]
        rules = gpu.kubectl_json("get", "devicetaintrules", "-l", "gpuplane.dev/noisy-neighbour-move=true")["items"]
        assert rules == [], rules
        assert not sc.events(bronze["metadata"]["name"], "NoisyNeighbourEvicted")
        with capsys.disabled():
            print(f"\n[e2e] refused to the administrator: {msg[msg.find('denied request') :][:200]}")
            print(f"[e2e] stored without the policy; controller: {logged[0][:300]}")
            print(f"[e2e] bronze {bronze['metadata']['name']} still running after {PERSIST_S}s; no DeviceTaintRule")
    finally:
        try:
            custom.delete_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", f"{forger}-gpuplane-0")
        except ApiException as exc:
            if exc.status != 404:
                raise
        if removed:
            gpu.cluster.apply(binding())
        sc.teardown()
