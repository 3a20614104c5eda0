"""The controller's MIG offer: sized from waiting claims and a spare set, grown at once, shrunk slowly, never
withdrawn under an allocated MIG device; and the snapshot it decides on, read from claims, pods and slices."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuplane.api.mig_offer import NODE_LABEL, NODE_LABEL_VALUE, Offer
from gpuplane.controller import indexed, names
from gpuplane.controller.migoffer import snapshot
from gpuplane.controller.migoffer.decide import Gpu, Memory, Node, Settings, Waiting, decide, node_labels, published
from gpuplane.controller.node import pod_nodes, slice_index
from gpuplane.driver.hw.sim import SimConfig, Simulator
from gpuplane.driver.inventory import discover
from gpuplane.driver.publish.slices import build_pool, render_slices

H100 = "NVIDIA H100 80GB HBM3"
S = Settings(spare_per_pool=2, shrink_after_s=600.0, withdraw_per_pass=1, grace_s=2.0)


def fleet(
    n: int = 4,
    *,
    mig: set[tuple[str, str]] = frozenset(),
    whole: set[tuple[str, str]] = frozenset(),
    cordoned: set[str] = frozenset(),
) -> tuple[Node, ...]:
    return tuple(
        Node(
            name=f"n{i}",
            pool="h100",
            schedulable=f"n{i}" not in cordoned,
            labels={"zone": "a" if i < 2 else "b"},
            gpus=tuple(
                Gpu(
                    f"gpu-{g}",
                    H100,
                    mig_allocated=(f"n{i}", f"gpu-{g}") in mig,
                    whole_allocated=(f"n{i}", f"gpu-{g}") in whole,
                )
                for g in range(8)
            ),
        )
        for i in range(n)
    )


def keys(offer: Offer) -> set[tuple[str, str]]:
    return {(n, g) for n, gpus in offer.nodes.items() for g in gpus}


def test_idle_fleet_offers_the_spare_set_only() -> None:
    d = decide(fleet(), (), Memory(), S, now=0.0)
    assert keys(d.offer) == {("n0", "gpu-0"), ("n0", "gpu-1")}
    assert d.explain == ()


def test_spares_skip_whole_allocated_and_cordoned() -> None:
    d = decide(fleet(whole={("n0", "gpu-0")}, cordoned={"n1"}), (), Memory(), S, now=0.0)
    assert keys(d.offer) == {("n0", "gpu-1"), ("n0", "gpu-2")}


def test_a_waiting_claim_grows_the_offer_at_once_where_its_pod_may_go_and_is_told_once() -> None:
    zone_b = lambda node, labels: labels.get("zone") == "b"  # noqa: E731
    w = Waiting("team/c", frozenset({"3g.40gb"}), zone_b, age_s=5.0)
    d = decide(fleet(), (w,), Memory(), S, now=0.0)
    assert ("n2", "gpu-0") in keys(d.offer)
    assert d.grown[0] == ("n2", "gpu-0")
    assert len(d.explain) == 1 and d.explain[0][0] == "team/c"
    assert d.explain[0][1].startswith("waiting for a MIG offer on n2 (pool h100)")
    again = decide(fleet(), (w,), d.memory, S, now=2.0)
    assert again.explain == () and keys(again.offer) == keys(d.offer)  # served by the GPU offered for it


def test_a_claim_in_its_first_seconds_takes_room_but_is_told_only_if_it_needed_a_new_gpu() -> None:
    young = Waiting("team/c", frozenset({"3g.40gb"}), None, age_s=0.5)
    spares = Offer({"n0": frozenset({"gpu-0", "gpu-1"})})
    mem = Memory(offer=spares, written=True, needed_at={("n0", "gpu-0"): 0.0, ("n0", "gpu-1"): 0.0})
    d = decide(fleet(), (young,), mem, S, now=1.0)
    # Room on a spare already offered: the scheduler's first try places it; not told; the spare set refilled.
    assert d.explain == () and len(keys(d.offer)) == 3
    fresh = decide(fleet(), (young,), Memory(written=True), S, now=1.0)
    assert [k for k, _ in fresh.explain] == ["team/c"] and "offered for MIG now" in fresh.explain[0][1]


def test_a_new_claim_gets_room_of_its_own_beside_an_older_one_in_the_schedulers_back_off() -> None:
    """Issue 36: two 7g claims, one waiting 20 s (its pod in kube-scheduler's back-off), one just made. Both get a
    GPU: when the new pod takes the GPU offered for the old one, the old one's retry finds the other."""
    old = Waiting("t/old", frozenset({"7g.80gb"}), None, age_s=20.0)
    new = Waiting("t/new", frozenset({"7g.80gb"}), None, age_s=0.1)
    none_spare = Settings(spare_per_pool=0, grace_s=2.0)
    d = decide(fleet(), (old, new), Memory(written=True), none_spare, now=0.0)
    assert len(d.grown) == 2 and len(keys(d.offer)) == 2


def test_small_profiles_pack_onto_one_offered_gpu() -> None:
    waiting = tuple(Waiting(f"t/c{i}", frozenset({"1g.10gb"}), None, age_s=10.0) for i in range(7))
    d = decide(fleet(), waiting, Memory(), S, now=0.0)
    # seven 1g claims fit one GPU; two idle spares stay beside it
    assert len(keys(d.offer)) == 3


def test_unknown_profile_is_explained_and_offers_nothing() -> None:
    d = decide(fleet(), (Waiting("t/c", frozenset({"9g.999gb"}), None, age_s=10.0),), Memory(), S, now=0.0)
    assert len(keys(d.offer)) == 2
    assert "no free GPU" in d.explain[0][1] and "9g.999gb" in d.explain[0][1]


def test_shrinks_slowly_and_never_under_an_allocated_mig_device() -> None:
    offered = Offer({"n3": frozenset(f"gpu-{g}" for g in range(6))})
    mem = Memory(offer=offered, written=True, needed_at={("n3", f"gpu-{g}"): 0.0 for g in range(6)})
    nodes = fleet(mig={("n3", "gpu-5")})
    early = decide(nodes, (), mem, S, now=100.0)
    assert keys(early.offer) == keys(offered) and early.withdrawn == ()
    d, now = early, 700.0
    for _ in range(10):
        d = decide(nodes, (), d.memory, S, now=now)
        assert len(d.withdrawn) <= 1
        now += 2.0
    # gpu-5 holds a MIG device: never withdrawn; two idle spares stay; the other three went one per pass
    assert keys(d.offer) == {("n3", "gpu-5"), ("n3", "gpu-3"), ("n3", "gpu-4")}


def test_gpu_with_allocated_mig_device_is_offered_even_if_never_chosen() -> None:
    d = decide(fleet(mig={("n2", "gpu-6")}), (), Memory(), S, now=0.0)
    assert ("n2", "gpu-6") in keys(d.offer)


def test_driver_published_gpus_count_once_the_offer_exists() -> None:
    nodes = (Node("n0", "h100", True, {}, (Gpu("gpu-0", H100, mig_published=True), Gpu("gpu-1", H100))),)
    assert keys(decide(nodes, (), Memory(written=True), S, now=0.0).offer) == {("n0", "gpu-0"), ("n0", "gpu-1")}
    # before any offer exists every GPU is published: that is not demand
    assert keys(decide(nodes, (), Memory(), Settings(spare_per_pool=1), now=0.0).offer) == {("n0", "gpu-0")}


def test_one_namespaces_waiting_claims_hold_room_on_a_bounded_number_of_gpus() -> None:
    """Issue 36 / tenancy: 20 waiting full-GPU claims of one namespace (pods that may never run) are given room on
    at most ``gpus_per_namespace`` GPUs, told why the rest wait; another namespace's claim still grows the offer."""
    limited = Settings(spare_per_pool=2, grace_s=2.0, gpus_per_namespace=4)
    hog = tuple(Waiting(f"hog/c{i:02d}", frozenset({"7g.80gb"}), None, age_s=100.0 - i) for i in range(20))
    other = Waiting("team/c", frozenset({"7g.80gb"}), None, age_s=5.0)
    d = decide(fleet(), (*hog, other), Memory(), limited, now=0.0)
    # 4 for the hog, 1 for the other team, 2 idle spares: 7 of 32 GPUs, not 20 + 1 + 2
    assert len(keys(d.offer)) == 7, keys(d.offer)
    told = dict(d.explain)
    assert told["team/c"].startswith("waiting for a MIG offer on")
    capped = [k for k, m in told.items() if "namespace hog" in m and "--mig-offer-gpus-per-namespace" in m]
    assert len(capped) == 16, told
    # The next pass: still bounded (the spares the hog's claims took are not a way past it), told once each.
    again = decide(fleet(), (*hog, other), d.memory, limited, now=2.0)
    assert len(keys(again.offer)) == 7 and again.explain == ()
    # Without the bound every one of the hog's claims is given a GPU of its own.
    unbounded = decide(fleet(), (*hog, other), Memory(), Settings(spare_per_pool=2, gpus_per_namespace=99), now=0.0)
    assert len(keys(unbounded.offer)) == 23


def test_exactly_the_nodes_the_offer_names_carry_the_mig_offered_label() -> None:
    offer = Offer({"n0": frozenset({"gpu-0"}), "n2": frozenset({"gpu-1", "gpu-2"})})
    on = {NODE_LABEL: NODE_LABEL_VALUE}
    labels = {"n0": {}, "n1": on, "n2": on, "n3": {NODE_LABEL: "false"}, "n4": {"zone": "a"}}
    assert node_labels(offer, labels) == (("n0", True), ("n1", False))
    assert node_labels(offer, {"n0": on, "n2": on}) == ()  # in line: nothing to write
    assert node_labels(Offer(), {"n0": on}) == (("n0", False),)
    # With the offer off, every node whose slices publish MIG placements is labelled.
    nodes = (
        Node("n0", "h100", True, {}, (Gpu("gpu-0", H100, mig_published=True), Gpu("gpu-1", H100))),
        Node("n1", "h100", True, {}, (Gpu("gpu-0", H100),)),
    )
    assert published(nodes) == Offer({"n0": frozenset({"gpu-0"})})
    assert node_labels(published(nodes), {"n0": {}, "n1": on}) == (("n0", True), ("n1", False))


# --- the snapshot, from what users and drivers wrote ---------------------------------------------------------
NOW = datetime.datetime(2026, 12, 6, 8, 0, tzinfo=datetime.UTC)


def claim(name: str, requests: list[Any], allocation: dict[str, Any] | None = None) -> indexed.ClaimView:
    """The claim as the claim index holds it (the snapshot reads nothing else)."""
    out: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "t", "uid": name, "creationTimestamp": "2026-12-06T07:59:50Z"},
        "spec": {"devices": {"requests": requests}},
        "status": {},
    }
    if allocation is not None:
        out["status"]["allocation"] = allocation
    return indexed.claim(out)


