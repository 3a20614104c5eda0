"""Steering against hostile tenants (issue 32, defects 2, 3 and 9): gated pods outside the opted-in
namespaces, pods whose patches always fail, timeouts past the per-pass cap, oversized annotations,
forged reservations and a pending-pod index a tenant cannot inflate."""

from __future__ import annotations

import dataclasses
from typing import Any

from gpuplane.controller import indexed, kube, steps
from gpuplane.controller.node import snapshot_builder
from gpuplane.controller.steer import decide, gate, reconciler
from gpuplane.placement import model
from gpuplane.placement.policies import gpuplane
from tests.unit.controller.steer import test_steer as base
from tests.unit.controller.steer.test_steer import MIG3, Writer, template

pool = base.pool  # the same module-scoped fixtures: two simulated HGX nodes' slices, the DeviceClasses
classes = base.classes


def _body_in(ns: str, name: str, **meta: Any) -> dict[str, Any]:
    """A gated pod's body, as the API shows it."""
    return {
        "metadata": {"namespace": ns, "name": name, "uid": f"uid-{ns}-{name}", **meta},
        "spec": {
            "resourceClaims": [{"name": "g", "resourceClaimTemplateName": "t3g"}],
            "schedulingGates": [{"name": decide.Settings().gate}],
        },
    }


def _pod_in(ns: str, name: str, **meta: Any) -> indexed.PodView:
    """That pod as the index holds it."""
    return indexed.pending_pod(_body_in(ns, name, **meta))


