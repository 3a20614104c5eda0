"""The steered layout (publish.steering) and the publisher's in-place reorder."""

from __future__ import annotations

import copy
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpuplane.driver import inventory
from gpuplane.driver.hw.sim import SimConfig, Simulator
from gpuplane.driver.prepare.checkpoint import Checkpoint, ClaimRecord, DeviceRecord, MigRecord
from gpuplane.driver.publish import slices, steering
from gpuplane.driver.publish.publisher import SlicePublisher
from gpuplane.mig.geometry import HOPPER
from gpuplane.placement import geometry
from testing.slicekit import SliceStore

SLOTS = geometry.slots_for(HOPPER)


@pytest.fixture(scope="module")
def hgx() -> Iterator[inventory.Inventory]:
    root = Path(tempfile.mkdtemp(prefix="st"))
    sim = Simulator(SimConfig(profile="hgx-h100", state_dir=root, node_name="node-a", durable=False))
    sim.init()
    try:
        yield inventory.discover("node-a", sim)
    finally:
        sim.shutdown()
        shutil.rmtree(root, ignore_errors=True)


def walk(objs: Sequence[Mapping[str, Any]], profile: str) -> list[tuple[str, bool]]:
    """The allocator's walk for one driver profile: slices by name, devices in order; (device, tainted)."""
    out = []
    for obj in sorted(objs, key=lambda o: o["metadata"]["name"]):
        for d in obj["spec"].get("devices") or []:
            if d["attributes"].get("migProfile", {}).get("string") == profile:
                out.append((d["name"], bool(d.get("taints"))))
    return out


def states_with(n: int, **mig: list[tuple[str, int]]) -> list[int]:
    out = [geometry.EMPTY] * n
    for key, insts in mig.items():
        st = geometry.EMPTY
        for prof, start in insts:
            st = SLOTS.add(st, prof, start)
        out[int(key[1:])] = st
    return out


def test_each_profile_is_one_slice_within_api_limits(hgx: inventory.Inventory) -> None:
    layout = steering.SteeredLayout(steering.SteeringSettings(order=True, withhold=True))
    objs = slices.render_slices(layout.build_pool(hgx, [geometry.EMPTY] * 8), 1)
    slices.validate_pool(objs)
    for obj in objs:
        profiles = {d["attributes"].get("migProfile", {}).get("string") for d in obj["spec"].get("devices") or []}
        assert len(profiles) <= 1
    # Same devices as today's layout, nothing lost or added.
    today = slices.render_slices(slices.build_pool(hgx), 1)
    names = sorted(d["name"] for o in objs for d in o["spec"].get("devices") or [])
    assert names == sorted(d["name"] for o in today for d in o["spec"].get("devices") or [])


def test_order_follows_gpuplane_and_stranding_placements_are_tainted(hgx: inventory.Inventory) -> None:
    layout = steering.SteeredLayout(steering.SteeringSettings(order=True, withhold=True))
    states = states_with(8, g2=[("4g", 0)], g5=[("2g", 0), ("2g", 2)])
    objs = slices.render_slices(layout.build_pool(hgx, states), 1)
    three = walk(objs, "3g.40gb")
    assert three[0] == ("gpu-2-mig-3g-40gb-4", False)  # beside the 4g: the GPU ends up full
    assert all(t for name, t in three if name.endswith("-0"))  # every 3g at slot 0 carries the taint
    assert not any(t for name, t in three if name.endswith("-4"))
    one = walk(objs, "1g.10gb")
    assert one[0][0].split("-mig-")[0] in ("gpu-2", "gpu-5")  # fill a partly used GPU, don't open an empty one


def test_today_order_without_steering_is_unchanged(hgx: inventory.Inventory) -> None:
    layout = steering.SteeredLayout(steering.SteeringSettings(withhold=True))
    objs = slices.render_slices(layout.build_pool(hgx, states_with(8, g2=[("4g", 0)])), 1)
    assert [n for n, _ in walk(objs, "3g.40gb")][:2] == ["gpu-0-mig-3g-40gb-0", "gpu-0-mig-3g-40gb-4"]


