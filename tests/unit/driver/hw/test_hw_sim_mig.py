"""Simulator MIG behaviour: what may coexist and what NVML would refuse, with the right ErrorCode."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuplane.driver.hw.interface import ErrorCode, HardwareError
from gpuplane.driver.hw.sim import SimConfig, Simulator
from gpuplane.mig import geometry, models, rules

MIG_PROFILES = ["a100-40gb", "hgx-h100", "hgx-h200"]


def _sim(state_dir: Path, profile: str, **kw: object) -> Simulator:
    return Simulator(SimConfig.model_validate({"profile": profile, "state_dir": state_dir, "durable": False, **kw}))


@pytest.fixture(params=MIG_PROFILES)
def mig_gpu(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Simulator, str]]:
    sim = _sim(tmp_path, request.param, initial_mig_mode={0: True})
    with sim:
        yield sim, sim.gpus()[0].uuid


def _raises(code: ErrorCode) -> pytest.RaisesContext[HardwareError]:
    return pytest.raises(HardwareError, match=f"^{code.value}:")


def test_calls_before_init_are_uninitialized(tmp_path: Path) -> None:
    with _raises(ErrorCode.UNINITIALIZED):
        _sim(tmp_path, "hgx-h100").gpus()


def test_profiles_match_table(mig_gpu: tuple[Simulator, str]) -> None:
    sim, u = mig_gpu
    model = models.model_for_product(sim.gpus()[0].product_name)
    assert model is not None and tuple(sim.mig_profiles(u)) == model.profiles


def test_every_profile_and_placement_alone(mig_gpu: tuple[Simulator, str]) -> None:
    sim, u = mig_gpu
    for prof in sim.mig_profiles(u):
        for start in prof.placements:
            gi = sim.create_gpu_instance(u, prof.profile_id, start)
            assert (gi.profile_id, gi.placement_start, gi.placement_size) == (
                prof.profile_id,
                start,
                prof.memory_slices,
            )
            sim.destroy_gpu_instance(u, gi.gi_id)
        bad = next(s for s in range(8) if s not in prof.placements)
        with _raises(ErrorCode.INVALID_ARGUMENT):
            sim.create_gpu_instance(u, prof.profile_id, bad)
    assert sim.gpu_instances(u) == ()


def test_coexistence_and_refusals(mig_gpu: tuple[Simulator, str]) -> None:
    sim, u = mig_gpu
    # two 3g fill all 8 memory slices
    a = sim.create_gpu_instance(u, geometry.GI_PROFILE_3_SLICE, 0)
    b = sim.create_gpu_instance(u, geometry.GI_PROFILE_3_SLICE, 4)
    with _raises(ErrorCode.INSUFFICIENT_RESOURCES):
        sim.create_gpu_instance(u, geometry.GI_PROFILE_1_SLICE, 0)
    sim.destroy_gpu_instance(u, a.gi_id)
    # 4g@0 + 3g@4
    c = sim.create_gpu_instance(u, geometry.GI_PROFILE_4_SLICE, 0)
    with _raises(ErrorCode.INSUFFICIENT_RESOURCES):
        sim.create_gpu_instance(u, geometry.GI_PROFILE_7_SLICE, 0)
    for g in (b, c):
        sim.destroy_gpu_instance(u, g.gi_id)
    # 1g@0 blocks 4g and 7g
    one = sim.create_gpu_instance(u, geometry.GI_PROFILE_1_SLICE, 0)
    for pid in (geometry.GI_PROFILE_4_SLICE, geometry.GI_PROFILE_7_SLICE):
        with _raises(ErrorCode.INSUFFICIENT_RESOURCES):
            sim.create_gpu_instance(u, pid, 0)
    for s in range(1, 7):
        sim.create_gpu_instance(u, geometry.GI_PROFILE_1_SLICE, s)
    with _raises(ErrorCode.INSUFFICIENT_RESOURCES):  # 8th 1g: count and slots exhausted
        sim.create_gpu_instance(u, geometry.GI_PROFILE_1_SLICE, 3)
    with _raises(ErrorCode.INSUFFICIENT_RESOURCES):  # slot 7 is stranded: REV2@6 overlaps
        sim.create_gpu_instance(u, geometry.GI_PROFILE_1_SLICE_REV2, 6)
    assert len(sim.gpu_instances(u)) == 7
    assert one.gi_id == 0 and sorted(g.gi_id for g in sim.gpu_instances(u)) == list(range(7))
    for g in sim.gpu_instances(u):
        sim.destroy_gpu_instance(u, g.gi_id)
    # +me at most once
    sim.create_gpu_instance(u, geometry.GI_PROFILE_1_SLICE_REV1, 2)
    with _raises(ErrorCode.INSUFFICIENT_RESOURCES):
        sim.create_gpu_instance(u, geometry.GI_PROFILE_1_SLICE_REV1, 5)


def test_gi_ids_reuse_lowest_free(mig_gpu: tuple[Simulator, str]) -> None:
    sim, u = mig_gpu
    ids = [sim.create_gpu_instance(u, geometry.GI_PROFILE_2_SLICE, s).gi_id for s in (0, 2, 4)]
    assert ids == [0, 1, 2]
    sim.destroy_gpu_instance(u, 1)
    assert sim.create_gpu_instance(u, geometry.GI_PROFILE_1_SLICE, 2).gi_id == 1


def test_compute_instance_lifecycle(mig_gpu: tuple[Simulator, str]) -> None:
    sim, u = mig_gpu
    gi = sim.create_gpu_instance(u, geometry.GI_PROFILE_3_SLICE, 4)
    assert gi.mig_uuid is None and gi.compute_instances == ()
    full = sim.create_compute_instance(u, gi.gi_id)
    assert full.mig_uuid is not None and full.mig_uuid.startswith("MIG-")
    assert full.compute_instances[0].ci_id == 0
    assert full.compute_instances[0].profile_id == geometry.CI_PROFILE_BY_SLICES[3]
    assert full.ci_caps_minor == (full.gi_caps_minor or 0) + 1
    with _raises(ErrorCode.INSUFFICIENT_RESOURCES):
        sim.create_compute_instance(u, gi.gi_id)
    with _raises(ErrorCode.IN_USE):
        sim.destroy_gpu_instance(u, gi.gi_id)
    with _raises(ErrorCode.NOT_FOUND):
        sim.destroy_compute_instance(u, gi.gi_id, 5)
    with _raises(ErrorCode.NOT_FOUND):
        sim.create_compute_instance(u, 9)
    with _raises(ErrorCode.NOT_FOUND):
        sim.destroy_gpu_instance(u, 9)
    sim.destroy_compute_instance(u, gi.gi_id, 0)
    assert sim.gpu_instances(u)[0].mig_uuid is None
    again = sim.create_compute_instance(u, gi.gi_id)
    assert again.mig_uuid != full.mig_uuid  # a new MIG device, a new UUID
    sim.destroy_compute_instance(u, gi.gi_id, 0)
    sim.destroy_gpu_instance(u, gi.gi_id)


def test_mig_disabled_refuses_instances(tmp_path: Path) -> None:
    with _sim(tmp_path, "hgx-h100") as sim:
        u = sim.gpus()[0].uuid
        assert sim.mig_mode(u).current is False
        assert sim.gpu_instances(u) == ()
        with _raises(ErrorCode.NOT_SUPPORTED):
            sim.create_gpu_instance(u, geometry.GI_PROFILE_1_SLICE, 0)
        assert sim.set_mig_mode(u, True).current is True  # Hopper: immediate
        sim.create_gpu_instance(u, geometry.GI_PROFILE_7_SLICE, 0)
        with _raises(ErrorCode.IN_USE):  # instances exist
            sim.set_mig_mode(u, False)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=st.lists(
        st.tuples(st.booleans(), st.sampled_from([0, 1, 2, 3, 4, 7, 9]), st.integers(0, 7)),
        min_size=1,
        max_size=25,
    )
)
def test_random_sequences_keep_invariants(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[bool, int, int]]
) -> None:
    sim = _sim(tmp_path_factory.mktemp("hyp"), "hgx-h200", initial_mig_mode={0: True})
    model = models.H200_141GB
    with sim:
        u = sim.gpus()[0].uuid
        for create, pid, n in ops:
            gis = sim.gpu_instances(u)
            if create or not gis:
                try:
                    sim.create_gpu_instance(u, pid, n)
                except HardwareError as e:
                    expected = rules.check_create(model, [(g.profile_id, g.placement_start) for g in gis], pid, n)
                    assert expected is not None and e.code.value == expected.code.value
            else:
                sim.destroy_gpu_instance(u, gis[n % len(gis)].gi_id)
            now = sim.gpu_instances(u)
            slots = [s for g in now for s in range(g.placement_start, g.placement_start + g.placement_size)]
            assert len(slots) == len(set(slots)) and all(0 <= s < 8 for s in slots)
            compute = 0
            for g in now:
                prof = model.profile(g.profile_id)
                assert prof is not None
                compute += prof.compute_slices
            assert compute <= 7
            assert rules.layout_is_valid(model, [(g.profile_id, g.placement_start) for g in now])