class FailingFor(Writer):
    """Refuses every patch of the pods whose name starts with ``prefix`` (a pod too large to write)."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def run(self, namespace: str, step: steps.Step) -> None:
        if step.name.startswith(self.prefix):
            raise kube.StepFailed("413 request entity too large")
        super().run(namespace, step)


def _kw(pool: list[dict[str, Any]], classes: dict[str, Any]) -> dict[str, Any]:
    return {
        "view": snapshot_builder.build_view(pool),
        "claims": {},
        "templates": {f"{ns}/t3g": template(ns, "t3g", MIG3) for ns in ("ns", "evil", "kube-system")},
        "classes": classes,
    }


def test_gated_pods_outside_the_opted_in_namespaces_are_not_decided(
    pool: list[dict[str, Any]], classes: dict[str, Any]
) -> None:
    evil = [_pod_in("evil", f"evil-{i}") for i in range(70)]
    system = [_pod_in("kube-system", "sys")]
    victim = _pod_in("ns", "victim")
    state, w = reconciler.SteerState(), Writer()
    acts = reconciler.run_pass(
        w,
        gpuplane.GpuPlane(),
        None,
        state,
        decide.Settings(),
        pending=[*evil, *system, victim],
        now=1.0,
        opted_in={"ns", "kube-system"},  # even a labelled system namespace is never steered
        **_kw(pool, classes),
    )
    state.drain()
    assert [a.key for a in acts] == ["ns/victim"] and [s[0] for s in w.steps] == ["ns"]


def test_pods_whose_patches_fail_cannot_take_the_writes_of_the_others(
    pool: list[dict[str, Any]], classes: dict[str, Any]
) -> None:
    evil = [_pod_in("ns", f"evil-{i:02d}") for i in range(reconciler.MAX_WRITES + 6)]
    state, w = reconciler.SteerState(), FailingFor("evil-")
    kw = _kw(pool, classes)
    settings = decide.Settings(timeout_s=1000.0)
    # The attacker's pods are older: the first pass spends its writes on them, and every one fails.
    reconciler.run_pass(w, gpuplane.GpuPlane(), None, state, settings, pending=evil, now=1.0, **kw)
    state.drain()
    assert w.steps == [] and len(state.backoff) == reconciler.MAX_WRITES
    victim = _pod_in("ns", "victim")
    acts = reconciler.run_pass(w, gpuplane.GpuPlane(), None, state, settings, pending=[*evil, victim], now=1.5, **kw)
    state.drain()
    assert "ns/victim" in {a.key for a in acts} and [s[1].name for s in w.steps] == ["victim"]
    # After their pause the failed pods are decided again, but behind every pod that never failed.
    late = _pod_in("ns", "late")
    order = reconciler.writes_of(
        reconciler.run_pass(
            FailingFor("evil-"), gpuplane.GpuPlane(), None, state, settings, pending=[*evil, late], now=10.0, **kw
        ),
        {p.key: 1 for p in evil},
    )
    state.drain()
    assert order[0].key == "ns/late"
    assert state.backoff[evil[0].uid][0] == 2  # the pause doubles


def test_pods_whose_annotations_are_full_are_not_decided_and_reserve_nothing(
    pool: list[dict[str, Any]], classes: dict[str, Any]
) -> None:
    """Pods created before the victim, in one pass with it, whose annotations leave no room for steering's:
    undecided, so they reserve no GPU for a write the API would refuse, and the victim is steered (issue 32;
    found by ``tests/e2e/test_steer.py`` when the first pass saw the tenant's pods and the victim together)."""
    full = [_pod_in("ns", f"full-{i:02d}", annotations={"tenant/blob": "x" * (262_144 - 60)}) for i in range(40)]
    assert all(p.annotation_bytes > indexed.ANNOTATIONS_FULL and p.annotations_full for p in full)
    roomy = _pod_in("ns", "roomy", annotations={"tenant/blob": "x" * 200_000})
    victim = _pod_in("ns", "victim")
    state, w = reconciler.SteerState(), Writer()
    acts = reconciler.run_pass(
        w,
        gpuplane.GpuPlane(),
        None,
        state,
        decide.Settings(),
        pending=[*full, roomy, victim],
        now=1.0,
        **_kw(pool, classes),
    )
    state.drain()
    assert {a.key for a in acts} == {"ns/roomy", "ns/victim"}
    assert {a.key: a.kind for a in acts}["ns/victim"] == "steer"
    assert sorted(s[1].name for s in w.steps) == ["roomy", "victim"]


def test_timeout_releases_are_never_capped(pool: list[dict[str, Any]], classes: dict[str, Any]) -> None:
    many = [_pod_in("ns", f"p{i:03d}") for i in range(reconciler.MAX_WRITES * 2)]
    state, w = reconciler.SteerState(), Writer()
    for p in many:
        state.first_seen[p.uid] = 0.0
    acts = reconciler.run_pass(
        w,
        gpuplane.GpuPlane(),
        None,
        state,
        decide.Settings(timeout_s=30.0),
        pending=many,
        now=100.0,
        **_kw(pool, classes),
    )
    state.drain()
    assert {a.outcome for a in acts} == {"timeout"} and len(w.steps) == len(many)


def test_the_patch_names_only_gpuplanes_annotation_keys() -> None:
    p = _pod_in("ns", "fat", annotations={"tenant/blob": "x" * 250_000, reconciler.ANNOTATION_RESULT: "old"})
    placement = model.MemberPlacement(member=0, node="n1", domain="d", gpus=("n1/gpu-0",))
    body = reconciler.patch_for(p, decide.Action("steer", "ns/fat", "steered", "r", placement), decide.Settings())
    assert len(str(body)) < 2_000  # not the owner's 250 KB
    paths = [op["path"] for op in body if op["path"].startswith("/metadata")]
    assert paths == ["/metadata/annotations/gpuplane.dev~1steered", "/metadata/annotations/gpuplane.dev~1steer-result"]
    assert [op["op"] for op in body if op["path"].startswith("/metadata")] == ["add", "remove"]


def test_a_pod_with_only_foreign_annotations_keeps_them() -> None:
    p = _pod_in("ns", "kept", annotations={"kubectl.kubernetes.io/last-applied-configuration": "{}"})
    placement = model.MemberPlacement(member=0, node="n1", domain="d", gpus=("n1/gpu-0",))
    act = decide.Action("steer", "ns/kept", "steered", "r", placement)
    body = reconciler.patch_for(p, act, decide.Settings())
    assert [op["path"] for op in body if op["path"].startswith("/metadata")] == [
        "/metadata/annotations/gpuplane.dev~1steered"
    ]  # the map itself is not replaced (it holds the owner's key, which the index leaves out)
    bare = reconciler.patch_for(_pod_in("ns", "bare"), act, decide.Settings())
    assert next(op for op in bare if op["path"] == "/metadata/annotations")["op"] == "add"


def test_a_forged_steered_annotation_reserves_nothing(pool: list[dict[str, Any]], classes: dict[str, Any]) -> None:
    view = snapshot_builder.build_view(pool)
    every = [g.id for g in view.gpus]
    forged = decide.encode_placement(model.MemberPlacement(member=0, node="n1", domain="d", gpus=tuple(every[:8])))
    liar = dataclasses.replace(_pod_in("evil", "liar", annotations={reconciler.ANNOTATION_STEERED: forged}), gates=())
    assert reconciler.reservations([liar], reconciler.SteerState(), [], 1.0) == []


def test_the_pending_pod_index_keeps_nothing_a_tenant_can_inflate() -> None:
    body = _body_in(
        "evil",
        "fat",
        annotations={"tenant/blob": "x" * 250_000, "gpuplane.dev/steering": "off", "gpuplane.dev/big": "y" * 5000},
        labels={f"l{i}": "v" * 63 for i in range(1000)},
    )
    body["spec"]["containers"] = [
        {"name": "c", "image": "i", "env": [{"name": f"E{i}", "value": "v" * 100} for i in range(1000)]}
    ]
    kept = indexed.pending_pod(body)
    assert len(str(kept)) < 1_000
    assert kept.annotations == {"gpuplane.dev/steering": "off"}  # 5,000 characters: not ours
    assert kept.annotation_bytes > 250_000  # counted, not kept
    assert not hasattr(kept, "labels") and not hasattr(kept, "containers")


def test_a_steering_write_keeps_every_other_systems_gate_in_order() -> None:
    """Defect 6: the gate check compares every gate; the controller lifts gpuplane.dev/steer and only it."""
    gates = [{"name": "kueue.x-k8s.io/admission"}, {"name": "gpuplane.dev/steer"}, {"name": "example.com/other"}]
    gated = indexed.pending_pod({"spec": {"schedulingGates": gates}})
    settings = decide.Settings()
    for ops in (gate.release_patch(gated, settings.gate), gate.steer_patch(gated, "n1", "prefer", settings.gate)):
        test, replace = ops[0], ops[1]
        assert test == {"op": "test", "path": "/spec/schedulingGates", "value": gates}
        assert replace["value"] == [{"name": "kueue.x-k8s.io/admission"}, {"name": "example.com/other"}]
    assert gate.held_by(gated, settings.gate) and not gate.held_by(gated, "gpuplane.dev/gang")
    foreign_only = indexed.pending_pod({"spec": {"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]}})
    assert not gate.held_by(foreign_only, settings.gate)  # never decided, never written


def test_any_pod_body_reads_into_a_view_without_raising() -> None:
    """The pending-pod index parses what a tenant wrote once: fields of the wrong type read as absent."""
    odd = indexed.pending_pod(
        {
            "metadata": {"name": "p", "namespace": "evil", "annotations": ["x"]},
            "spec": {
                "schedulingGates": "gpuplane.dev/steer",
                "resourceClaims": [1, {"name": 2, "resourceClaimName": "c"}],
                "nodeSelector": ["kubernetes.io/hostname"],
                "affinity": "anywhere",
                "nodeName": None,
            },
        }
    )
    assert odd.gates == () and odd.claims == (indexed.PodClaimRef("2", claim="c"),)
    assert odd.node_selector == {} and odd.affinity is None and odd.node_name == ""
    assert not gate.held_by(odd, decide.Settings().gate) and gate.pinned_node(odd) is None
    assert indexed.pending_pod({"metadata": "x", "spec": 3}) == indexed.PodView(name="")