def test_gpu_states_from_the_checkpoint(hgx: inventory.Inventory) -> None:
    gpu0, gpu3 = hgx.gpus[0], hgx.gpus[3]
    cp = Checkpoint(
        claims={
            "u1": ClaimRecord(
                uid="u1",
                namespace="ns",
                name="c1",
                phase="PrepareCompleted",
                devices=[
                    DeviceRecord(
                        request_names=["r"],
                        pool="node-a",
                        device="gpu-0-mig-3g-40gb-4",
                        kind="mig",
                        gpu_uuid=gpu0.info.uuid,
                        gpu_minor=gpu0.info.minor,
                        mig=MigRecord(
                            parent_uuid=gpu0.info.uuid, profile_id=2, profile_name="3g.40gb", start=4, size=4
                        ),
                    )
                ],
            ),
            "u2": ClaimRecord(
                uid="u2",
                namespace="ns",
                name="c2",
                phase="PrepareStarted",
                devices=[
                    DeviceRecord(
                        request_names=["r"],
                        pool="node-a",
                        device="gpu-3",
                        kind="gpu",
                        gpu_uuid=gpu3.info.uuid,
                        gpu_minor=gpu3.info.minor,
                    )
                ],
            ),
        }
    )
    states = steering.gpu_states(hgx, cp)
    assert states[0] == SLOTS.add(geometry.EMPTY, "3g", 4)
    assert states[3] == geometry.WHOLE
    assert states[1] == geometry.EMPTY


def test_a_reorder_rewrites_only_the_changed_slices_at_the_same_generation(hgx: inventory.Inventory) -> None:
    layout = steering.SteeredLayout(steering.SteeringSettings(order=True, withhold=True))
    states: list[list[int]] = [[geometry.EMPTY] * 8]
    api = SliceStore()
    pub = SlicePublisher(api, "node-a", "gpu.gpuplane.dev", layout=lambda inv, t: layout.build_pool(inv, states[0]))
    assert pub.publish(hgx)
    first = {n: o["spec"]["pool"]["generation"] for n, o in api.objects.items()}
    assert len(api.writes()) == len(api.objects) and all(v == "create" for v, _ in api.writes())
    api.calls.clear()
    states[0] = states_with(8, g6=[("4g", 0)])  # a 4g was prepared on GPU 6: the rankings change
    assert pub.publish(hgx)
    assert api.writes() and all(v == "replace" for v, _ in api.writes())
    assert len(api.writes()) < len(api.objects)  # counter slices and unaffected profiles are not rewritten
    assert {n: o["spec"]["pool"]["generation"] for n, o in api.objects.items()} == first
    assert pub.writes["reorder"] == len(api.writes())
    assert walk(list(api.objects.values()), "3g.40gb")[0][0] == "gpu-6-mig-3g-40gb-4"
    api.calls.clear()
    assert not pub.publish(hgx)  # nothing changed: nothing written
    assert api.writes() == []


def test_a_change_in_two_slices_still_bumps_the_generation(hgx: inventory.Inventory) -> None:
    api = SliceStore()
    taints: dict[str, list[slices.DeviceTaint]] = {}
    pub = SlicePublisher(api, "node-a", "gpu.gpuplane.dev", taints=lambda: taints)
    pub.publish(hgx)
    gen = {o["spec"]["pool"]["generation"] for o in api.objects.values()}
    # GPUs 0 and 7 sit in different slices (a change confined to one slice is updated in place:
    # tests/unit/driver/publish/test_publisher.py)
    taints["gpu-0"] = [slices.DeviceTaint("gpu.gpuplane.dev/unhealthy", "xid-79", "NoExecute")]
    taints["gpu-7"] = [slices.DeviceTaint("gpu.gpuplane.dev/unhealthy", "xid-79", "NoExecute")]
    api.calls.clear()
    assert pub.publish(hgx)
    new = {o["spec"]["pool"]["generation"] for o in api.objects.values()}
    assert len(new) == 1 and new != gen
    assert len(api.writes()) == len(api.objects)