def mig_request(expr: str) -> dict[str, Any]:
    return {
        "name": "r",
        "exactly": {"deviceClassName": "mig.gpuplane.dev", "selectors": [{"cel": {"expression": expr}}]},
    }


def test_waiting_claims_read_from_claims_and_pending_pods() -> None:
    claims = {
        "t/a": claim("a", [mig_request('device.attributes["gpu.gpuplane.dev"].migProfile == "3g.40gb"')]),
        "t/b": claim("b", [{"name": "r", "exactly": {"deviceClassName": "gpu.gpuplane.dev"}}]),
        "t/c": claim("c", [mig_request("true")]),
        "t/d": claim("d", [mig_request("x")], allocation={"devices": {"results": []}}),
        "t/e": claim("e", [{"name": "r", "firstAvailable": [{"deviceClassName": "mig.gpuplane.dev"}, 7, None]}]),
        "t/f": claim("f", "not a list"),  # type: ignore[arg-type]
        "t/g": claim("g", [mig_request("true")]),  # no pending pod
    }
    pods = {
        f"t/p{k}": indexed.pending_pod(
            {"spec": {"nodeSelector": {"zone": "b"}} if k == "a" else {"affinity": {"nodeAffinity": 3}}}
        )
        for k in "abcdef"
    }
    consumers = {f"t/{k}": [f"p{k}"] for k in "abcdefg"}
    got = {w.key: w for w in snapshot.waiting(claims, consumers, pods, NOW)}
    assert set(got) == {"t/a", "t/c", "t/e"}
    assert got["t/a"].profiles == {"3g.40gb"} and got["t/c"].profiles == frozenset()
    assert got["t/a"].age_s == pytest.approx(10.0)
    allowed = got["t/a"].allowed
    assert allowed is not None and allowed("n", {"zone": "b"}) and not allowed("n", {"zone": "a"})


