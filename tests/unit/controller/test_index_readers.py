"""Every reader of the controller's compact indexes gets from them what it gets from the API objects.

The controller indexes ResourceSlices as digests keyed by node and claims as the few fields it
reads (gpuplane.controller.node.slice_index, gpuplane.controller.indexed). Rebalancing (noisy
taints, claim tiers, shares, pods, its annotation) and right-sizing (the fleet's GPU models) read
those indexes as the handlers pass them; here each runs once over the API's slices and once over
their digests, on pools the driver itself builds, and the outcomes must be equal and non-trivial
(claims are read only as indexed, :class:`~gpuplane.controller.indexed.ClaimView`). Dropping a field
a reader needs from a digest makes one of these fail. Steering's readers (node labels, the view over
the digests, claims' specs and Pod owners) are in steer/test_index_readers_steer.py.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from typing import Any

import pytest

from gpuplane.api import names as dn
from gpuplane.api import noisy_taint
from gpuplane.controller import indexed
from gpuplane.controller.metrics import ControllerMetrics
from gpuplane.controller.node import slice_index
from gpuplane.controller.rebalance import act, loop
from gpuplane.controller.rebalance.decide import Settings
from gpuplane.controller.rightsize import fleet as rs_fleet
from tests.indexkit import HOGS, T0, fleet
from tests.indexkit import slice_idx as _slice_idx

S = Settings(persist_s=10.0, cooldown_s=100.0)


@pytest.fixture(scope="module")
def raw_slices(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return fleet(tmp_path_factory.mktemp("sim"))


def _claim(uid: str, name: str, node: str, *, tier: str, share: int, pod: str) -> dict[str, Any]:
    """A claim as the API returns it: a firstAvailable request with the tier class in an alternative."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "uid": uid,
            "name": name,
            "namespace": "team",
            "annotations": {"other.example/x": "y"},
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "firstAvailable": [
                            {"name": "whole", "deviceClassName": "gpu.gpuplane.dev"},
                            {"name": "mps", "deviceClassName": rs_fleet.tier_class(tier)},
                        ],
                    }
                ]
            }
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu/mps",
                            "driver": dn.DRIVER_NAME,
                            "pool": node,
                            "device": "gpu-7",
                            "shareID": "abc",
                            "consumedCapacity": {dn.CAP_SHARE_PERCENT: str(share)},
                        }
                    ]
                },
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name"}]}]},
            },
            "reservedFor": [{"resource": "pods", "name": pod, "uid": f"uid-{pod}"}],
        },
    }


def _claims() -> list[dict[str, Any]]:
    out = []
    for node, hog in HOGS.items():
        out.append(_claim(hog, f"bronze-{node}", node, tier="bronze", share=20, pod=f"bronze-{node}"))
        out.append(_claim(f"{hog[:-2]}aa", f"gold-{node}", node, tier="gold", share=60, pod=f"gold-{node}"))
    return out