class DefaultingApi(SliceStore):
    """Like the API server: a taint written without timeAdded comes back stamped with the write's time."""

    def _store(self, body: Mapping[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(dict(body))
        for d in obj["spec"].get("devices") or []:
            for t in d.get("taints") or []:
                t.setdefault("timeAdded", f"2026-01-01T00:00:{self.rv % 60:02d}Z")
        return super()._store(obj)


def test_reorder_in_place_survives_the_api_stamping_taint_times(hgx: inventory.Inventory) -> None:
    layout = steering.SteeredLayout(steering.SteeringSettings(order=True, withhold=True))  # no fixed taint time
    states: list[list[int]] = [[geometry.EMPTY] * 8]
    health = {"gpu-7": [slices.DeviceTaint("gpu.gpuplane.dev/unhealthy", "xid-79", "NoExecute")]}
    api = DefaultingApi()
    pub = SlicePublisher(
        api,
        "node-a",
        "gpu.gpuplane.dev",
        taints=lambda: health,
        layout=lambda inv, t: layout.build_pool(inv, states[0], taints=t),
    )
    pub.publish(hgx)
    stamped = {
        (d["name"], t["key"]): t["timeAdded"]
        for o in api.objects.values()
        for d in o["spec"].get("devices") or []
        for t in d.get("taints") or []
    }
    api.calls.clear()
    states[0] = states_with(8, g3=[("4g", 0)])
    assert pub.publish(hgx)
    assert api.writes() and all(v == "replace" for v, _ in api.writes()) and len(api.writes()) < len(api.objects)
    after = {
        (d["name"], t["key"]): t["timeAdded"]
        for o in api.objects.values()
        for d in o["spec"].get("devices") or []
        for t in d.get("taints") or []
    }
    assert after == stamped  # no taint restamped by a reorder


def test_the_stable_order_writes_less_and_the_allocator_walks_the_free_devices_as_before(
    hgx: inventory.Inventory,
) -> None:
    # bench.placement.steer_writes measures this on trace arrivals; here a fixed sequence on one node.
    from bench.placement import steer_writes as sw
    from gpuplane.placement import model

    states = [geometry.EMPTY] * 8
    layouts = [
        steering.SteeredLayout(steering.SteeringSettings(order=True, withhold=True, stable=s), taint_time="t")
        for s in (True, False)
    ]
    apis = [sw.MemoryApi("node-a"), sw.MemoryApi("node-a")]
    pubs = [
        SlicePublisher(a, "node-a", "gpu.gpuplane.dev", layout=sw.layout_over(lay, states))
        for a, lay in zip(apis, layouts, strict=True)
    ]
    for p in pubs:
        p.publish(hgx)
    reqs = [model.Request(id=f"r{i}", mig_profile=m) for i, m in enumerate(["1g", "3g", "2g", "1g", "4g", None, "1g"])]
    held = []
    whole_rewrites = [0, 0]
    for r in reqs:
        before = [dict(a.objects) for a in apis]
        got = sw.take(r, apis[0].walk(), states)
        assert got is not None
        held.append((r, got))
        for p in pubs:
            p.publish(hgx)
        for k, a in enumerate(apis):
            whole_rewrites[k] += sum(
                1
                for n, o in a.objects.items()
                if o is not before[k].get(n) and any(d["name"] == "gpu-0" for d in o["spec"].get("devices") or [])
            )
        assert sw.free_walk(apis[0].walk(), states) == sw.free_walk(apis[1].walk(), states)
    for r, got in held[::2]:
        sw.release(r, got, states)
        for p in pubs:
            p.publish(hgx)
        assert sw.free_walk(apis[0].walk(), states) == sw.free_walk(apis[1].walk(), states)
    stable, relisted = (sum(p.writes.values()) for p in pubs)
    assert stable < relisted
    # A MIG device on an empty GPU takes it out of the whole GPUs the allocator can pick; the others keep
    # their order, so the stable layout leaves the whole-GPU slice as it is; re-listing moves the GPU back.
    assert whole_rewrites[0] < whole_rewrites[1]
