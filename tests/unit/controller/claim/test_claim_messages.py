"""What the controller tells a user about a claim says what is wrong, and says it once (issue 18, defect 6).

- a claim whose DeviceClass (or own selector) matches no GPU, or whose CEL reads an attribute
  no GPU publishes (the scheduler's CEL fails at run time), was explained as "largest free
  block: 0 GPUs ... 0 free in all" while every GPU was free;
- ``InvalidDeviceConfig`` was recorded 2-5 times per claim: each claim event whose body was
  older than the controller's own annotation reviewed the claim again.

Slices are the real driver's (:mod:`tests.controllerkit`); the review runs through
``handling.check_claim`` with a writer that records what it would write.
"""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any

import pytest

from gpuplane.controller import config, deviceclass, events, indexed, kube, metrics, names, runtime
from gpuplane.controller.claim import checks, handling
from gpuplane.controller.gang import run as gang_run
from gpuplane.controller.gang import world
from gpuplane.controller.node import snapshot_builder
from tests import controllerkit as kit


@pytest.fixture(scope="module", name="view")
def view_fixture(tmp_path_factory: pytest.TempPathFactory) -> snapshot_builder.ClusterView:
    return snapshot_builder.build_view(kit.cluster_slices(tmp_path_factory.mktemp("sim")))


def _nothing_class(expression: str) -> deviceclass.ClassView:
    return deviceclass.view(
        {"metadata": {"name": "odd.gpuplane.dev"}, "spec": {"selectors": [{"cel": {"expression": expression}}]}}
    )


def test_a_class_that_matches_no_gpu_is_named_not_counted(view: snapshot_builder.ClusterView) -> None:
    classes = {
        **kit.CLASSES,
        "odd.gpuplane.dev": _nothing_class(
            'device.driver == "gpu.gpuplane.dev" && device.attributes["gpu.gpuplane.dev"].productName == "NVIDIA B300"'
        ),
    }
    why = kit.explain(kit.claim_body([kit.req("g", cls="odd.gpuplane.dev")]), classes, view)
    free = len(view.gpus)
    assert "0 free in all" not in why, why
    assert f"no GPU matches the selectors of DeviceClass odd.gpuplane.dev ({free} of {free} GPUs free)" in why, why


def test_a_request_selector_that_matches_no_gpu_is_named(view: snapshot_builder.ClusterView) -> None:
    sel = 'device.attributes["gpu.gpuplane.dev"].productName == "NVIDIA B300"'
    why = kit.explain(kit.claim_body([kit.req("g", sel=[sel])]), kit.CLASSES, view)
    assert "no GPU matches the selectors of DeviceClass gpu.gpuplane.dev and request g" in why, why


def test_a_selector_on_an_attribute_no_gpu_publishes_is_a_cel_runtime_error(view: snapshot_builder.ClusterView) -> None:
    sel = 'device.attributes["gpu.gpuplane.dev"].vendorColour == "green"'
    why = kit.explain(kit.claim_body([kit.req("g", sel=[sel])]), kit.CLASSES, view)
    assert 'reads device.attributes["gpu.gpuplane.dev"].vendorColour, which no GPU publishes' in why, why
    assert "fails at run time" in why and "0 free in all" not in why, why


class Recorder(kube.KubeWriter):
    """A KubeWriter that records the writes instead of making them."""

    def __init__(self) -> None:  # no API client: nothing is sent
        self.guard = lambda: True
        self.writes: list[tuple[str, Any]] = []

    def event(self, ref: events.ObjectRef, kind: events.EventType, reason: str, message: str) -> None:
        self.writes.append(("event", (ref.kind, ref.name, reason)))

    def annotate_claim(self, namespace: str, name: str, annotations: Any) -> None:
        self.writes.append(("annotate", dict(annotations)))

    def set_pod_condition(self, namespace: str, name: str, cond: Any) -> None:
        self.writes.append(("condition", name))

    def fail_pending_pod(self, namespace: str, name: str, reason: str, message: str) -> bool:
        self.writes.append(("fail", name))
        return False  # already failed: no pod Event


def test_invalid_device_config_is_recorded_once_though_stale_bodies_arrive() -> None:
    writer = Recorder()
    rt = runtime.Runtime.create(config.parse_args(["--identity", "a"], {}), writer, metrics.ControllerMetrics())
    opaque = {"driver": "gpu.gpuplane.dev", "parameters": {}}  # no apiVersion/kind: invalid
    bad = kit.claim_body([kit.req("g")], [{"requests": ["g"], "opaque": opaque}])
    bad["metadata"]["uid"] = "u-bad"
    for _ in range(4):  # the scheduler's and kubelet's updates, each a body older than the annotation
        asyncio.run(handling.check_claim(rt, copy.deepcopy(bad), kit.CLASSES, ["p"]))
    claim_events = [w for w in writer.writes if w[0] == "event" and w[1][0] == "ResourceClaim"]
    assert [e[1][2] for e in claim_events] == [events.CLAIM_INVALID_CONFIG], writer.writes
    assert sum(1 for w in writer.writes if w[0] == "annotate") == 1, writer.writes


