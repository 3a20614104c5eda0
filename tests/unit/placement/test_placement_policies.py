"""Concrete placement choices: the NVLink rule, gpuplane's slot and domain choices, baselines."""

from __future__ import annotations

from gpuplane.placement import model, place, policies, snapshot


def req(rid: str, **kw: object) -> model.Request:
    return model.Request(id=rid, **kw)  # type: ignore[arg-type]


def test_gpuplane_puts_3g_at_slot_4_and_1g_at_slot_6() -> None:
    snap = snapshot.uniform_cluster(1, 1, 2)
    pol = policies.make("gpuplane")
    d = place.place(req("a", mig_profile="3g"), snap, pol)
    assert d.members[0].mig[0].start == 4
    d1 = place.place(req("b", mig_profile="1g"), snap, pol)
    assert d1.members[0].mig[0].start == 6


def test_best_fit_uses_lowest_start_and_fills_partial_gpus() -> None:
    snap = snapshot.uniform_cluster(1, 1, 2)
    pol = policies.make("best-fit")
    d = place.place(req("a", mig_profile="3g"), snap, pol)
    assert d.members[0].mig[0].start == 0
    snap = snap.with_allocation(d)
    d2 = place.place(req("b", mig_profile="3g"), snap, pol)
    assert d2.members[0].mig[0].gpu == d.members[0].mig[0].gpu


def test_gpuplane_fills_a_4g_hole_with_3g() -> None:
    snap = snapshot.uniform_cluster(1, 1, 2)
    pol = policies.make("gpuplane")
    d = place.place(req("a", mig_profile="4g"), snap, pol)
    snap = snap.with_allocation(d)
    d2 = place.place(req("b", mig_profile="3g"), snap, pol)
    assert d2.members[0].mig[0].gpu == d.members[0].mig[0].gpu
    assert d2.members[0].mig[0].start == 4


def test_tp8_gang_on_nvl72_stays_in_one_domain() -> None:
    snap = snapshot.uniform_cluster(3, 18, 4)
    for name in policies.NAMES:
        d = place.place(req("g", gpus_per_member=4, members=2, tp_size=8), snap, policies.make(name))
        assert d.placed and len(d.domains) == 1


def test_data_parallel_gang_may_span_domains_but_each_tp_group_does_not() -> None:
    snap = snapshot.uniform_cluster(2, 1, 8)  # two HGX nodes
    d = place.place(req("dp", gpus_per_member=8, members=2, tp_size=8), snap, policies.make("gpuplane"))
    assert d.placed and len(d.domains) == 2
    d2 = place.place(req("tp16", gpus_per_member=8, members=2, tp_size=16), snap, policies.make("gpuplane"))
    assert not d2.placed and "TP size 16 exceeds the largest NVLink domain (8 GPUs)" in d2.reason


def test_gpuplane_keeps_tp8_capable_domain() -> None:
    """Two NVL72-like domains: A has exactly 2 empty nodes (TP8-capable), B has 3.

    A whole-node member must break a node somewhere: gpuplane takes it from B,
    keeping both TP8-capable; best-fit takes the fuller domain A.
    """
    snap = snapshot.uniform_cluster(2, 4, 4)
    fill = [req(f"f{i}", gpus_per_member=4) for i in range(3)]
    pol = policies.make("first-fit")
    for r in fill[:2]:
        snap = snap.with_allocation(place.place(r, snap, pol))
    # domain d0 now has 2 empty nodes, d1 has 4; use one node of d1 -> 3
    d1_node = place.place(req("x", gpus_per_member=4), snapshot.Snapshot.build(snap.domains[1:]), pol)
    snap = snap.with_allocation(d1_node)
    r = req("y", gpus_per_member=4)
    gp = place.place(r, snap, policies.make("gpuplane"))
    bf = place.place(r, snap, policies.make("best-fit"))
    assert gp.domains == ("d1",)
    assert bf.domains == ("d0",)


def test_refusal_when_full_has_reason() -> None:
    snap = snapshot.uniform_cluster(1, 1, 1)
    pol = policies.make("gpuplane")
    snap = snap.with_allocation(place.place(req("a"), snap, pol))
    d = place.place(req("b"), snap, pol)
    assert not d.placed and "no NVLink domain has room" in d.reason
    d = place.place(req("c", mig_profile="1g"), snap, pol)
    assert not d.placed and "no GPU has a free 1g placement" in d.reason
    d = place.place(req("d", mig_profile="5g"), snap, pol)
    assert not d.placed and "unknown MIG profile" in d.reason


