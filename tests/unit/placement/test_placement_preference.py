"""placement.preference: the order a driver publishes a node's devices in, and the placements to withhold."""

from __future__ import annotations

from gpuplane.mig.geometry import HOPPER
from gpuplane.placement import fragmentation, geometry, preference
from gpuplane.placement.policies import gpuplane

SLOTS = geometry.slots_for(HOPPER)


def test_stranding_placements_on_hopper() -> None:
    assert preference.hopper_stranding() == {("3g", 0), ("1g.2m", 0), ("1g.2m", 2), ("1g.2m", 4)}


def test_withheld_placements_strand_in_every_layout_others_never() -> None:
    withheld = preference.hopper_stranding()
    st = SLOTS.add(geometry.EMPTY, "4g", 0)
    for p in HOPPER.profiles:
        for s in SLOTS.starts(geometry.EMPTY, p.name):
            strands = SLOTS.stranded(SLOTS.add(geometry.EMPTY, p.name, s)) > 0
            assert strands == ((p.name, s) in withheld)
    assert SLOTS.stranded(SLOTS.add(st, "3g", 4)) == 0


def test_order_fills_a_partly_used_gpu_before_an_empty_one_and_ranks_stranding_last() -> None:
    pol = gpuplane.GpuPlane()
    four = SLOTS.add(geometry.EMPTY, "4g", 0)
    states = [geometry.EMPTY, four, geometry.WHOLE, geometry.EMPTY]
    order = preference.mig_order(pol, SLOTS, states, "3g")
    assert order[0] == (1, 4)  # next to the 4g: a full GPU, nothing stranded
    assert {gpu for gpu, _ in order} == {0, 1, 3}  # the GPU held whole offers nothing
    assert order[-2:] == [(0, 0), (3, 0)]  # 3g at slot 0 strands a slice: last
    assert preference.best_on_node(pol, SLOTS, states, "3g") == order[0]
    withheld = preference.mig_order(pol, SLOTS, states, "3g", preference.hopper_stranding())
    assert (0, 0) not in withheld and withheld[0] == (1, 4)


def test_order_keys_are_the_policys_own() -> None:
    mix = fragmentation.SizeMix.from_counts(
        {fragmentation.Shape(mig_profile="2g"): 3, fragmentation.Shape(mig_profile="1g"): 1}
    )
    pol = gpuplane.GpuPlane(mix, hold_stranding=False)
    st = SLOTS.add(geometry.EMPTY, "2g", 0)
    keys = pol.start_keys(SLOTS, st, "1g")
    best = pol.mig_partial(SLOTS, st, "1g")
    assert best is not None and min(keys) == best
    empty = pol.empty_start_keys(SLOTS, "2g", (3,), 3, 8)
    got = pol.mig_empty(SLOTS, "2g", (3,), 8)
    assert got is not None and min(empty) == (got[0], got[1])


def test_no_free_placement_no_order() -> None:
    pol = gpuplane.GpuPlane()
    assert preference.mig_order(pol, SLOTS, [geometry.WHOLE, geometry.WHOLE], "1g") == []
    assert preference.best_on_node(pol, SLOTS, [geometry.WHOLE], "1g") is None


def test_size_mix_from_labels() -> None:
    mix = fragmentation.SizeMix.parse("3g=1, 1gpu=3, tp8(2x4)=0, tp4=1")
    assert dict(mix.shapes) == {
        fragmentation.Shape(mig_profile="3g"): 0.2,
        fragmentation.Shape(): 0.6,
        fragmentation.Shape(gpus_per_member=4): 0.2,
    }
    for bad in ("3g", "5x=1", "3g=-1", "tp8(3x4)=1"):
        try:
            fragmentation.SizeMix.parse(bad)
        except ValueError as exc:
            assert bad.split("=")[0] in str(exc) or "weight" in str(exc)
        else:
            raise AssertionError(f"{bad!r} parsed")
