"""Issue 3, must-show 1: MIG rules through the production prepare path (DeviceState on the simulator).

For A100-40GB (MIG on), H100-80GB and H200-141GB: every profile at every valid placement prepares and
unprepares; layouts that may coexist do; what must be refused is refused per claim with nothing left
behind. And the key property: a set of published MIG devices fits the published counters exactly when
the simulator can create it, so the scheduler can neither hand out overlapping pieces nor refuse a valid
layout.
"""

from __future__ import annotations

import pytest

from gpuplane.api import names
from gpuplane.driver.hw import interface as hw
from gpuplane.driver.inventory import mig_device_name
from testing.driverkit import make_claim, ref
from tests.migkit import (
    GIB,
    MODELS,
    S1,
    S1D,
    S1ME,
    S2,
    S3,
    S4,
    S7,
    Model,
    assert_nothing_left,
    cdi_doc,
    instances,
    layout,
    mig_driver,
    mig_model,  # noqa: F401  (the fixture named model)
    name_of,
    prepare,
    unprepare,
)


# --- every profile at every placement ---------------------------------------------------------------------
def test_every_profile_at_every_placement(model: Model) -> None:
    with mig_driver(model) as drv:
        gpu0 = drv.state.inventory().gpus[0]
        published = {s.name for s in gpu0.mig_slots}
        expected = {name_of(model, p.profile_id, s) for p in model.table.profiles for s in p.placements}
        assert published == expected and len(published) == 25
        seen_uuids: set[str] = set()
        for slot in gpu0.mig_slots:
            claim, err = prepare(drv, f"c-{slot.name}", [slot.name])
            assert err == "", f"{slot.name}: {err}"
            (gi,) = instances(drv)
            assert (gi.profile_id, gi.placement_start, gi.placement_size) == (
                slot.profile.profile_id,
                slot.start,
                slot.profile.memory_slices,
            )
            assert len(gi.compute_instances) == 1 and gi.mig_uuid is not None
            assert gi.mig_uuid not in seen_uuids
            seen_uuids.add(gi.mig_uuid)
            rec = drv.state.snapshot().claims[claim["metadata"]["uid"]]
            assert rec.phase == "PrepareCompleted" and rec.devices[0].mig is not None
            assert rec.devices[0].mig.mig_uuid == gi.mig_uuid
            doc = cdi_doc(drv, claim)
            (device,) = doc["devices"]
            nodes = [n["path"] for n in device["containerEdits"]["deviceNodes"]]
            assert nodes[0] == "/dev/nvidia0"
            assert len(nodes) == 3 and all(n.startswith("/dev/nvidia-caps/nvidia-cap") for n in nodes[1:])
            env = doc["containerEdits"]["env"]
            assert f"NVIDIA_VISIBLE_DEVICES={gi.mig_uuid}" in env
            assert f"CUDA_VISIBLE_DEVICES={gi.mig_uuid}" in env
            var = f"GPUPLANE_DEVICE_{slot.name.upper().replace('-', '_')}_UUID={gi.mig_uuid}"
            assert var in device["containerEdits"]["env"]
            unprepare(drv, claim)
            assert instances(drv) == [], f"{slot.name} left an instance"
            assert_nothing_left(drv, claim)
        assert drv.sim.mig_mode(drv.sim.uuid_of_minor(0)).current


# --- layouts that coexist ---------------------------------------------------------------------------------
COEXISTING = {
    "3g@0+3g@4": [(S3, 0), (S3, 4)],
    "4g@0+3g@4": [(S4, 0), (S3, 4)],
    "4g@0+2g@4+1g@6": [(S4, 0), (S2, 4), (S1, 6)],
    "seven-1g": [(S1, i) for i in range(7)],
    "1g+me@0+six-1g": [(S1ME, 0)] + [(S1, i) for i in range(1, 7)],
    "1g+me@6+1g-double@0,2,4": [(S1D, 0), (S1D, 2), (S1D, 4), (S1ME, 6)],
    "four-1g-double": [(S1D, i) for i in (0, 2, 4, 6)],
    "three-2g+1g-double@6": [(S2, 0), (S2, 2), (S2, 4), (S1D, 6)],
    "2g@0+1g@2,3+3g@4": [(S2, 0), (S1, 2), (S1, 3), (S3, 4)],
    "7g": [(S7, 0)],
}


@pytest.mark.parametrize("combo", list(COEXISTING), ids=list(COEXISTING))
def test_coexisting_layouts(model: Model, combo: str) -> None:
    wanted = COEXISTING[combo]
    with mig_driver(model) as drv:
        claims = [make_claim(f"c{i}", drv.node, [name_of(model, p, s)]) for i, (p, s) in enumerate(wanted)]
        drv.claims.add(*claims)
        results = drv.state.prepare([ref(c) for c in claims])
        assert [r.error for r in results.values()] == [""] * len(wanted)
        assert layout(drv) == set(wanted)
        uuids = {gi.mig_uuid for gi in instances(drv)}
        assert None not in uuids and len(uuids) == len(wanted)
        unprepare(drv, *claims)
        assert instances(drv) == []
        assert drv.state.snapshot().claims == {} and drv.cdi_files() == []


