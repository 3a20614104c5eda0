"""Queue order with aging, preemption victim selection, DRF fair share."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuplane.placement import model, place, policies, queue, snapshot


def test_order_priority_then_age_then_id() -> None:
    rs = [
        model.Request(id="b", priority=1, created=5.0),
        model.Request(id="a", priority=1, created=5.0),
        model.Request(id="c", priority=2, created=9.0),
        model.Request(id="d", priority=1, created=1.0),
    ]
    assert [r.id for r in queue.order(rs, now=10.0, aging=queue.Aging(period_s=1e9))] == ["c", "d", "a", "b"]


def test_aging_lets_old_low_priority_overtake() -> None:
    old = model.Request(id="old", priority=0, created=0.0)
    new = model.Request(id="new", priority=2, created=1000.0)
    aging = queue.Aging(period_s=300.0)
    assert queue.order([new, old], now=1000.0, aging=aging)[0].id == "old"  # 0 + 3 > 2
    assert queue.order([new, old], now=400.0, aging=aging)[0].id == "new"


def fill(snap: snapshot.Snapshot, rs: list[model.Request]) -> tuple[snapshot.Snapshot, list[queue.Running]]:
    pol = policies.make("first-fit")
    running = []
    for r in rs:
        d = place.place(r, snap, pol)
        assert d.placed
        snap = snap.with_allocation(d)
        running.append(queue.Running(r, d))
    return snap, running


def test_preemption_picks_fewest_lower_priority_in_one_domain() -> None:
    snap = snapshot.uniform_cluster(2, 1, 8)
    rs = [model.Request(id=f"s{i}", priority=0, created=float(i)) for i in range(8)]  # 8 singles in d0
    rs.append(model.Request(id="big", priority=0, gpus_per_member=4, created=9.0))  # d1: 4 GPUs
    rs.append(model.Request(id="hi", priority=5, gpus_per_member=4, created=10.0))  # d1: the other 4
    snap, running = fill(snap, rs)
    want = model.Request(id="new", priority=3, gpus_per_member=4, tp_size=4, created=20.0)
    p = queue.select_victims(want, snap, running, policies.make("gpuplane"))
    assert p is not None
    assert p.victims == ("big",)  # one gang in d1 beats four singles in d0; "hi" is higher priority
    assert p.domain == "d1" and p.decision.placed


def test_preemption_never_for_equal_priority() -> None:
    snap = snapshot.uniform_cluster(1, 1, 4)
    snap, running = fill(snap, [model.Request(id=f"s{i}", priority=2) for i in range(4)])
    want = model.Request(id="eq", priority=2)
    assert queue.select_victims(want, snap, running, policies.make("gpuplane")) is None


@settings(max_examples=40, deadline=None)
@given(prios=st.lists(st.integers(0, 4), min_size=1, max_size=12), want=st.integers(0, 5), seed=st.integers(0, 99))
def test_victims_strictly_lower_priority_and_request_fits(prios: list[int], want: int, seed: int) -> None:
    snap = snapshot.uniform_cluster(2, 2, 4)
    rng = random.Random(seed)
    rs = [
        model.Request(id=f"r{i}", priority=p, gpus_per_member=rng.choice((1, 2, 4)), created=float(i))
        for i, p in enumerate(prios)
    ]
    pol = policies.make("best-fit")
    running = []
    for r in rs:
        d = place.place(r, snap, pol)
        if d.placed:
            snap = snap.with_allocation(d)
            running.append(queue.Running(r, d))
    req = model.Request(id="w", priority=want, gpus_per_member=4, members=2, tp_size=8, created=99.0)
    p = queue.select_victims(req, snap, running, pol)
    if p is None:
        return
    by_id = {r.request.id: r for r in running}
    assert p.victims and all(by_id[v].request.priority < want for v in p.victims)
    freed = snap
    for v in p.victims:
        freed = freed.with_release(by_id[v].decision)
    freed.with_allocation(p.decision)  # the decision really fits once victims are gone
    assert p.decision.domains == (p.domain,)
    assert queue.select_victims(req, snap, list(reversed(running)), pol) == p  # deterministic


@settings(max_examples=40, deadline=None)
@given(
    spec=st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 4), st.integers(0, 5)), min_size=1, max_size=15),
    seed=st.integers(0, 99),
)
def test_drf_is_deterministic_under_input_order(spec: list[tuple[str, int, int]], seed: int) -> None:
    pending = [
        model.Request(id=f"{ns}{i}", namespace=ns, gpus_per_member=g, created=float(t))
        for i, (ns, g, t) in enumerate(spec)
    ]
    snap = snapshot.uniform_cluster(2, 1, 4)
    pol = policies.make("gpuplane")
    a = queue.drf_schedule(pending, {}, snap, pol, now=10.0)
    shuffled = list(pending)
    random.Random(seed).shuffle(shuffled)
    b = queue.drf_schedule(shuffled, {}, snap, pol, now=10.0)
    assert a.decisions == b.decisions and a.skipped == b.skipped


def test_drf_smallest_dominant_share_first_and_ties_by_arrival_then_name() -> None:
    snap = snapshot.uniform_cluster(1, 1, 8)
    pol = policies.make("gpuplane")
    pending = [
        model.Request(id="b1", namespace="b", created=1.0),
        model.Request(id="a1", namespace="a", created=1.0),
        model.Request(id="a2", namespace="a", created=2.0),
        model.Request(id="c1", namespace="c", created=0.5),
    ]
    res = queue.drf_schedule(pending, {"c": queue.Usage(gpus=4.0, memory_gib=320.0)}, snap, pol, now=5.0)
    # a and b have share 0 and arrive together: name breaks the tie; c already holds half the cluster
    assert [d.request_id for d in res.decisions] == ["a1", "b1", "a2", "c1"]


def test_drf_skips_a_tenant_whose_next_task_does_not_fit() -> None:
    snap = snapshot.uniform_cluster(1, 1, 4)
    pol = policies.make("gpuplane")
    pending = [
        model.Request(id="a-big", namespace="a", gpus_per_member=8, created=0.0),
        model.Request(id="b1", namespace="b", created=1.0),
    ]
    res = queue.drf_schedule(pending, {}, snap, pol, now=5.0)
    assert [d.request_id for d in res.decisions] == ["b1"]
    assert res.skipped == ("a",)


def test_fair_share_memory_comes_from_published_gpu_memory() -> None:
    """DRF's memory dimension uses each GPU's published memory, not a table keyed by short model names."""
    from gpuplane.placement import model as pm
    from gpuplane.placement import queue as pq
    from gpuplane.placement.snapshot import Snapshot

    big = pm.Gpu(id="n1-g0", node="n1", domain="d1", model="NVIDIA H200", memory_gib=141.0)
    small = pm.Gpu(id="n2-g0", node="n2", domain="d2", model="NVIDIA A100-SXM4-40GB", memory_gib=40.0)
    snap = Snapshot.build(
        [
            pm.Domain(name="d1", nodes=(pm.Node(name="n1", domain="d1", gpus=(big,)),)),
            pm.Domain(name="d2", nodes=(pm.Node(name="n2", domain="d2", gpus=(small,)),)),
        ]
    )
    assert pq.capacity(snap) == pq.Usage(2.0, 181.0)
    assert pq.demand(pm.Request(id="r", gpus_per_member=1), snap) == pq.Usage(1.0, 90.5)
    # An unknown product name without published memory still falls back to the table's default.
    assert pm.Gpu(id="x", node="n", domain="d", model="mystery").memory == 80.0
