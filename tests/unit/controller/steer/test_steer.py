"""Gate-and-steer: the pod patches, a claim's shape, one decision pass, and the pass's writes."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuplane.controller import claimtemplate, deviceclass, indexed, steps
from gpuplane.controller.node import snapshot_builder
from gpuplane.controller.steer import decide, gate, reconciler, shape
from gpuplane.driver import inventory
from gpuplane.driver.hw.sim import SimConfig, Simulator
from gpuplane.driver.publish import slices
from gpuplane.placement import model
from gpuplane.placement.policies import gpuplane
from tests import controllerkit

GATE = decide.Settings().gate


@pytest.fixture(scope="module")
def pool() -> Iterator[list[dict[str, Any]]]:
    objs: list[dict[str, Any]] = []
    for node in ("n1", "n2"):
        root = Path(tempfile.mkdtemp(prefix="sg"))
        sim = Simulator(SimConfig(profile="hgx-h100", state_dir=root, node_name=node, durable=False))
        sim.init()
        try:
            objs += slices.render_slices(slices.build_pool(inventory.discover(node, sim)), 1)
        finally:
            sim.shutdown()
            shutil.rmtree(root, ignore_errors=True)
    yield objs


@pytest.fixture(scope="module")
def classes() -> dict[str, deviceclass.ClassView]:
    return controllerkit.shipped_classes()


def template(ns: str, name: str, exactly: dict[str, Any]) -> claimtemplate.TemplateView:
    """A ResourceClaimTemplate of one request, as the template index keeps it."""
    return claimtemplate.view(
        {
            "metadata": {"namespace": ns, "name": name},
            "spec": {"spec": {"devices": {"requests": [{"name": "g", "exactly": exactly}]}}},
        }
    )


MIG3 = {
    "deviceClassName": "mig.gpuplane.dev",
    "selectors": [{"cel": {"expression": 'device.attributes["gpu.gpuplane.dev"].migProfile == "3g.40gb"'}}],
}


def pod(name: str, tmpl: str = "t3g", gates: tuple[str, ...] = (GATE,), **spec: Any) -> indexed.PodView:
    """A pending pod as the index holds it."""
    return indexed.pending_pod(
        {
            "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}"},
            "spec": {
                "resourceClaims": [{"name": "g", "resourceClaimTemplateName": tmpl}],
                "schedulingGates": [{"name": g} for g in gates],
                **spec,
            },
        }
    )


def test_patches_lift_only_our_gate_and_write_the_node() -> None:
    p = pod("a", gates=("other", GATE))
    prefer = gate.steer_patch(p, "n1", "prefer", GATE)
    assert prefer[0] == {"op": "test", "path": "/spec/schedulingGates", "value": [{"name": "other"}, {"name": GATE}]}
    assert prefer[1]["value"] == [{"name": "other"}]
    term = prefer[2]["value"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["weight"] == 100 and term["preference"]["matchExpressions"][0]["values"] == ["n1"]
    require = gate.steer_patch(p, "n1", "require", GATE)
    req = require[2]["value"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert req["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}
    ]
    assert gate.release_patch(p, GATE) == prefer[:2]
    assert gate.pinned_node(pod("b", nodeSelector={"kubernetes.io/hostname": "n2"})) == "n2"
    assert gate.pinned_node(p) is None


def test_shape_of_a_mig_and_a_whole_gpu_claim(pool: list[dict[str, Any]], classes: dict[str, Any]) -> None:
    view = snapshot_builder.build_view(pool)
    got = shape.shape_of(pod("a"), template("ns", "t", MIG3).claim_spec, "template t", classes, view)
    assert isinstance(got, shape.Shape) and got.request.mig_profile == "3g" and len(got.gpus) == 16
    two = {"deviceClassName": "gpu.gpuplane.dev", "count": 2}
    got = shape.shape_of(pod("a"), template("ns", "t", two).claim_spec, "template t", classes, view)
    assert isinstance(got, shape.Shape) and got.request.gpus_per_member == 2 and got.request.mig_profile is None
    odd = {
        "deviceClassName": "gpu.gpuplane.dev",
        "selectors": [{"cel": {"expression": "device.capacity['x'].compareTo(quantity('1')) > 0"}}],
    }
    reason = shape.shape_of(pod("a"), template("ns", "t", odd).claim_spec, "template t", classes, view)
    assert isinstance(reason, str) and "outside what the controller evaluates" in reason
    share = {"deviceClassName": "gpu.gpuplane.dev", "capacity": {"requests": {"sharePercent": "50"}}}
    reason = shape.shape_of(pod("a"), template("ns", "t", share).claim_spec, "template t", classes, view)
    assert isinstance(reason, str) and "share" in reason
    missing = shape.claim_spec_of(pod("a", tmpl="nope"), {}, {})
    assert isinstance(missing, str) and missing.endswith("not known (yet)")


def test_a_pass_packs_three_3g_and_releases_what_does_not_fit(
    pool: list[dict[str, Any]], classes: dict[str, Any]
) -> None:
    view = snapshot_builder.build_view(pool)
    templates = {"ns/t3g": template("ns", "t3g", MIG3)}
    gated = [decide.Gated(f"ns/p{i}", pod(f"p{i}"), float(i)) for i in range(3)]
    gated.append(decide.Gated("ns/pinned", pod("pinned", nodeSelector={"kubernetes.io/hostname": "n2"}), 5.0))
    gated.append(decide.Gated("ns/old", pod("old"), -100.0))
    actions = decide.decide(
        gated, decide.Inputs(view, {}, templates, classes), gpuplane.GpuPlane(), now=10.0, settings=decide.Settings()
    )
    by = {a.key: a for a in actions}
    steered = [by[f"ns/p{i}"] for i in range(3)]
    assert all(a.kind == "steer" for a in steered)
    assert {a.placement.node for a in steered if a.placement} == {
        steered[0].placement.node if steered[0].placement else ""
    }
    assert all(a.placement and a.placement.mig[0].start == 4 for a in steered)  # never 3g@0: it strands
    assert len({a.placement.mig[0].gpu for a in steered if a.placement}) == 3
    assert by["ns/pinned"].kind == "release" and by["ns/pinned"].outcome == "pinned"
    assert by["ns/old"].kind == "release" and by["ns/old"].outcome == "timeout"


def test_every_3g_slot_4_taken_means_released_not_held(pool: list[dict[str, Any]], classes: dict[str, Any]) -> None:
    view = snapshot_builder.build_view(pool)
    templates = {"ns/t3g": template("ns", "t3g", MIG3)}
    gated = [decide.Gated(f"ns/p{i}", pod(f"p{i}"), float(i)) for i in range(17)]
    actions = decide.decide(
        gated, decide.Inputs(view, {}, templates, classes), gpuplane.GpuPlane(), now=20.0, settings=decide.Settings()
    )
    assert [a.kind for a in actions].count("steer") == 16  # one clean 3g per GPU
    assert actions[-1].kind == "release" and actions[-1].outcome == "no-room"
    assert "strand" in actions[-1].reason


class Writer:
    def __init__(self) -> None:
        self.steps: list[tuple[str, steps.Step]] = []

    def run(self, namespace: str, step: steps.Step) -> None:
        self.steps.append((namespace, step))


def test_run_pass_writes_once_and_reserves(pool: list[dict[str, Any]], classes: dict[str, Any]) -> None:
    view = snapshot_builder.build_view(pool)
    templates = {"ns/t3g": template("ns", "t3g", MIG3)}
    state = reconciler.SteerState()
    w = Writer()
    pending = [pod("a"), pod("b")]
    kw: dict[str, Any] = {"view": view, "claims": {}, "templates": templates, "classes": classes}
    acts = reconciler.run_pass(w, gpuplane.GpuPlane(), None, state, decide.Settings(), pending=pending, now=1.0, **kw)
    state.drain()
    assert [a.kind for a in acts] == ["steer", "steer"] and len(w.steps) == 2
    ops = w.steps[0][1].body
    ann = ops[-1]["value"][reconciler.ANNOTATION_STEERED]
    assert decide.decode_placement(ann) == acts[0].placement
    # The index still shows the gate: the next pass must not decide (or write) again.
    assert (
        reconciler.run_pass(w, gpuplane.GpuPlane(), None, state, decide.Settings(), pending=pending, now=2.0, **kw)
        == []
    )
    # Once the patch lands, the pod is a reservation until its claim is allocated: from this replica's
    # memory, never from the annotation (which the pod's owner can write: issue 32, defect 3).
    landed = dataclasses.replace(pending[0], annotations={reconciler.ANNOTATION_STEERED: ann}, gates=())
    got = reconciler.reservations([landed], state, [], 2.0)
    assert [r.placement for r in got] == [a.placement for a in acts]
    assert reconciler.reservations([landed]) == []  # the annotation alone reserves nothing


def test_a_pod_patched_but_not_yet_seen_patched_still_reserves(
    pool: list[dict[str, Any]], classes: dict[str, Any]
) -> None:
    templates = {"ns/t3g": template("ns", "t3g", MIG3)}
    state = reconciler.SteerState()
    w = Writer()
    first = reconciler.run_pass(
        w,
        gpuplane.GpuPlane(),
        None,
        state,
        decide.Settings(),
        pending=[pod("a")],
        now=1.0,
        view=snapshot_builder.build_view(pool),
        claims={},
        templates=templates,
        classes=classes,
    )
    # The cache still shows "a" gated, without its annotation: its placement must still count.
    pending = [pod("a"), pod("c")]
    res = reconciler.reservations(pending, state, [], 1.5)
    assert [r.placement for r in res] == [first[0].placement]
    view = snapshot_builder.build_view(pool, reservations=res)
    second = reconciler.run_pass(
        w,
        gpuplane.GpuPlane(),
        None,
        state,
        decide.Settings(),
        pending=pending,
        now=1.5,
        view=view,
        claims={},
        templates=templates,
        classes=classes,
    )
    assert [a.key for a in second] == ["ns/c"]
    assert second[0].placement and first[0].placement
    assert second[0].placement.mig[0].gpu != first[0].placement.mig[0].gpu
    # Once the claim shows allocated (owned by the pod), the memory lets go.
    claim = indexed.claim(
        {"metadata": {"ownerReferences": [{"kind": "Pod", "uid": "uid-a"}]}, "status": {"allocation": {"x": 1}}}
    )
    assert all(r.gang != "steer:ns/a" for r in reconciler.reservations(pending, state, [claim], 2.0))


def test_a_failed_patch_is_decided_again(pool: list[dict[str, Any]], classes: dict[str, Any]) -> None:
    from gpuplane.controller import kube

    class Failing(Writer):
        def run(self, namespace: str, step: steps.Step) -> None:
            raise kube.StepFailed("422 the test op failed")

    templates = {"ns/t3g": template("ns", "t3g", MIG3)}
    state = reconciler.SteerState()
    kw: dict[str, Any] = {
        "view": snapshot_builder.build_view(pool),
        "claims": {},
        "templates": templates,
        "classes": classes,
    }
    reconciler.run_pass(
        Failing(), gpuplane.GpuPlane(), None, state, decide.Settings(), pending=[pod("a")], now=1.0, **kw
    )
    state.drain()
    assert state.decided == {} and state.reserved == {}
    w = Writer()
    again = reconciler.run_pass(
        w, gpuplane.GpuPlane(), None, state, decide.Settings(), pending=[pod("a")], now=2.0, **kw
    )
    state.drain()
    assert [a.kind for a in again] == ["steer"] and len(w.steps) == 1


def test_a_reservation_that_clashes_with_a_real_allocation_is_left_out(pool: list[dict[str, Any]]) -> None:
    gpu = next(g.id for g in snapshot_builder.build_view(pool).gpus)
    node = gpu.split("/")[0]
    claim = {
        "metadata": {"namespace": "ns", "name": "c"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "driver": "gpu.gpuplane.dev",
                            "pool": node,
                            "device": gpu.split("/")[1] + "-mig-2g-20gb-4",
                            "request": "g",
                        }
                    ]
                }
            }
        },
    }
    clash = snapshot_builder.Reservation(
        "steer:ns/p", model.MemberPlacement(0, node, "d", mig=(model.MigSlot(gpu, "3g", 4),))
    )
    view = snapshot_builder.build_view(pool, [indexed.claim(claim)], reservations=[clash])
    snap = view.snapshot()  # would raise on the overlap
    assert snap.gpu(gpu).mig == (model.MigInstance("2g", 4),)