def test_a_pod_held_by_someone_elses_gate_is_not_demand() -> None:
    """A claim counts only while its pod will be tried: no gate, gpuplane's gang gate, or the steer gate in a
    namespace opted in to steering; a tenant's own gate (or the steer gate where nobody lifts it) asks nothing."""
    request = [mig_request("true")]
    gates = {
        "none": [],
        "own": [{"name": "tenant.example/hold"}],
        "gang": [{"name": "gpuplane.dev/gang"}],
        "steer": [{"name": names.STEER_GATE}],
        "both": [{"name": names.STEER_GATE}, {"name": "tenant.example/hold"}],
        "full": [{"name": names.STEER_GATE}],  # annotations too full for steering to write: never lifted
    }
    claims = {f"t/{k}": claim(k, request) for k in gates}
    bodies = {f"t/p{k}": {"metadata": {"namespace": "t"}, "spec": {"schedulingGates": g}} for k, g in gates.items()}
    bodies["t/pfull"]["metadata"]["annotations"] = {"tenant/blob": "x" * indexed.ANNOTATIONS_FULL}
    pods = {k: indexed.pending_pod(b) for k, b in bodies.items()}
    consumers = {f"t/{k}": [f"p{k}"] for k in gates}
    opted = {w.key for w in snapshot.waiting(claims, consumers, pods, NOW, steering={"t"})}
    assert opted == {"t/none", "t/gang", "t/steer"}
    not_opted = {w.key for w in snapshot.waiting(claims, consumers, pods, NOW, steering={"other"})}
    assert not_opted == {"t/none", "t/gang"}
    assert {w.key for w in snapshot.waiting(claims, consumers, pods, NOW)} == {"t/none", "t/gang"}  # not read yet
    # One pod of a claim that will be tried is enough.
    both = {"t/none": claim("none", request)}
    shared = {"t/none": ["pown", "pnone"]}
    assert [w.key for w in snapshot.waiting(both, shared, pods, NOW)] == ["t/none"]


