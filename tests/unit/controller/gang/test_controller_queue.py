"""The controller's gang queue without a cluster: preemption (never of equal priority), DRF, aging, victims.

Slices come from the real driver code on the simulator; every pass is the production queue pass
and reconcile (:mod:`tests.controllerkit`).
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from gpuplane.controller.gang import queue_runner
from gpuplane.controller.gang.spec import GangSpec
from tests import controllerkit
from tests.controllerkit import GB200, T0, decide, gang_body, holding, make_world, member_pod, run_pass


@pytest.fixture(scope="module")
def cluster_slices(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return controllerkit.cluster_slices(tmp_path_factory.mktemp("sim"))


def test_preemption_picks_fewest_lower_priority_never_equal(cluster_slices: list[dict[str, Any]]) -> None:
    # The NVL72 clique is full: low (prio 0) holds nvl-0,1; mid (prio 5) holds nvl-2; eq (prio 10) holds nvl-3.
    low = holding("low", "team-b", 0, ["nvl-0", "nvl-1"], T0)
    mid = holding("mid", "team-b", 5, ["nvl-2"], T0)
    eq = holding("eq", "team-c", 10, ["nvl-3"], T0)
    hi = gang_body("hi", members=2, gpusPerMember=4, tensorParallelSize=8, selectors=[GB200], created=T0 + 5)
    gangs_ = [low[0], mid[0], eq[0], hi]
    pods = low[1] + mid[1] + eq[1] + [member_pod("hi", i, priority=10) for i in range(2)]
    w = make_world(cluster_slices, gangs_, pods, low[2] + mid[2] + eq[2])
    plan, _ = run_pass(w)
    act = plan.actions["team-a/hi"]
    assert act.kind == "preempt"
    assert act.victims == ("team-b/low",)  # one victim frees 8 GPUs; 'eq' has equal priority: never
    # Equal priority only: no preemption at all.
    w2 = make_world(
        cluster_slices,
        [eq[0], gang_body("peer", members=2, gpusPerMember=4, tensorParallelSize=8, selectors=[GB200])],
        eq[1] + [member_pod("peer", i, priority=10) for i in range(2)] + [],
        eq[2],
    )
    full = holding("eq2", "team-c", 10, ["nvl-0", "nvl-1", "nvl-2"], T0)
    w2 = make_world(
        cluster_slices,
        [eq[0], full[0], w2.gangs["team-a/peer"]],
        eq[1] + full[1] + [member_pod("peer", i, priority=10) for i in range(2)],
        eq[2] + full[2],
    )
    plan2, _ = run_pass(w2)
    assert plan2.actions["team-a/peer"].kind == "wait"


def test_preemptor_waits_until_capacity_is_really_free(cluster_slices: list[dict[str, Any]]) -> None:
    low = holding("low", "team-b", 0, ["nvl-0", "nvl-1", "nvl-2", "nvl-3"], T0)
    low[0]["status"]["phase"] = "Preempted"  # evicted, but its claims are still allocated
    hi = gang_body(
        "hi",
        members=2,
        gpusPerMember=4,
        tensorParallelSize=8,
        selectors=[GB200],
        status_={"phase": "Queued", "nominatedVictims": ["team-b/low"]},
    )
    w = make_world(cluster_slices, [low[0], hi], [member_pod("hi", i, priority=10) for i in range(2)], low[2])
    plan, _ = run_pass(w)
    assert plan.actions["team-a/hi"].kind == "await-victims"
    w_freed = make_world(cluster_slices, [low[0], hi], [member_pod("hi", i, priority=10) for i in range(2)], [])
    plan, _ = run_pass(w_freed)
    assert plan.actions["team-a/hi"].kind == "place"


def test_preemptor_waits_for_its_victim_before_its_own_status_shows_the_nomination(
    cluster_slices: list[dict[str, Any]],
) -> None:
    # The victim's Preempted status is seen, the preemptor's nominatedVictims not yet: it must wait for
    # that victim, not nominate the other lower-priority gang as well (a loaded e2e run preempted both).
    low = holding("low", "team-b", 0, ["nvl-0", "nvl-1"], T0)
    low[0]["status"].update(phase="Preempted", message="preempted by higher-priority gang team-a/hi")
    other = holding("other", "team-b", 0, ["nvl-2", "nvl-3"], T0)
    hi = gang_body("hi", members=2, gpusPerMember=4, tensorParallelSize=8, selectors=[GB200])
    pods = other[1] + [member_pod("hi", i, priority=10) for i in range(2)]
    plan, _ = run_pass(make_world(cluster_slices, [low[0], other[0], hi], pods, low[2] + other[2]))
    assert plan.actions["team-a/hi"].kind == "await-victims", plan.actions["team-a/hi"]
    assert plan.actions["team-a/hi"].victims == ("team-b/low",)
    # Once the victim's claims are gone the preemptor is placed where it was.
    plan, _ = run_pass(make_world(cluster_slices, [low[0], other[0], hi], pods, other[2]))
    assert plan.actions["team-a/hi"].kind == "place"


def test_drf_orders_equal_priority_by_dominant_share(cluster_slices: list[dict[str, Any]]) -> None:
    rich = holding("rich", "team-rich", 0, ["hgx-0"], T0, gpus=8)
    a = gang_body("a", ns="team-rich", members=1, gpusPerMember=8, created=T0 - 30)
    b = gang_body("b", ns="team-poor", members=1, gpusPerMember=8, created=T0)
    w = make_world(
        cluster_slices,
        [rich[0], a, b],
        rich[1] + [member_pod("a", 0, ns="team-rich"), member_pod("b", 0, ns="team-poor")],
        rich[2],
    )
    plan, _ = run_pass(w)
    assert plan.order == ("team-poor/b", "team-rich/a")  # older, but its namespace holds more


def test_aging_lifts_old_low_priority_gangs() -> None:
    spec = GangSpec(members=1, gpusPerMember=1, priority=0)
    e = queue_runner.Entry("ns/x", "ns", spec, created=T0, waiting_since=T0, ready=True, holding=False)
    s = queue_runner.Settings(aging_s=60, aging_cap=3)
    assert queue_runner.effective_priority(e, T0 + 59, s) == 0
    assert queue_runner.effective_priority(e, T0 + 130, s) == 2
    assert queue_runner.effective_priority(e, T0 + 10_000, s) == 3


# --- status coalescing --------------------------------------------------------------------------------


def test_victim_choice_is_deterministic_and_minimal(cluster_slices: list[dict[str, Any]]) -> None:
    # Four one-node gangs fill the clique; a TP=8 gang needs two of them gone. Pick the two lowest priorities.
    parts = [holding(f"v{i}", "team-b", p, [f"nvl-{i}"], T0 + i) for i, p in enumerate([3, 1, 2, 1])]
    hi = gang_body("hi", members=2, gpusPerMember=4, tensorParallelSize=8, selectors=[GB200])
    pods = list(itertools.chain.from_iterable(p[1] for p in parts)) + [
        member_pod("hi", i, priority=9) for i in range(2)
    ]
    w = make_world(
        cluster_slices, [p[0] for p in parts] + [hi], pods, list(itertools.chain.from_iterable(p[2] for p in parts))
    )
    plan, _ = run_pass(w)
    assert plan.actions["team-a/hi"].victims == ("team-b/v1", "team-b/v3")


# --- released vs preempted --------------------------------------------------------------------------


def test_released_gang_stays_released_on_the_next_reconciles(cluster_slices: list[dict[str, Any]]) -> None:
    # e2e regression: a gang whose pods were all deleted went Running -> Released -> "Preempted" one
    # reconcile later, with no preemption anywhere (every gang had priority 0).
    body, _pods, claim_objs = holding("fill", "team-a", 0, ["nvl-0", "nvl-1"], T0)
    body["status"]["phase"] = "Running"
    out = decide(make_world(cluster_slices, [body], [], claim_objs), "team-a/fill")
    assert out.status["phase"] == "Released" and out.victims == ()
    assert [s.kind for s in out.steps] == ["delete-claim", "delete-claim"]
    for claims_left in (claim_objs, []):  # before and after the claims are really gone
        seen = {**body, "status": {**body["status"], **out.status}}
        again = decide(make_world(cluster_slices, [seen], [], claims_left), "team-a/fill", now=T0 + 20)
        assert again.status["phase"] == "Released", again.status
        assert again.events == () and again.victims == ()
        out = again


def test_preempted_gang_stays_preempted_until_its_pods_return(cluster_slices: list[dict[str, Any]]) -> None:
    body = gang_body(
        "low", members=2, gpusPerMember=4, status_={"phase": "Preempted", "reason": "Preempted", "message": "by hi"}
    )
    out = decide(make_world(cluster_slices, [body], []), "team-a/low")
    assert (out.status["phase"], out.status["reason"], out.events) == ("Preempted", "Preempted", ())
    back = decide(make_world(cluster_slices, [body], [member_pod("low", i) for i in range(2)]), "team-a/low")
    assert back.status["phase"] == "Placing"  # pods back and gated: queued again, and room is free


def test_victims_seen_through_the_preemptors_filter(cluster_slices: list[dict[str, Any]]) -> None:
    # A low-priority gang holds GPUs in both the clique and an HGX node; the GB200-only preemptor sees
    # (and frees) only its clique part, without tripping over the GPUs outside its filter.
    wide = holding("wide", "team-b", 0, ["nvl-0", "nvl-1", "nvl-2", "nvl-3", "hgx-0"], T0)
    hi = gang_body("hi", members=2, gpusPerMember=4, tensorParallelSize=8, selectors=[GB200])
    w = make_world(
        cluster_slices, [wide[0], hi], wide[1] + [member_pod("hi", i, priority=5) for i in range(2)], wide[2]
    )
    plan, _ = run_pass(w)
    assert plan.actions["team-a/hi"].kind == "preempt" and plan.actions["team-a/hi"].victims == ("team-b/wide",)


def test_a_running_gang_is_nominated_by_one_preemptor_per_pass(cluster_slices: list[dict[str, Any]]) -> None:
    low = holding("low", "team-b", 0, ["nvl-0", "nvl-1", "nvl-2", "nvl-3"], T0)
    his = [
        gang_body(n, members=2, gpusPerMember=4, tensorParallelSize=8, selectors=[GB200], created=T0 + i)
        for i, n in enumerate(("hi-a", "hi-b"))
    ]
    pods = low[1] + [member_pod(n, i, priority=5) for n in ("hi-a", "hi-b") for i in range(2)]
    plan, _ = run_pass(make_world(cluster_slices, [low[0], *his], pods, low[2]))
    assert plan.actions["team-a/hi-a"].kind == "preempt" and plan.actions["team-a/hi-a"].victims == ("team-b/low",)
    assert plan.actions["team-a/hi-b"].kind == "wait"  # behind the preemptor; no second eviction
