"""Unit tests for gpuplane.driver.hw.mig_tables: the MIG profile tables and the pure placement rules."""

from __future__ import annotations

import itertools

import pytest

from gpuplane.driver.hw import mig_tables as mt
from gpuplane.driver.hw.interface import ErrorCode

MODELS = mt.ALL_MODELS


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.key)
def test_table_geometry_is_the_shared_8x7_layout(model: mt.MigModel) -> None:
    rows = {p.profile_id: p for p in model.profiles}
    assert set(rows) == {0, 1, 2, 3, 4, 7, 9}
    expect = {  # constant: (compute, memory slices, max, placements)
        0: (1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),
        7: (1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        9: (1, 2, 4, (0, 2, 4, 6)),
        1: (2, 2, 3, (0, 2, 4)),
        2: (3, 4, 2, (0, 4)),
        3: (4, 4, 1, (0,)),
        4: (7, 8, 1, (0,)),
    }
    for const, (c, m, mx, pl) in expect.items():
        p = rows[const]
        assert (p.compute_slices, p.memory_slices, p.max_count, p.placements) == (c, m, mx, pl), p.name
        assert p.info_id == const
        assert p.memory_bytes > 0 and p.multiprocessors > 0
        assert p.name.startswith(f"{c}g.")
    assert rows[7].name.endswith("+me") and rows[7].ofas == 1
    # memory grows with memory slices
    assert rows[0].memory_bytes < rows[9].memory_bytes <= rows[2].memory_bytes < rows[4].memory_bytes


def test_known_names_and_sms() -> None:
    assert [p.name for p in mt.A100_40GB.profiles] == [
        "1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb",
    ]  # fmt: skip
    assert mt.A100_40GB.profile(4) is not None and mt.A100_40GB.profile(4).multiprocessors == 98  # type: ignore[union-attr]
    assert mt.H100_80GB.profile_by_name("7g.80gb").multiprocessors == 132  # type: ignore[union-attr]
    assert mt.H200_141GB.profile_by_name("7g.141gb") is not None
    assert mt.H100_94GB.profile_by_name("3g.47gb") is not None
    assert mt.GB200_186GB.profile_by_name("7g.186gb") is not None
    assert mt.A100_40GB.profile(mt.GI_PROFILE_6_SLICE) is None


@pytest.mark.parametrize(
    ("product", "key"),
    [
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("NVIDIA H100 NVL", "H100-94GB"),
        ("NVIDIA H200", "H200-141GB"),
        ("NVIDIA B200", "B200-180GB"),
        ("NVIDIA GB200", "GB200-186GB"),
        ("NVIDIA L4", None),
        ("Tesla T4", None),
    ],
)
def test_model_for_product(product: str, key: str | None) -> None:
    m = mt.model_for_product(product)
    assert (m.key if m else None) == key


def test_conflict_helper() -> None:
    assert mt.placements_conflict(0, 4, 3, 1)
    assert not mt.placements_conflict(0, 4, 4, 4)
    assert mt.placements_conflict(6, 2, 7, 1)
    assert not mt.placements_conflict(0, 1, 1, 1)


def _code(model: mt.MigModel, existing: list[tuple[int, int]], pid: int, start: int) -> ErrorCode | None:
    r = mt.check_create(model, existing, pid, start)
    return None if r is None else r.code


@pytest.mark.parametrize("model", [mt.A100_40GB, mt.H100_80GB, mt.H200_141GB], ids=lambda m: m.key)
def test_documented_rules(model: mt.MigModel) -> None:
    ok, ir = None, ErrorCode.INSUFFICIENT_RESOURCES
    ia, ns = ErrorCode.INVALID_ARGUMENT, ErrorCode.NOT_SUPPORTED
    assert mt.layout_is_valid(model, [(2, 0), (2, 4)])  # two 3g: slots 0-3 and 4-7
    assert mt.layout_is_valid(model, [(3, 0), (2, 4)])  # 4g@0 + 3g@4
    assert _code(model, [(0, 0)], 3, 0) is ir  # 1g@0 blocks 4g
    assert _code(model, [(0, 0)], 4, 0) is ir  # ... and 7g
    seven = [(0, s) for s in range(7)]
    assert mt.layout_is_valid(model, seven)
    assert _code(model, seven, 0, 6) is ir
    assert 7 not in mt.used_slots(model, seven)  # slot 7 stranded
    assert _code(model, seven, 9, 6) is ir  # REV2@6 overlaps 1g@6
    assert _code(model, [(7, 0)], 7, 1) is ir  # one +me only
    assert _code(model, [], 7, 3) is ok
    assert _code(model, [], 2, 2) is ia  # 3g@2 not a valid start
    assert _code(model, [], 4, 1) is ia
    assert _code(model, [], 6, 0) is ns  # constant the model lacks
    assert _code(model, [], 42, 0) is ia
    assert _code(model, [(9, 0), (9, 2), (9, 4)], 9, 6) is ok
    assert _code(model, [(9, 0), (9, 2), (9, 4), (9, 6)], 0, 0) is ir
    assert _code(model, [(1, 0), (1, 2), (1, 4)], 0, 6) is ok
    assert _code(model, [(1, 0), (1, 2), (1, 4)], 9, 6) is ok
    assert mt.layout_is_valid(model, [(3, 0), (1, 4), (0, 6)])
    assert mt.layout_is_valid(model, [(1, 0), (1, 2), (2, 4)])  # 2g+2g+3g = 7 compute


def test_any_accepted_layout_is_disjoint_and_within_compute() -> None:
    """Exhaustive over all ordered pairs/triples of (profile, placement) on the H100 table."""
    model = mt.H100_80GB
    cands = [(p.profile_id, s) for p in model.profiles for s in p.placements]
    for n in (1, 2, 3):
        for combo in itertools.product(cands, repeat=n):
            if not mt.layout_is_valid(model, list(combo)):
                continue
            slots: list[int] = []
            compute = 0
            for pid, start in combo:
                prof = model.profile(pid)
                assert prof is not None
                slots.extend(mt.memory_slots(start, prof.memory_slices))
                compute += prof.compute_slices
            assert len(slots) == len(set(slots)) and max(slots) < 8
            assert compute <= 7


def test_caps_minors() -> None:
    assert mt.caps_minors(0, 0, None) == (3, None)
    assert mt.caps_minors(0, 0, 0) == (3, 4)
    assert mt.caps_minors(0, 1, None) == (12, None)
    assert mt.caps_minors(1, 0, None) == (138, None)
