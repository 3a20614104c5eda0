"""Issue 3, must-show 1 (continued): the published counters are the MIG rules.

A set of published MIG devices fits the published counters exactly when the simulator can create it, so the
scheduler can neither hand out overlapping pieces nor refuse a valid layout (A100-40GB, H100-80GB, H200-141GB,
and the other MIG-capable simulator profiles on the pure rules).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuplane.driver.hw import interface as hw
from gpuplane.driver.hw.sim import Simulator
from gpuplane.driver.inventory import discover
from gpuplane.driver.publish.slices import build_pool, render_slices
from gpuplane.mig import models, rules
from testing.driverkit import simulator
from tests.migkit import (
    MODELS,
    OTHER_MIG_PROFILES,
    Model,
    assert_nothing_left,
    instances,
    layout,
    mig_driver,
    mig_model,  # noqa: F401  (the fixture named model)
    prepare,
    unprepare,
)

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
