"""SlicePublisher: which API calls a change costs, and that every state a reader can see is a valid pool.

The fake API keeps slices by name, checks resourceVersion on update like the API server, and records
every call; after every call the pool a reader would see (the newest generation, if complete) is
checked with ``validate_pool``, so a publisher that exposed a half-written pool would fail here.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpuplane.api import names
from gpuplane.driver.hw.sim import SimConfig, Simulator
from gpuplane.driver.inventory import Inventory, discover
from gpuplane.driver.publish.publisher import Layout, SlicePublisher
from gpuplane.driver.publish.slices import DeviceTaint, PoolContent, build_pool, slice_name, validate_pool
from testing.slicekit import SliceStore

NODE = "node-a"


class FakeSliceApi(SliceStore):
    """The shared store, checking after each write that a complete pool is valid, as the scheduler reads it."""

    def __init__(self) -> None:
        super().__init__()
        self.seen_pools: list[list[dict[str, Any]]] = []

    def changed(self) -> None:
        objs = list(self.objects.values())
        if not objs:
            return
        newest = max(o["spec"]["pool"]["generation"] for o in objs)
        current = [o for o in objs if o["spec"]["pool"]["generation"] == newest]
        if len(current) == current[0]["spec"]["pool"]["resourceSliceCount"]:
            validate_pool(current)  # what the scheduler would use now
            self.seen_pools.append(current)


@pytest.fixture
def inventories(tmp_path: Path) -> Iterator[tuple[Inventory, Inventory]]:
    sim = Simulator(SimConfig(profile="hgx-h100", state_dir=tmp_path / "sim", node_name=NODE, durable=False))
    sim.init()
    try:
        yield discover(NODE, sim), discover(NODE, sim, mig_placements=False)
    finally:
        sim.shutdown()


def _xid(gpu: str) -> dict[str, list[DeviceTaint]]:
    return {gpu: [DeviceTaint(key="gpu.gpuplane.dev/xid", value="xid-94", effect="NoSchedule")]}


class TestSlicePublisher:
    def test_first_publish_creates_every_slice_at_generation_one(
        self, inventories: tuple[Inventory, Inventory]
    ) -> None:
        api = FakeSliceApi()
        assert SlicePublisher(api, NODE, names.DRIVER_NAME).publish(inventories[0])
        assert [c[0] for c in api.writes()] == ["create"] * 5
        assert api.generations() == {1}

    def test_unchanged_inventory_writes_nothing(self, inventories: tuple[Inventory, Inventory]) -> None:
        api = FakeSliceApi()
        pub = SlicePublisher(api, NODE, names.DRIVER_NAME)
        pub.publish(inventories[0])
        before = len(api.calls)
        assert not pub.publish(inventories[0])
        assert len(api.calls) == before  # not even a list: the fingerprint matches
        fresh = SlicePublisher(api, NODE, names.DRIVER_NAME)  # a restarted driver lists, compares, writes nothing
        assert not fresh.publish(inventories[0])
        assert api.writes() == [("create", f"{NODE}-gpuplane-{i}") for i in range(5)]

    def test_taint_on_one_gpu_updates_its_slice_alone_at_the_same_generation(
        self, inventories: tuple[Inventory, Inventory]
    ) -> None:
        api = FakeSliceApi()
        taints: dict[str, list[DeviceTaint]] = {}
        pub = SlicePublisher(api, NODE, names.DRIVER_NAME, taints=lambda: taints)
        pub.publish(inventories[0])
        holder = next(
            n for n, o in api.objects.items() if any(d["name"] == "gpu-3" for d in o["spec"].get("devices") or [])
        )
        api.calls.clear()
        taints.update(_xid("gpu-3"))
        assert pub.publish(inventories[0])
        assert api.writes() == [("replace", holder)]
        assert api.generations() == {1}
        tainted = [d for d in api.objects[holder]["spec"]["devices"] if d["name"].startswith("gpu-3")]
        assert tainted and all(d["taints"][0]["value"] == "xid-94" for d in tainted)
        api.calls.clear()
        taints.clear()  # recovery: again one update
        assert pub.publish(inventories[0])
        assert api.writes() == [("replace", holder)]

    def test_changes_in_two_slices_raise_the_generation_and_rewrite_all(
        self, inventories: tuple[Inventory, Inventory]
    ) -> None:
        api = FakeSliceApi()
        taints: dict[str, list[DeviceTaint]] = {}
        pub = SlicePublisher(api, NODE, names.DRIVER_NAME, taints=lambda: taints)
        pub.publish(inventories[0])
        api.calls.clear()
        taints.update({**_xid("gpu-0"), **_xid("gpu-7")})  # GPU 0 and 7 sit in different device slices
        assert pub.publish(inventories[0])
        assert sorted(c[0] for c in api.writes()) == ["replace"] * 5
        assert api.generations() == {2}

    def test_fewer_slices_raise_the_generation_and_delete_the_stale_ones_last(
        self, inventories: tuple[Inventory, Inventory]
    ) -> None:
        api = FakeSliceApi()
        pub = SlicePublisher(api, NODE, names.DRIVER_NAME)
        pub.publish(inventories[0])
        api.calls.clear()
        assert pub.publish(inventories[1])  # whole GPUs only: one slice
        kinds = [c[0] for c in api.writes()]
        assert kinds == ["replace"] + ["delete"] * 4
        assert api.generations() == {2}
        (only,) = api.objects.values()
        assert len(only["spec"]["devices"]) == 8 and not any(d.get("consumesCounters") for d in only["spec"]["devices"])
        assert all(len(p) in (5, 1) for p in api.seen_pools)  # never a mixed or partial pool


def _holder(api: FakeSliceApi, gpu: str) -> str:
    return next(n for n, o in api.objects.items() if any(d["name"] == gpu for d in o["spec"].get("devices") or []))


def _reversing(reverse: set[str]) -> Layout:
    """The driver's layout with the devices of the slices named in ``reverse`` in reverse order: a change
    of device order alone, as the steered layout makes when it re-ranks placements."""

    def layout(inv: Inventory, taints: Mapping[str, Sequence[DeviceTaint]]) -> PoolContent:
        content = build_pool(inv, names.DRIVER_NAME, taints)
        specs = tuple(
            {**s, "devices": list(reversed(s["devices"]))} if slice_name(content.pool, i) in reverse else s
            for i, s in enumerate(content.slice_specs)
        )
        return PoolContent(pool=content.pool, slice_specs=specs)

    return layout


class TestOneRuleInPlace:
    """One slice's devices changed plus any number of reorders: in place, same generation."""

    def test_a_taint_on_one_gpu_and_a_reorder_elsewhere_are_written_in_place(
        self, inventories: tuple[Inventory, Inventory]
    ) -> None:
        api = FakeSliceApi()
        taints: dict[str, list[DeviceTaint]] = {}
        reverse: set[str] = set()
        pub = SlicePublisher(api, NODE, names.DRIVER_NAME, taints=lambda: taints, layout=_reversing(reverse))
        pub.publish(inventories[0])
        holder, other = _holder(api, "gpu-3"), _holder(api, "gpu-7")
        assert holder != other
        order = [d["name"] for d in api.objects[other]["spec"]["devices"]]
        api.calls.clear()
        taints.update(_xid("gpu-3"))
        reverse.add(other)
        assert pub.publish(inventories[0])
        assert sorted(api.writes()) == sorted([("replace", holder), ("replace", other)])
        assert api.generations() == {1}
        assert (pub.writes["update"], pub.writes["reorder"]) == (1, 1)
        assert [d["name"] for d in api.objects[other]["spec"]["devices"]] == order[::-1]
        held = [sorted(d["name"] for o in pool for d in o["spec"].get("devices") or []) for pool in api.seen_pools]
        assert len(held) >= 3 and all(h == held[0] for h in held)  # every pool a reader saw: each device once
        api.calls.clear()
        assert not pub.publish(inventories[0], force=True)  # the API holds it now: nothing to write
        assert api.writes() == []

    def test_a_reorder_with_changes_in_two_slices_raises_the_generation(
        self, inventories: tuple[Inventory, Inventory]
    ) -> None:
        api = FakeSliceApi()
        taints: dict[str, list[DeviceTaint]] = {}
        reverse: set[str] = set()
        pub = SlicePublisher(api, NODE, names.DRIVER_NAME, taints=lambda: taints, layout=_reversing(reverse))
        pub.publish(inventories[0])
        count = len(api.objects)
        reverse.add(_holder(api, "gpu-5"))
        api.calls.clear()
        taints.update({**_xid("gpu-0"), **_xid("gpu-7")})
        assert pub.publish(inventories[0])
        assert [c[0] for c in api.writes()] == ["replace"] * count
        assert api.generations() == {2}
        assert pub.writes["replace"] == count and pub.writes["update"] == pub.writes["reorder"] == 0


