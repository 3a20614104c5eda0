"""Rebalancing among tenants, end to end (issue 32, defect 4): the controller does not take a claim's tier on trust.

The scenario of ``test_rebalance`` (a gold MPS claim and a noisy bronze Deployment's claim on one GPU
of a simulated HGX H100 node, the session's controllers), in a namespace its administrator never
granted gold, the gold claim made while the admission policy ``gpuplane-tier-entitlement`` is unbound
(as a claim made before the policy existed): the noisy bronze neighbour is not evicted; once the
administrator labels the namespace ``gpuplane.dev/max-tier=gold``, the same alert moves it.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from e2e.cluster.handle import KubectlError
from e2e.plane import simnodes
from gpuplane.api import noisy_taint
from tests.e2e.conftest import GpuCluster, eventually
from tests.e2e.test_rebalance import Scenario, quote
from tests.e2e.test_rebalance import node as node  # noqa: PLC0414  (the module's own simulated node)

pytestmark = pytest.mark.e2e


TIER_BINDING = "gpuplane-tier-entitlement"


def test_a_gold_claim_its_namespace_was_never_granted_gets_nobody_evicted(
    node: tuple[GpuCluster, simnodes.SimNode], capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 32, defect 4: the controller does not take a claim's class on trust.

    The gold claim is made while the admission policy is unbound (as a claim made before the policy
    existed), in a namespace its administrator never granted gold: rebalancing counts it as bronze, so the
    noisy bronze neighbour stays. Once the administrator labels the namespace gold, the same alert moves it.
    """
    gpu, sim = node
    sc = Scenario(gpu, sim, "rebalance-ungranted")
    binding = json.loads(
        gpu.cluster.kubectl("get", "validatingadmissionpolicybinding", TIER_BINDING, "-o", "json", check=False) or "{}"
    )
    for key in ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"):
        binding.get("metadata", {}).pop(key, None)
    binding.pop("status", None)
    gpu.cluster.kubectl("delete", "validatingadmissionpolicybinding", TIER_BINDING, "--ignore-not-found")
    try:
        # The policy sees the binding go within a second or so; until then the gold claim may be refused.
        def made() -> tuple[dict[str, Any], dict[str, Any]] | None:
            try:
                return sc.setup(6, (6, 7), pdb=False, granted=False)
            except KubectlError:  # refused while the binding's removal propagates
                return None

        gold, bronze = eventually(made, 60, "gold and bronze running in an ungranted namespace")
    finally:
        if binding:
            gpu.cluster.apply(json.dumps(binding))
    try:
        bronze_name = bronze["metadata"]["name"]
        sc.hog(6, sc.claim_of(bronze), sc.claim_of(gold))
        device = eventually(
            lambda: (gpu.slice_devices().get((sim.name, "gpu-6")) or {}).get("taints"), 60, "the noisy taint on gpu-6"
        )
        assert any(t["key"] == noisy_taint.KEY for t in device), device
        # Persist (5 s) and several passes (every 5 s): no eviction, no rule.
        deadline = time.monotonic() + 25
        while time.monotonic() < deadline:
            assert not quote(sc, bronze_name, "NoisyNeighbourEvicted")
            assert f"gpuplane-moved.{sim.name}.gpu-6" not in gpu.cluster.kubectl(
                "get", "devicetaintrules", "-o", "name"
            )
            time.sleep(2)
        still = gpu.pod(sc.ns, bronze_name)
        assert still["metadata"]["uid"] == bronze["metadata"]["uid"] and not still["metadata"].get("deletionTimestamp")
        # The administrator grants gold: the gold claim now counts as gold and the bronze neighbour moves.
        gpu.cluster.kubectl("label", "namespace", sc.ns, "gpuplane.dev/max-tier=gold")
        evicted = eventually(lambda: quote(sc, bronze_name, "NoisyNeighbourEvicted"), 90, "NoisyNeighbourEvicted")
        with capsys.disabled():
            print("\n[e2e] ungranted gold claim: no eviction for 25 s; after the label:")
            for line in evicted:
                print(f"[e2e] Event {line}")
    finally:
        sc.teardown()
