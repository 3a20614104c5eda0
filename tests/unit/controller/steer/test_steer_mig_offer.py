"""Steering under the MIG offer: a gated MIG pod that nothing published fits waits (gated) while the offer can
grow for it, the offer grows for its claim, and the pod is steered onto what the driver then publishes; never
onto a placement that is not published. Steering and the offer decide over the same catalogue."""

from __future__ import annotations

import dataclasses
import datetime
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from gpuplane.api.mig_offer import Offer
from gpuplane.controller import deviceclass, indexed, kube, steps
from gpuplane.controller.migoffer import decide as offer_decide
from gpuplane.controller.migoffer import snapshot
from gpuplane.controller.node import slice_index, snapshot_builder
from gpuplane.controller.steer import decide, offer_wait, reconciler
from gpuplane.controller.steer import run as steer_run
from gpuplane.controller.steer import writes as steer_writes
from gpuplane.driver import inventory
from gpuplane.driver.hw.sim import SimConfig, Simulator
from gpuplane.driver.publish import slices
from gpuplane.placement.policies import gpuplane
from tests import controllerkit

GATE = decide.Settings().gate
NOW = datetime.datetime(2026, 12, 6, 8, 0, tzinfo=datetime.UTC)
LABELS = {"n1": {"pool": "a"}, "n2": {"pool": "b"}}
MIG3 = 'device.attributes["gpu.gpuplane.dev"].migProfile == "3g.40gb"'


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, Simulator]]:
    out, roots = {}, []
    for node in LABELS:
        root = Path(tempfile.mkdtemp(prefix="som"))
        roots.append(root)
        sim = Simulator(SimConfig(profile="hgx-h100", state_dir=root, node_name=node, durable=False))
        sim.init()
        out[node] = sim
    yield out
    for sim in out.values():
        sim.shutdown()
    for root in roots:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def classes() -> dict[str, deviceclass.ClassView]:
    return controllerkit.shipped_classes()


def published(sims: Mapping[str, Simulator], offer: Offer) -> list[dict[str, Any]]:
    """Every node's slices as its driver publishes them under ``offer``."""
    objs: list[dict[str, Any]] = []
    for node, sim in sims.items():
        objs += slices.render_slices(
            slices.build_pool(inventory.discover(node, sim, mig_offer=offer.for_node(node))), 1
        )
    return objs


def spec(exactly: dict[str, Any]) -> dict[str, Any]:
    return {"devices": {"requests": [{"name": "g", "exactly": exactly}]}}


def mig3() -> dict[str, Any]:
    return spec({"deviceClassName": "mig.gpuplane.dev", "selectors": [{"cel": {"expression": MIG3}}]})


def pod(name: str, **spec: Any) -> indexed.PodView:
    """A gated pod as the pending-pod index holds it."""
    return indexed.pending_pod(
        {
            "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}"},
            "spec": {
                "resourceClaims": [{"name": "g", "resourceClaimName": f"{name}-g"}],
                "schedulingGates": [{"name": GATE}],
                "nodeSelector": {"pool": "b"},
                **spec,
            },
        }
    )


def claim_body(name: str, device: str | None = None) -> dict[str, Any]:
    stamp = "2026-12-06T07:59:50Z"
    out: dict[str, Any] = {
        "metadata": {"namespace": "ns", "name": f"{name}-g", "uid": f"c-{name}", "creationTimestamp": stamp},
        "spec": mig3(),
        "status": {},
    }
    if device is not None:
        result = {"driver": "gpu.gpuplane.dev", "pool": "n2", "device": device, "request": "g"}
        out["status"]["allocation"] = {"devices": {"results": [result]}}
    return out


def claim(name: str, device: str | None = None) -> indexed.ClaimView:
    """The claim as the claim index holds it."""
    return indexed.claim(claim_body(name, device))


