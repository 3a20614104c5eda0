"""MIG slot math (``placement.geometry.Slots`` over ``gpuplane.mig.geometry.HOPPER``) against the MIG User Guide.

The expected values are the Guide's "Supported MIG Profiles" tables (7 compute and 8 memory
slices): the start slices each GPU-instance size may take, and which instances block which.
"""

from __future__ import annotations

import pytest

from gpuplane.mig.geometry import HOPPER
from gpuplane.placement import geometry


@pytest.fixture()
def slots() -> geometry.Slots:
    return geometry.slots_for(HOPPER)


def test_one_g_at_slot_zero_blocks_4g_and_7g(slots: geometry.Slots) -> None:
    st = slots.add(geometry.EMPTY, "1g", 0)
    assert not slots.can_host(st, "4g")
    assert not slots.can_host(st, "7g")
    assert slots.can_host(st, "3g")  # at slot 4


def test_seven_1g_strand_memory_slice_7(slots: geometry.Slots) -> None:
    st = geometry.EMPTY
    for s in range(7):
        st = slots.add(st, "1g", s)
    assert slots.free_compute(st) == 0
    assert slots.largest_free(st) is None


def test_two_3g_use_all_memory_but_six_compute(slots: geometry.Slots) -> None:
    st = slots.add(slots.add(geometry.EMPTY, "3g", 0), "3g", 4)
    assert slots.free_compute(st) == 1
    assert slots.largest_free(st) is None  # the last compute slice has no memory


def test_4g_plus_3g_fill_a_gpu(slots: geometry.Slots) -> None:
    st = slots.add(slots.add(geometry.EMPTY, "4g", 0), "3g", 4)
    assert slots.free_compute(st) == 0


def test_overlap_raises_and_remove_restores(slots: geometry.Slots) -> None:
    st = slots.add(geometry.EMPTY, "2g", 2)
    with pytest.raises(ValueError):
        slots.add(st, "3g", 0)
    assert slots.remove(st, "2g", 2) == geometry.EMPTY
    with pytest.raises(ValueError):
        slots.remove(geometry.EMPTY, "2g", 2)


def test_media_engine_profile_once_per_gpu(slots: geometry.Slots) -> None:
    st = slots.add(geometry.EMPTY, "1g+me", 0)
    assert not slots.can_host(st, "1g+me")
    assert slots.can_host(st, "1g")
    assert slots.can_host(slots.remove(st, "1g+me", 0), "1g+me")


def test_valid_starts_match_table(slots: geometry.Slots) -> None:
    assert slots.starts(geometry.EMPTY, "1g.2m") == (0, 2, 4, 6)
    assert slots.starts(geometry.EMPTY, "2g") == (0, 2, 4)
    assert slots.starts(geometry.EMPTY, "3g") == (0, 4)
    assert slots.starts(geometry.EMPTY, "4g") == (0,)
    assert slots.starts(geometry.EMPTY, "7g") == (0,)
    assert slots.starts(geometry.WHOLE, "1g") == ()


def test_largest_free_block(slots: geometry.Slots) -> None:
    lf = slots.largest_free(geometry.EMPTY)
    assert lf is not None and lf.name == "7g"
    lf = slots.largest_free(slots.add(geometry.EMPTY, "3g", 4))
    assert lf is not None and lf.name == "4g"
    lf = slots.largest_free(slots.add(geometry.EMPTY, "3g", 0))
    assert lf is not None and lf.name == "3g"
