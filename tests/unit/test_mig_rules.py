"""Issue 3, must-show 1: MIG rules through the production prepare path (DeviceState on the simulator).

For A100-40GB (MIG on), H100-80GB and H200-141GB: every profile at every valid placement prepares and
unprepares; layouts that may coexist do; what must be refused is refused per claim with nothing left
behind. And the key property: a set of published MIG devices fits the published counters exactly when
the simulator can create it, so the scheduler can neither hand out overlapping pieces nor refuse a valid
layout.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuplane.driver.api import names
from gpuplane.driver.hw import interface as hw
from gpuplane.driver.hw.sim import Simulator
from gpuplane.driver.prepare import cdi
from gpuplane.driver.publish.inventory import discover, mig_device_name
from gpuplane.driver.publish.slices import build_pool, render_slices
from gpuplane.mig import geometry, models, rules
from tests.driverkit import DriverUnderTest, driver_env, make_claim, ref, simulator

GIB = 1024**3
S1, S1ME, S1D, S2, S3, S4, S7 = (
    geometry.GI_PROFILE_1_SLICE,
    geometry.GI_PROFILE_1_SLICE_REV1,
    geometry.GI_PROFILE_1_SLICE_REV2,
    geometry.GI_PROFILE_2_SLICE,
    geometry.GI_PROFILE_3_SLICE,
    geometry.GI_PROFILE_4_SLICE,
    geometry.GI_PROFILE_7_SLICE,
)


@dataclass(frozen=True)
class Model:
    id: str
    profile: str
    table: models.MigModel
    sim: Mapping[str, Any] = field(default_factory=dict)
    foreign_profile: str = ""  # a real profile name of another model: never published here


MODELS = (
    Model("A100-40GB", "a100-40gb", models.A100_40GB, {"initial_mig_mode": {0: True, 1: True}}, "1g.10gb+me"),
    Model("H100-80GB", "hgx-h100", models.H100_80GB, {}, "1g.18gb"),
    Model("H200-141GB", "hgx-h200", models.H200_141GB, {}, "1g.10gb"),
)
# The counter property is also checked (on the pure rules) for the other MIG-capable simulator profiles.
OTHER_MIG_PROFILES = ("h100-nvl-pcie", "gb200-nvl72")


def name_of(model: Model, profile_id: int, start: int, minor: int = 0) -> str:
    profile = model.table.profile(profile_id)
    assert profile is not None
    return mig_device_name(minor, profile.name, start)


def mig_driver(model: Model, **extra: Any) -> contextlib.AbstractContextManager[DriverUnderTest]:
    return driver_env(model.profile, "node-a", prefix="mr", **{"durable": False, **model.sim, **extra})


@pytest.fixture(params=MODELS, ids=lambda m: m.id)
def model(request: pytest.FixtureRequest) -> Model:
    m: Model = request.param
    return m


def prepare(drv: DriverUnderTest, name: str, devices: Sequence[str], **kw: Any) -> tuple[dict[str, Any], str]:
    claim = make_claim(name, drv.node, list(devices), **kw)
    drv.claims.add(claim)
    uid = claim["metadata"]["uid"]
    return claim, drv.state.prepare([ref(claim)])[uid].error


def unprepare(drv: DriverUnderTest, *claims: Mapping[str, Any]) -> None:
    results = drv.state.unprepare([ref(c) for c in claims])
    assert all(r.error == "" for r in results.values()), results


def instances(drv: DriverUnderTest, minor: int = 0) -> list[hw.GpuInstance]:
    uuid = drv.sim.uuid_of_minor(minor)
    return list(drv.sim.gpu_instances(uuid)) if drv.sim.mig_mode(uuid).current else []


def layout(drv: DriverUnderTest, minor: int = 0) -> set[tuple[int, int]]:
    return {(gi.profile_id, gi.placement_start) for gi in instances(drv, minor)}


def assert_nothing_left(drv: DriverUnderTest, claim: Mapping[str, Any]) -> None:
    uid = claim["metadata"]["uid"]
    assert uid not in drv.state.snapshot().claims
    assert not cdi.spec_path(drv.cdi_root, uid).exists()
    assert drv.mps.list_daemons() == []


def cdi_doc(drv: DriverUnderTest, claim: Mapping[str, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(cdi.spec_path(drv.cdi_root, claim["metadata"]["uid"]).read_text())
    return doc


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
Counters = dict[str, int]


def published_counters(sim: Simulator, minor: int = 0) -> tuple[Counters, dict[str, Counters]]:
    """The counter set of one GPU and what each of its devices consumes, read back from the rendered slices."""
    slices = render_slices(build_pool(discover("node-a", sim)), 1)
    set_name = f"gpu-{minor}-counters"
    (capacity,) = [
        {k: int(v["value"]) for k, v in cs["counters"].items()}
        for s in slices
        for cs in s["spec"].get("sharedCounters") or []
        if cs["name"] == set_name
    ]
    usage: dict[str, Counters] = {}
    for s in slices:
        for d in s["spec"].get("devices") or []:
            (use,) = d["consumesCounters"] if d.get("consumesCounters") else [None]
            if use is not None and use["counterSet"] == set_name:
                usage[d["name"]] = {k: int(v["value"]) for k, v in use["counters"].items()}
    return capacity, usage


def fits(capacity: Counters, usage: Mapping[str, Counters], devices: Sequence[str]) -> bool:
    """What the scheduler's allocator checks: for every counter, summed consumption <= the set's value."""
    total: dict[str, int] = {}
    for d in devices:
        for k, v in usage[d].items():
            total[k] = total.get(k, 0) + v
    return all(v <= capacity[k] for k, v in total.items())


def counter_family(capacity: Counters, usage: Mapping[str, Counters], names_: Sequence[str]) -> set[frozenset[str]]:
    """Every set of devices that fits the counters (downward closed, so DFS with pruning finds them all)."""
    out: set[frozenset[str]] = set()

    def dfs(i: int, chosen: list[str]) -> None:
        out.add(frozenset(chosen))
        for j in range(i, len(names_)):
            if fits(capacity, usage, [*chosen, names_[j]]):
                dfs(j + 1, [*chosen, names_[j]])

    dfs(0, [])
    return out


def bare_sim(profile: str, **extra: Any) -> contextlib.AbstractContextManager[Simulator]:
    # The exhaustive search makes ~20k simulator calls, each a state-file read: keep that file in memory.
    return simulator(profile, prefix="ms", in_memory=True, **extra)


def simulator_family(sim: Simulator, slots: Mapping[str, tuple[int, int]]) -> set[frozenset[str]]:
    """Every set of devices the simulator lets coexist, found by really creating GPU instances (DFS)."""
    uuid = sim.uuid_of_minor(0)
    order = sorted(slots)
    out: set[frozenset[str]] = set()

    def dfs(i: int, chosen: list[str]) -> None:
        out.add(frozenset(chosen))
        for j in range(i, len(order)):
            pid, start = slots[order[j]]
            try:
                gi = sim.create_gpu_instance(uuid, pid, start)
            except hw.HardwareError as exc:
                assert exc.code is hw.ErrorCode.INSUFFICIENT_RESOURCES, exc
                continue
            dfs(j + 1, [*chosen, order[j]])
            sim.destroy_gpu_instance(uuid, gi.gi_id)

    dfs(0, [])
    assert sim.gpu_instances(uuid) == ()
    return out


def test_counters_fit_exactly_when_the_simulator_can_create(model: Model) -> None:
    with bare_sim(model.profile, initial_mig_mode={0: True}) as sim:
        capacity, usage = published_counters(sim)
        gpu0 = discover("node-a", sim).gpus[0]
        slots = {s.name: (s.profile.profile_id, s.start) for s in gpu0.mig_slots}
        by_counters = counter_family(capacity, usage, sorted(slots))
        by_simulator = simulator_family(sim, slots)
    assert len(by_simulator) == 2319  # every layout of the 8-slot / 7-compute-slice geometry
    refused_valid = by_simulator - by_counters
    overlapping_fit = by_counters - by_simulator
    assert not refused_valid, f"counters refuse valid layouts, e.g. {sorted(map(sorted, refused_valid))[:3]}"
    assert not overlapping_fit, f"counters admit impossible layouts, e.g. {sorted(map(sorted, overlapping_fit))[:3]}"


@pytest.mark.parametrize("profile", OTHER_MIG_PROFILES)
def test_counters_match_the_rules_on_other_mig_gpus(profile: str) -> None:
    with bare_sim(profile, initial_mig_mode={0: True}) as sim:
        capacity, usage = published_counters(sim)
        gpu0 = discover("node-a", sim).gpus[0]
        table = sim.profile.gpu.mig_model
    assert table is not None
    slots = {s.name: (s.profile.profile_id, s.start) for s in gpu0.mig_slots}
    by_counters = counter_family(capacity, usage, sorted(slots))
    by_rules = {
        frozenset(combo) for combo in by_counters if rules.layout_is_valid(table, [slots[n] for n in sorted(combo)])
    }
    assert by_rules == by_counters and len(by_counters) == 2319
    assert all(p.memory_bytes <= gpu0.info.memory_bytes for p in table.profiles)


def test_whole_gpu_and_any_mig_device_never_fit_together(model: Model) -> None:
    with bare_sim(model.profile, **model.sim) as sim:
        capacity, usage = published_counters(sim)
        whole_offered = discover("node-a", sim).gpus[0].offer_whole
    mig = [n for n in usage if n != "gpu-0"]
    assert len(mig) == 25
    if model.table is models.A100_40GB:
        # MIG on an A100 cannot be switched off without a reset: the whole GPU is not offered at all.
        assert not whole_offered and "gpu-0" not in usage
        return
    assert whole_offered and usage["gpu-0"] == capacity
    assert fits(capacity, usage, ["gpu-0"])
    assert not any(fits(capacity, usage, ["gpu-0", m]) for m in mig)


def _maximal(family: set[frozenset[str]]) -> list[list[str]]:
    return sorted(sorted(s) for s in family if not any(s < t for t in family))


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.id)
def test_random_device_sets_prepare_exactly_when_they_fit(model: Model) -> None:
    """Through DeviceState: one claim holding a drawn set of published MIG devices of gpu-0."""
    with mig_driver(model, initial_mig_mode={0: True}) as drv:
        capacity, usage = published_counters(drv.sim)
        mig = sorted(n for n in usage if n != "gpu-0")
        maximal = _maximal(counter_family(capacity, usage, mig))
        drawn = st.one_of(
            st.sampled_from(maximal),
            st.lists(st.sampled_from(mig), min_size=1, max_size=5, unique=True),
            # a maximal layout plus one more device: never fits (unless the device is already in it)
            st.tuples(st.sampled_from(maximal), st.sampled_from(mig)).map(lambda t: sorted({*t[0], t[1]})),
        )
        counter = iter(range(10**6))

        @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(devices=drawn)
        def check(devices: list[str]) -> None:
            claim, err = prepare(drv, f"c{next(counter)}", devices)
            if fits(capacity, usage, devices):
                assert err == "", f"{devices}: {err}"
                slots = {s.name: (s.profile.profile_id, s.start) for s in drv.state.inventory().gpus[0].mig_slots}
                assert layout(drv) == {slots[d] for d in devices}
                unprepare(drv, claim)
            else:
                assert "already taken" in err, f"{devices}: {err}"
                assert_nothing_left(drv, claim)
            assert instances(drv) == []

        check()