def steer(
    objs: list[dict[str, Any]], claims: Mapping[str, indexed.ClaimView], pods: list[indexed.PodView], classes: Any
) -> dict[str, decide.Action]:
    view = snapshot_builder.build_view(objs, claims.values())
    gated = [decide.Gated(p.key, p, float(i)) for i, p in enumerate(pods)]
    inputs = decide.Inputs(view, claims, {}, classes, node_labels=LABELS)
    actions = decide.decide(gated, inputs, gpuplane.GpuPlane(), now=10.0, settings=decide.Settings())
    return {a.key: a for a in actions}


def grow(
    objs: list[dict[str, Any]], claims: Mapping[str, indexed.ClaimView], pods: list[indexed.PodView], memory: Any
) -> offer_decide.Decision:
    """One pass of the MIG offer over the same objects (the gated pods are pending: their claims are demand)."""
    digests = [d for o in objs if (d := slice_index.digest(o["metadata"]["name"], o["spec"])) is not None]
    index = {
        n: indexed.NodeView(n, schedulable=True, labels={**labels, snapshot.POOL_LABEL: "h100"})
        for n, labels in LABELS.items()
    }
    fleet = snapshot.nodes(digests, index, claims.values())
    pending = {p.key: p for p in pods}
    consumers = {f"{p.key}-g": [p.name] for p in pods}
    waiting = snapshot.waiting(claims, consumers, pending, NOW, steering={"ns"})  # opted in to steering
    return offer_decide.decide(fleet, waiting, memory, offer_decide.Settings(spare_per_pool=2), now=100.0)


def test_steering_waits_for_the_offer_which_grows_and_then_steers_onto_what_is_published(
    sims: Mapping[str, Simulator], classes: Any
) -> None:
    spare = Offer({"n1": frozenset({"gpu-0", "gpu-1"})})  # the spare set, on a node the pods may not use
    pods = [pod("p0"), pod("p1")]
    claims = {f"ns/{n}-g": claim(n) for n in ("p0", "p1")}
    objs = published(sims, spare)
    first = steer(objs, claims, pods, classes)
    assert [a.kind for a in first.values()] == ["wait", "wait"]
    assert {a.outcome for a in first.values()} == {"mig-offer"}
    assert "waiting for the MIG offer" in first["ns/p0"].reason

    d = grow(objs, claims, pods, offer_decide.Memory(offer=spare, written=True))
    assert d.offer.for_node("n2"), d.offer  # grown where the gated pods may go
    assert [k for k, _ in d.explain] == ["ns/p0-g", "ns/p1-g"]  # each claim told it waits for the offer
    objs = published(sims, d.offer)
    second = steer(objs, claims, pods, classes)
    p0 = second["ns/p0"]
    assert p0.kind == "steer" and p0.placement is not None and p0.placement.node == "n2"
    assert p0.placement.mig[0].start == 4  # the policy's choice, on a published placement
    # The offer packed both 3g claims onto one GPU; steering never takes 3g@0 (it strands): p1 waits on.
    assert second["ns/p1"].kind == "wait" and second["ns/p1"].outcome == "mig-offer"

    gpu = p0.placement.mig[0].gpu.rpartition("/")[2]
    claims["ns/p0-g"] = claim("p0", f"{gpu}-mig-3g-40gb-4")  # the scheduler allocated what steering chose
    d = grow(objs, claims, pods[1:], d.memory)
    assert len(d.offer.for_node("n2")) == 2 and d.grown and d.grown[0][0] == "n2"
    third = steer(published(sims, d.offer), claims, pods[1:], classes)
    p1 = third["ns/p1"]
    assert p1.kind == "steer" and p1.placement is not None and p1.placement.node == "n2"
    assert p1.placement.mig[0].start == 4 and p1.placement.mig[0].gpu != p0.placement.mig[0].gpu