def test_the_mig_offered_label_a_pod_asks_for_is_met_on_every_node() -> None:
    """The controller labels the nodes it offers MIG on; a pod asking for the label may use any node the offer
    could grow onto, so the offer and steering read it as met (the pod's other constraints still count)."""
    by_selector = {"spec": {"nodeSelector": {NODE_LABEL: NODE_LABEL_VALUE}}}
    assert pod_nodes.node_filter(indexed.pending_pod(by_selector)) is None
    also_zone = {"spec": {"nodeSelector": {NODE_LABEL: NODE_LABEL_VALUE, "zone": "b"}}}
    allowed = pod_nodes.node_filter(indexed.pending_pod(also_zone))
    assert allowed is not None and allowed("n", {"zone": "b"}) and not allowed("n", {"zone": "a"})
    expr = {"key": NODE_LABEL, "operator": "In", "values": [NODE_LABEL_VALUE]}
    by_affinity = {
        "spec": {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [expr, {"key": "zone", "operator": "In", "values": ["a"]}]}
                        ]
                    }
                }
            }
        }
    }
    allowed = pod_nodes.node_filter(indexed.pending_pod(by_affinity))
    assert allowed is not None and allowed("n", {"zone": "a"}) and not allowed("n", {"zone": "b"})
    only_label = {
        "spec": {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [expr]}]
                    }
                }
            }
        }
    }
    assert pod_nodes.node_filter(indexed.pending_pod(only_label)) is None


