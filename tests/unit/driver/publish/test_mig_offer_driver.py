"""The driver's side of the MIG offer: which GPUs publish MIG placements, that the pool stays valid and
accounted, that a placement allocated before the offer shrank still resolves, and the offer's parser."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from gpuplane.api import mig_offer
from gpuplane.driver import config
from gpuplane.driver.hw.sim import SimConfig, Simulator
from gpuplane.driver.inventory import discover
from gpuplane.driver.prepare.checkpoint import ClaimRecord, DeviceRecord, MigRecord
from gpuplane.driver.prepare.claims import AllocatedDevice, ClaimAllocation, ClaimError
from gpuplane.driver.prepare.planning import plan_claim
from gpuplane.driver.publish.offer_watch import OfferWatch, node_offer
from gpuplane.driver.publish.slices import build_pool, render_slices, validate_pool

NODE = "node-a"


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[Simulator]:
    backend = Simulator(SimConfig(profile="hgx-h100", state_dir=tmp_path / "sim", node_name=NODE, durable=False))
    backend.init()
    try:
        yield backend
    finally:
        backend.shutdown()


def _devices(inv: object) -> list[dict[str, object]]:
    pool = render_slices(build_pool(inv), 1)  # type: ignore[arg-type]
    validate_pool(pool)
    return [d for s in pool for d in s["spec"].get("devices") or []]


def test_only_offered_gpus_publish_mig_placements_and_counters(sim: Simulator) -> None:
    everything = discover(NODE, sim)
    offered = discover(NODE, sim, mig_offer={"gpu-2"})
    devices = _devices(offered)
    mig = [str(d["name"]) for d in devices if "-mig-" in str(d["name"])]
    assert mig and all(name.startswith("gpu-2-mig-") for name in mig)
    assert {str(d["name"]) for d in devices} - set(mig) == {f"gpu-{i}" for i in range(8)}
    counted = [str(d["name"]) for d in devices if d.get("consumesCounters")]
    assert sorted(counted) == sorted(["gpu-2", *mig])  # only gpu-2's devices consume counters
    pool = render_slices(build_pool(offered), 1)
    counter_sets = [cs["name"] for s in pool for cs in s["spec"].get("sharedCounters") or []]
    assert counter_sets == ["gpu-2-counters"]
    assert len(devices) * 6 < len(_devices(everything))  # ~190 devices down to 8 + one GPU's placements


def test_empty_offer_is_whole_gpus_only_and_none_is_everything(sim: Simulator) -> None:
    assert [d["name"] for d in _devices(discover(NODE, sim, mig_offer=()))] == [f"gpu-{i}" for i in range(8)]
    assert discover(NODE, sim, mig_offer=None).published_view() == discover(NODE, sim).published_view()


def test_gpu_holding_mig_instances_stays_offered(sim: Simulator) -> None:
    uuid = sim.gpus()[5].uuid
    sim.set_mig_mode(uuid, True)
    profile = next(p for p in sim.mig_profiles(uuid) if p.name == "1g.10gb")
    gi = sim.create_gpu_instance(uuid, profile.profile_id, 0)
    inv = discover(NODE, sim, [(uuid, gi.gi_id)], mig_offer=set())
    gpu5 = inv.gpu("gpu-5")
    assert gpu5 is not None and gpu5.offer_dynamic_mig and gpu5.mig_slots and not gpu5.mig_withdrawn
    assert all(not g.offer_dynamic_mig for g in inv.gpus if g.name != "gpu-5")


def test_placement_allocated_before_the_offer_shrank_still_resolves(sim: Simulator) -> None:
    before = discover(NODE, sim, mig_offer={"gpu-3"})
    name = next(s.name for s in before.gpus[3].mig_slots if s.profile.name == "3g.40gb")
    after = discover(NODE, sim, mig_offer=set())
    assert name not in after.device_names()
    found = after.mig_slot(name)
    assert found is not None
    gpu, slot = found
    assert gpu.name == "gpu-3" and slot.profile.name == "3g.40gb" and slot.name == name
    assert after.mig_slot("gpu-3-mig-3g-40gb-1") is None  # no such placement: still refused


@pytest.mark.parametrize(
    "text",
    [
        "",
        "[]",
        '{"version": 2, "nodes": {}}',
        '{"version": 1, "nodes": []}',
        '{"version": 1, "nodes": {"n": "gpu-0"}}',
        '{"version": 1, "nodes": {"n": ["gpu-0; rm -rf /"]}}',
        '{"version": 1, "nodes": {"n": [["gpu-0"]]}}',
        '{"version": 1, "nodes": {"n": [' + ",".join('"gpu-1"' for _ in range(65)) + "]}}",
        "[" * 10_000,
        '{"version": 1, "nodes": {"": ["gpu-0"]}}',
    ],
)
def test_hostile_offer_text_is_refused(text: str) -> None:
    with pytest.raises(mig_offer.OfferError):
        mig_offer.parse(text)


def test_offer_round_trip_and_node_view() -> None:
    offer = mig_offer.Offer({"b": frozenset({"gpu-1", "gpu-0"}), "a": frozenset({"gpu-7"}), "c": frozenset()})
    text = mig_offer.render(offer)
    assert text == '{"nodes":{"a":["gpu-7"],"b":["gpu-0","gpu-1"]},"version":1}'
    assert mig_offer.parse(text).for_node("b") == {"gpu-0", "gpu-1"}
    assert node_offer({mig_offer.DATA_KEY: text}, "z") == frozenset()
    assert node_offer(None, "a") is None  # no ConfigMap: every GPU
    with pytest.raises(mig_offer.OfferError):
        node_offer({}, "a")


def _held(uid: str, device: str, gpu_uuid: str, mig: bool) -> ClaimRecord:
    record = (
        MigRecord(parent_uuid=gpu_uuid, profile_id=19, profile_name="1g.10gb", start=0, size=1, gi_id=1, ci_id=0)
        if mig
        else None
    )
    dev = DeviceRecord(
        request_names=["r"],
        pool=NODE,
        device=device,
        kind="mig" if mig else "gpu",
        gpu_uuid=gpu_uuid,
        gpu_minor=3,
        mig=record,
    )
    return ClaimRecord(uid=uid, namespace="t", name=uid, phase="PrepareCompleted", devices=[dev])


def _alloc(device: str) -> ClaimAllocation:
    return ClaimAllocation("new", "t", "new", (AllocatedDevice("r", NODE, device, None, False, {}),), ())


def test_mig_device_of_a_gpu_held_whole_is_refused(sim: Simulator) -> None:
    """Only possible in the moment a GPU leaves the MIG offer: the driver refuses rather than overlap (the
    reverse, a whole GPU beside MIG instances, is refused at prepare: test_mig_rules)."""
    inv = discover(NODE, sim, mig_offer={"gpu-3"})
    uuid = inv.gpus[3].info.uuid
    mig_name = next(s.name for s in inv.gpus[3].mig_slots if s.profile.name == "1g.10gb")
    with pytest.raises(ClaimError, match="already held whole by claim t/old"):
        plan_claim(inv, {"old": _held("old", "gpu-3", uuid, mig=False)}, _alloc(mig_name), NODE, "gpu.gpuplane.dev")
    other = next(s.name for s in inv.gpus[3].mig_slots if s.profile.name == "2g.20gb")
    plan = plan_claim(inv, {"old": _held("old", mig_name, uuid, mig=True)}, _alloc(other), NODE, "gpu.gpuplane.dev")
    assert [slot.name for _, _, slot in plan.devices if slot is not None] == [other]  # two MIG devices: fine


def test_offer_watch_keeps_the_last_good_offer_and_tells_only_changes() -> None:
    changes: list[frozenset[str] | None] = []
    watch = OfferWatch(client.ApiClient(), "a", lambda: changes.append(watch.current()))
    good = mig_offer.render(mig_offer.Offer({"a": frozenset({"gpu-1"})}))
    watch._apply({mig_offer.DATA_KEY: good}, present=True)
    watch._apply({mig_offer.DATA_KEY: good}, present=True)  # unchanged: not told again
    watch._apply({mig_offer.DATA_KEY: '{"version": 1, "nodes": {"a": ["../etc"]}}'}, present=True)  # malformed
    watch._apply(None, present=True)  # a ConfigMap without the key: malformed too
    assert watch.current() == {"gpu-1"}
    watch._apply(None, present=False)  # deleted: every GPU again
    assert changes == [frozenset({"gpu-1"}), None]


def test_mig_placements_flag_chooses_offer_all_or_none() -> None:
    """dynamic (the default) follows the controller's offer; all publishes every GPU's placements and reads no
    offer (a node pool kept for MIG); off publishes whole GPUs only."""
    base = ["--node-name=n", "--backend=sim", "--sim-profile=hgx-h100"]
    modes = {m: config.parse_args([*base, f"--mig-placements={m}"]) for m in ("dynamic", "all", "off")}
    assert (config.parse_args(base).mig_placements, config.parse_args(base).mig_offer) == (True, True)
    assert [(c.mig_placements, c.mig_offer) for c in modes.values()] == [(True, True), (True, False), (False, False)]
