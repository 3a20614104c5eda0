"""Issue 32, defect 5: a slice whose pool is not its node is never read.

The driver publishes one node-local pool per node, named after the node. A slice of driver
gpu.gpuplane.dev whose ``pool.name`` is not its ``nodeName`` (or that names no node) was written by
someone else: a stolen node credential publishing pool "victim-node" from node "attacker", with a
noisy-neighbour taint naming a claim on the victim's node, got that claim's pod evicted. Such a slice
is not indexed (a counter by reason and a log line say so), so its devices and taints reach neither
placement, nor steering, nor the rebalancer.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from gpuplane.api import names as dn
from gpuplane.api import noisy_taint
from gpuplane.controller import caches
from gpuplane.controller import metrics as metrics_mod
from gpuplane.controller.node import slice_index, snapshot_builder
from gpuplane.controller.rebalance import loop

HOG_UID = "0b7e4c1a-2f3d-4e5f-8a9b-0c1d2e3f4a5b"
TAINT = {
    "key": noisy_taint.KEY,
    "value": noisy_taint.encode(noisy_taint.NoisyFigures(HOG_UID, 90, 60, 30)),
    "effect": noisy_taint.EFFECT,
    "timeAdded": "2026-01-01T00:00:00Z",
}


def gpu(name: str, *taints: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "attributes": {dn.ATTR_TYPE: {"string": dn.DEVICE_TYPE_GPU}},
        "capacity": {dn.CAP_MEMORY: {"value": "80Gi"}},
        **({"taints": list(taints)} if taints else {}),
    }


def body(name: str, pool: Any, node: Any, *devices: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {"driver": dn.DRIVER_NAME, "pool": {"name": pool, "generation": 1}, "devices": list(devices)}
    if node is not None:
        spec["nodeName"] = node
    return {"metadata": {"name": name}, "spec": spec}


# node "attacker" publishes the victim's pool (and a noisy taint naming the victim's claim); a slice with
# no node at all; the victim's own, well-formed slice
FORGED = body("attacker-gpuplane-0", "victim", "attacker", gpu("gpu-0", TAINT))
NO_NODE = body("cluster-wide", "victim", None, gpu("gpu-0", TAINT))
OWN = body("victim-gpuplane-0", "victim", "victim", gpu("gpu-0"))


class Memo:
    """What the slice index handler uses of the runtime: the touch mark and the metrics."""

    def __init__(self) -> None:
        self.touches = 0
        self.metrics = metrics_mod.ControllerMetrics()

    def touched(self) -> None:
        self.touches += 1

    def untrusted(self, reason: str) -> float:
        got = self.metrics.registry.get_sample_value("gpuplane_untrusted_slices_total", {"reason": reason})
        return got or 0.0


def slice_idx_fn(memo: Memo) -> caches.SliceIndexer:
    """The controller's slice indexer, counting into ``memo``'s metrics."""
    return caches.SliceIndexer(memo.metrics, slice_index.Interner())


class TestUntrusted:
    def test_the_reason_of_each_slice(self) -> None:
        assert slice_index.untrusted(FORGED["spec"]) == slice_index.POOL_NOT_NODE
        assert slice_index.untrusted(NO_NODE["spec"]) == slice_index.NO_NODE
        assert slice_index.untrusted(OWN["spec"]) is None
        assert slice_index.untrusted({**FORGED["spec"], "driver": "gpu.example.com"}) is None  # not ours

    def test_a_forged_slice_has_no_digest_and_no_gpus(self) -> None:
        assert slice_index.digest("s", FORGED["spec"]) is None
        assert slice_index.digest("s", NO_NODE["spec"]) is None
        assert slice_index.as_digest(FORGED) is None
        own = slice_index.digest("s", OWN["spec"])
        assert own is not None and [g.id for g in own.gpus] == ["victim/gpu-0"]

    def test_the_snapshot_built_from_raw_slices_holds_only_the_own_nodes(self) -> None:
        view = snapshot_builder.build_view([FORGED, NO_NODE, OWN])
        assert sorted(g.id for g in view.gpus) == ["victim/gpu-0"]


class TestSliceIndex:
    def test_a_forged_slice_is_not_indexed_counted_and_logged(self, caplog: pytest.LogCaptureFixture) -> None:
        memo = Memo()
        with caplog.at_level(logging.WARNING):
            got = slice_idx_fn(memo)(FORGED)
        assert dict(got) == {}  # not indexed
        assert memo.untrusted(slice_index.POOL_NOT_NODE) == 1
        assert any(
            "attacker-gpuplane-0" in r.getMessage() and "pool-not-node" in r.getMessage() for r in caplog.records
        )

    def test_a_slice_naming_no_node_is_counted_by_its_reason(self) -> None:
        memo = Memo()
        assert dict(slice_idx_fn(memo)(NO_NODE)) == {}
        assert memo.untrusted(slice_index.NO_NODE) == 1
        assert memo.untrusted(slice_index.POOL_NOT_NODE) == 0

    def test_the_rebalancer_never_sees_the_forged_noisy_taint(self) -> None:
        memo = Memo()
        idx: dict[str, list[Any]] = {}
        for b in (FORGED, NO_NODE, OWN):
            for node, d in slice_idx_fn(memo)(b).items():
                idx.setdefault(node, []).append(d)
        assert list(idx) == ["victim"]
        assert loop.noisy_slices(idx) == []  # the taint naming the victim's claim is nowhere

    def test_the_own_nodes_noisy_taint_still_reaches_the_rebalancer(self) -> None:
        own = body("victim-gpuplane-0", "victim", "victim", gpu("gpu-0", TAINT))
        got = slice_idx_fn(Memo())(own)
        noisy = loop.noisy_slices({k: [v] for k, v in got.items()})
        assert [t["value"] for s in noisy for d in s["devices"] for t in d["taints"]] == [TAINT["value"]]