def test_claims_of_one_template_share_one_explanation_per_view(view: snapshot_builder.ClusterView) -> None:
    # 7,200 pending claims of one template each built a snapshot of the whole fleet per pass; now one does.
    sel = 'device.attributes["gpu.gpuplane.dev"].productName == "NVIDIA B300"'
    cache = checks.ReasonCache()
    first = kit.claim_body([kit.req("g", sel=[sel])])
    twin = copy.deepcopy(first)
    twin["metadata"]["name"], twin["metadata"]["uid"] = "c-2", "uid-c-2"
    want = kit.explain(first, kit.CLASSES, view)
    assert cache.reason(indexed.claim(first), kit.CLASSES, view) == want and cache.hits == 0
    assert cache.reason(indexed.claim(twin), kit.CLASSES, view) == want and cache.hits == 1
    # Other requests, another class definition, or a new view: worked out again.
    other = kit.claim_body([kit.req("g", sel=[sel.replace("B300", "B200")])])
    assert cache.reason(indexed.claim(other), kit.CLASSES, view) == kit.explain(other, kit.CLASSES, view)
    odd = {**kit.CLASSES, "gpu.gpuplane.dev": _nothing_class('device.driver == "x"')}
    assert cache.reason(indexed.claim(twin), odd, view) == kit.explain(twin, odd, view)
    assert cache.hits == 1
    newer = copy.copy(view)
    assert cache.reason(indexed.claim(twin), kit.CLASSES, newer) == want and cache.hits == 1


def test_a_claim_asked_again_under_the_same_view_and_classes_is_answered_by_uid(
    view: snapshot_builder.ClusterView, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The explainer asks about every pending claim every pass; a quiet cluster keeps one view.
    sel = 'device.attributes["gpu.gpuplane.dev"].productName == "NVIDIA B300"'
    cache = checks.ReasonCache()
    body = kit.claim_body([kit.req("g", sel=[sel])])
    body["metadata"]["uid"] = "uid-c-1"
    claim = indexed.claim(body)  # as the claim index holds it
    want = cache.reason(claim, kit.CLASSES, view)
    encoded: list[int] = []
    real = checks.json.dumps
    monkeypatch.setattr(checks.json, "dumps", lambda *a, **k: encoded.append(1) or real(*a, **k))
    assert cache.reason(claim, kit.CLASSES, view) == want and cache.hits == 1 and encoded == []
    other_classes = dict(kit.CLASSES)  # equal content, another mapping (the next pass): classes encoded once
    assert cache.reason(claim, other_classes, view) == want and cache.hits == 2 and len(encoded) == 1
    odd = {**kit.CLASSES, "gpu.gpuplane.dev": _nothing_class('device.driver == "x"')}
    assert cache.reason(claim, odd, view) == kit.explain(body, odd, view)  # new classes: again


def test_an_explanation_is_written_again_when_its_wording_changes_not_its_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    writer = Recorder()
    rt = runtime.Runtime.create(config.parse_args(["--identity", "a"], {}), writer, metrics.ControllerMetrics())
    monkeypatch.setattr(gang_run, "plan_for", lambda *a, **k: (None, None))
    answers = iter(
        [
            "request g needs 4 GPUs on one node; largest free block: 3 GPUs on one node, 120 free in all",
            "request g needs 4 GPUs on one node; largest free block: 2 GPUs on one node, 97 free in all",
            "request g: no GPU matches the selectors of class gpu.gpuplane.dev (0 of 8 GPUs free)",
        ]
    )
    monkeypatch.setattr(rt.state(handling.ClaimState).reasons, "reason", lambda *a: next(answers))
    claim = kit.claim_body([kit.req("g", count=4)])
    claim["metadata"].update(uid="u-1", creationTimestamp="2026-01-01T00:00:00Z")
    w = world.World(gangs={}, pods={}, claims={}, slices=(), nodes={}, classes=kit.CLASSES)
    for _ in range(3):  # three explainer passes; the fleet's counts changed between them
        asyncio.run(handling.explain_claim(rt, indexed.claim(claim), kit.CLASSES, w, time.time()))
        written = [a for kind, a in writer.writes if kind == "annotate"]
        if written:
            claim["metadata"]["annotations"] = written[-1]  # the index shows the annotation written
    said = [a[names.ANNOTATION_EXPLAINED] for kind, a in writer.writes if kind == "annotate"]
    assert len(said) == 2 and "120 free in all" in said[0] and "no GPU matches" in said[1]
    assert sum(1 for kind, _ in writer.writes if kind == "event") == 2
    assert handling.same_reason("3 of 4 free", "9 of 4 free") and not handling.same_reason(None, "x")