class Writer:
    """Records what a rebalancing pass writes; pods owned by a ReplicaSet unless ``bare``."""

    def __init__(self, bare: bool = False) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.rules: dict[str, dict[str, Any]] = {}
        self.bare = bare

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        refs = [] if self.bare else [{"kind": "ReplicaSet", "name": "rs", "uid": "rs-1", "controller": True}]
        return {"metadata": {"name": name, "uid": f"uid-{name}", "ownerReferences": refs}, "status": {}}

    def list_pods(self, namespace: str) -> list[dict[str, Any]]:
        return []

    def evict_pod(self, namespace: str, name: str, uid: str = "") -> str | None:
        self.calls.append(("evict", name))
        return None

    def namespace_labels(self) -> dict[str, dict[str, str]]:
        return {"team": {"gpuplane.dev/max-tier": "gold"}}

    def list_device_taint_rules(self, label: str) -> list[dict[str, Any]] | None:
        return list(self.rules.values())

    def create_device_taint_rule(self, body: Mapping[str, Any]) -> None:
        self.calls.append(("create-rule", copy.deepcopy(dict(body))))

    def delete_device_taint_rule(self, name: str) -> None:
        self.calls.append(("delete-rule", name))

    def annotate_device_taint_rule(self, name: str, annotations: Mapping[str, str]) -> None:
        self.calls.append(("annotate-rule", name))

    def annotate_claim(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        self.calls.append(("annotate-claim", (name, dict(annotations))))

    def event(self, ref: Any, kind: str, reason: str, message: str) -> None:
        self.calls.append(("event", (ref.kind, ref.name, kind, reason, message)))


def _pass(w: Writer, slices_: list[Any], claims: list[indexed.ClaimView], now: float) -> list[tuple[str, str, str]]:
    r = act.Rebalancer(w, S, ControllerMetrics())
    return [(d.alert.gpu, d.hog.name if d.hog else "", o) for d, o in asyncio.run(r.run_pass(slices_, claims, now))]


def test_rebalancing_over_the_indexes_moves_what_it_moves_over_the_api_objects(
    raw_slices: list[dict[str, Any]],
) -> None:
    raw_claims = _claims()
    idx_claims = [indexed.claim(c) for c in raw_claims]
    from_index = loop.noisy_slices(_slice_idx(raw_slices))
    w_raw, w_idx = Writer(), Writer()
    got_raw = _pass(w_raw, raw_slices, idx_claims, T0 + 11)  # claims are read as indexed only (ClaimView)
    got_idx = _pass(w_idx, from_index, idx_claims, T0 + 11)
    moved = sorted(g for g in got_raw if g[2] != "ignore")  # the GPU's MIG placements carry its taint too
    assert moved == [("hgx-0/gpu-7", "bronze-hgx-0", "evicted"), ("hgx-1/gpu-7", "bronze-hgx-1", "evicted")]
    assert sorted(got_idx) == sorted(got_raw)
    # The same rules (with the moved share: consumedCapacity), evictions and Events (tiers, pods).
    assert w_idx.calls == w_raw.calls
    rule = next(c[1] for c in w_idx.calls if c[0] == "create-rule")
    assert "0.2" in str(rule), rule  # the bronze claim's 20 % share, read from the indexed allocation
    hogs = {c.name: c for c in idx_claims if c.name.startswith("bronze-hgx-0")}
    assert [r.share_percent for r in hogs["bronze-hgx-0"].results] == ["20"], hogs


def test_a_reported_outcome_is_not_reported_again_from_the_indexed_claim(raw_slices: list[dict[str, Any]]) -> None:
    raw_claims = _claims()
    w = Writer(bare=True)
    r = act.Rebalancer(w, S, ControllerMetrics())
    slices_ = loop.noisy_slices(_slice_idx(raw_slices))
    first = asyncio.run(r.run_pass(slices_, [indexed.claim(c) for c in raw_claims], T0 + 11))
    assert {o for _, o in first} - {"ignore"} == {"bare-pod"}
    notes = {n: a for kind, (n, a) in [c for c in w.calls if c[0] == "annotate-claim"]}
    assert set(notes) == {"bronze-hgx-0", "bronze-hgx-1"}  # display only (issue 32): never read back
    w.calls.clear()
    asyncio.run(r.run_pass(slices_, [indexed.claim(c) for c in raw_claims], T0 + 12))
    assert [c for c in w.calls if c[0] in ("event", "annotate-claim")] == []  # the controller's memory


def test_the_indexed_claim_keeps_the_rebalancing_annotation_act_writes() -> None:
    assert indexed.REBALANCE_ANNOTATION == act.ANNOTATION


def test_noisy_taints_of_every_node_and_every_slice_reach_rebalancing(raw_slices: list[dict[str, Any]]) -> None:
    idx = _slice_idx(raw_slices)
    assert all(len(v) > 1 for v in idx.values())  # several slices per node key
    specs = loop.noisy_slices(idx)
    got = sorted((s["nodeName"], d["name"], t["value"]) for s in specs for d in s["devices"] for t in d["taints"])
    want = sorted(
        (s["spec"]["nodeName"], d["name"], t["value"])
        for s in raw_slices
        for d in s["spec"].get("devices") or []
        for t in d.get("taints") or []
        if t["key"] == noisy_taint.KEY
    )
    assert got == want and {(n, d) for n, d, _ in got} >= {("hgx-0", "gpu-7"), ("hgx-1", "gpu-7")}


def test_rightsizing_reads_the_same_fleet_from_the_digests(raw_slices: list[dict[str, Any]]) -> None:
    from_api = rs_fleet.models(raw_slices)
    from_index = rs_fleet.models(slice_index.every(_slice_idx(raw_slices)))
    assert from_index == from_api
    assert len(from_api) == 2 and all(m.memory_bytes > 0 and m.multiprocessors > 0 for m in from_api)
    assert all(len(m.mig) >= 5 for m in from_api), from_api  # every MIG profile with its memory and SMs
