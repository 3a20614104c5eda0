"""The chaos e2e's invariant checks (e2e.plane.chaos_invariants.check) find each kind of violation they claim to.

A consistent reading (three Running pods: a whole GPU, a MIG device, an MPS share, all prepared
once on node ``n0``; one pending claim with the controller's reason) passes; each mutation below
(a leaked MIG instance, an MPS daemon or CDI spec without an owner, a claim prepared on two
nodes or left ``PrepareStarted``, a GPU held twice, an unexplained pending claim, ...) is reported
with a sentence naming the object.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from e2e.plane.chaos_invariants import ApiView, NodeView, check, terminating
from gpuplane.driver.prepare.checkpoint import Checkpoint, ClaimRecord, DeviceRecord, MigRecord, SharingRecord

NS = "chaos"
DRIVER = "gpu.gpuplane.dev"
MIG_DEVICE = "gpu-1-mig-1g.10gb-0"


def _claim(name: str, uid: str, pod_uid: str, results: list[dict[str, Any]] | None) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if results is not None:
        status = {"allocation": {"devices": {"results": results}}, "reservedFor": [{"uid": pod_uid}]}
    meta = {"name": name, "namespace": NS, "uid": uid, "ownerReferences": [{"kind": "Pod", "uid": pod_uid}]}
    return {"metadata": meta, "status": status}


def _pod(name: str, uid: str, claim: str, phase: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NS, "uid": uid},
        "spec": {"nodeName": "n0", "resourceClaims": [{"name": "gpu"}]},
        "status": {"phase": phase, "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": claim}]},
    }


def _result(device: str, share: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"driver": DRIVER, "pool": "n0", "device": device, "request": "gpu"}
    if share is not None:
        out["consumedCapacity"] = {"sharePercent": share}
    return out


def _record(uid: str, name: str, device: DeviceRecord, strategy: str = "Exclusive") -> ClaimRecord:
    return ClaimRecord(
        uid=uid,
        namespace=NS,
        name=name,
        phase="PrepareCompleted",
        devices=[device],
        sharing=SharingRecord(strategy=strategy),
        mps_daemon=strategy == "MPS",
    )


def _gpu(device: str, minor: int) -> DeviceRecord:
    return DeviceRecord(
        request_names=["gpu"], pool="n0", device=device, kind="gpu", gpu_uuid=f"GPU-{minor}", gpu_minor=minor
    )


MIG = MigRecord(parent_uuid="GPU-1", profile_id=19, profile_name="1g.10gb", start=0, size=1, gi_id=3, ci_id=0)


def consistent() -> tuple[ApiView, list[NodeView]]:
    api = ApiView(
        namespace=NS,
        pods=[
            _pod("whole", "p1", "whole-c", "Running"),
            _pod("mig", "p2", "mig-c", "Running"),
            _pod("mps", "p3", "mps-c", "Running"),
            _pod("unfit", "p4", "unfit-c", "Pending"),
        ],
        claims=[
            _claim("whole-c", "c1", "p1", [_result("gpu-0")]),
            _claim("mig-c", "c2", "p2", [_result(MIG_DEVICE)]),
            _claim("mps-c", "c3", "p3", [_result("gpu-2", "20")]),
            _claim("unfit-c", "c4", "p4", None),
        ],
        events=[{"involvedObject": {"kind": "ResourceClaim", "name": "unfit-c"}, "reason": "NotAllocated"}],
    )
    mig_device = DeviceRecord(
        request_names=["gpu"], pool="n0", device=MIG_DEVICE, kind="mig", gpu_uuid="GPU-1", gpu_minor=1, mig=MIG
    )
    cp = Checkpoint(
        claims={
            "c1": _record("c1", "whole-c", _gpu("gpu-0", 0)),
            "c2": _record("c2", "mig-c", mig_device),
            "c3": _record("c3", "mps-c", _gpu("gpu-2", 2), "MPS"),
        }
    )
    node = NodeView("n0", cp, frozenset({"c1", "c2", "c3"}), (("GPU-1", 3),), frozenset({"c3"}), ("c3",))
    other = NodeView("n1", Checkpoint(), frozenset(), (), frozenset(), ())
    return api, [node, other]


def test_a_consistent_reading_passes_every_check() -> None:
    api, nodes = consistent()
    verdict = check(api, nodes, must_run=lambda pod: pod["metadata"]["name"] != "unfit")
    assert verdict.violations == []
    assert verdict.checks >= 30


def _with_node(nodes: list[NodeView], index: int, **changes: Any) -> list[NodeView]:
    out = list(nodes)
    out[index] = dataclasses.replace(out[index], **changes)
    return out


def _mutations() -> dict[str, tuple[ApiView, list[NodeView], str]]:
    api, nodes = consistent()
    n0 = nodes[0]
    cases: dict[str, tuple[ApiView, list[NodeView], str]] = {}
    cases["leaked MIG instance"] = (
        api,
        _with_node(nodes, 0, mig_instances=(("GPU-1", 3), ("GPU-5", 1))),
        "MIG instance 1 on GPU-5 has no owner claim",
    )
    cases["MIG instance made twice"] = (
        api,
        _with_node(nodes, 0, mig_instances=(("GPU-1", 3), ("GPU-1", 3))),
        "2 instances",
    )
    cases["MIG instance gone"] = (api, _with_node(nodes, 0, mig_instances=()), "0 instances")
    cases["orphan MPS daemon"] = (
        api,
        _with_node(nodes, 0, mps_daemons=("c3", "gone")),
        "MPS control daemon of claim gone without an owner claim",
    )
    cases["orphan MPS directory"] = (
        api,
        _with_node(nodes, 0, mps_dirs=frozenset({"c3", "gone"})),
        "MPS directory of claim gone",
    )
    cases["MPS daemon missing"] = (api, _with_node(nodes, 0, mps_daemons=()), "0 live control daemons")
    cases["orphan CDI spec"] = (
        api,
        _with_node(nodes, 0, cdi_claims=n0.cdi_claims | {"gone"}),
        "CDI spec of claim gone",
    )
    cases["CDI spec on two nodes"] = (
        api,
        _with_node(nodes, 1, cdi_claims=frozenset({"c1"})),
        "has CDI specs on ['n0', 'n1']",
    )
    twice = copy.deepcopy(n0.checkpoint)
    cases["prepared on two nodes"] = (
        api,
        _with_node(nodes, 1, checkpoint=Checkpoint(claims={"c1": twice.claims["c1"]})),
        "is in the checkpoint of ['n0', 'n1']",
    )
    started = copy.deepcopy(n0.checkpoint)
    started.claims["c1"].phase = "PrepareStarted"
    cases["left PrepareStarted"] = (api, _with_node(nodes, 0, checkpoint=started), "is left PrepareStarted")
    unowned = copy.deepcopy(n0.checkpoint)
    unowned.claims["zz"] = _record("zz", "deleted", _gpu("gpu-7", 7))
    cases["entry without claim"] = (api, _with_node(nodes, 0, checkpoint=unowned), "deleted (zz) has no ResourceClaim")
    shared = copy.deepcopy(n0.checkpoint)
    shared.claims["c9"] = _record("c9", "other", _gpu("gpu-0", 0))
    api_c9 = dataclasses.replace(api, claims=[*api.claims, _claim("other", "c9", "p9", [_result("gpu-0")])])
    cases["GPU held twice"] = (api_c9, _with_node(nodes, 0, checkpoint=shared), "gpu-0 is exclusive to")
    cases["share over 100 %"] = (api_c9, _with_node(nodes, 0, checkpoint=shared), "claims allocated 200 %")
    wrong = copy.deepcopy(n0.checkpoint)
    wrong.claims["c1"].devices = [_gpu("gpu-4", 4)]
    cases["wrong device prepared"] = (api, _with_node(nodes, 0, checkpoint=wrong), "prepared [('n0', 'gpu-4')]")
    silent = dataclasses.replace(api, events=[])
    cases["pending claim unexplained"] = (silent, nodes, "claim unfit-c is pending and nothing says why")
    missing = copy.deepcopy(n0.checkpoint)
    del missing.claims["c1"]
    cases["Running pod not prepared"] = (
        api,
        _with_node(nodes, 0, checkpoint=missing, cdi_claims=frozenset({"c2", "c3"})),
        "claim whole-c is in the checkpoint of []",
    )
    stuck = dataclasses.replace(api, pods=[*api.pods[:2], _pod("mps", "p3", "mps-c", "Pending"), api.pods[3]])
    cases["allocated pod stuck silently"] = (stuck, nodes, "no Event says why")
    orphan_claim = dataclasses.replace(api, claims=[*api.claims, _claim("left", "c8", "p-gone", None)])
    cases["claim outlives its pod"] = (orphan_claim, nodes, "claim chaos/left outlives its pod")
    return cases


@pytest.mark.parametrize("case", sorted(_mutations()))
def test_each_violation_is_found(case: str) -> None:
    api, nodes, expected = _mutations()[case]
    verdict = check(api, nodes, must_run=lambda pod: pod["metadata"]["name"] != "unfit")
    assert any(expected in v for v in verdict.violations), verdict.violations


def test_a_pending_claim_with_the_controllers_annotation_is_explained() -> None:
    api, nodes = consistent()
    claims = copy.deepcopy(list(api.claims))
    claims[3]["metadata"]["annotations"] = {"gpuplane.dev/unallocated-reason": "needs 9 GPUs on one node"}
    verdict = check(dataclasses.replace(api, claims=claims, events=[]), nodes)
    assert verdict.violations == []


def test_a_pod_that_must_run_but_is_pending_is_reported() -> None:
    api, nodes = consistent()
    verdict = check(api, nodes, must_run=lambda pod: True)
    assert verdict.violations == ["pod chaos/unfit is Pending, not Running"]


def test_pods_and_claims_being_deleted_are_named() -> None:
    api, _ = consistent()
    pods = copy.deepcopy(list(api.pods))
    pods[0]["metadata"]["deletionTimestamp"] = "2026-12-01T16:42:40Z"
    claims = copy.deepcopy(list(api.claims))
    claims[1]["metadata"]["deletionTimestamp"] = "2026-12-01T16:42:41Z"
    assert terminating(dataclasses.replace(api, pods=pods, claims=claims)) == [
        "pod chaos/whole (deleted at 2026-12-01T16:42:40Z)",
        "claim chaos/mig-c (deleted at 2026-12-01T16:42:41Z)",
    ]
    assert terminating(api) == []