def test_mig_gang_all_or_nothing() -> None:
    snap = snapshot.uniform_cluster(1, 1, 1)
    pol = policies.make("gpuplane")
    d = place.place(req("g", mig_profile="4g", members=2), snap, pol)
    assert not d.placed and d.members == () and "member 2 of 2" in d.reason
    d = place.place(req("h", mig_profile="3g", members=2), snap, pol)
    assert d.placed and {m.mig[0].start for m in d.members} == {0, 4}


def test_snapshot_is_immutable_and_request_validated() -> None:
    import pytest

    snap = snapshot.uniform_cluster(1, 1, 1)
    with pytest.raises(AttributeError):
        snap.max_node_gpus = 3  # type: ignore[misc]
    with pytest.raises(ValueError):
        model.Request(id="bad", gpus_per_member=4, tp_size=3)
    with pytest.raises(ValueError):
        model.Request(id="bad", mig_profile="1g", gpus_per_member=2)
    d = place.place(req("a"), snap, policies.make("best-fit"))
    snap2 = snap.with_allocation(d)
    with pytest.raises(ValueError):
        snap2.with_allocation(d)  # double allocation is rejected
    assert snap.gpu("d0-n0-g0").empty and snap2.gpu("d0-n0-g0").whole


def _with_mig(snap: snapshot.Snapshot, gpu: str, profile: str, start: int) -> snapshot.Snapshot:
    node = snap.gpu(gpu).node
    dom = snap.gpu(gpu).domain
    mp = model.MemberPlacement(member=0, node=node, domain=dom, mig=(model.MigSlot(gpu, profile, start),))
    return snap.with_allocation(model.Decision(f"{gpu}-{profile}-{start}", (mp,)))


def test_gpuplane_never_strands_compute_when_a_clean_placement_exists() -> None:
    """GPU g0 holds a 3g at slot 4, g1 is empty. A second 3g at g0 slot 0 would be the tightest fit (best-fit
    takes it) but strands compute slice 3 for as long as both run; gpuplane opens g1 at slot 4 instead,
    which leaves both GPUs completable by a 4g."""
    snap = _with_mig(snapshot.uniform_cluster(1, 1, 2), "d0-n0-g0", "3g", 4)
    r = req("x", mig_profile="3g")
    bf = place.place(r, snap, policies.make("best-fit")).members[0].mig[0]
    assert (bf.gpu, bf.start) == ("d0-n0-g0", 0)
    gp = place.place(r, snap, policies.make("gpuplane")).members[0].mig[0]
    assert (gp.gpu, gp.start) == ("d0-n0-g1", 4)
    assert snap.slots.stranded(snap.slots.add(snap.slots.add(0, "3g", 4), "3g", 0)) == 1


def test_gpuplane_holds_a_request_rather_than_strand_compute() -> None:
    """Only a stranding placement is free: gpuplane refuses with the reason (the request waits); best-fit
    places. Once a clean placement frees up, gpuplane takes it."""
    snap = _with_mig(snapshot.uniform_cluster(1, 1, 2), "d0-n0-g0", "3g", 4)
    snap = snap.with_allocation(place.place(req("w"), snap, policies.make("first-fit")))  # g1 whole
    assert snap.gpu("d0-n0-g1").whole
    r = req("x", mig_profile="3g")
    d = place.place(r, snap, policies.make("gpuplane"))
    assert not d.placed and "strand compute" in d.reason and "policy gpuplane holds" in d.reason
    assert place.place(r, snap, policies.make("best-fit")).placed
    freed = snap.with_release(model.Decision("w", (model.MemberPlacement(0, "d0-n0", "d0", gpus=("d0-n0-g1",)),)))
    d = place.place(r, freed, policies.make("gpuplane"))
    assert d.placed and (d.members[0].mig[0].gpu, d.members[0].mig[0].start) == ("d0-n0-g1", 4)


def test_gpuplane_hold_never_starves_a_gang_that_must_strand() -> None:
    """Two 3g members on a one-GPU cluster can only ever run as 3g@0 + 3g@4: the hold is lifted for them."""
    snap = snapshot.uniform_cluster(1, 1, 1)
    d = place.place(req("h", mig_profile="3g", members=2), snap, policies.make("gpuplane"))
    assert d.placed and {m.mig[0].start for m in d.members} == {0, 4}