class TestBeforeLayout:
    """The options that reproduce the publisher and layout before the fleet-scale fixes (benchmark only)."""

    def test_not_in_place_rewrites_the_pool_for_a_one_gpu_taint(self, inventories: tuple[Inventory, Inventory]) -> None:
        api = FakeSliceApi()
        taints: dict[str, list[DeviceTaint]] = {}
        pub = SlicePublisher(api, NODE, names.DRIVER_NAME, taints=lambda: taints, in_place=False)
        pub.publish(inventories[0])
        api.calls.clear()
        taints.update(_xid("gpu-3"))
        assert pub.publish(inventories[0])
        assert sorted(c[0] for c in api.writes()) == ["replace"] * 5
        assert api.generations() == {2}

    def test_one_counter_set_per_slice_is_the_old_twelve_slice_layout(
        self, inventories: tuple[Inventory, Inventory]
    ) -> None:
        api = FakeSliceApi()
        pub = SlicePublisher(api, NODE, names.DRIVER_NAME, counter_sets_per_slice=1)
        pub.publish(inventories[0])
        counter_slices = [o for o in api.objects.values() if o["spec"].get("sharedCounters")]
        assert len(api.objects) == 12 and len(counter_slices) == 8
        assert all(len(o["spec"]["sharedCounters"]) == 1 for o in counter_slices)
        pub.counter_sets_per_slice = 8  # packing again: a new generation of 5 slices, the 7 stale ones deleted
        api.calls.clear()
        assert pub.publish(inventories[0])
        assert len(api.objects) == 5 and api.generations() == {2}
        assert [c[0] for c in api.writes()].count("delete") == 7

    def test_counter_sets_per_slice_out_of_range_is_refused(self, inventories: tuple[Inventory, Inventory]) -> None:
        with pytest.raises(ValueError, match=r"counter_sets_per_slice must be 1\.\.8, not 9"):
            SlicePublisher(FakeSliceApi(), NODE, names.DRIVER_NAME, counter_sets_per_slice=9)
        pub = SlicePublisher(FakeSliceApi(), NODE, names.DRIVER_NAME)
        pub.counter_sets_per_slice = 0  # set after construction: the builder refuses it, nothing is written
        with pytest.raises(ValueError, match=r"must be 1\.\.8, not 0"):
            pub.publish(inventories[0])