def test_nothing_published_anywhere_waits_and_the_timeout_still_releases(
    sims: Mapping[str, Simulator], classes: Any
) -> None:
    objs = published(sims, Offer())
    claims = {"ns/p0-g": claim("p0")}
    got = steer(objs, claims, [pod("p0")], classes)["ns/p0"]
    assert got.kind == "wait" and got.outcome == "mig-offer"
    view = snapshot_builder.build_view(objs, claims.values())
    late = decide.decide(
        [decide.Gated("ns/p0", pod("p0"), -100.0)],
        decide.Inputs(view, claims, {}, classes, node_labels=LABELS),
        gpuplane.GpuPlane(),
        now=10.0,
        settings=decide.Settings(),
    )
    assert late[0].kind == "release" and late[0].outcome == "timeout"


def test_released_as_before_when_the_offer_cannot_grow_for_it(sims: Mapping[str, Simulator], classes: Any) -> None:
    every = Offer({n: frozenset(f"gpu-{i}" for i in range(8)) for n in LABELS})
    objs = published(sims, every)  # every GPU already publishes: nothing for the offer to add
    claims = {f"ns/p{i}-g": claim(f"p{i}") for i in range(9)}
    got = steer(objs, claims, [pod(f"p{i}") for i in range(9)], classes)
    assert [a.kind for a in got.values()].count("steer") == 8
    assert got["ns/p8"].kind == "release" and got["ns/p8"].outcome == "no-room"
    # A whole-GPU request nothing matches is not the offer's business either.
    whole = spec({"deviceClassName": "gpu.gpuplane.dev", "selectors": [{"cel": {"expression": "false"}}]})
    wclaims = {"ns/w-g": indexed.claim({**claim_body("w"), "spec": whole})}
    got = steer(objs, wclaims, [pod("w")], classes)
    assert got["ns/w"].kind == "release" and got["ns/w"].outcome == "unsteerable"


def test_growable_skips_busy_gpus_other_models_and_nodes_the_pod_may_not_use(sims: Mapping[str, Simulator]) -> None:
    objs = published(sims, Offer({"n2": frozenset({"gpu-0"})}))
    taken = claim("x", "gpu-1")  # n2/gpu-1 held whole
    view = snapshot_builder.build_view(objs, [taken])
    only_b = lambda node, labels: labels.get("pool") == "b"  # noqa: E731
    got = offer_wait.growable(view, frozenset({"3g.40gb"}), only_b, LABELS)
    assert got == tuple(f"n2/gpu-{i}" for i in range(2, 8))  # gpu-0 publishes 3g already; gpu-1 is busy
    assert offer_wait.growable(view, frozenset({"3g.71gb"}), only_b, LABELS) == ()  # a GB200 profile
    assert len(offer_wait.growable(view, frozenset(), None, LABELS)) == 14  # any profile, any node
    assert offer_wait.reason(spec({"deviceClassName": "gpu.gpuplane.dev"}), view, None, LABELS) is None