def test_gpuplane_queue_aware_keeps_a_4g_hole_for_a_waiting_3g() -> None:
    """g0 is empty, g1 holds a 4g (slots 4-7 free). Without a queue a 2g fills g1's hole (one 1g sliver
    left). With a 3g waiting for exactly that hole, the 2g opens g0 and the 3g completes g1."""
    from gpuplane.placement import fragmentation

    snap = _with_mig(snapshot.uniform_cluster(1, 1, 2), "d0-n0-g1", "4g", 0)
    r = req("x", mig_profile="2g")
    pol = policies.make("gpuplane")
    plain = place.place(r, snap, pol).members[0].mig[0]
    assert (plain.gpu, plain.start) == ("d0-n0-g1", 4)
    policies.base.observe_queue(pol, {fragmentation.Shape(mig_profile="3g"): 1, fragmentation.Shape(): 1})
    queued = place.place(r, snap, pol).members[0].mig[0]
    assert queued.gpu == "d0-n0-g0"
    # The queue emptied again: back to the plain choice (memo tables are per queue state).
    policies.base.observe_queue(pol, {})
    again = place.place(r, snap, pol).members[0].mig[0]
    assert (again.gpu, again.start) == ("d0-n0-g1", 4)


def test_observe_queue_is_a_no_op_for_baselines() -> None:
    from gpuplane.placement import fragmentation

    snap = _with_mig(snapshot.uniform_cluster(1, 1, 2), "d0-n0-g0", "3g", 4)
    r = req("x", mig_profile="3g")
    for name in ("best-fit", "first-fit", "spread"):
        pol = policies.make(name)
        before = place.place(r, snap, pol)
        policies.base.observe_queue(pol, {fragmentation.Shape(mig_profile="4g"): 3})
        assert place.place(r, snap, pol) == before


def test_gpuplane_expected_fill_keeps_a_4g_hole_when_saturated() -> None:
    """Mix where 4g is far more frequent than 2g: g0 holds a 3g at slot 4 (slots 0-3 free, a 4g hole).
    Unsaturated, a 2g fills g0 at slot 0; with a whole GPU waiting (saturated fleet) the 2g leaves the hole
    to the 4g expected next, even though no 4g waits right now."""
    from gpuplane.placement import fragmentation

    shape = fragmentation.Shape
    mix = fragmentation.SizeMix.from_counts(
        {shape(): 50, shape(mig_profile="4g"): 30, shape(mig_profile="3g"): 10, shape(mig_profile="2g"): 5}
    )
    snap = _with_mig(snapshot.uniform_cluster(1, 1, 2), "d0-n0-g0", "3g", 4)
    r = req("x", mig_profile="2g")
    pol = policies.make("gpuplane", mix)
    d = place.place(r, snap, pol).members[0].mig[0]
    assert (d.gpu, d.start) == ("d0-n0-g0", 0)  # not saturated: plain gradient
    policies.base.observe_queue(pol, {shape(): 1})
    d = place.place(r, snap, pol).members[0].mig[0]
    assert d.gpu == "d0-n0-g1"


def test_stranded_compute_and_clean_fit_on_hopper() -> None:
    """Compute slices no later placement can reach, and how many instances one GPU takes without any."""
    slots = snapshot.uniform_cluster(1, 1, 1).slots
    e = 0
    assert slots.stranded(e) == 0
    assert slots.stranded(slots.add(e, "3g", 4)) == 0  # a 4g still completes it
    assert slots.stranded(slots.add(e, "3g", 0)) == 1  # compute slice 3 sits behind memory slice 3
    assert slots.stranded(slots.add(slots.add(e, "4g", 0), "2g", 4)) == 0  # a 1g at slot 6 completes it
    two_20gb = slots.add(slots.add(e, "1g.2m", 0), "1g.2m", 2)
    assert slots.stranded(two_20gb) == 2  # 1g.20gb at 0 and 2 hold memory 0-3 but compute 0 and 2 only
    assert {p: slots.clean_fit(p) for p in ("1g", "2g", "3g", "4g", "7g")} == {
        "1g": 7,
        "2g": 3,
        "3g": 1,
        "4g": 1,
        "7g": 1,
    }
