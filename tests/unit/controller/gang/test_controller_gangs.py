"""Controller gang logic without a cluster: slices come from the real driver code on the simulator.

Covers: snapshot building from published slices, all-or-nothing apply steps,
idempotent re-apply after a crash mid-apply, TP refusal with the reason,
preemption victims (never equal priority), DRF ordering, status coalescing,
and node label derivation. Claim checks: ``test_controller_claims``.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuplane.controller import names
from gpuplane.controller.gang import desired, placement_record, status
from gpuplane.controller.node import labels, selectors, snapshot_builder
from tests import controllerkit
from tests.controllerkit import (
    CLUSTER,
    GB200,
    H100,
    T0,
    FakeApi,
    apply_all,
    decide,
    gang_body,
    gang_world,
    make_world,
    member_pod,
    pods_bound,
)

# --- builders -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster_slices(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return controllerkit.cluster_slices(tmp_path_factory.mktemp("sim"))


# --- snapshot and labels -------------------------------------------------------------------------


def test_view_reads_domains_from_real_slices(cluster_slices: list[dict[str, Any]]) -> None:
    view = snapshot_builder.build_view(cluster_slices)
    snap = view.snapshot()
    sizes = sorted(d.gpu_count for d in snap.domains)
    assert sizes == [8, 8, 16]  # two HGX nodes, one NVL72 clique of 4 nodes x 4 GPUs
    assert snap.max_domain_gpus == 16
    assert "3g" in view.profiles.values()


def test_node_label_from_slices(cluster_slices: list[dict[str, Any]]) -> None:
    hgx = labels.desired(labels.domains_of_node("hgx-0", cluster_slices))
    nvl = [labels.desired(labels.domains_of_node(f"nvl-{i}", cluster_slices)).label for i in range(4)]
    assert hgx.label == "hgx-0.nvl0"
    assert len(set(nvl)) == 1 and nvl[0] == f"{CLUSTER}.1"
    stale = {names.NODE_LABEL_NVLINK_DOMAIN: "stale"}
    assert labels.patch_for(stale, None, hgx) == {
        "metadata": {"labels": {names.NODE_LABEL_NVLINK_DOMAIN: "hgx-0.nvl0"}}
    }
    assert labels.patch_for({names.NODE_LABEL_NVLINK_DOMAIN: "hgx-0.nvl0"}, None, hgx) is None
    assert labels.desired({"a", "b"}) == labels.NodeDomains(label=None, annotation="a,b")


def test_selector_prefilter() -> None:
    c = selectors.compile_all([GB200, 'device.attributes["x.y"].n >= 3 && !(device.driver != "d")', "size(x) > 1"])
    assert c.unsupported == ("size(x) > 1",)
    assert c.predicate("d", {"gpu.gpuplane.dev/productName": "NVIDIA GB200", "x.y/n": 3})
    assert not c.predicate("d", {"gpu.gpuplane.dev/productName": "NVIDIA GB200", "x.y/n": 2})
    assert not c.predicate("d", {"x.y/n": 5})  # missing attribute: no match


# --- gang placement -----------------------------------------------------------------------------


def test_tp8_gang_lands_in_one_nvl72_clique_all_or_nothing(cluster_slices: list[dict[str, Any]]) -> None:
    body = gang_body("train", members=2, gpusPerMember=4, tensorParallelSize=8, selectors=[GB200])
    w = gang_world(cluster_slices, body, 2)
    out = decide(w, "team-a/train")
    assert out.status["phase"] == "Placing"
    placement = out.status["placement"]
    assert placement["domains"] == [f"{CLUSTER}.1"]
    assert set(placement["members"].values()) <= {f"nvl-{i}" for i in range(4)}
    kinds = [s.kind for s in out.steps]
    # claims first, then affinities, then gates: gates never before every claim exists
    assert kinds == ["create-claim"] * 2 + ["patch-pod"] * 4
    claim = out.steps[0].body
    assert claim["metadata"]["ownerReferences"][0]["uid"] == "uid-train"
    exprs = [s["cel"]["expression"] for s in claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"]]
    assert any(f'nvlinkDomain == "{CLUSTER}.1"' in e for e in exprs)
    assert claim["spec"]["devices"]["constraints"] == [
        {"requests": ["gpus"], "matchAttribute": "gpu.gpuplane.dev/nvlinkDomain"}
    ]


def test_gang_waits_for_all_members(cluster_slices: list[dict[str, Any]]) -> None:
    body = gang_body("train", members=2, gpusPerMember=4, tensorParallelSize=8)
    w = make_world(cluster_slices, [body], [member_pod("train", 0)])
    out = decide(w, "team-a/train")
    assert out.status["phase"] == "Pending" and not out.steps
    assert "1 of 2" in out.status["message"]


def test_tp16_on_h100_is_refused_with_reason(cluster_slices: list[dict[str, Any]]) -> None:
    body = gang_body("big", members=2, gpusPerMember=8, tensorParallelSize=16, selectors=[H100])
    out = decide(gang_world(cluster_slices, body, 2), "team-a/big")
    assert out.status["phase"] == "Unschedulable"
    assert "TP size 16 exceeds the largest NVLink domain (8 GPUs)" in out.status["message"]
    assert not out.steps
    assert ("Warning", "Unschedulable", out.status["message"]) in out.events


def test_crash_mid_apply_converges_without_duplicates(cluster_slices: list[dict[str, Any]]) -> None:
    body = gang_body("train", members=4, gpusPerMember=4, tensorParallelSize=8, selectors=[GB200])
    w = gang_world(cluster_slices, body, 4)
    first = decide(w, "team-a/train")
    total = len(first.steps)
    for crash_at in range(total):
        api = FakeApi(w, crash_after=crash_at)
        assert not apply_all(api, first.steps)
        # The status (decision) was written first; rebuild the world from the "API" and go on.
        st = {**body["status"], **{k: v for k, v in first.status.items() if v is not None}}
        w2 = make_world(
            cluster_slices,
            [gang_body("train", status_=st, **body["spec"])],
            list(api.pods.values()),
            [dict(c, status={}) for c in api.claims.values()],
        )
        again = decide(w2, "team-a/train")
        assert again.status["phase"] == "Placing" and "placement" not in again.status  # the decision stands
        api.crash_after = None
        assert apply_all(api, again.steps)
        assert len(api.writes) == total, f"crash at {crash_at}: {api.writes}"
        assert all(not p["spec"]["schedulingGates"] for p in api.pods.values())
        assert sorted(api.claims) == [f"train-{i}" for i in range(4)]
        w3 = make_world(
            cluster_slices,
            [gang_body("train", status_=st, **body["spec"])],
            list(api.pods.values()),
            [dict(c, status={}) for c in api.claims.values()],
        )
        assert decide(w3, "team-a/train").steps == ()


def test_gates_not_lifted_while_a_member_claim_is_foreign(cluster_slices: list[dict[str, Any]]) -> None:
    body = gang_body("train", members=2, gpusPerMember=4, tensorParallelSize=8, selectors=[GB200])
    foreign = {"metadata": {"name": "train-1", "namespace": "team-a", "annotations": {}}, "spec": {}, "status": {}}
    w = make_world(cluster_slices, [body], [member_pod("train", i) for i in range(2)], [foreign])
    out = decide(w, "team-a/train")
    assert out.steps[-1].kind == "wait"
    assert not any(s.kind == "patch-pod" and "gate" in s.why for s in out.steps)


def test_narrowing_keeps_existing_terms() -> None:
    aff = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]
            }
        }
    }
    out = desired.narrowed_affinity(aff, "n1")
    assert out is not None
    exprs = out["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
        "matchExpressions"
    ]
    assert exprs == [
        {"key": "zone", "operator": "In", "values": ["a"]},
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]},
    ]
    assert desired.narrowed_affinity(out, "n1") is None
    assert desired.pinned_elsewhere(out, "n2") == "n1"


# --- queue: fairness, aging, preemption ------------------------------------------------------------


def test_256_member_gang_status_writes_are_bounded(cluster_slices: list[dict[str, Any]]) -> None:
    n = 256
    placement = {
        "id": "p",
        "domains": ["d"],
        "members": {str(i): "hgx-0" for i in range(n)},
        "devices": {str(i): "" for i in range(n)},
    }
    decided = placement_record.decision_from_status("team-a/huge", placement, {})
    assert decided is not None
    member_claims = [
        {
            "metadata": {
                "name": f"huge-{i}",
                "namespace": "team-a",
                "annotations": {names.ANNOTATION_DECISION: placement_record.decision_id(decided)},
                "ownerReferences": [{"apiVersion": names.GANG_API_VERSION, "kind": names.GANG_KIND, "name": "huge"}],
            },
            "spec": {},
            "status": {},
        }
        for i in range(n)
    ]
    coal = status.Coalescer(min_interval_s=5.0)
    current: dict[str, Any] = {"phase": "Placed", "placement": placement}
    writes = 0
    t = T0
    for bound in range(n + 1):  # one pod event per member bind, 20 ms apart
        t += 0.02
        body = gang_body("huge", status_=current, members=n, migProfile="1g.10gb")
        w = make_world(cluster_slices, [body], list(pods_bound("huge", n, bound)), member_claims)
        out = decide(w, "team-a/huge", now=t)
        patch = status.merge_patch(current, out.status)
        if coal.admit("team-a/huge", patch, t):
            writes += 1
            current = {**current, **{k: v for k, v in patch.items() if v is not None}}
    assert current["phase"] == "Scheduled"
    assert writes <= 5, writes  # phase changes are immediate; counters at most every 5 s


# --- claims ------------------------------------------------------------------------------------------------


def test_selector_outside_the_prefilter_is_reported_once(cluster_slices: list[dict[str, Any]]) -> None:
    odd = 'device.attributes["gpu.gpuplane.dev"].productName.startsWith("NVIDIA")'
    body = gang_body("odd", members=1, gpusPerMember=1, selectors=[odd, H100])
    out = decide(gang_world(cluster_slices, body, 1), "team-a/odd")
    approx = [e for e in out.events if e[1] == "SelectorNotPrefiltered"]
    assert len(approx) == 1 and odd in approx[0][2] and H100 not in approx[0][2]
    seen = {**body, "status": out.status}
    again = decide(gang_world(cluster_slices, seen, 1), "team-a/odd", now=T0 + 20)
    assert not [e for e in again.events if e[1] == "SelectorNotPrefiltered"]
    plain = gang_body("plain", members=1, gpusPerMember=1, selectors=[H100])
    assert not [
        e
        for e in decide(gang_world(cluster_slices, plain, 1), "team-a/plain").events
        if e[1] == "SelectorNotPrefiltered"
    ]