def test_the_steer_gate_is_steerings() -> None:
    from gpuplane.controller.steer import decide as steer_decide

    assert steer_decide.Settings().gate == names.STEER_GATE


@pytest.fixture
def slices(tmp_path: Path) -> Iterator[list[slice_index.SliceDigest]]:
    sim = Simulator(SimConfig(profile="hgx-h100", state_dir=tmp_path / "sim", node_name="n0", durable=False))
    sim.init()
    try:
        objs = render_slices(build_pool(discover("n0", sim, mig_offer={"gpu-2"})), 1)
    finally:
        sim.shutdown()
    digests = [slice_index.digest(o["metadata"]["name"], o["spec"]) for o in objs]
    yield [d for d in digests if d is not None]


def test_nodes_from_slices_and_allocations(slices: list[slice_index.SliceDigest]) -> None:
    alloc = {
        "devices": {
            "results": [
                {"driver": "gpu.gpuplane.dev", "pool": "n0", "device": "gpu-2-mig-1g-10gb-0", "request": "r"},
                {"driver": "gpu.gpuplane.dev", "pool": "n0", "device": "gpu-4", "request": "r"},
                {"driver": "other.dev", "pool": "n0", "device": "gpu-5", "request": "r"},
                {"driver": "gpu.gpuplane.dev", "pool": ["x"], "device": "gpu-6", "request": "r"},
            ]
        }
    }
    nodes_index = {"n0": indexed.NodeView("n0", schedulable=True, labels={"gpuplane.dev/node-pool": "inference"})}
    (node,) = snapshot.nodes(slices, nodes_index, [claim("a", [], alloc)])
    assert node.pool == "inference" and node.schedulable
    gpus = {g.name: g for g in node.gpus}
    assert len(gpus) == 8 and gpus["gpu-0"].product.startswith("NVIDIA H100")
    assert gpus["gpu-2"].mig_published and gpus["gpu-2"].mig_allocated and not gpus["gpu-0"].mig_published
    assert gpus["gpu-4"].whole_allocated and not gpus["gpu-5"].whole_allocated and not gpus["gpu-6"].whole_allocated
    (unlabelled,) = snapshot.nodes(slices, {}, [])
    assert unlabelled.pool.startswith("NVIDIA H100") and not unlabelled.schedulable


def test_a_withdrawn_gpu_still_published_by_a_slow_driver_is_not_taken_back() -> None:
    offered = Offer({"n3": frozenset({"gpu-0", "gpu-1", "gpu-2"})})
    mem = Memory(offer=offered, written=True, needed_at={("n3", f"gpu-{g}"): 0.0 for g in range(3)})
    d = decide(fleet(), (), mem, S, now=700.0)
    (gone,) = d.withdrawn
    slow = tuple(
        Node(
            n.name,
            n.pool,
            n.schedulable,
            n.labels,
            tuple(Gpu(g.name, g.product, mig_published=(n.name, g.name) in keys(offered)) for g in n.gpus),
        )
        for n in fleet()
    )
    again = decide(slow, (), d.memory, S, now=702.0)
    assert gone not in keys(again.offer)
    later = decide(slow, (), again.memory, S, now=800.0)  # still published long after: a driver's own (MIG mode)
    assert gone in keys(later.offer)
