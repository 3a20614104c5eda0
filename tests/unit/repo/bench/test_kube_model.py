"""The benchmark's model of kube-scheduler: scoring arithmetic, Go's heap tie-break, the allocator's walk."""

from __future__ import annotations

import pytest

from bench.kube import kube_model
from gpuplane.placement import fragmentation, geometry, model, snapshot


def test_least_allocated_matches_integer_arithmetic() -> None:
    s = kube_model.Scoring(base_pods=0)
    # cpu: (64000 - 100n) * 100 // 64000; memory: (512Gi - 200Mi n) * 100 // 512Gi; mean (floor).
    assert s.score(1) == (99 + 99) // 2
    assert s.score(7) == (98 + 99) // 2  # cpu steps every 6.4 pods, memory every 26.2
    assert s.score(27) == (95 + 98) // 2
    assert kube_model.Scoring(base_pods=1).score(6) == s.score(7)


def test_feasible_nodes_to_find() -> None:
    assert kube_model.feasible_to_find(16) == 16
    assert kube_model.feasible_to_find(99) == 99
    assert kube_model.feasible_to_find(125) == 100  # 49 % of 125 is 61, below the floor of 100
    assert kube_model.feasible_to_find(252) == 120  # 48 % of 252
    assert kube_model.feasible_to_find(5000) == 5000 * 10 // 100


@pytest.mark.parametrize(
    ("scores", "root"),
    [
        ([5, 5, 5, 5], 0),  # all equal: nothing moves, the first found wins
        ([1, 2, 3, 3, 2], 3),  # the 3 at index 3 bubbles up through index 1 and wins over index 2
        ([3, 1, 3], 0),
        ([1, 9], 1),
        ([7], 0),
    ],
)
def test_heap_root_is_gos_heap_init_then_pop(scores: list[int], root: int) -> None:
    assert kube_model.heap_root(scores) == root
    assert scores[kube_model.heap_root(scores)] == max(scores)


def test_todays_hgx_walk_visits_gpus_in_natural_order() -> None:
    # Slice -0 holds the eight counter sets, -1..-4 devices of two GPUs each: by name -1 < -2 < -3 < -4.
    # (Before the counter sets were packed, -0..-7 held counters and -10 sorted before -8: GPUs 4-7 first.)
    walk = kube_model.published_walk("hgx-h100")
    assert walk.whole == (0, 1, 2, 3, 4, 5, 6, 7)
    assert walk.mig["3g"][:3] == ((0, 0), (0, 4), (1, 0))
    assert [s for g, s in walk.mig["1g"] if g == 0] == [0, 1, 2, 3, 4, 5, 6]


def _cluster(nodes: int) -> snapshot.Snapshot:
    return snapshot.uniform_cluster(nodes, 1, 8)


def _mix() -> fragmentation.SizeMix:
    return fragmentation.SizeMix.from_counts({fragmentation.Shape(mig_profile="3g"): 1, fragmentation.Shape(): 1})


def test_default_path_spreads_by_pod_count_and_takes_the_first_published_device() -> None:
    walks = kube_model.walks_for([8])
    ks = kube_model.KubeScheduler("today", walks, _mix())
    snap = _cluster(2)
    placed: list[model.Decision] = []
    for i in range(14):
        d = ks.place(model.Request(id=f"r{i}", mig_profile="3g"), snap)
        assert d.placed
        snap = snap.with_allocation(d)
        ks.allocated(d)
        placed.append(d)
    # The first 3g lands on GPU 0 at slot 0 (first published device), stranding a compute slice.
    first = placed[0].members[0].mig[0]
    assert first.gpu.endswith("-g0") and first.start == 0
    # Scores tie (99) until the first node's LeastAllocated score drops at its 6th pod (7 with the
    # driver's pod): ties go to the first node found, then the emptier node wins: spread in steps.
    nodes = [d.members[0].node for d in placed]
    assert nodes[:5] == ["d0-n0"] * 5
    assert nodes[5] == "d1-n0"
    assert abs(nodes.count("d0-n0") - nodes.count("d1-n0")) <= 6


def test_withholding_skips_stranding_placements_and_steering_packs() -> None:
    walks = kube_model.walks_for([8])
    withhold = kube_model.KubeScheduler("w", walks, _mix(), withhold=True)
    snap = _cluster(1)
    d = withhold.place(model.Request(id="a", mig_profile="3g"), snap)
    assert d.members[0].mig[0].start == 4  # 3g@0 is tainted
    steered = kube_model.KubeScheduler(
        "s", walks, _mix(), node_choice="gpuplane", device_order="preference", withhold=True
    )
    snap = _cluster(2)
    nodes = set()
    for i in range(3):
        d = steered.place(model.Request(id=f"s{i}", mig_profile="3g"), snap)
        snap = snap.with_allocation(d)
        steered.allocated(d)
        nodes.add(d.members[0].node)
        assert d.members[0].mig[0].start == 4
    assert nodes == {"d0-n0"}  # gpuplane fills one node before opening another


def test_gangs_go_through_the_controller() -> None:
    ks = kube_model.KubeScheduler("today", kube_model.walks_for([4]), _mix())
    snap = snapshot.uniform_cluster(2, 2, 4)
    d = ks.place(model.Request(id="g", gpus_per_member=4, members=2, tp_size=8), snap)
    assert d.placed and len(d.domains) == 1
    assert geometry.EMPTY == 0
