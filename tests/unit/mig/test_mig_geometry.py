"""One MIG geometry: the driver's create rule and the placement module's slot arithmetic agree on every layout.

The simulator refuses a GPU-instance creation with :func:`gpuplane.mig.rules.check_create`; the
controller's placement packs the same layout into bit states (:class:`gpuplane.placement
.geometry.Slots`). Both read :mod:`gpuplane.mig`; these tests check that the two answer every
question the same way: exhaustively over every layout each GPU model can hold, and with hypothesis
over arbitrary sequences (invalid profiles and start slots included). The documented examples
below are the MIG User Guide's, asked of both.
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuplane.driver.hw import caps
from gpuplane.mig import geometry, models, rules
from gpuplane.placement import geometry as placement

Layout = tuple[tuple[int, int], ...]  # (NVML profile constant, start), in creation order


def _slots(model: models.MigModel) -> placement.Slots:
    return placement.slots_for(model.layout)


def _placement_accepts(model: models.MigModel, state: int, profile_id: int, start: int) -> bool:
    """Whether the placement module lets ``profile_id``@``start`` join a GPU in ``state``."""
    shape = model.layout.shape(profile_id)
    if shape is None or model.profile(profile_id) is None:
        return False
    return _slots(model).fits(state, shape.name, start)


def geometry_state(model: models.MigModel, layout: Layout) -> int:
    slots = _slots(model)
    state = placement.EMPTY
    for pid, start in layout:
        shape = model.layout.shape(pid)
        assert shape is not None
        state = slots.add(state, shape.name, start)
    return state


def _driver_accepts(model: models.MigModel, layout: Layout, profile_id: int, start: int) -> bool:
    return rules.check_create(model, layout, profile_id, start) is None


def _candidates(model: models.MigModel) -> list[tuple[int, int]]:
    return [(p.profile_id, s) for p in model.profiles for s in p.placements]


@functools.cache
def _every_layout(model: models.MigModel) -> tuple[Layout, ...]:
    """Every set of instances the driver's rule accepts (each once, in ascending order)."""
    cands = _candidates(model)
    seen: set[Layout] = {()}
    stack: list[Layout] = [()]
    while stack:
        layout = stack.pop()
        for cand in cands:
            if cand in layout or not _driver_accepts(model, layout, *cand):
                continue
            grown = tuple(sorted((*layout, cand)))
            if grown not in seen:
                seen.add(grown)
                stack.append(grown)
    return tuple(sorted(seen))


@pytest.mark.parametrize("model", models.ALL_MODELS, ids=lambda m: m.key)
def test_rows_are_the_shared_shapes(model: models.MigModel) -> None:
    """Every model row has the slices, count and placements of its shape in the one layout."""
    for p in model.profiles:
        shape = model.layout.shape(p.profile_id)
        assert shape is not None, p.name
        assert (p.compute_slices, p.memory_slices, p.max_count, p.placements) == (
            shape.compute,
            shape.memory,
            shape.max_count,
            shape.starts,
        ), p.name
        assert p.name.startswith(f"{shape.compute}g."), p.name
        assert p.name.endswith("+me") == shape.exclusive, p.name


@pytest.mark.parametrize("model", models.ALL_MODELS, ids=lambda m: m.key)
def test_create_rule_and_placement_agree_on_every_layout(model: models.MigModel) -> None:
    """Exhaustive: for every layout the GPU can hold and every (profile, start), both accept or both refuse."""
    disagreements: list[str] = []
    probes = [*_candidates(model), (geometry.GI_PROFILE_3_SLICE, 2), (geometry.GI_PROFILE_7_SLICE, 1)]
    layouts = _every_layout(model)
    for layout in layouts:
        state = geometry_state(model, layout)
        for pid, start in probes:
            driver = _driver_accepts(model, layout, pid, start)
            if driver != _placement_accepts(model, state, pid, start):
                disagreements.append(f"{layout} + ({pid}, {start}): driver {'accepts' if driver else 'refuses'}")
    assert disagreements == []
    # Not a vacuous walk: the documented full layouts are among those visited.
    for full in ([(0, s) for s in range(7)], [(2, 0), (2, 4)], [(3, 0), (2, 4)], [(4, 0)], [(1, 0), (1, 2), (2, 4)]):
        assert tuple(sorted(full)) in layouts, full
    assert len(layouts) > 1000


@pytest.mark.parametrize("model", models.ALL_MODELS, ids=lambda m: m.key)
def test_full_layouts_leave_no_placement_on_either_side(model: models.MigModel) -> None:
    """A layout the driver can grow no further is one the placement module finds no free start in."""
    slots = _slots(model)
    for layout in _every_layout(model):
        if any(_driver_accepts(model, layout, *c) for c in _candidates(model)):
            continue
        state = geometry_state(model, layout)
        assert slots.placements(state) == 0, layout


_MODEL = st.sampled_from(models.ALL_MODELS)
_STEP = st.tuples(st.integers(-1, geometry.GI_PROFILE_COUNT), st.integers(-1, 8))


@settings(max_examples=300, deadline=None)
@given(model=_MODEL, steps=st.lists(_STEP, max_size=12))
def test_create_rule_and_placement_agree_on_any_sequence(model: models.MigModel, steps: list[tuple[int, int]]) -> None:
    """Any order, any profile constant and start (valid or not): each step is accepted by both or by neither."""
    layout: Layout = ()
    for pid, start in steps:
        driver = _driver_accepts(model, layout, pid, start)
        assert driver == _placement_accepts(model, geometry_state(model, layout), pid, start), (layout, pid, start)
        if driver:
            layout = (*layout, (pid, start))
    assert rules.layout_is_valid(model, layout)


def _code(model: models.MigModel, existing: list[tuple[int, int]], pid: int, start: int) -> rules.RefusalCode | None:
    r = rules.check_create(model, existing, pid, start)
    return None if r is None else r.code


@pytest.mark.parametrize("model", [models.A100_40GB, models.H100_80GB, models.H200_141GB], ids=lambda m: m.key)
def test_documented_rules(model: models.MigModel) -> None:
    """The MIG User Guide's examples, with the NVML codes the simulator returns."""
    ok, ir = None, rules.RefusalCode.INSUFFICIENT_RESOURCES
    ia, ns = rules.RefusalCode.INVALID_ARGUMENT, rules.RefusalCode.NOT_SUPPORTED
    assert rules.layout_is_valid(model, [(2, 0), (2, 4)])  # two 3g: slots 0-3 and 4-7
    assert rules.layout_is_valid(model, [(3, 0), (2, 4)])  # 4g@0 + 3g@4
    assert _code(model, [(0, 0)], 3, 0) is ir  # 1g@0 blocks 4g
    assert _code(model, [(0, 0)], 4, 0) is ir  # ... and 7g
    seven = [(0, s) for s in range(7)]
    assert rules.layout_is_valid(model, seven)
    assert _code(model, seven, 0, 6) is ir
    assert _slots(model).largest_free(geometry_state(model, tuple(seven))) is None  # slot 7 stranded
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
    assert rules.layout_is_valid(model, [(3, 0), (1, 4), (0, 6)])
    assert rules.layout_is_valid(model, [(1, 0), (1, 2), (2, 4)])  # 2g+2g+3g = 7 compute


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
    m = models.model_for_product(product)
    assert (m.key if m else None) == key


def test_caps_minors() -> None:
    assert caps.caps_minors(0, 0, None) == (3, None)
    assert caps.caps_minors(0, 0, 0) == (3, 4)
    assert caps.caps_minors(0, 1, None) == (12, None)
    assert caps.caps_minors(1, 0, None) == (138, None)