# --- refusals ----------------------------------------------------------------------------------------------
def test_unsupported_profile_or_placement_is_refused(model: Model) -> None:
    with mig_driver(model) as drv:
        uuid = drv.sim.uuid_of_minor(0)
        mode = drv.sim.mig_mode(uuid)
        for device in (
            mig_device_name(0, model.foreign_profile, 0),  # another model's profile
            mig_device_name(0, model.table.profiles[4].name, 2),  # 3g at slot 2: not a valid placement
            mig_device_name(0, model.table.profiles[6].name, 1),  # 7g at slot 1
        ):
            claim, err = prepare(drv, "bad", [device])
            assert device in err and "not published" in err
            assert_nothing_left(drv, claim)
            assert instances(drv) == []
            assert drv.sim.mig_mode(uuid) == mode
        assert [e[1] for e in drv.claims.events] == ["PrepareFailed"] * 3


@pytest.mark.parametrize(
    ("first", "second"),
    [((S3, 4), (S3, 4)), ((S3, 4), (S1, 5)), ((S3, 4), (S7, 0)), ((S2, 2), (S1D, 2)), ((S1ME, 1), (S1ME, 3))],
    ids=["same-placement", "overlap-1g", "overlap-7g", "overlap-1g-double", "second-1g+me"],
)
def test_taken_or_overlapping_placement_is_refused(
    model: Model, first: tuple[int, int], second: tuple[int, int]
) -> None:
    with mig_driver(model) as drv:
        holder, err = prepare(drv, "holder", [name_of(model, *first)])
        assert err == ""
        (held,) = instances(drv)
        late, err = prepare(drv, "late", [name_of(model, *second)])
        assert "already taken" in err and name_of(model, *second).split("-mig-")[0] in err, err
        assert "delete and recreate the pod" in err
        assert instances(drv) == [held], "the holder's instance is untouched"
        assert_nothing_left(drv, late)
        assert drv.state.snapshot().claims[holder["metadata"]["uid"]].phase == "PrepareCompleted"
        unprepare(drv, holder)
        assert instances(drv) == []


def test_overlap_inside_one_claim_rolls_back_everything(model: Model) -> None:
    with mig_driver(model) as drv:
        devices = [name_of(model, S1, 6), name_of(model, S4, 0), name_of(model, S3, 0)]
        claim, err = prepare(drv, "greedy", devices)
        assert "already taken" in err and "overlaps" in err, err
        assert instances(drv) == []
        assert_nothing_left(drv, claim)


def test_a100_with_mig_off_offers_no_mig_devices() -> None:
    a100 = MODELS[0]
    with mig_driver(a100, initial_mig_mode={}) as drv:
        uuid = drv.sim.uuid_of_minor(0)
        assert drv.state.inventory().gpus[0].mig_slots == ()
        claim, err = prepare(drv, "mig", [name_of(a100, S3, 0)])
        assert "not published" in err
        assert drv.sim.mig_mode(uuid) == hw.MigMode(False, False)
        assert_nothing_left(drv, claim)


def test_a100_mig_turned_off_behind_the_driver_needs_a_reset_and_mode_is_untouched() -> None:
    a100 = MODELS[0]
    with mig_driver(a100) as drv:
        uuid = drv.sim.uuid_of_minor(0)
        assert name_of(a100, S3, 0) in {s.name for s in drv.state.inventory().gpus[0].mig_slots}
        # An administrator turns MIG off and resets the GPU before the driver republishes.
        drv.sim.set_mig_mode(uuid, False)
        drv.sim.reset_gpu(uuid)
        assert drv.sim.mig_mode(uuid) == hw.MigMode(False, False)
        claim, err = prepare(drv, "mig", [name_of(a100, S3, 0)])
        assert "needs a reset" in err and "never resets" in err, err
        assert drv.sim.mig_mode(uuid) == hw.MigMode(False, False), "no pending MIG mode left behind"
        assert_nothing_left(drv, claim)


@pytest.mark.parametrize("model", MODELS[1:], ids=lambda m: m.id)
def test_busy_gpu_with_mig_off_is_refused_without_mode_change(model: Model) -> None:
    with mig_driver(model) as drv:
        uuid = drv.sim.uuid_of_minor(0)
        drv.sim.add_process(uuid, 4242, GIB)
        claim, err = prepare(drv, "mig", [name_of(model, S1, 0)])
        assert "running process" in err and "gpu-0" in err, err
        assert drv.sim.mig_mode(uuid) == hw.MigMode(False, False)
        assert_nothing_left(drv, claim)
        # Another, idle GPU of the node is fine.
        other, err = prepare(drv, "ok", [name_of(model, S1, 0, minor=1)])
        assert err == "" and len(instances(drv, 1)) == 1
        unprepare(drv, other)


# --- whole GPU and MIG ------------------------------------------------------------------------------------
def test_whole_gpu_after_mig_use_has_mig_mode_off_again() -> None:
    h100 = MODELS[1]
    with mig_driver(h100) as drv:
        uuid = drv.sim.uuid_of_minor(0)
        mig, err = prepare(drv, "mig", [name_of(h100, S3, 0)])
        assert err == "" and drv.sim.mig_mode(uuid).current
        # While a MIG instance exists the whole GPU is refused (the scheduler never allocates both).
        early, err = prepare(drv, "early", ["gpu-0"])
        assert "MIG instances" in err, err
        assert_nothing_left(drv, early)
        unprepare(drv, mig)
        sliced = {"apiVersion": names.CONFIG_API_VERSION, "kind": "GpuConfig",
                  "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}}  # fmt: skip
        whole, err = prepare(drv, "whole", ["gpu-0"], claim_config=[sliced])
        assert err == "", err
        assert drv.sim.mig_mode(uuid) == hw.MigMode(False, False), "a whole GPU in MIG mode runs no CUDA work"
        assert drv.sim.timeslice(uuid) == "Long"
        unprepare(drv, whole)
        assert drv.sim.timeslice(uuid) == "Default"


# --- the counters are the MIG rules -----------------------------------------------------------------------