class FailingFor:
    """Writes every patch but those of pods named with ``prefix`` (a tenant's pod too large to write)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.steps: list[steps.Step] = []

    def run(self, namespace: str, step: steps.Step) -> None:
        if step.name.startswith(self.prefix):
            raise kube.StepFailed("413 request entity too large")
        self.steps.append(step)


def test_the_wait_is_written_once_on_the_pod_and_an_unwritable_pod_goes_behind(
    sims: Mapping[str, Simulator], classes: Any
) -> None:
    objs = published(sims, Offer())
    pods = [pod("full"), pod("ok")]
    claims = {f"ns/{n}-g": claim(n) for n in ("full", "ok")}
    state, w = reconciler.SteerState(), FailingFor("full")
    kw: dict[str, Any] = {"claims": claims, "templates": {}, "classes": classes, "node_labels": LABELS}
    view = snapshot_builder.build_view(objs, claims.values())
    acts = reconciler.run_pass(
        w, gpuplane.GpuPlane(), None, state, decide.Settings(), pending=pods, view=view, now=1.0, **kw
    )
    state.drain()
    assert {a.outcome for a in acts} == {"mig-offer"}
    (step,) = w.steps
    assert step.name == "ok" and [op["path"] for op in step.body] == ["/metadata/annotations"]
    assert step.body[0]["value"][reconciler.ANNOTATION_RESULT].startswith("mig-offer: waiting for the MIG offer")
    assert state.backoff["uid-full"][0] == 1 and "uid-ok" in state.told and not state.decided
    again = reconciler.run_pass(
        w, gpuplane.GpuPlane(), None, state, decide.Settings(), pending=pods, view=view, now=3.0, **kw
    )
    state.drain()
    assert [a.key for a in again] == ["ns/ok", "ns/full"] and len(w.steps) == 1  # told once; full failed again
    assert state.backoff["uid-full"][0] == 2
    # One clean 3g placement appears: the pod that can be written gets it, though the other is older.
    objs = published(sims, Offer({"n2": frozenset({"gpu-0"})}))
    view = snapshot_builder.build_view(objs, claims.values())
    gated = reconciler.gated_pods(pods, state, decide.Settings(), 10.0)
    assert [(g.key, g.failures) for g in gated] == [("ns/full", 2), ("ns/ok", 0)]
    inputs = decide.Inputs(view, claims, {}, classes, node_labels=LABELS)
    by = {a.key: a for a in decide.decide(gated, inputs, gpuplane.GpuPlane(), now=10.0, settings=decide.Settings())}
    assert by["ns/ok"].kind == "steer" and by["ns/full"].outcome == "mig-offer"


def test_a_pod_nothing_fits_waits_while_a_node_it_may_use_republishes(
    sims: Mapping[str, Simulator], classes: Any
) -> None:
    """Every GPU publishes and eight pods take them: the ninth is released no-room, unless a node it may use is
    rewriting its slices (mixed generations: part of its devices missing from the view), when it waits for the
    next pass without a write. Found by e2e test_steer: the victim was released while the offer's republish of
    its node was half written."""
    every = Offer({n: frozenset(f"gpu-{i}" for i in range(8)) for n in LABELS})
    objs = published(sims, every)
    claims = {f"ns/p{i}-g": claim(f"p{i}") for i in range(9)}
    view = snapshot_builder.build_view(objs, claims.values())
    gated = [decide.Gated(f"ns/p{i}", pod(f"p{i}"), float(i)) for i in range(9)]

    def last(republishing: frozenset[str]) -> decide.Action:
        inputs = decide.Inputs(view, claims, {}, classes, node_labels=LABELS, republishing=republishing)
        return decide.decide(gated, inputs, gpuplane.GpuPlane(), now=10.0, settings=decide.Settings())[-1]

    assert (last(frozenset()).kind, last(frozenset()).outcome) == ("release", "no-room")
    waiting = last(frozenset(LABELS))
    assert (waiting.kind, waiting.outcome) == (
        "wait",
        "republishing",
    ) and "republishing their devices" in waiting.reason
    assert steer_writes.writes_of([waiting], {}) == []  # nothing written for it: the next pass decides again
    digests = [slice_index.digest(o["metadata"]["name"], o["spec"]) for o in objs]
    steady = [d for d in digests if d is not None]
    assert steer_run.republishing(steady) == frozenset()
    half = [dataclasses.replace(d, generation=d.generation + 1) if i == 0 else d for i, d in enumerate(steady)]
    assert steer_run.republishing(half) == frozenset({steady[0].node})
    # The old generation already gone, the new one not all written: incomplete (kube-scheduler's own rule).
    first = steady[0]
    assert first.slice_count >= 1
    pool = [d for d in steady if d.pool == first.pool]
    promised = dataclasses.replace(first, slice_count=len(pool) + 1)
    started = [promised, *(d for d in steady if d is not first)]
    assert steer_run.republishing(started) == frozenset({first.node})
    assert slice_index.incomplete(steady) == frozenset()
