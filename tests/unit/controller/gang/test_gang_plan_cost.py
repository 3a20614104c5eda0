"""What a gang reconcile costs: a queue pass only when the decision needs one, and a slow pass reused.

At 1,000 nodes with 10,000 claims one queue pass took about a second on the event loop, and every
gang event built it again: 100 gangs held the loop for minutes, kopf's re-list of pods outlived the
API server's snapshot again and again, and no gang ever saw its members (docs/benchmarks.md).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest

from gpuplane.controller import config, indexed, metrics, runtime
from gpuplane.controller.gang import queue_runner, reconciler, world
from gpuplane.controller.gang import run as gang_run
from gpuplane.placement.policies import make as make_policy
from tests.controllerkit import GB200, T0, gang_body, make_world, member_pod, run_pass
from tests.templatekit import cluster_slices_fixture  # noqa: F401

NOW = T0 + 10


def test_a_gang_still_waiting_for_members_decides_without_a_queue_pass(cluster_slices: list[dict[str, Any]]) -> None:
    body = gang_body("g", members=2, gpusPerMember=4, selectors=[GB200])
    w = make_world(cluster_slices, [body], [member_pod("g", 0)])

    def no_pass() -> Any:
        raise AssertionError("a gang waiting for its members needs no queue pass")

    out = reconciler.decide(
        "team-a/g", w.gangs["team-a/g"], w, planned=no_pass, domains=no_pass, now=NOW, settings=reconciler.Settings()
    )
    assert out.status["phase"] == "Pending" and out.status["reason"] == "WaitingForMembers"

    # With every member there, the queue's action decides, from one pass.
    w = make_world(cluster_slices, [body], [member_pod("g", 0), member_pod("g", 1)])
    calls = []

    def one_pass() -> Any:
        calls.append(1)
        return run_pass(w)

    domains = lambda: world.gpu_domains(w)  # noqa: E731
    out = reconciler.decide(
        "team-a/g", w.gangs["team-a/g"], w, planned=one_pass, domains=domains, now=NOW, settings=reconciler.Settings()
    )
    assert out.status["phase"] in ("Placing", "Placed") and out.status.get("placement")
    assert len(calls) == 1


def test_a_gang_holding_its_placement_follows_it_without_a_queue_pass(cluster_slices: list[dict[str, Any]]) -> None:
    """Run 4 (docs/benchmarks.md): 100 placed gangs each built the pass only to read their decision back."""
    body = gang_body("g", members=2, gpusPerMember=4, selectors=[GB200])
    pods = [member_pod("g", 0), member_pod("g", 1)]
    w = make_world(cluster_slices, [body], pods)
    placing = reconciler.decide(
        "team-a/g",
        w.gangs["team-a/g"],
        w,
        planned=lambda: run_pass(w),
        domains=lambda: world.gpu_domains(w),
        now=NOW,
        settings=reconciler.Settings(),
    )
    assert placing.status["phase"] == "Placing" and placing.steps
    held = gang_body("g", members=2, gpusPerMember=4, selectors=[GB200], status_=placing.status)
    w = make_world(cluster_slices, [held], pods)
    view = world.cluster_view(w)
    assert world.gpu_domains(w) == {gpu.id: gpu.domain for gpu in view.gpus}  # what _holding read before

    def no_pass() -> Any:
        raise AssertionError("a gang holding a placement needs no queue pass")

    out = reconciler.decide(
        "team-a/g",
        w.gangs["team-a/g"],
        w,
        planned=no_pass,
        domains=lambda: world.gpu_domains(w),
        now=NOW + 1,
        settings=reconciler.Settings(),
    )
    # It goes on applying its own placement (the same writes), in the domain it was placed in.
    assert out.status["phase"] == "Placing" and out.status["domain"] == placing.status["domain"] != ""
    assert [str(s) for s in out.steps] == [str(s) for s in placing.steps]


def test_a_slow_pass_is_reused_for_its_own_build_time_then_rebuilt(
    cluster_slices: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = runtime.Runtime.create(config.parse_args(["--identity", "t"], {}), None, metrics.ControllerMetrics())  # type: ignore[arg-type]
    body = gang_body("g", members=2, gpusPerMember=4, selectors=[GB200])
    w = make_world(cluster_slices, [body], [member_pod("g", 0), member_pod("g", 1)])
    real = world.cluster_view
    builds: list[float] = []

    def slow_view(w_: world.World) -> Any:
        builds.append(time.monotonic())
        time.sleep(0.3)
        return real(w_)

    monkeypatch.setattr(world, "cluster_view", slow_view)
    first, _ = gang_run.plan_for(rt, w, NOW)
    assert rt.state(gang_run.GangState).plan_build_s >= 0.3
    rt.touched()  # the index changed: before, this alone rebuilt the pass
    again, _ = gang_run.plan_for(rt, w, NOW)
    assert again is first and len(builds) == 1
    time.sleep(rt.state(gang_run.GangState).plan_build_s + 0.05)
    rebuilt, _ = gang_run.plan_for(rt, w, NOW)
    assert rebuilt is not first and len(builds) == 2
    # Nothing changed since: the pass stands however old it is.
    time.sleep(rt.state(gang_run.GangState).plan_build_s + 0.05)
    assert gang_run.plan_for(rt, w, NOW)[0] is rebuilt and len(builds) == 2


def test_the_domain_map_is_reused_while_the_slices_and_nodes_stay_the_same(
    cluster_slices: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    body = gang_body("g", members=2, gpusPerMember=4, selectors=[GB200])
    w = make_world(cluster_slices, [body], [])
    built: list[int] = []
    real = world.gpu_domains

    def counted(w_: world.World) -> dict[str, str]:
        built.append(1)
        return real(w_)

    monkeypatch.setattr(world, "gpu_domains", counted)
    cache = world.DomainCache()
    first = cache.of(w)
    assert first == real(w) and first
    # Another world copied from the same indexes: the same slice objects, the same nodes.
    again = dataclasses.replace(w, slices=tuple(w.slices), nodes=dict(w.nodes))
    assert cache.of(again) is first and len(built) == 1
    # A node cordoned: its GPUs leave the map.
    node = next(iter(w.nodes))
    cordoned = dataclasses.replace(w, nodes={**w.nodes, node: False})
    assert not any(k.startswith(f"{node}/") for k in cache.of(cordoned)) and len(built) == 2
    # A slice republished (a new object): the map is built again.
    fewer = dataclasses.replace(w, slices=w.slices[1:], nodes=w.nodes)
    assert cache.of(fewer) == real(fewer) and len(built) == 3


def test_a_pass_evaluates_each_distinct_filter_once_over_the_fleet(cluster_slices: list[dict[str, Any]]) -> None:
    """At 1,000 nodes the selector over every GPU, once per gang, was most of a 4 s pass (docs/benchmarks.md)."""
    bodies = [gang_body(f"g{i}", members=1, gpusPerMember=4, selectors=[GB200]) for i in range(3)]
    pods = [member_pod(f"g{i}", 0) for i in range(3)]
    w = make_world(cluster_slices, bodies, pods)
    view = world.cluster_view(w)
    entries = world.entries(w, view)
    assert len(entries) == 3
    shared = {world.admit_for(w, e.spec).predicate for e in entries}
    assert len(shared) == 1  # gangs of one shape share one compiled filter
    (pred,) = shared
    calls: list[str] = []

    def counted(driver: str, attrs: Any) -> bool:
        calls.append(driver)
        return pred(driver, attrs)

    plan = queue_runner.plan(entries, view, lambda e: counted, make_policy("gpuplane"), now=NOW)
    assert len(calls) == len(view.gpus)  # once per GPU for the three gangs, not three times
    placed = [a for a in plan.actions.values() if a.kind == "place"]
    assert len(placed) == 3 and all(
        view.by_id[g].product == "NVIDIA GB200" for a in placed for m in a.decision.members for g in m.gpus
    )


def test_gang_timers_share_one_copy_of_the_indexes_until_something_indexed_changes() -> None:
    """Run 6 (docs/benchmarks.md): 100 gang timers each copied 10,000 claims and 4,600 slices out of
    kopf's indexes every resync: 55 % of a CPU with nothing changing."""
    rt = runtime.Runtime.create(config.parse_args(["--identity", "t"], {}), None, metrics.ControllerMetrics())  # type: ignore[arg-type]
    idx: dict[str, Any] = {
        "gang_idx": {},
        "pod_idx": {},
        "claim_idx": {"ns/c": [{"metadata": {"name": "c", "namespace": "ns"}}]},
        "slice_idx": {},
        "node_idx": {"n": [indexed.NodeView("n", schedulable=True)]},
        "class_idx": {},
    }
    first = gang_run.make_world(rt, now=NOW, **idx)
    assert gang_run.make_world(rt, now=NOW + 0.5, **idx) is first  # nothing changed: the same copy
    rt.touched()  # an index handler saw a change
    second = gang_run.make_world(rt, now=NOW + 0.6, **idx)
    assert second is not first
    assert (
        gang_run.make_world(rt, now=NOW + 0.6 + rt.state(gang_run.GangState).worlds.reuse_s, **idx) is not second
    )  # too old
    other = {**idx, "claim_idx": {}}  # other index objects (another registry, a test): never shared
    assert gang_run.make_world(rt, now=NOW + 0.7, **other).claims == {}
